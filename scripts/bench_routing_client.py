"""The client of scripts/bench-routing.sh: CONVERSATIONS conversations of TURNS turns, each
turn of every conversation sent at once (streamed, greedy), each with its own long system
prompt. Prints per turn: cached tokens / ideal (the previous turn's prompt but its last page),
cached / prompt, and the median time to first token."""

import json
import statistics
import sys
import threading
import time
import urllib.request

URL, KEY, CONVS, TURNS, POLICY = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
DECODE_METRICS = [u for u in sys.argv[6].split(",") if u]
SYSTEM_TOKENS = int(sys.argv[7])
PAGE = 16
QUESTIONS = [
    "What do you sell?",
    "How long is delivery?",
    "Can I return a gift?",
    "Do you have a shop in town?",
    "What does a repair cost?",
    "Which item do you recommend first?",
    "Do gift cards expire?",
    "Thanks, anything else I should know?",
]


def system(i):
    # About 25 tokens a rule.
    rules = " ".join(
        f"Rule {r} for shop {i}: customers are served in order, politely, and every answer names the shop {i}."
        for r in range(max(1, SYSTEM_TOKENS // 25))
    )
    return f"You are the assistant of shop number {i}. Answer in one short sentence. {rules}"


def decode_counters(name):
    """The counter on each decode worker."""
    values = []
    for url in DECODE_METRICS:
        value = 0.0
        with urllib.request.urlopen(url, timeout=30) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + "{") or line.startswith(name + " "):
                    value += float(line.rsplit(" ", 1)[1])
        values.append(value)
    return values


def decode_counter(name):
    return sum(decode_counters(name))


def served_model():
    req = urllib.request.Request(f"{URL}/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)["data"][0]["id"]


MODEL = served_model()


def turn(messages):
    body = json.dumps({
        "model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0,
        "stream": True, "stream_options": {"include_usage": True},
    }).encode()
    req = urllib.request.Request(f"{URL}/v1/chat/completions", body, {
        "Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    start, ttft, text, usage = time.monotonic(), None, "", None
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for c in chunk.get("choices", []):
                piece = c.get("delta", {}).get("content")
                if piece:
                    ttft = ttft or time.monotonic() - start
                    text += piece
            if chunk.get("usage"):
                usage = chunk["usage"]
    return text, usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"], ttft or 0.0


def main():
    convs = [[{"role": "system", "content": system(i)}] for i in range(CONVS)]
    previous = [0] * CONVS
    previous_prompts = [0] * CONVS
    # Bytes of one token's KV, all layers: learned from the first turn (whole prompts cross).
    token_bytes = None
    for t in range(TURNS):
        results = [None] * CONVS
        bytes_before = decode_counter("pagewarden_kv_bytes_received_total")
        held_before = decode_counter("pagewarden_kv_held_prompt_tokens_total")
        routes_before = decode_counters("pagewarden_worker_reservations_total")

        def one(i):
            convs[i].append({"role": "user", "content": QUESTIONS[t % len(QUESTIONS)]})
            results[i] = turn(convs[i])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(CONVS)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        cached = sum(r[2] for r in results)
        prompt = sum(r[1] for r in results)
        ideal = sum((p - 1) // PAGE * PAGE for p in previous) if t else 0
        for i, r in enumerate(results):
            convs[i].append({"role": "assistant", "content": r[0]})
            previous[i] = r[1]
        ttft = statistics.median(r[3] for r in results)
        of_ideal = f"{cached / ideal:6.1%}" if ideal else "     -"
        moved = decode_counter("pagewarden_kv_bytes_received_total") - bytes_before
        held = decode_counter("pagewarden_kv_held_prompt_tokens_total") - held_before
        split = "/".join(str(int(a - b)) for a, b in
                         zip(decode_counters("pagewarden_worker_reservations_total"), routes_before))
        if token_bytes is None and held == 0:
            token_bytes = moved / prompt
        # The bound: each conversation's new tokens' pages plus one page (the partial one).
        new_pages = sum(-(-(r[1] - (p // PAGE) * PAGE) // PAGE) + 1 for r, p in zip(results, previous_prompts))
        bound = new_pages * PAGE * (token_bytes or 0)
        print(f"{POLICY:13} turn {t + 1}: cached {cached:6}/{prompt:6} tokens ({cached / prompt:6.1%}), "
              f"of ideal {of_ideal}; KV moved {moved / 1e6:8.2f} MB (held {int(held):6} tokens; "
              f"bound {bound / 1e6:8.2f} MB); decode split {split}; TTFT p50 {ttft * 1000:7.1f} ms", flush=True)
        previous_prompts[:] = [r[1] for r in results]


main()
