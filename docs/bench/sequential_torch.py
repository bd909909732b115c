#!/usr/bin/env python3
"""PyTorch eager side of examples/sequential: the same loops, data on the GPU.

Trains nn.Sequential models on MNIST with SGD (momentum 0.9), batch BS,
drop_last, 2 epochs, the training set already on the GPU as float32, and
prints one JSON line per model: seconds per epoch, test accuracy.

Usage: python3 sequential_torch.py MNIST_DIR [BS] [LR] [mlp,lenet] [fp32|tf32]

tf32 lets the products and convolutions round their inputs to TF32 on
tensor cores (torch.backends.*.allow_tf32), as train --precision tf32.
"""
import gzip, json, os, sys, time
import numpy as np


def idx(d, name):
    """An IDX file's array (the MNIST layout), from its gzip."""
    with gzip.open(os.path.join(d, name), "rb") as f:
        b = f.read()
    dims = b[3]
    shape = [int.from_bytes(b[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    a = np.frombuffer(b, np.uint8, offset=4 + 4 * dims).reshape(shape)
    return a.reshape(shape[0], 1, *shape[1:]) if dims == 3 else a  # images as [N, 1, H, W]


def load(d):
    """The four MNIST files, images normalised as train does (0.1307, 0.3081)."""
    xtr, ytr = idx(d, "train-images-idx3-ubyte.gz"), idx(d, "train-labels-idx1-ubyte.gz")
    xte, yte = idx(d, "t10k-images-idx3-ubyte.gz"), idx(d, "t10k-labels-idx1-ubyte.gz")
    norm = lambda x: ((x.astype(np.float32) / 255.0) - 0.1307) / 0.3081
    return norm(xtr), ytr.astype(np.int64), norm(xte), yte.astype(np.int64)
import torch, torch.nn as nn


def build(name):
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    return nn.Sequential(nn.Conv2d(1, 20, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(20, 50, 5), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(800, 500), nn.ReLU(), nn.Linear(500, 10))


def main():
    d = sys.argv[1]
    bs = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    lr = float(sys.argv[3]) if len(sys.argv) > 3 else 0.01
    names = (sys.argv[4] if len(sys.argv) > 4 else "mlp").split(",")
    precision = sys.argv[5] if len(sys.argv) > 5 else "fp32"
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.benchmark = True
    xtr, ytr, xte, yte = (torch.from_numpy(a).to("cuda") for a in load(d))
    n = xtr.shape[0]
    for name in names:
        torch.manual_seed(0)
        net = build(name).to("cuda")
        opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
        crit = nn.CrossEntropyLoss()
        times = []
        for epoch in range(2):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            perm = torch.randperm(n, device="cuda")
            for i in range(n // bs):
                idx = perm[i * bs:(i + 1) * bs]
                opt.zero_grad(set_to_none=True)
                loss = crit(net(xtr[idx]), ytr[idx])
                loss.backward()
                opt.step()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        with torch.no_grad():
            acc = sum((net(xte[i:i + 1000]).argmax(1) == yte[i:i + 1000]).sum().item() for i in range(0, xte.shape[0], 1000)) / xte.shape[0]
        print(json.dumps(dict(fw="torch-eager-sequential", model=name, version=torch.__version__, precision=precision, bs=bs, lr=lr,
                              epoch_s=[round(t, 4) for t in times], test_acc=round(100 * acc, 2))), flush=True)


if __name__ == "__main__":
    main()
