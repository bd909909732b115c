# PyTorch's peak GPU memory for a zoo.py workload: runs zoo.py (whose path is
# the first argument) unchanged, with the rest of the arguments as its own,
# then prints one JSON line with torch.cuda.max_memory_reserved() and
# max_memory_allocated() in MiB: what the caching allocator held from the
# driver at its peak, and what tensors used at theirs.
#
# usage: python3 zoo_memory.py PATH/zoo.py WHAT MODE [args]
#   e.g. python3 zoo_memory.py zoo.py resnet9 fp32 FMNIST_DIR 2
import json
import runpy
import sys

import torch


def main():
    if len(sys.argv) < 4:
        sys.exit("usage: python3 zoo_memory.py PATH/zoo.py WHAT MODE [args]")
    path, args = sys.argv[1], sys.argv[2:]
    torch.cuda.init()
    torch.cuda.reset_peak_memory_stats()
    sys.argv = [path] + args  # zoo.py reads its arguments from sys.argv
    runpy.run_path(path, run_name="__main__")
    torch.cuda.synchronize()
    mib = lambda n: round(n / 2**20, 1)
    print(json.dumps({"what": args[0], "mode": args[1], "torch_max_reserved_mib": mib(torch.cuda.max_memory_reserved()),
                      "torch_max_allocated_mib": mib(torch.cuda.max_memory_allocated())}), flush=True)


if __name__ == "__main__":
    main()
