# Where a step's GPU time goes, by kernel, from an Nsight Compute CSV:
# each kernel's share of the profiled time, its mean time a launch, and its
# DRAM bandwidth (bytes read and written over its time).
# usage: python3 ncu_kernels.py NCU.csv[.gz] [SUBSTRING]
# With SUBSTRING, the kernels whose names contain it are listed by launch
# shape (grid, block) instead, to tell their geometries apart.
# The CSV comes from a run such as (bf16 airbench, eager, 600 kernels after
# the first 4000):
#   EMBER_ZOO=airbench EMBER_ZOO_PRECISION=bf16 EMBER_ZOO_GRAPH=0 EMBER_ZOO_EPOCHS=1 \
#     ncu --cache-control none --clock-control none --launch-skip 4000 --launch-count 600 --csv \
#     --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size \
#     models.test -test.run '^TestZooGPU$' > ncu.csv
import collections, csv, gzip, sys


def rows(path):
    f = gzip.open(path, "rt") if path.endswith(".gz") else open(path)
    lines = (l for l in f if l.startswith('"'))  # the profiled program's own output is not quoted
    r = list(csv.reader(lines))
    return r[0], r[1:]


def number(s):
    return float(s.replace(",", "")) if s else 0.0


def main():
    hdr, body = rows(sys.argv[1])
    col = {name: hdr.index(name) for name in ("ID", "Kernel Name", "Metric Name", "Metric Value", "Grid Size", "Block Size")}
    launches = collections.defaultdict(dict)
    names = {}
    for r in body:
        i = r[col["ID"]]
        if not i.isdigit():
            continue
        launches[i][r[col["Metric Name"]]] = number(r[col["Metric Value"]])
        names[i] = (r[col["Kernel Name"]].split("(")[0][:64], r[col["Grid Size"]], r[col["Block Size"]])
    pick = sys.argv[2] if len(sys.argv) > 2 else None
    agg = collections.defaultdict(lambda: [0, 0.0, 0.0])
    total = 0.0
    for i, m in launches.items():
        t = m.get("gpu__time_duration.sum", 0.0)  # ns
        total += t
        name, grid, block = names[i]
        if pick is not None and pick not in name:
            continue
        key = (name, grid, block) if pick is not None else (name,)
        a = agg[key]
        a[0] += 1
        a[1] += t
        a[2] += m.get("dram__bytes_read.sum", 0.0) + m.get("dram__bytes_write.sum", 0.0)
    print(f"{len(launches)} launches, {total / 1e3:.1f} µs")
    print("| kernel | launches | share | µs a launch | GB/s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for key, (n, t, b) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print(f"| {' '.join(key)} | {n} | {100 * t / total:.1f}% | {t / n / 1e3:.1f} | {b / t if t else 0:.0f} |")


if __name__ == "__main__":
    main()
