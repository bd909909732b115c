#!/bin/bash
# Peak GPU memory of the zoo's workloads, ours beside PyTorch's, in one call:
# ResNet-9 (Fashion-MNIST, 2 epochs with their evaluations), airbench94's
# network (3 epochs) and the char GPT (3 rounds of 100 steps), each in fp32
# and bf16. Ours: the zoo harness (models/zoo_gpu_test.go), whose JSON lines
# carry the allocator's peak reserved and allocated memory over the run;
# PyTorch's: zoo_memory.py running zoo.py unchanged, which prints
# torch.cuda.max_memory_reserved() and max_memory_allocated(). The goal:
# ours at most half of PyTorch's peak reserved.
# Usage (repository root), logs under $OUT:
#   BIN=DIR_WITH_models.test FMNIST=DIR CORPUS=FILE ZOO=path/to/zoo.py bash docs/bench/zoo_memory.sh
# where models.test is built with CGO_ENABLED=0 go test -c -o models.test ./models
# (gzipped as models.test.gz is fine). BEFORE=1 also runs ours keeping each
# step's activations until the next step (EMBER_ZOO_RELEASE=0), the
# behaviour before the backward pass gave them back. RECOMPUTE=1 also runs
# ours with every block recomputed in the backward pass
# (EMBER_ZOO_RECOMPUTE=1, train's --recompute). NOLEND=1 also runs ours
# with the evaluation in memory of its own instead of the captured step's
# idle memory (EMBER_ZOO_LEND=0; only ResNet-9 evaluates). WHAT="resnet9 gpt"
# and PRECISIONS="fp32" narrow the runs. Takes about 4 minutes (6 with
# BEFORE=1).
D=${BIN:?BIN: the folder holding models.test}
FM=${FMNIST:?FMNIST: the Fashion-MNIST folder}; CORPUS=${CORPUS:?CORPUS: the text corpus}
ZOO=${ZOO:?ZOO: the path of zoo.py}
cd "$(dirname "$0")/../.." || exit 1
MEM=$PWD/docs/bench/zoo_memory.py
[ -f $D/models.test.gz ] && gunzip -kf $D/models.test.gz; chmod +x $D/models.test
export EMBER_KERNEL_CACHE=${EMBER_KERNEL_CACHE:-/tmp/kc} EMBER_REQUIRE_GPU=1 EMBER_REQUIRE_CUDNN=1
OUT=${OUT:-/tmp/zoo-memory}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

# ours NAME WHAT PREC [ENV...]: the zoo harness on one workload.
ours() {
	name=$1 what=$2 prec=$3; shift 3
	env EMBER_ZOO=$what EMBER_ZOO_PRECISION=$prec EMBER_ZOO_FMNIST=$FM EMBER_ZOO_EPOCHS=2 EMBER_ZOO_CORPUS=$CORPUS "$@" \
		timeout 300 $D/models.test -test.run '^TestZooGPU$' -test.v -test.timeout 290s > $OUT/$name.log 2>&1
	echo "$name rc=$?"; grep -E '^\{|FAIL|panic' $OUT/$name.log | tail -2 | cut -c1-300
}
# torch NAME WHAT MODE ARGS...: zoo.py under zoo_memory.py.
torch() {
	name=$1; shift
	timeout 300 python3 $MEM $ZOO "$@" > $OUT/$name.log 2>&1
	echo "$name rc=$?"; grep -E '^\{' $OUT/$name.log | tail -1 | cut -c1-300
}

for what in ${WHAT:-resnet9 airbench gpt}; do
	for prec in ${PRECISIONS:-fp32 bf16}; do
		ours ember_${what}_$prec $what $prec
		[ "$BEFORE" = 1 ] && ours before_${what}_$prec $what $prec EMBER_ZOO_RELEASE=0
		[ "$RECOMPUTE" = 1 ] && ours recompute_${what}_$prec $what $prec EMBER_ZOO_RECOMPUTE=1
		[ "$NOLEND" = 1 ] && [ $what = resnet9 ] && ours nolend_${what}_$prec $what $prec EMBER_ZOO_LEND=0
		case $what in
		resnet9) torch torch_${what}_$prec resnet9 $prec $FM 2 ;;
		airbench) torch torch_${what}_$prec airbench $prec ;;
		gpt) torch torch_${what}_$prec gpt $prec $CORPUS ;;
		esac
	done
done

# The table: the last JSON line of each log.
OUT=$OUT WHAT="${WHAT:-resnet9 airbench gpt}" PRECS="${PRECISIONS:-fp32 bf16}" python3 - <<'EOF'
import json, os
out = os.environ["OUT"]
def last(name, key):
    try:
        lines = [json.loads(l) for l in open(f"{out}/{name}.log") if l.startswith("{")]
    except (OSError, ValueError):
        return None
    lines = [l for l in lines if key in l]
    return lines[-1] if lines else None
def f(v):
    return "n/a" if v is None else f"{v:,.1f}"
print()
print("| workload | precision | ours peak reserved | ours peak allocated | ours training / evaluation peak reserved | ours before (activations kept) | ours, blocks recomputed | ours, evaluation not lent | PyTorch peak reserved | PyTorch peak allocated | ours / PyTorch reserved (goal <= 0.5) |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for what in os.environ["WHAT"].split():
    for prec in os.environ["PRECS"].split():
        o = last(f"ember_{what}_{prec}", "peak_reserved_mib") or {}
        b = last(f"before_{what}_{prec}", "peak_reserved_mib") or {}
        rc = last(f"recompute_{what}_{prec}", "peak_reserved_mib") or {}
        nl = last(f"nolend_{what}_{prec}", "peak_reserved_mib") or {}
        t = last(f"torch_{what}_{prec}", "torch_max_reserved_mib") or {}
        r, tr = o.get("peak_reserved_mib"), t.get("torch_max_reserved_mib")
        phases = f"{f(o.get('train_peak_reserved_mib'))} / {f(o.get('eval_peak_reserved_mib'))}"
        ratio = f"{r / tr:.2f}" if r and tr else "n/a"
        print(f"| {what} | {prec} | {f(r)} | {f(o.get('peak_allocated_mib'))} | {phases} | {f(b.get('peak_reserved_mib'))} | {f(rc.get('peak_reserved_mib'))} | {f(nl.get('peak_reserved_mib'))} | {f(tr)} | {f(t.get('torch_max_allocated_mib'))} | {ratio} |")
print("\n(MiB; ours include the data set on the GPU and cuBLAS's workspace, as PyTorch's do.)")
EOF
