"""Two models in one deployment, through the official `openai` client: each answers under its
own name, a tenant sees and uses only the models it may, and a model it may not use answers
exactly as a model that does not exist.

Usage: python models_test.py BASE_URL KEY_ALL KEY_GEMMA_ONLY SMOLLM_NAME GEMMA_NAME
"""
import sys

import openai
from openai import OpenAI

from checks import check, done

base, key_all, key_gemma, smol, gemma = sys.argv[1:6]
every = OpenAI(base_url=base + "/v1", api_key=key_all, max_retries=0, timeout=120)
limited = OpenAI(base_url=base + "/v1", api_key=key_gemma, max_retries=0, timeout=120)

check(sorted(m.id for m in every.models.list().data) == sorted([smol, gemma]), "both models listed for an unlimited tenant")
check([m.id for m in limited.models.list().data] == [gemma], "only the allowed model listed")

for client, model in ((every, smol), (every, gemma), (limited, gemma)):
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8, temperature=0
    )
    check(r.model == model, f"{model} answers under its own name")
    check(isinstance(r.choices[0].message.content, str) and r.usage.completion_tokens > 0, f"{model} chat content")

# Gemma's greedy continuation, as llama.cpp's on the same file (reference/gemma3), through the
# server: its own tokenizer, BOS and forward pass.
r = limited.completions.create(model=gemma, prompt="The capital of France is", max_tokens=6, temperature=0)
check(r.choices[0].text == " the capital of the country of", f"Gemma's greedy text: {r.choices[0].text!r}")
check(r.usage.prompt_tokens == 6, "Gemma's prompt counts its BOS token, as llama.cpp")
r = every.completions.create(model=smol, prompt="The capital of France is", max_tokens=6, temperature=0)
check(r.usage.prompt_tokens == 5, "SmolLM2's prompt has no BOS")


def refusal(client, model):
    try:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=1)
    except openai.NotFoundError as e:
        return e.status_code, e.body
    check(False, f"{model} refused with 404")


status_denied, body_denied = refusal(limited, smol)
status_unknown, body_unknown = refusal(limited, "no-such-model")
check(status_denied == status_unknown == 404, "both 404")
check(body_denied["code"] == body_unknown["code"] == "model_not_found", "model_not_found code")
check(
    body_denied["message"].replace(smol, "X") == body_unknown["message"].replace("no-such-model", "X"),
    "a model not allowed is refused in the words of an unknown one",
)
check(
    {k: v for k, v in body_denied.items() if k != "message"} == {k: v for k, v in body_unknown.items() if k != "message"},
    "the rest of the error envelope is identical",
)
try:
    limited.completions.create(model=smol, prompt="hi", max_tokens=1)
    check(False, "completions refused too")
except openai.NotFoundError:
    check(True, "completions refused too")
done()
