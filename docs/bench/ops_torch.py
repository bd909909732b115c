# PyTorch eager on the cases of ember's operator benchmark (TestGPUOpBench in
# cuda/opbench_test.go): the same shapes, passes, timing and byte counts, one
# JSON line per case and pass. docs/bench/ops_table.py puts both side by side.
# usage: python3 ops_torch.py [--out FILE] [--filter REGEX] [--device cuda|cpu]
#
# Passes, as in the Go benchmark:
#   fwd      one call under torch.no_grad().
#   fwd+bwd  the call, loss = output.sum() (the output itself when it is a
#            scalar: cross_entropy), loss.backward(). The inputs are leaves
#            with requires_grad whose .grad is kept between calls, so each
#            call adds into it. The "Sum" cases time the loss alone.
# Time: WARMUP calls, then REPS samples of k calls between two
# torch.cuda.synchronize(), k chosen so that a sample takes about SAMPLE_S;
# the median time per call. GB/s: the compulsory float32 traffic of the
# operation (each tensor read or written once; loss and accumulation not
# counted) over the time; products report TFLOP/s. float32 throughout: no
# autocast, TF32 off.
import argparse, json, re, sys, time
import torch
import torch.nn.functional as F

REPS, WARMUP, SAMPLE_S, MAX_K = 21, 3, 2e-3, 500
F32 = 4
COPY_N = 1 << 28  # float32 elements of the copy reference: 1 GiB

ap = argparse.ArgumentParser()
ap.add_argument("--out", help="also write the JSON lines to this file")
ap.add_argument("--filter", help="only the cases whose 'op shape pass' matches")
ap.add_argument("--device", default="cuda")
args = ap.parse_args()
dev = torch.device(args.device)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.set_float32_matmul_precision("highest")


def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize()


def time_calls(step):
    """Median µs per call over REPS samples, and the calls per sample."""
    for _ in range(WARMUP):
        step()
    sync()
    t0 = time.perf_counter()
    step()
    sync()
    k = min(max(int(SAMPLE_S / max(time.perf_counter() - t0, 1e-6)), 1), MAX_K)
    samples = []
    for _ in range(REPS):
        t0 = time.perf_counter()
        for _ in range(k):
            step()
        sync()
        samples.append((time.perf_counter() - t0) * 1e6 / k)
    samples.sort()
    return samples[len(samples) // 2], k


def numel(dims):
    n = 1
    for d in dims:
        n *= d
    return n


def shape_name(dims):
    return "[" + ",".join(str(d) for d in dims) + "]"


gen = torch.Generator(device=dev)
gen.manual_seed(1)


def uniform(dims, grad=True):
    """Uniform values in [-2, 2), as the Go benchmark's inputs."""
    return (torch.rand(dims, device=dev, generator=gen) * 4 - 2).requires_grad_(grad)


def labels(n, classes):
    return torch.randint(0, classes, (n,), device=dev, generator=gen)


class Case:
    def __init__(s, op, shape, setup, fwd_bytes=0, bwd_bytes=0, fwd_flops=0, bwd_flops=0):
        s.op, s.shape, s.setup = op, shape, setup
        s.fwd_bytes, s.bwd_bytes, s.fwd_flops, s.bwd_flops = fwd_bytes, bwd_bytes, fwd_flops, bwd_flops


def unary(op, shape, dims, fwd, bwd, f):
    n = numel(dims) * F32
    def setup():
        x = uniform(dims)
        return (lambda: f(x)), [x]
    return Case(op, shape, setup, fwd * n, bwd * n)


def binary(op, dims, fwd, bwd, f):
    n = numel(dims) * F32
    def setup():
        x, y = uniform(dims), uniform(dims)
        return (lambda: f(x, y)), [x, y]
    return Case(op, shape_name(dims), setup, fwd * n, bwd * n)


def reduce(op, dims, axes, f):
    kept = numel(dims)
    for a in axes:
        kept //= dims[a]
    n, r = numel(dims) * F32, kept * F32
    def setup():
        x = uniform(dims)
        return (lambda: f(x, axes)), [x]
    return Case(op, shape_name(dims) + " over " + ",".join(str(a) for a in axes), setup, n + r, r + n)


def norm(op, shape, dims, pdims, f, stats):
    n, p = numel(dims) * F32, numel(pdims) * F32
    def setup():
        x = uniform(dims)
        w = torch.ones(pdims, device=dev, requires_grad=True)
        b = torch.zeros(pdims, device=dev, requires_grad=True)
        if stats:
            rm, rv = torch.zeros(pdims, device=dev), torch.ones(pdims, device=dev)
            return (lambda: f(x, w, b, rm, rv)), [x, w, b]
        return (lambda: f(x, w, b)), [x, w, b]
    return Case(op, shape, setup, 2 * n + 2 * p, 3 * n + 3 * p)


def batch_norm(dims):
    return norm("BatchNorm", shape_name(dims) + " train", dims, [dims[1]],
                lambda x, w, b, rm, rv: F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5), True)


def cross_entropy(smoothing):
    n, r = ROWS * VOCAB * F32, ROWS * F32
    def setup():
        x, y = uniform([ROWS, VOCAB]), labels(ROWS, VOCAB)
        return (lambda: F.cross_entropy(x, y, label_smoothing=smoothing)), [x]
    return Case("CrossEntropyLoss", f"{shape_name([ROWS, VOCAB])} smoothing {smoothing:g}", setup, n + r, 2 * n + r)


# The zoo's shapes (cuda/opbench_test.go has the same).
RESNET_ACT = [512, 64, 28, 28]  # ResNet-9's largest activation
B, T, C, H, VOCAB = 64, 256, 384, 6, 96  # the character GPT
ROWS = B * T
GPT_MLP, GPT_ACT, GPT_SCORES, GPT_QKV = [B, T, 4 * C], [B, T, C], [B, H, T, T], [B, H, T, C // H]
BIAS = [1, RESNET_ACT[1], 1, 1]
ACT, NB = numel(RESNET_ACT) * F32, RESNET_ACT[1] * F32
# causal attention: 2·2·T·T·D/2 per head forward, 2.5 times that backward
ATTN_FWD = 2 * B * H * T * T * (C // H)
M, K, N = ROWS, C, 3 * C


def add_bias_setup():
    x, y = uniform(RESNET_ACT), uniform(BIAS)
    return (lambda: x + y), [x, y]


def attention_setup():
    q, k, v = uniform(GPT_QKV), uniform(GPT_QKV), uniform(GPT_QKV)
    return (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)), [q, k, v]


def matmul_setup():
    x, w = uniform([ROWS, C]), uniform([C, N])
    return (lambda: x @ w), [x, w]


def softmax(dims):
    return [unary("Softmax", shape_name(dims), dims, 2, 3, lambda x: torch.softmax(x, -1)),
            unary("LogSoftmax", shape_name(dims), dims, 2, 3, lambda x: torch.log_softmax(x, -1))]


CASES = [
    binary("Add", RESNET_ACT, 3, 3, lambda x, y: x + y),
    Case("Add", shape_name(RESNET_ACT) + "+" + shape_name(BIAS), add_bias_setup, 2 * ACT + NB, 2 * ACT + NB),
    binary("Mul", RESNET_ACT, 3, 5, lambda x, y: x * y),
    unary("ReLU", shape_name(GPT_MLP), GPT_MLP, 2, 3, torch.relu),
    unary("GELU", shape_name(GPT_MLP), GPT_MLP, 2, 3, F.gelu),
    reduce("SumAxes", [ROWS, C], [-1], lambda x, a: x.sum(a)),
    reduce("MeanAxes", [ROWS, C], [-1], lambda x, a: x.mean(a)),
    reduce("SumAxes", RESNET_ACT, [0, 2, 3], lambda x, a: x.sum(a)),
    reduce("MeanAxes", RESNET_ACT, [0, 2, 3], lambda x, a: x.mean(a)),
    reduce("SumAxes", [512, 128, 14, 14], [0, 2, 3], lambda x, a: x.sum(a)),
    # the same bytes read flat, and a copy of each shape (the reference of its size)
    unary("Sum", shape_name([512, 128, 14, 14]), [512, 128, 14, 14], 1, 1, torch.sum),
    *[unary("Copy", shape_name(d), d, 2, 0, torch.clone)
      for d in (RESNET_ACT, [512, 128, 14, 14], GPT_MLP, GPT_SCORES, GPT_ACT, [ROWS, C], [ROWS, VOCAB])],
    *softmax(GPT_SCORES),
    *softmax([ROWS, VOCAB]),
    norm("LayerNorm", shape_name(GPT_ACT) + f" over {C}", GPT_ACT, [C], lambda x, w, b: F.layer_norm(x, (C,), w, b, 1e-5), False),
    batch_norm(RESNET_ACT),
    batch_norm([512, 128, 14, 14]),
    batch_norm([512, 256, 7, 7]),
    # fewer channels than SMs (a CIFAR ResNet's last stage)
    batch_norm([512, 64, 8, 8]),
    batch_norm([256, 32, 8, 8]),
    cross_entropy(0.1),
    cross_entropy(0.0),
    unary("Dropout", shape_name(GPT_ACT) + " p=0.2", GPT_ACT, 2, 2, lambda x: F.dropout(x, 0.2, training=True)),
    Case("ScaledDotProductAttention", shape_name(GPT_QKV) + " causal", attention_setup, fwd_flops=ATTN_FWD, bwd_flops=2.5 * ATTN_FWD),
    Case("MatMul", f"[{ROWS},{C}]x[{C},{N}]", matmul_setup, fwd_flops=2 * M * N * K, bwd_flops=4 * M * N * K),
    *[unary("Sum", shape_name(d), d, 1, 1, torch.sum) for d in (RESNET_ACT, GPT_MLP, GPT_SCORES, GPT_ACT, [ROWS, VOCAB])],
]

out = open(args.out, "w") if args.out else None
flt = re.compile(args.filter) if args.filter else None


def emit(**r):
    line = json.dumps(r)
    print(line, flush=True)
    if out:
        out.write(line + "\n")
        out.flush()


meta = {"torch": torch.__version__, "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"}
emit(meta=meta)

if not flt or flt.search("copy 1GiB fwd"):
    src, dst = torch.ones(COPY_N, device=dev), torch.empty(COPY_N, device=dev)
    us, k = time_calls(lambda: dst.copy_(src))
    emit(**{"op": "copy", "shape": "1GiB", "pass": "fwd", "us": round(us, 2), "gbps": round(2 * COPY_N * F32 / us / 1e3, 2),
             "calls_per_sample": k, "reps": REPS})
    del src, dst

for c in CASES:
    for pas in ("fwd", "fwd+bwd"):
        if flt and not flt.search(f"{c.op} {c.shape} {pas}"):
            continue
        if pas == "fwd+bwd" and not (c.bwd_bytes or c.bwd_flops):
            continue  # a reference row with no backward (Copy)
        backward = pas == "fwd+bwd"
        try:
            call, inputs = c.setup()
            def step():
                y = call()
                if backward:
                    (y if y.numel() == 1 else y.sum()).backward()
            with torch.set_grad_enabled(backward):
                us, k = time_calls(step)
        except Exception as e:  # report and go on with the other cases
            print(f"{c.op} {c.shape} {pas}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            continue
        finally:
            call = inputs = None
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        r = {"op": c.op, "shape": c.shape, "pass": pas, "us": round(us, 2)}
        flops = c.fwd_flops + (c.bwd_flops if backward else 0)
        if flops:
            r["tflops"] = round(flops / us / 1e6, 2)
        else:
            r["gbps"] = round((c.fwd_bytes + (c.bwd_bytes if backward else 0)) / us / 1e3, 2)
        r.update(calls_per_sample=k, reps=REPS)
        emit(**r)
