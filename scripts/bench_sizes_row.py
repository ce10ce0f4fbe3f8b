#!/usr/bin/env python3
"""One row of scripts/bench-sizes.sh's table, from the files it wrote for one model file:
bench.json (`bench model --json --llama-bench`), pw.time and ll.time (`/usr/bin/time -a -f
"%e %M"` of pagewarden generate and llama-bench, one line a run), and where it ran them
batch.json (`bench model --batch B --json`) and batch.jsonl (llama-batched-bench's)."""
import json, os, statistics, sys
q, work = sys.argv[1], sys.argv[2]
size = os.path.getsize(q)
b = json.load(open(os.path.join(work, "bench.json")))


def runs(name):
    """(median seconds, largest peak memory in KB) over the runs in a time file."""
    lines = [l.split()[-2:] for l in open(os.path.join(work, name)) if l.strip() and l.split()[0][0].isdigit()]
    return statistics.median(float(t) for t, _ in lines), max(int(m) for _, m in lines)


pw_t, pw_m = runs("pw.time")
ll_t, ll_m = runs("ll.time")
v = b["llama_cpp"]["versus"][0]
row = next(r for r in b["rows"] if r["batch"] == 1 and r["threads"] == v["threads"] and r["depth"] == v["depth"])
bw = next(x["read_gb_per_s"] for x in b["read_bandwidth"] if x["threads"] == v["threads"]) * 1e9
ours = row["decode_tokens_per_s"] * b["weight_bytes_per_step"] / bw
theirs = v["llama_tg_tokens_per_s"] * size / bw
gb = lambda kb: int(kb) * 1024 / 1e9
batch = "not run"
if os.path.exists(os.path.join(work, "batch.json")):
    ob = json.load(open(os.path.join(work, "batch.json")))["rows"][0]
    lb = [json.loads(l) for l in open(os.path.join(work, "batch.jsonl")) if l.strip()][0]
    batch = f"{ob['decode_tokens_per_s'] / lb['speed_tg']:.2f}x ({ob['decode_tokens_per_s']:.0f} / {lb['speed_tg']:.0f} tok/s)"
print(f"| {os.path.basename(q)} ({size / 1e9:.2f} GB) | {v['prefill_ratio']:.2f}x | {v['decode_ratio']:.2f}x "
      f"| {100 * ours:.0f}% / {100 * theirs:.0f}% of {bw / 1e9:.1f} GB/s "
      f"| {gb(pw_m):.2f} / {gb(ll_m):.2f} GB | {pw_t:.2f} / {ll_t:.2f} s | {batch} |")
