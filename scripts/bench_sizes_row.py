#!/usr/bin/env python3
"""One row of scripts/bench-sizes.sh's table, from the files it wrote for one model file:
bench.json (`bench model --json --llama-bench`), pw.time and ll.time (`/usr/bin/time -f "%e %M"`
of pagewarden generate and llama-bench)."""
import json, os, sys
q, work = sys.argv[1], sys.argv[2]
size = os.path.getsize(q)
b = json.load(open(os.path.join(work, "bench.json")))
pw_t, pw_m = open(os.path.join(work, "pw.time")).read().split()[-2:]
ll_t, ll_m = open(os.path.join(work, "ll.time")).read().split()[-2:]
v = b["llama_cpp"]["versus"][0]
row = next(r for r in b["rows"] if r["batch"] == 1 and r["threads"] == v["threads"] and r["depth"] == v["depth"])
bw = next(x["read_gb_per_s"] for x in b["read_bandwidth"] if x["threads"] == v["threads"]) * 1e9
ours = row["decode_tokens_per_s"] * b["weight_bytes_per_step"] / bw
theirs = v["llama_tg_tokens_per_s"] * size / bw
gb = lambda kb: int(kb) * 1024 / 1e9
print(f"| {os.path.basename(q)} ({size / 1e9:.2f} GB) | {v['prefill_ratio']:.2f}x | {v['decode_ratio']:.2f}x "
      f"| {100 * ours:.0f}% / {100 * theirs:.0f}% of {bw / 1e9:.1f} GB/s "
      f"| {gb(pw_m):.2f} / {gb(ll_m):.2f} GB | {float(pw_t):.1f} / {float(ll_t):.1f} s |")
