# PyTorch DistributedDataParallel reference for ember's data-parallel
# training: zoo.py's ResNet-9 (the same network, optimiser, schedule, loss
# and augmentation), each rank taking its share of one seeded permutation
# (DistributedSampler's layout: rank r takes positions r, r+W, ...), a
# batch of BATCH per GPU, gradients averaged by DDP (buckets of 25 MiB,
# overlapped with the backward pass). Rank 0 prints one JSON line per
# epoch: seconds and images per second over the whole world.
#
# usage: torchrun --nproc_per_node N ddp_zoo.py ZOO_PY MODE FMNIST_DIR EPOCHS BATCH
#   ZOO_PY: path of zoo.py (its building blocks are imported from there)
#   MODE:   fp32 | bf16
# e.g.     torchrun --nproc_per_node 2 ddp_zoo.py path/to/zoo.py fp32 FASHION_MNIST_DIR 3 512
import gzip, importlib.util, json, os, sys, time
import numpy as np, torch, torch.distributed as dist, torch.nn as nn, torch.nn.functional as F

zoo_path, mode, data, epochs, bs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
# zoo.py runs the workload its argv names at import; "none" names none, so
# that only its definitions (cbr, Res) are made.
argv, sys.argv = sys.argv, [zoo_path, "none", mode]
spec = importlib.util.spec_from_file_location("zoo", zoo_path)
zoo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(zoo)
sys.argv = argv

dist.init_process_group("nccl")
rank, world, local = dist.get_rank(), dist.get_world_size(), int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dev = f"cuda:{local}"
torch.backends.cudnn.benchmark = True

def idx(p, off): return np.frombuffer(gzip.open(p).read(), np.uint8, offset=off)
Xtr = torch.tensor(idx(f"{data}/train-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28), device=dev).float().div(255)
Ytr = torch.tensor(idx(f"{data}/train-labels-idx1-ubyte.gz", 8).astype(np.int64), device=dev)
Xte = torch.tensor(idx(f"{data}/t10k-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28), device=dev).float().div(255)
Yte = torch.tensor(idx(f"{data}/t10k-labels-idx1-ubyte.gz", 8).astype(np.int64), device=dev)
mu, sd = Xtr.mean(), Xtr.std(); Xtr, Xte = (Xtr - mu) / sd, (Xte - mu) / sd

torch.manual_seed(1)  # the same initial weights as zoo.py (DDP broadcasts rank 0's anyway)
cbr, Res = zoo.cbr, zoo.Res
net = nn.Sequential(cbr(1, 64), cbr(64, 128), nn.MaxPool2d(2), Res(128), cbr(128, 256), nn.MaxPool2d(2),
                    cbr(256, 512), nn.MaxPool2d(2), Res(512), nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(512, 10, bias=False)).to(dev).to(memory_format=torch.channels_last)
net = nn.parallel.DistributedDataParallel(net, device_ids=[local])
global_bs = bs * world
steps_per_epoch = Xtr.shape[0] // global_bs
opt = torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9, nesterov=True, weight_decay=5e-4)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.2, total_steps=epochs * steps_per_epoch, pct_start=0.25, anneal_strategy="linear")
lossf = nn.CrossEntropyLoss(label_smoothing=0.1)
def step(x, y):
    with torch.autocast("cuda", torch.bfloat16, enabled=mode != "fp32"): loss = lossf(net(x) * 0.125, y)
    opt.zero_grad(set_to_none=True); loss.backward(); opt.step(); sched.step(); return loss

g = torch.Generator(device=dev); g.manual_seed(1)  # the same draws on every rank
for e in range(epochs):
    net.train(); torch.cuda.synchronize(); dist.barrier(); t = time.time()
    perm = torch.randperm(Xtr.shape[0], device=dev, generator=g)
    xp = F.pad(Xtr, (2, 2, 2, 2))
    dx = torch.randint(0, 5, (Xtr.shape[0],), device=dev, generator=g); dy = torch.randint(0, 5, (Xtr.shape[0],), device=dev, generator=g)
    ar = torch.arange(28, device=dev)
    rows = (dy[:, None] + ar[None, :])[:, :, None].expand(-1, 28, 28); cols = (dx[:, None] + ar[None, :])[:, None, :].expand(-1, 28, 28)
    xa = xp[torch.arange(Xtr.shape[0], device=dev)[:, None, None], 0, rows, cols].unsqueeze(1)
    flip = torch.rand(Xtr.shape[0], device=dev, generator=g) < 0.5
    xa = torch.where(flip[:, None, None, None], xa.flip(3), xa).contiguous(memory_format=torch.channels_last)
    mine = perm[: steps_per_epoch * global_bs][rank::world]  # DistributedSampler's positions
    for i in range(steps_per_epoch):
        j = mine[i*bs:(i+1)*bs]; loss = step(xa[j], Ytr[j])
    torch.cuda.synchronize(); dist.barrier(); dt = time.time() - t
    if rank == 0:
        net.eval(); correct = 0
        with torch.no_grad():
            for i in range(0, Xte.shape[0], 2000):
                correct += (net.module(Xte[i:i+2000].contiguous(memory_format=torch.channels_last)).argmax(1) == Yte[i:i+2000]).sum().item()
        print(json.dumps({"what": "ddp_resnet9", "mode": mode, "world": world, "batch_per_gpu": bs, "epoch": e + 1, "s": round(dt, 3),
                          "images_per_s": round(steps_per_epoch * global_bs / dt), "loss": round(loss.item(), 4), "test_acc": correct / 100}), flush=True)
    dist.barrier()
dist.destroy_process_group()
