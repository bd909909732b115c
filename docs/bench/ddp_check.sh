#!/bin/bash
# Data-parallel checks on one GPU. No timing: correctness only.
#   1. nn/parallel's NCCL tests: world size 1 through NCCL; two ranks on
#      this GPU (a different NCCL_HOSTID each) against one CPU rank.
#   2. nn/trainer: Run over NCCL at world size 1 with the step captured as
#      a CUDA graph (overlapped buckets on NCCL's second stream,
#      SyncBatchNorm), against the CPU.
#   3. train --nproc-per-node 1 (NCCL at world size 1, captured) and
#      --nproc-per-node 2 (ranks on this one GPU, NCCL_HOSTID per rank
#      through --rank-env) against one process at the same global batch:
#      the loss line and the weights; the same through torchrun --no-python.
#   4. ResNet-9 with --sync-bn: 2 ranks against 1 process.
# Prints a pass/fail table; logs and checkpoints go to $OUT.
# Usage: BIN=DIR MNIST=DIR bash docs/bench/ddp_check.sh, where DIR holds
# train (go build ./cmd/train), parallel.test (go test -c ./nn/parallel) and
# trainer.test (go test -c ./nn/trainer), built with CGO_ENABLED=0.
MNIST=${MNIST:?MNIST: the MNIST folder}; MNIST=$(cd "$MNIST" && pwd)
cd "${BIN:?BIN: the folder of the binaries}"
for f in parallel.test trainer.test train; do [ -f $f.gz ] && gunzip -kf $f.gz; chmod +x $f; done
export EMBER_KERNEL_CACHE=/tmp/kc EMBER_REQUIRE_GPU=1 EMBER_REQUIRE_CUDNN=1
# Two "hosts" that are one: NCCL over loopback sockets.
export NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1
DATA=$MNIST
OUT=${OUT:-/tmp/ddp-check}; mkdir -p $OUT
ROWS=()
row() { ROWS+=("| $1 | $2 | $3 |"); echo "== $1: $2 ($3)"; }
# rel A B: the largest |a-b|/max(1,|b|) over the float32 tensors of two checkpoints.
rel() { python3 - "$1" "$2" <<'PY'
import json, struct, sys, array
def load(p):
    b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]
    h = json.loads(b[8:8+n]); out = {}
    for k, v in h.items():
        if k != '__metadata__' and v['dtype'] == 'F32':
            s, e = v['data_offsets']; a = array.array('f'); a.frombytes(b[8+n+s:8+n+e]); out[k] = a
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
assert a.keys() == b.keys() and a, (sorted(a), sorted(b))
print('%.3g' % max(abs(x-y)/max(1.0, abs(y)) for k in a for x, y in zip(a[k], b[k])))
PY
}
# check NAME VALUE LIMIT: pass when VALUE <= LIMIT.
check() { if python3 -c "import sys; sys.exit(0 if float('$2') <= $3 else 1)" 2>/dev/null; then row "$1" PASS "max rel diff $2 <= $3"; else row "$1" FAIL "max rel diff ${2:-none} > $3"; fi; }
loss() { grep -o 'train loss [0-9.]*' "$1" | head -1; }

timeout 30 ./parallel.test -test.run 'NCCL' -test.v -test.count=1 > $OUT/parallel_nccl.log 2>&1
rc=$?; row "nn/parallel NCCL tests (world 1; 2 ranks on one GPU)" $([ $rc = 0 ] && echo PASS || echo FAIL) "rc=$rc, $(grep -c -- '--- PASS' $OUT/parallel_nccl.log) passed, $(grep -c -- '--- SKIP' $OUT/parallel_nccl.log) skipped"

timeout 30 ./trainer.test -test.run 'NCCLCaptured' -test.v -test.count=1 > $OUT/trainer_nccl.log 2>&1
rc=$?; row "trainer: NCCL world 1, captured step, overlap, SyncBN" $([ $rc = 0 ] && echo PASS || echo FAIL) "rc=$rc; $(grep -o 'largest relative difference[^:]*: [0-9.e-]*' $OUT/trainer_nccl.log | sed 's/.*: //' | tr '\n' ' ')"

DEVICE=${DEVICE:-cuda}  # DEVICE=cpu: a dry run of the script on a machine without a GPU
COMMON="--device $DEVICE --data $DATA --limit 6400 --test-limit 1000 --epochs 1 --batch-size 128 --log-interval 10"
timeout 20 ./train $COMMON --save $OUT/one.safetensors > $OUT/one.log 2>&1
rc1=$?
timeout 20 ./train $COMMON --nproc-per-node 1 --save $OUT/world1.safetensors > $OUT/world1.log 2>&1
rc=$?
if [ $rc1 = 0 ] && [ $rc = 0 ]; then
  check "train --nproc-per-node 1 (NCCL, world 1) vs 1 process" "$(rel $OUT/world1.safetensors $OUT/one.safetensors)" 1e-5
  grep -q "parallel: 1 ranks (ember), NCCL" $OUT/world1.log && grep -q "captured once and replayed" $OUT/world1.log && row "world 1: NCCL, captured step" PASS "log lines" || row "world 1: NCCL, captured step" FAIL "see world1.log"
else
  row "train --nproc-per-node 1 vs 1 process" FAIL "rc one=$rc1 world1=$rc (one.log, world1.log)"
fi
timeout 30 ./train $COMMON --nproc-per-node 2 --rank-env 'NCCL_HOSTID=ember-{rank}' --save $OUT/two.safetensors > $OUT/two.log 2>&1
rc2=$?
if [ $rc1 = 0 ] && [ $rc2 = 0 ]; then
  check "train --nproc-per-node 2 vs 1 process, LeNet batch 128 ($(loss $OUT/two.log) vs $(loss $OUT/one.log))" "$(rel $OUT/two.safetensors $OUT/one.safetensors)" 1e-4
  grep -q "parallel: 2 ranks (ember), NCCL" $OUT/two.log && grep -q "captured once and replayed" $OUT/two.log && row "2 ranks: NCCL, captured step" PASS "log lines" || row "2 ranks: NCCL, captured step" FAIL "see two.log"
else
  row "train --nproc-per-node 2 vs 1 process" FAIL "rc one=$rc1 two=$rc2 (one.log, two.log)"
fi

if command -v torchrun >/dev/null; then
  timeout 30 torchrun --no_python --standalone --nproc_per_node 2 bash -c 'NCCL_HOSTID=torch-$RANK exec "$0" "$@"' ./train $COMMON --save $OUT/torchrun.safetensors > $OUT/torchrun.log 2>&1
  rc=$?
  if [ $rc = 0 ]; then check "torchrun --no-python, 2 ranks vs 1 process" "$(rel $OUT/torchrun.safetensors $OUT/one.safetensors)" 1e-4
  else row "torchrun --no-python, 2 ranks" FAIL "rc=$rc (torchrun.log)"; fi
else
  row "torchrun --no-python" SKIP "no torchrun"
fi

if [ $SECONDS -lt 55 ]; then
  R9="--device $DEVICE --data $DATA --model resnet9 --limit 2048 --test-limit 500 --epochs 1 --batch-size 256 --log-interval 4"
  timeout 15 ./train $R9 --save $OUT/r9one.safetensors > $OUT/r9one.log 2>&1; rc1=$?
  timeout 15 ./train $R9 --nproc-per-node 2 --sync-bn --rank-env 'NCCL_HOSTID=ember-{rank}' --save $OUT/r9two.safetensors > $OUT/r9two.log 2>&1; rc2=$?
  if [ $rc1 = 0 ] && [ $rc2 = 0 ]; then
    # cuDNN's batch norm against the gathered statistics, 8 steps: looser.
    check "ResNet-9 --sync-bn, 2 ranks vs 1 process ($(loss $OUT/r9two.log) vs $(loss $OUT/r9one.log))" "$(rel $OUT/r9two.safetensors $OUT/r9one.safetensors)" 1e-3
  else row "ResNet-9 --sync-bn, 2 ranks vs 1 process" FAIL "rc one=$rc1 two=$rc2 (r9one.log, r9two.log)"; fi
else
  row "ResNet-9 --sync-bn" SKIP "out of time ($SECONDS s used)"
fi

echo; echo "| check | result | detail |"; echo "| --- | --- | --- |"
printf '%s\n' "${ROWS[@]}"
echo "total ${SECONDS} s"
