#!/bin/bash
# Weak scaling of data-parallel training on 2 GPUs of one host,
# beside PyTorch DDP (torchrun) running zoo.py's ResNet-9 in the same call.
# Needs the nvidia-h200-x2 machine; takes about 4 minutes.
# Usage (repository root), logs under $OUT:
#   BIN=DIR_WITH_train FMNIST=DIR MNIST=DIR ZOO=path/to/zoo.py bash docs/bench/ddp_scaling.sh
# where train is built with CGO_ENABLED=0 go build ./cmd/train.
# Weak scaling: the batch per GPU is fixed (ResNet-9 512, LeNet 1024), so
# --batch-size (the global batch) doubles with the GPUs. Steady epochs are
# epochs 2-3 (the first captures the graph and compiles). Target: ResNet-9
# images/s on 2 GPUs >= 1.9x one GPU's.
D=${BIN:?BIN: the folder holding the train binary}
FM=${FMNIST:?FMNIST: the Fashion-MNIST folder}; MN=${MNIST:?MNIST: the MNIST folder}
cd "$(dirname "$0")/../.." || exit 1
[ -f $D/train.gz ] && gunzip -kf $D/train.gz; chmod +x $D/train
export EMBER_KERNEL_CACHE=/tmp/kc EMBER_REQUIRE_GPU=1 EMBER_REQUIRE_CUDNN=1
OUT=${OUT:-/tmp/ddp-scaling}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nvidia-smi topo -m | head -4
ZOO=${ZOO:?ZOO: the path of zoo.py}; DDP=docs/bench/ddp_zoo.py
R9="--model resnet9 --dataset fashion-mnist --data $FM --augment --lr 0.2 --nesterov --weight-decay 5e-4 --schedule onecycle --epochs 3 --log-interval 1000 --overwrite"
LE="--data $MN --epochs 3 --log-interval 1000 --overwrite"
# steady NAME LOG: the mean images/s of epochs 2 and 3 of an ember log.
steady() { grep -E '^epoch [23]/3:' "$2" | grep -o '[0-9]* images/s' | awk -v n="$1" '{s+=$1; k++} END {if (k) printf "%.0f\n", s/k; else print "none"}'; }
run() { name=$1 lim=$2; shift 2; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$?"; grep -E '^epoch [0-9]/3:|parallel:|error|failed' $OUT/$name.log | cut -c1-200; }

run r9_1gpu 120 $D/train $R9 --batch-size 512 --save $OUT/r9_1.safetensors
run r9_2gpu 120 $D/train $R9 --nproc-per-node 2 --batch-size 1024 --save $OUT/r9_2.safetensors
run lenet_1gpu 60 $D/train $LE --batch-size 1024 --save $OUT/le_1.safetensors
run lenet_2gpu 60 $D/train $LE --nproc-per-node 2 --batch-size 2048 --save $OUT/le_2.safetensors
timeout 150 torchrun --standalone --nproc_per_node 1 $DDP $ZOO fp32 $FM 3 512 > $OUT/torch_1gpu.log 2>&1; echo "torch 1 GPU rc=$?"; cat $OUT/torch_1gpu.log | grep '^{' 
timeout 150 torchrun --standalone --nproc_per_node 2 $DDP $ZOO fp32 $FM 3 512 > $OUT/torch_2gpu.log 2>&1; echo "torch 2 GPUs rc=$?"; cat $OUT/torch_2gpu.log | grep '^{'
tsteady() { grep '^{' "$1" | python3 -c 'import json,sys; r=[json.loads(l) for l in sys.stdin]; r=[x["images_per_s"] for x in r if x["epoch"]>1]; print(round(sum(r)/len(r)) if r else "none")'; }

a=$(steady r9 $OUT/r9_1gpu.log); b=$(steady r9 $OUT/r9_2gpu.log)
c=$(steady le $OUT/lenet_1gpu.log); d=$(steady le $OUT/lenet_2gpu.log)
e=$(tsteady $OUT/torch_1gpu.log); f=$(tsteady $OUT/torch_2gpu.log)
ratio() { python3 -c "import sys; a,b=sys.argv[1:]; print('%.2fx' % (float(b)/float(a)) if a.replace('.','').isdigit() and b.replace('.','').isdigit() else 'n/a')" "$1" "$2"; }
echo; echo "| workload (steady epochs 2-3) | 1 GPU images/s | 2 GPUs images/s | scaling |"; echo "| --- | ---: | ---: | ---: |"
echo "| ember ResNet-9, Fashion-MNIST, 512/GPU, fp32 | $a | $b | $(ratio $a $b) (target >= 1.9x) |"
echo "| PyTorch DDP ResNet-9 (zoo.py's), 512/GPU, fp32 | $e | $f | $(ratio $e $f) |"
echo "| ember LeNet, MNIST, 1024/GPU | $c | $d | $(ratio $c $d) |"
echo "accuracy: $(grep -o 'test accuracy [0-9.]*%' $OUT/r9_2gpu.log | tail -1) (ember 2 GPUs, 3 epochs), $(grep '^{' $OUT/torch_2gpu.log | tail -1 | grep -o '"test_acc": [0-9.]*') (torch 2 GPUs)"
