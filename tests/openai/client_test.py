"""The official `openai` Python client against a running pagewarden server.

Usage: python client_test.py BASE_URL API_KEY MODEL
Exits non-zero (with the failing check named) when any behaviour differs from what the OpenAI
API promises its users.
"""
import sys

import openai
from openai import OpenAI

from checks import check, done

base, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
client = OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=120)


# Models
models = client.models.list()
check(any(m.id == model for m in models.data), "model listed by /v1/models")

# Chat, non-streaming
r = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "What is the capital of France?"}], max_tokens=16, temperature=0
)
check(r.object == "chat.completion", "chat object type")
check(r.choices[0].message.role == "assistant", "assistant role")
check(isinstance(r.choices[0].message.content, str) and r.choices[0].message.content, "chat content")
check(r.choices[0].finish_reason in ("stop", "length"), "finish_reason")
check(r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0, "usage")
check(r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, "usage total")

# Chat, streaming, with usage
stream = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Count from one to five."}],
    max_tokens=16,
    temperature=0,
    stream=True,
    stream_options={"include_usage": True},
)
text, finish, usage = "", None, None
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        if c.delta.content:
            text += c.delta.content
        if c.finish_reason:
            finish = c.finish_reason
check(text, "streamed content")
check(finish in ("stop", "length"), "streamed finish_reason")
check(usage is not None and usage.completion_tokens > 0, "streamed usage chunk")

# Streaming equals non-streaming for greedy decoding
full = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Count from one to five."}], max_tokens=16, temperature=0
)
check(full.choices[0].message.content == text, "streamed text equals non-streamed text")

# Completions
c = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0)
check(c.object == "text_completion", "completion object type")
check(c.choices[0].text, "completion text")
check(c.usage.completion_tokens > 0, "completion usage")

# Log-probs
lp = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0, logprobs=True, top_logprobs=3
)
content = lp.choices[0].logprobs.content
check(content and len(content[0].top_logprobs) == 3, "top_logprobs")
check(all(t.logprob <= 0 for t in content), "logprobs are log-probabilities")

# A wrong key
bad = OpenAI(base_url=base + "/v1", api_key="pw-not-a-key", max_retries=0)
try:
    bad.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    check(False, "wrong key must fail")
except openai.AuthenticationError as e:
    check(e.status_code == 401, "wrong key is 401")

# An over-long prompt
try:
    client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hello " * 9000}], max_tokens=16
    )
    check(False, "over-long prompt must fail")
except openai.BadRequestError as e:
    check(e.status_code == 400, "over-long prompt is 400")
    check(e.code == "context_length_exceeded", "over-long prompt code")

# Unknown model
try:
    client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    check(False, "unknown model must fail")
except openai.NotFoundError as e:
    check(e.status_code == 404, "unknown model is 404")

# n choices
r = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=4, temperature=1, n=3
)
check([c.index for c in r.choices] == [0, 1, 2], "n = 3 returns 3 choices")
check(all(isinstance(c.message.content, str) for c in r.choices), "each choice has content")
c3 = client.completions.create(model=model, prompt="Once upon a time", max_tokens=3, n=3, temperature=1)
check(len(c3.choices) == 3, "completions n = 3")

# logit_bias: +100 on one token forces it
forced = client.completions.create(
    model=model, prompt="The capital of France is", max_tokens=2, temperature=0, logit_bias={"504": 100}
)
again = client.completions.create(
    model=model, prompt="Something else entirely:", max_tokens=2, temperature=0, logit_bias={"504": 100}
)
check(forced.choices[0].text == again.choices[0].text, "logit_bias forces the same token whatever the prompt")


def refused_naming(param, **kwargs):
    try:
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4, **kwargs
        )
    except openai.BadRequestError as e:
        return e.status_code == 400 and e.param == param
    return False


# Fields the server does not know or cannot honour are refused, never ignored
check(refused_naming("frobnicate", extra_body={"frobnicate": 1}), "an unknown field is a 400 naming it")
check(refused_naming("audio", audio={"voice": "alloy", "format": "wav"}), "an unsupported field is a 400 naming it")
check(refused_naming("store", store=True), "store: true is a 400 naming it")

done()
