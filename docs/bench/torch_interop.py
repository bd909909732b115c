# Checks that checkpoints of ember's model zoo and PyTorch's go both ways.
#
# usage: python3 torch_interop.py DIR [--device cuda|cpu]
#
# DIR holds what `EMBER_TORCH_INTEROP_DIR=DIR go test ./models -run
# TestTorchInteropWrite` wrote: for NAME in resnet9, airbench, gpt, the
# checkpoint ember_NAME.safetensors and ember_NAME_io.safetensors with a
# fixed input ("inputs"; the GPT's token ids as whole float32 numbers) and
# ember's logits for it in evaluation mode ("logits").
#
# For each NAME this script
#   1. builds the network of zoo.py (the same layers, written again here,
#      since zoo.py runs its benchmark when imported), loads ember's
#      checkpoint with load_state_dict(strict=True), runs the input in
#      evaluation mode and compares the logits with ember's: every logit
#      within TOLERANCE * (the largest |logit|) + FLOOR;
#   2. writes torch_NAME.safetensors, a network PyTorch initialised (seed 2)
#      and trained for three SGD steps on random data (so that weights and
#      the BatchNorm statistics are PyTorch's own, num_batches_tracked 3),
#      and torch_NAME_io.safetensors with an input and PyTorch's logits,
#      for `go test ./models -run TestTorchInteropLoad` to compare.
#
# It prints one JSON line per network and exits 1 if any comparison fails.
# Everything is float32: TF32 is turned off for cuDNN and cuBLAS.
import json, os, sys
import torch, torch.nn as nn, torch.nn.functional as F
from safetensors.torch import load_file, save_file

TOLERANCE, FLOOR = 2e-3, 1e-5  # the Go side's interopTolerance and interopFloor
VOCAB, C, HEADS, LAYERS, CONTEXT, DROPOUT = 65, 384, 6, 6, 256, 0.2

torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False


def conv_bn_relu(ci, co):
    return nn.Sequential(nn.Conv2d(ci, co, 3, padding=1, bias=False), nn.BatchNorm2d(co), nn.ReLU())


class TwoConvResidual(nn.Module):  # zoo.py's Res
    def __init__(self, c):
        super().__init__()
        self.a, self.b = conv_bn_relu(c, c), conv_bn_relu(c, c)

    def forward(self, x):
        return x + self.b(self.a(x))


def resnet9():
    return nn.Sequential(
        conv_bn_relu(1, 64), conv_bn_relu(64, 128), nn.MaxPool2d(2), TwoConvResidual(128),
        conv_bn_relu(128, 256), nn.MaxPool2d(2), conv_bn_relu(256, 512), nn.MaxPool2d(2),
        TwoConvResidual(512), nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(512, 10, bias=False))


def conv_pool_gelu(ci, co):  # zoo.py's cg
    return nn.Sequential(
        nn.Conv2d(ci, co, 3, padding=1, bias=False), nn.MaxPool2d(2), nn.BatchNorm2d(co), nn.GELU(),
        nn.Conv2d(co, co, 3, padding=1, bias=False), nn.BatchNorm2d(co), nn.GELU())


def airbench():
    return nn.Sequential(
        nn.Conv2d(3, 24, 2, padding=0, bias=True), nn.GELU(), conv_pool_gelu(24, 64),
        conv_pool_gelu(64, 256), conv_pool_gelu(256, 256), nn.MaxPool2d(3), nn.Flatten(),
        nn.Linear(256, 10, bias=False))


class Block(nn.Module):  # zoo.py's Block: the attribute names are the state dict's
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.mlp = nn.Sequential(nn.Linear(C, 4 * C), nn.GELU(), nn.Linear(4 * C, C), nn.Dropout(DROPOUT))
        self.drop = nn.Dropout(DROPOUT)

    def forward(self, x):
        b, t, _ = x.shape
        heads = [h.view(b, t, HEADS, C // HEADS).transpose(1, 2) for h in self.qkv(self.ln1(x)).split(C, 2)]
        y = F.scaled_dot_product_attention(*heads, is_causal=True, dropout_p=DROPOUT if self.training else 0)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(x.shape)))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, C), nn.Embedding(CONTEXT, C)
        self.blocks = nn.Sequential(*[Block() for _ in range(LAYERS)])
        self.ln, self.head = nn.LayerNorm(C), nn.Linear(C, VOCAB, bias=False)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.ln(self.blocks(self.tok(idx) + self.pos(pos))))


# name: (constructor, a random input of the shape ember's test uses, is the input token ids)
CASES = {
    "resnet9": (resnet9, lambda g, dev: torch.randn(4, 1, 28, 28, generator=g).to(dev), False),
    "airbench": (airbench, lambda g, dev: torch.randn(4, 3, 32, 32, generator=g).to(dev), False),
    "gpt": (GPT, lambda g, dev: torch.randint(0, VOCAB, (2, CONTEXT), generator=g).to(dev), True),
}


def logits_of(net, x):
    net.eval()
    with torch.no_grad():
        return net(x).float()


def compare(got, want):
    scale = want.abs().max().item()
    diff = (got - want).abs().max().item()
    return diff, scale, diff <= TOLERANCE * scale + FLOOR


def check_ember(name, directory, dev):
    build, _, ids = CASES[name]
    model = os.path.join(directory, f"ember_{name}.safetensors")
    if not os.path.exists(model):
        return {"what": name, "ember_checkpoint": "missing", "ok": False}
    net = build().to(dev)
    state = load_file(model)
    net.load_state_dict(state, strict=True)  # raises, naming the keys, on any mismatch
    io = load_file(os.path.join(directory, f"ember_{name}_io.safetensors"))
    x = io["inputs"].to(dev)
    if ids:
        x = x.long()
    diff, scale, ok = compare(logits_of(net, x).cpu(), io["logits"])
    counts = sorted({int(v) for k, v in state.items() if k.endswith("num_batches_tracked")})
    return {"what": name, "ember_checkpoint": "loaded strict", "max_abs_diff": diff, "max_abs_logit": scale,
            "tolerance": TOLERANCE * scale + FLOOR, "num_batches_tracked": counts, "ok": ok}


def write_torch(name, directory, dev):
    build, make_input, ids = CASES[name]
    torch.manual_seed(2)
    g = torch.Generator().manual_seed(2)
    net = build().to(dev)
    net.train()
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    for _ in range(3):
        x = make_input(g, dev)
        out = net(x)
        target = (torch.randint(0, out.shape[-1], out.shape[:-1], generator=g)).to(dev)
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    x = make_input(g, dev)
    y = logits_of(net, x)
    state = {k: v.detach().contiguous().cpu() for k, v in net.state_dict().items()}
    save_file(state, os.path.join(directory, f"torch_{name}.safetensors"), metadata={"format": "pt"})
    save_file({"inputs": x.float().contiguous().cpu(), "logits": y.contiguous().cpu()},
              os.path.join(directory, f"torch_{name}_io.safetensors"), metadata={"format": "pt"})
    return {"what": name, "torch_checkpoint": f"torch_{name}.safetensors", "final_train_loss": round(loss.item(), 4)}


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        sys.exit("usage: python3 torch_interop.py DIR [--device cuda|cpu]")
    directory = args[0]
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if "--device" in args:
        dev = args[args.index("--device") + 1]
    failed = False
    for name in CASES:
        result = check_ember(name, directory, dev)
        result.update(write_torch(name, directory, dev))
        failed |= not result["ok"]
        print(json.dumps(result), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
