#!/bin/bash
# Regenerates the CUDA backend's kernel bundle (cuda/kernels/bundle.zip):
# every kernel unit compiled ahead of time by NVRTC for sm_90 (cubin) and
# compute_90 (PTX). NVRTC is needed, a GPU is not; the Go machine has
# neither NVRTC nor a GPU, so the compile runs on the GPU machine.
#
#   1. here, from the repository root of the final tree (every .cu merged):
#        bash docs/bench/kernel_bundle.sh build DIR     # DIR: a folder the GPU call carries
#   2. on the GPU machine (its repository root, DIR carried):
#        bash docs/bench/kernel_bundle.sh gpu DIR       # writes $OUT/bundle.zip
#   3. here, with the files the call brought back:
#        cp FILES_AT/bundle.zip cuda/kernels/bundle.zip
#        go run ./cmd/kernelbundle -strict -check cuda/kernels/bundle.zip
#        EMBER_KERNEL_BUNDLE_STRICT=1 go test -run KernelBundleFresh ./cuda
#      and commit the bundle.
#
# Step 2 also times a cold LeNet start (empty kernel cache) with the new
# bundle and without any, when DIR holds a train binary (step 1 builds
# one) and MNIST names a folder of the MNIST files.
set -u
mode=${1:-}; dir=${2:-}
if [ -z "$mode" ] || [ -z "$dir" ]; then
  echo "usage: $0 build|gpu DIR" >&2; exit 2
fi
case $mode in
build)
  mkdir -p "$dir" || exit 2
  export CGO_ENABLED=0
  go build -trimpath -ldflags='-s -w' -o "$dir/kernelbundle" ./cmd/kernelbundle || exit 1
  go build -trimpath -ldflags='-s -w' -o "$dir/train" ./cmd/train || exit 1
  gzip -f9 "$dir/kernelbundle" "$dir/train"
  ls -l "$dir"
  ;;
gpu)
  : "${OUT:?OUT must name the folder whose files come back}"
  dir=$(cd "$dir" && pwd) || exit 2
  for f in "$dir"/*.gz; do gunzip -kf "$f"; done
  chmod +x "$dir"/kernelbundle "$dir"/train 2>/dev/null
  timeout 120 "$dir/kernelbundle" -v -o "$OUT/bundle.zip" 2> "$OUT/kernelbundle.log" || { tail "$OUT/kernelbundle.log"; exit 1; }
  "$dir/kernelbundle" -strict -check "$OUT/bundle.zip" || exit 1
  mnist=${MNIST:-}
  if [ -x "$dir/train" ] && [ -d "$mnist" ]; then
    w=$(mktemp -d); cd "$w" || exit 1
    for b in "$OUT/bundle.zip" off; do
      rm -rf "$w/cache"
      echo "LeNet, empty kernel cache, EMBER_KERNEL_BUNDLE=$b:"
      EMBER_KERNEL_BUNDLE=$b EMBER_KERNEL_CACHE="$w/cache" timeout 60 "$dir/train" --device cuda --epochs 2 --bench --data "$mnist" 2>&1 |
        grep -E "epoch [12] seconds"
    done
  fi
  ;;
*)
  echo "usage: $0 build|gpu DIR" >&2; exit 2
  ;;
esac
