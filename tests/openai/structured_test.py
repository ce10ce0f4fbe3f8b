"""Structured outputs and function calling with the official `openai` Python client.

Usage: python structured_test.py BASE_URL API_KEY MODEL
Checks: `response_format` json_schema answers validate against their schema (jsonschema) for 20
varied prompts, streamed or not; json_object answers parse; a `tools` request returns
`tool_calls` whose arguments validate against the function's parameters, also streamed; a
`tool` message answering the call goes into the next turn's prompt (its length shows in
`usage`); a bad schema is a 400 naming `response_format`. Exits non-zero naming the failing check.
"""
import json
import sys

import jsonschema
import openai
from openai import OpenAI

from checks import check, done

base, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
client = OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=120)


# Bounded strings and numbers: a schema without bounds lets a small model write digits until
# max_tokens (the document is then cut, finish_reason "length").
S = {"type": "string", "maxLength": 24}
SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 150}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "list": {
        "type": "object",
        "properties": {"items": {"type": "array", "items": S, "minItems": 1, "maxItems": 4}},
        "required": ["items"],
        "additionalProperties": False,
    },
    "choice": {
        "type": "object",
        "properties": {"answer": {"type": "string", "enum": ["yes", "no", "maybe"]}, "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
        "required": ["answer", "confidence"],
        "additionalProperties": False,
    },
    "nested": {
        "type": "object",
        "properties": {
            "city": S,
            "location": {
                "type": "object",
                "properties": {"country": S, "population": {"type": "integer", "minimum": 0, "maximum": 99999999}},
                "required": ["country", "population"],
                "additionalProperties": False,
            },
            "capital": {"type": "boolean"},
        },
        "required": ["city", "location", "capital"],
        "additionalProperties": False,
    },
}
PROMPTS = [
    ("person", "Describe a famous scientist."),
    ("person", "Invent a character for a novel."),
    ("person", "Who wrote Hamlet?"),
    ("person", "Tell me about your grandmother."),
    ("person", "Make up a football player."),
    ("list", "List some fruits."),
    ("list", "Name colours of the rainbow."),
    ("list", "What should I pack for a beach trip?"),
    ("list", "Give me programming languages."),
    ("list", "Which planets do you know?"),
    ("choice", "Is the sky blue?"),
    ("choice", "Will it rain tomorrow?"),
    ("choice", "Is 7 a prime number?"),
    ("choice", "Can penguins fly?"),
    ("choice", "Should I learn Rust?"),
    ("nested", "Tell me about Paris."),
    ("nested", "Describe Tokyo."),
    ("nested", "What do you know about Lyon?"),
    ("nested", "Describe a small town in Canada."),
    ("nested", "Tell me about Berlin."),
]

for i, (name, prompt) in enumerate(PROMPTS):
    schema = SCHEMAS[name]
    rf = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
    messages = [{"role": "user", "content": prompt + " Answer in JSON."}]
    if i % 4 == 3:
        # Streamed: the concatenated deltas are the document.
        text = ""
        for chunk in client.chat.completions.create(
            model=model, messages=messages, max_tokens=300, temperature=0.7, seed=i, response_format=rf, stream=True
        ):
            for c in chunk.choices:
                text += c.delta.content or ""
    else:
        r = client.chat.completions.create(
            model=model, messages=messages, max_tokens=300, temperature=0.7, seed=i, response_format=rf
        )
        check(r.choices[0].finish_reason == "stop", f"prompt {i}: the document ended before max_tokens")
        text = r.choices[0].message.content
    try:
        doc = json.loads(text)
        jsonschema.validate(doc, schema)
    except (json.JSONDecodeError, jsonschema.ValidationError) as e:
        check(False, f"prompt {i} ({name}): {text!r} does not validate: {e}")
    check(True, f"prompt {i} validates")

r = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Describe a car as a JSON object with make and year."}],
    max_tokens=200,
    temperature=0,
    response_format={"type": "json_object"},
)
# Any object, of any length: this prompt's greedy answer ends well within max_tokens.
check(r.choices[0].finish_reason == "stop", "the json_object answer ended")
check(isinstance(json.loads(r.choices[0].message.content), dict), "json_object answers are JSON objects")

try:
    client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=8,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}},
    )
    check(False, "a schema that does not compile must fail")
except openai.BadRequestError as e:
    check(e.param == "response_format", "a bad schema is a 400 naming response_format")

WEATHER = {
    "type": "object",
    "properties": {"city": S, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Current weather in a city", "parameters": WEATHER},
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Current time in a timezone",
            "parameters": {
                "type": "object",
                "properties": {"timezone": S},
                "required": ["timezone"],
                "additionalProperties": False,
            },
        },
    },
]
ask = [{"role": "user", "content": "What is the weather in Paris?"}]
r = client.chat.completions.create(
    model=model, messages=ask, max_tokens=120, temperature=0, tools=TOOLS, tool_choice="required"
)
msg = r.choices[0].message
check(r.choices[0].finish_reason == "tool_calls", "a required tool choice finishes with tool_calls")
check(msg.tool_calls and len(msg.tool_calls) == 1, "one tool call")
call = msg.tool_calls[0]
check(call.type == "function" and call.id, "the call has an id and type")
params = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
check(call.function.name in params, "the call names an offered function")
jsonschema.validate(json.loads(call.function.arguments), params[call.function.name])
check(True, "the call's arguments validate against the function's parameters")

# Most clients write parameters without `additionalProperties`: such an object admits no other
# keys (as llama.cpp reads it), so the call closes instead of inventing keys until max_tokens.
OPEN = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
r = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "What is the weather in Rome?"}],
    max_tokens=120,
    temperature=0,
    tools=[{"type": "function", "function": {"name": "get_weather", "parameters": OPEN}}],
    tool_choice="required",
)
check(r.choices[0].finish_reason == "tool_calls", "an object schema without additionalProperties still ends in a call")
open_args = json.loads(r.choices[0].message.tool_calls[0].function.arguments)
jsonschema.validate(open_args, OPEN)
check(set(open_args) <= {"city"}, f"no key beyond the listed properties ({sorted(open_args)})")

named = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "What time is it in Tokyo?"}],
    max_tokens=120,
    temperature=0,
    tools=TOOLS,
    tool_choice={"type": "function", "function": {"name": "get_time"}},
)
nc = named.choices[0].message.tool_calls[0]
check(nc.function.name == "get_time", "a named tool choice calls that function")
jsonschema.validate(json.loads(nc.function.arguments), params["get_time"])

# Streamed: the call arrives as a tool_calls delta.
deltas, finish = [], None
for chunk in client.chat.completions.create(
    model=model, messages=ask, max_tokens=120, temperature=0, tools=TOOLS, tool_choice="required", stream=True
):
    for c in chunk.choices:
        deltas.extend(c.delta.tool_calls or [])
        finish = c.finish_reason or finish
check(finish == "tool_calls" and deltas, "a streamed call arrives as tool_calls deltas")
streamed_args = "".join(d.function.arguments or "" for d in deltas)
check(streamed_args == call.function.arguments, "the streamed call equals the full one")

# The next turn: the call and its result go back to the model.
def next_turn(result):
    return client.chat.completions.create(
        model=model,
        messages=ask
        + [
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)},
        ],
        max_tokens=40,
        temperature=0,
        tools=TOOLS,
        tool_choice="none",
    )


follow = next_turn({"temperature": 18, "sky": "clear"})
check(isinstance(follow.choices[0].message.content, str), "a tool result is answered in text")
# The result is in the prompt: a longer result makes a longer prompt, by about its length.
notes = " ".join(["humid with a light breeze from the west"] * 20)
longer = next_turn({"temperature": 18, "sky": "clear", "notes": notes})
grew = longer.usage.prompt_tokens - follow.usage.prompt_tokens
check(grew >= 100, f"the tool message's content goes into the next prompt ({grew} more prompt tokens)")
without = client.chat.completions.create(model=model, messages=ask, max_tokens=1, temperature=0)
check(
    follow.usage.prompt_tokens > without.usage.prompt_tokens + 10,
    "the call and its result lengthen the next turn's prompt",
)

done()
