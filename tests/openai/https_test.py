"""The official `openai` Python client against a pagewarden server over HTTPS.

Usage: python https_test.py BASE_URL API_KEY MODEL TRUSTED_CA OTHER_CA
BASE_URL is https://...; TRUSTED_CA signed the certificate the server presents now, OTHER_CA
did not. Exits non-zero (naming the failing check) when any behaviour differs.
"""
import ssl
import sys
import time

import httpx
import openai
from openai import OpenAI

from checks import check, done

base, key, model, trusted, other = sys.argv[1:6]


def client(ca, url=base):
    ctx = ssl.create_default_context(cafile=ca)
    return OpenAI(
        base_url=url + "/v1", api_key=key, max_retries=0, timeout=60, http_client=httpx.Client(verify=ctx, timeout=60)
    )


def refused(make_call):
    try:
        make_call()
    except openai.APIConnectionError:
        return True
    return False


def chat(c):
    return c.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is 2 + 2?"}], max_tokens=8, temperature=0
    )


good = client(trusted)
# A reload (SIGHUP) may still be on its way: the trusted CA gets a few seconds to be served.
deadline = time.time() + 20
while True:
    try:
        r = chat(good)
        break
    except openai.APIConnectionError:
        if time.time() > deadline:
            check(False, "a client trusting the server's CA connects")
        time.sleep(0.5)
check(r.choices[0].message.content, "chat over HTTPS answers")
check(r.usage.completion_tokens > 0, "usage over HTTPS")
check(any(m.id == model for m in good.models.list().data), "models over HTTPS")

stream = good.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "What is 2 + 2?"}],
    max_tokens=8,
    temperature=0,
    stream=True,
    stream_options={"include_usage": True},
)
text, usage = "", None
for chunk in stream:
    usage = chunk.usage or usage
    for ch in chunk.choices:
        text += ch.delta.content or ""
check(text == r.choices[0].message.content, "a stream over HTTPS equals the full answer")
check(usage is not None and usage.completion_tokens == r.usage.completion_tokens, "streamed usage over HTTPS")

check(refused(lambda: chat(client(other))), "a client trusting another CA refuses the server's certificate")
check(refused(lambda: chat(client(trusted, base.replace("https://", "http://")))), "plain HTTP to the HTTPS port fails")
# The listener survives refused handshakes.
check(chat(good).choices[0].message.content == r.choices[0].message.content, "HTTPS still serves after refusals")
done()
