# The Markdown table of the operator benchmark from the JSON lines of ember's
# TestGPUOpBench (EMBER_OPBENCH_OUT) and of ops_torch.py (--out).
# usage: python3 ops_table.py OURS.jsonl TORCH.jsonl
# Lines that are not JSON objects with an "op" (test runner output) are
# skipped. Rows follow the torch file's order; cases only one side has come
# last. "% of copy" is our throughput over our 1 GiB device-to-device copy's;
# "% of its size's copy" over our copy of the row's first shape (the Copy
# rows), where the benchmark has one: launch and ramp weigh more on a 25 or
# 51 MB operation than on the 1 GiB copy, and a copy of the same size pays
# them too.
import json, sys


def load(path):
    rows, meta = {}, {}
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if "meta" in r:
            meta = r["meta"]
        elif "op" in r:
            rows[(r["op"], r["shape"], r["pass"])] = r
    return rows, meta


ours, _ = load(sys.argv[1])
torch, meta = load(sys.argv[2])
copy = ours.get(("copy", "1GiB", "fwd"), {}).get("gbps")


def rate(r):
    if r is None:
        return "—"
    if "tflops" in r:
        return f"{r['tflops']:.1f} TFLOP/s"
    return f"{r['gbps']:.0f}" if "gbps" in r else "—"


def pct(r):
    if r is None or "gbps" not in r or not copy:
        return "—"
    return f"{100 * r['gbps'] / copy:.0f}%"


def sized_pct(key, r):
    if r is None or "gbps" not in r:
        return "—"
    shape = key[1].split(" ")[0].split("+")[0]
    c = ours.get(("Copy", shape, "fwd"))
    if not c or not c.get("gbps"):
        return "—"
    return f"{100 * r['gbps'] / c['gbps']:.0f}%"


if meta:
    print(f"PyTorch {meta.get('torch', '?')} on {meta.get('device', '?')}.", end=" ")
tc = torch.get(("copy", "1GiB", "fwd"), {}).get("gbps")
print(f"Copy bandwidth (1 GiB device to device, read + write): ours {copy or '—'} GB/s, PyTorch {tc or '—'} GB/s.\n")
print("| op | shape | pass | ours µs | ours GB/s | % of copy | torch µs | torch/ours | % of its size's copy |")
print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
keys = list(torch) + [k for k in ours if k not in torch]
for key in keys:
    o, t = ours.get(key), torch.get(key)
    ratio = f"{t['us'] / o['us']:.2f}×" if o and t and o["us"] > 0 else "—"
    print(f"| {key[0]} | {key[1]} | {key[2]} | {o['us'] if o else '—'} | {rate(o)} | {pct(o)} | {t['us'] if t else '—'} | {ratio} | {sized_pct(key, o)} |")
