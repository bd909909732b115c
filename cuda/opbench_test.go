package cuda

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/ember-ml/ember/tensor"
)

// The operator benchmark: the general operators of the tensor package on
// the shapes of the model zoo (ResNet-9 on Fashion-MNIST at batch 512, the
// character GPT of 6 layers × 384 channels at B 64, T 256, 6 heads, vocab
// 96), against docs/bench/ops_torch.py, which times the same cases in
// PyTorch eager; docs/bench/ops_table.py puts the two side by side
// (docs/performance.md, "Operator benchmark").
//
// Definitions, the same on both sides:
//   - fwd: one call of the operation on inputs that record no gradient
//     (a no-grad scope; torch.no_grad).
//   - fwd+bwd: the call with gradients recorded, the loss Sum(output) (the
//     output itself when it is a scalar: CrossEntropyLoss), and Backward.
//     The inputs are leaves requiring gradients, whose Grad is kept between
//     calls: each call adds into it, as PyTorch's leaves do. The loss and
//     the accumulation are in the time; the "Sum" cases measure them alone.
//   - Time: after warming up (which compiles the kernels), samples of k
//     calls each between two Synchronize calls, k chosen so that a sample
//     takes about opBenchSample; the median over opBenchReps samples of the
//     time per call. Every call resets the scope it works in, so memory is
//     reused through the caching allocator as in a training step.
//   - GB/s: the compulsory traffic of the operation (each tensor it must
//     read or write, once, in float32; for fwd+bwd that of the forward plus
//     that of the backward, which reads the output's gradient and writes the
//     inputs'; the loss and the accumulation not counted) over the time.
//     Products (MatMul, attention) report TFLOP/s instead.
//   - The reference line, "copy": a 1 GiB device-to-device copy
//     (Backend.Copy; x.copy_(y) in PyTorch), 2 GiB moved.

const (
	opBenchReps   = 21                   // samples per case; the median is reported
	opBenchWarmup = 3                    // calls before timing
	opBenchSample = 2 * time.Millisecond // the aimed length of one sample
	opBenchMaxK   = 500                  // most calls in one sample
	opBenchCopyN  = 1 << 28              // float32 elements of the copy reference: 1 GiB
	f32Bytes      = 4                    // bytes of a float32
)

// opCase is one row of the benchmark. Exactly one of the byte counts and
// the FLOP counts is set.
type opCase struct {
	op, shape          string  // as ops_torch.py names them
	fwdBytes, bwdBytes float64 // compulsory traffic of each pass
	fwdFlops, bwdFlops float64 // products: FLOPs of each pass
	// setup makes the case's long-lived inputs on b (those that take
	// gradients marked so) and returns one call of the operation on views
	// of them borrowed by s.
	setup func(b tensor.Backend, rng *rand.Rand) (call func(s *tensor.Scope) *tensor.Tensor, inputs []*tensor.Tensor)
}

// opResult is one JSON line of the output.
type opResult struct {
	Op     string  `json:"op"`
	Shape  string  `json:"shape"`
	Pass   string  `json:"pass"`
	US     float64 `json:"us"`
	GBps   float64 `json:"gbps,omitempty"`
	TFLOPs float64 `json:"tflops,omitempty"`
	Calls  int     `json:"calls_per_sample"`
	Reps   int     `json:"reps"`
}

// TestGPUOpBench runs the operator benchmark: one JSON line per case and
// pass on stdout, and in the file named by EMBER_OPBENCH_OUT when set. It
// runs only with EMBER_OPBENCH=1 (it takes a minute and needs several GB
// of device memory); EMBER_OPBENCH_FILTER, a regular expression, picks the
// cases whose "op shape pass" it matches.
func TestGPUOpBench(t *testing.T) {
	if os.Getenv("EMBER_OPBENCH") != "1" {
		t.Skip("the operator benchmark runs with EMBER_OPBENCH=1")
	}
	b := newGPUBackend(t, BackendOptions{})
	// EMBER_OPBENCH_BN=THREADSxUNROLL picks the one-pass batch norm's
	// block size and loads in flight per thread (to compare its forms).
	if v := os.Getenv("EMBER_OPBENCH_BN"); v != "" {
		if _, err := fmt.Sscanf(v, "%dx%d", &b.bnOne.threads, &b.bnOne.unroll); err != nil {
			t.Fatalf("EMBER_OPBENCH_BN=%q: want THREADSxUNROLL, e.g. 512x16", v)
		}
	}
	// EMBER_OPBENCH_BN_CLUSTER=KxTHREADS picks the cluster batch norm's
	// blocks a channel and block size (0x0: its own choice; -1x0: none,
	// so that the one-pass or split path runs).
	if v := os.Getenv("EMBER_OPBENCH_BN_CLUSTER"); v != "" {
		if _, err := fmt.Sscanf(v, "%dx%d", &b.bnOne.cluster, &b.bnOne.clusterThreads); err != nil {
			t.Fatalf("EMBER_OPBENCH_BN_CLUSTER=%q: want KxTHREADS, e.g. 4x256", v)
		}
		if b.bnOne.cluster < 0 {
			b.noClusters = true
			b.bnOne.cluster = 0
		}
	}
	// EMBER_OPBENCH_CHAN=BLOCKSxCHUNK picks the per-channel reduction's
	// aimed block count and least chunk (chanBlocks, chanChunkMin).
	if v := os.Getenv("EMBER_OPBENCH_CHAN"); v != "" {
		if _, err := fmt.Sscanf(v, "%dx%d", &chanBlocks, &chanChunkMin); err != nil || chanBlocks < 1 || chanChunkMin < 4 {
			t.Fatalf("EMBER_OPBENCH_CHAN=%q: want BLOCKSxCHUNK, e.g. 4096x8192", v)
		}
	}
	var filter *regexp.Regexp
	if f := os.Getenv("EMBER_OPBENCH_FILTER"); f != "" {
		var err error
		if filter, err = regexp.Compile(f); err != nil {
			t.Fatalf("EMBER_OPBENCH_FILTER: %v", err)
		}
	}
	var out *os.File
	if name := os.Getenv("EMBER_OPBENCH_OUT"); name != "" {
		var err error
		if out, err = os.Create(name); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := out.Close(); err != nil {
				t.Error(err)
			}
		}()
	}
	emit := func(r opResult) {
		line, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Println(string(line))
		if out != nil {
			if _, err := out.Write(append(line, '\n')); err != nil {
				t.Fatal(err)
			}
		}
	}
	if filter == nil || filter.MatchString("copy 1GiB fwd") {
		us, k := opBenchCopy(t, b)
		emit(opResult{Op: "copy", Shape: "1GiB", Pass: "fwd", US: round2(us), GBps: round2(2 * opBenchCopyN * f32Bytes / us / 1e3), Calls: k, Reps: opBenchReps})
	}
	for i, c := range opCases() {
		for _, pass := range []string{"fwd", "fwd+bwd"} {
			if filter != nil && !filter.MatchString(c.op+" "+c.shape+" "+pass) {
				continue
			}
			if pass == "fwd+bwd" && c.bwdBytes == 0 && c.bwdFlops == 0 {
				continue // a reference row with no backward (Copy)
			}
			us, k, err := runOpCase(b, c, pass == "fwd+bwd", uint64(i))
			if err != nil {
				t.Errorf("%s %s %s: %v", c.op, c.shape, pass, err)
				continue
			}
			r := opResult{Op: c.op, Shape: c.shape, Pass: pass, US: round2(us), Calls: k, Reps: opBenchReps}
			bytes, flops := c.fwdBytes, c.fwdFlops
			if pass == "fwd+bwd" {
				bytes, flops = bytes+c.bwdBytes, flops+c.bwdFlops
			}
			if flops > 0 {
				r.TFLOPs = round2(flops / us / 1e6)
			} else {
				r.GBps = round2(bytes / us / 1e3)
			}
			emit(r)
		}
	}
	// The copy once more after the cases: a host's copy rate drifts (a copy
	// in the first seconds of a process has run 12% slower than the next
	// process's), and the cases come between the two.
	if filter == nil || filter.MatchString("copy 1GiB again") {
		us, k := opBenchCopy(t, b)
		emit(opResult{Op: "copy", Shape: "1GiB again", Pass: "fwd", US: round2(us), GBps: round2(2 * opBenchCopyN * f32Bytes / us / 1e3), Calls: k, Reps: opBenchReps})
	}
	if n := tensor.Leaks(); n != 0 {
		t.Logf("%d tensors were left to Go's collector", n)
	}
}

func round2(v float64) float64 { return math.Round(v*100) / 100 }

// composedAttention is the backend without its fused attention, for the
// rows of the composed attention (products, softmax, dropout) on the same
// device.
type composedAttention struct{ *Backend }

func (composedAttention) AttentionSupported(d, dv int) bool { return false }

// attnDropoutCase is the GPT's causal attention with dropout 0.2, under
// bfloat16 autocast when autocast, composed of the core operators when
// composed (else the fused kernels where the backend has them).
func attnDropoutCase(suffix string, gen tensor.RandomSource, autocast, composed bool) opCase {
	attnFwd := float64(2 * gptB * gptHeads * gptT * gptT * (gptWidth / gptHeads))
	return opCase{op: "ScaledDotProductAttention", shape: shapeName(gptQKV) + " causal dropout 0.2" + suffix, fwdFlops: attnFwd, bwdFlops: 2.5 * attnFwd,
		setup: func(b tensor.Backend, rng *rand.Rand) (func(*tensor.Scope) *tensor.Tensor, []*tensor.Tensor) {
			if cb, ok := b.(*Backend); ok && composed {
				b = composedAttention{cb}
			}
			q, k, v := benchUniform(b, rng, true, gptQKV...), benchUniform(b, rng, true, gptQKV...), benchUniform(b, rng, true, gptQKV...)
			return func(s *tensor.Scope) *tensor.Tensor {
				if autocast {
					s.SetAutocast(tensor.BFloat16)
				}
				return tensor.ScaledDotProductAttentionDropout(s.Borrow(q), s.Borrow(k), s.Borrow(v), true, 0, 0.2, gen)
			}, []*tensor.Tensor{q, k, v}
		}}
}

// runOpCase times one case and pass and frees everything it made. An
// operation's panic (a missing kernel, a shape it refuses, out of memory)
// is returned, so that the other cases still run.
func runOpCase(b tensor.Backend, c opCase, backward bool, seed uint64) (us float64, k int, err error) {
	var inputs []*tensor.Tensor
	s := tensor.NewNoGradScope()
	if backward {
		s = tensor.NewScope()
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
		s.Release()
		for _, x := range inputs {
			if g := x.Grad(); g != nil {
				g.Release()
			}
			x.Release()
		}
		if serr := b.Synchronize(); serr != nil && err == nil {
			err = serr
		}
	}()
	call, inputs := c.setup(b, rand.New(rand.NewPCG(seed, 0x0b)))
	if backward && !slices.ContainsFunc(inputs, (*tensor.Tensor).RequiresGrad) {
		return 0, 0, fmt.Errorf("no input takes a gradient")
	}
	step := func() {
		s.Reset()
		y := call(s)
		if !backward {
			return
		}
		if y.Len() != 1 {
			y = tensor.Sum(y)
		}
		y.Backward()
	}
	us, k, err = timeCalls(b, step)
	return us, k, err
}

// opBenchCopy times the reference copy of 1 GiB.
func opBenchCopy(t *testing.T, b *Backend) (us float64, k int) {
	src := tensor.Full(b, nil, 1, opBenchCopyN)
	dst := tensor.Empty(b, nil, opBenchCopyN)
	defer src.Release()
	defer dst.Release()
	us, k, err := timeCalls(b, func() { b.Copy(dst.Buffer(), src.Buffer()) })
	if err != nil {
		t.Fatalf("copy: %v", err)
	}
	return us, k
}

// timeCalls warms step up, then returns the median over opBenchReps
// samples of the time per call, in µs, and the calls per sample.
func timeCalls(b tensor.Backend, step func()) (us float64, k int, err error) {
	for range opBenchWarmup {
		step()
	}
	if err := b.Synchronize(); err != nil {
		return 0, 0, err
	}
	t0 := time.Now()
	step()
	if err := b.Synchronize(); err != nil {
		return 0, 0, err
	}
	k = int(opBenchSample / max(time.Since(t0), time.Microsecond))
	k = min(max(k, 1), opBenchMaxK)
	samples := make([]float64, opBenchReps)
	for r := range samples {
		t0 := time.Now()
		for range k {
			step()
		}
		if err := b.Synchronize(); err != nil {
			return 0, 0, err
		}
		samples[r] = float64(time.Since(t0).Nanoseconds()) / 1e3 / float64(k)
	}
	slices.Sort(samples)
	return samples[len(samples)/2], k, nil
}

// ---- inputs ----

func numelOf(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// benchUniform returns a long-lived tensor of uniform values in [-2, 2)
// (torch.rand(shape) * 4 - 2 in ops_torch.py), taking gradients when grad.
func benchUniform(b tensor.Backend, rng *rand.Rand, grad bool, shape ...int) *tensor.Tensor {
	data := make([]float32, numelOf(shape))
	for i := range data {
		data[i] = rng.Float32()*4 - 2
	}
	return tensor.FromFloat32(b, nil, data, shape...).SetRequiresGrad(grad)
}

// benchLabels returns n int32 labels in [0, classes).
func benchLabels(b tensor.Backend, rng *rand.Rand, n, classes int) *tensor.Tensor {
	data := make([]int32, n)
	for i := range data {
		data[i] = int32(rng.IntN(classes))
	}
	return tensor.FromInt32(b, nil, data, n)
}

// shapeName writes a shape as ops_torch.py does: [a,b,c].
func shapeName(shape []int) string {
	s := "["
	for i, d := range shape {
		if i > 0 {
			s += ","
		}
		s += fmt.Sprint(d)
	}
	return s + "]"
}

// ---- cases ----

// Shapes of the zoo (docs/bench/ops_torch.py has the same).
var (
	resnetAct = []int{512, 64, 28, 28} // ResNet-9's largest activation, 103 MB
	gptMLP    = []int{64, 256, 1536}   // the GPT's MLP hidden layer (B·T = 16384 rows)
	gptAct    = []int{64, 256, 384}    // the GPT's residual stream
	gptScores = []int{64, 6, 256, 256} // attention scores [B, H, T, T]
	gptLogits = []int{16384, 96}       // the GPT head's logits, vocab 96
	gptQKV    = []int{64, 6, 256, 64}  // q, k, v [B, H, T, C/H]
	gptRows   = 16384                  // B·T
	gptVocab  = 96                     // symbols of the corpus
	gptWidth  = 384                    // channels
	gptHeads  = 6                      // heads
	gptT      = 256                    // context
	gptB      = 64                     // batch
	gptQKVOut = 3 * gptWidth           // the fused q, k, v projection's outputs
)

// unaryCase is an operation of one float input of shape, whose passes move
// fwd and bwd times its elements.
func unaryCase(op, shape string, dims []int, fwd, bwd float64, f func(x *tensor.Tensor) *tensor.Tensor) opCase {
	n := float64(numelOf(dims)) * f32Bytes
	return opCase{op: op, shape: shape, fwdBytes: fwd * n, bwdBytes: bwd * n,
		setup: func(b tensor.Backend, rng *rand.Rand) (func(*tensor.Scope) *tensor.Tensor, []*tensor.Tensor) {
			x := benchUniform(b, rng, true, dims...)
			return func(s *tensor.Scope) *tensor.Tensor { return f(s.Borrow(x)) }, []*tensor.Tensor{x}
		}}
}

// copyCase is a copy of a tensor of dims into a new one (x.clone() in
// ops_torch.py): the copy reference at one size, forward only.
func copyCase(dims []int) opCase {
	n := float64(numelOf(dims)) * f32Bytes
	return opCase{op: "Copy", shape: shapeName(dims), fwdBytes: 2 * n,
		setup: func(b tensor.Backend, rng *rand.Rand) (func(*tensor.Scope) *tensor.Tensor, []*tensor.Tensor) {
			x := benchUniform(b, rng, false, dims...)
			return func(s *tensor.Scope) *tensor.Tensor {
				y := tensor.Empty(b, s, dims...)
				tensor.CopyTensor(y, s.Borrow(x))
				return y
			}, []*tensor.Tensor{x}
		}}
}

// binaryCase is an elementwise operation of two float inputs of one shape.
func binaryCase(op string, dims []int, fwd, bwd float64, f func(x, y *tensor.Tensor) *tensor.Tensor) opCase {
	n := float64(numelOf(dims)) * f32Bytes
	return opCase{op: op, shape: shapeName(dims), fwdBytes: fwd * n, bwdBytes: bwd * n,
		setup: func(b tensor.Backend, rng *rand.Rand) (func(*tensor.Scope) *tensor.Tensor, []*tensor.Tensor) {
			x, y := benchUniform(b, rng, true, dims...), benchUniform(b, rng, true, dims...)
			return func(s *tensor.Scope) *tensor.Tensor { return f(s.Borrow(x), s.Borrow(y)) }, []*tensor.Tensor{x, y}
		}}
}

// crossEntropyCase is CrossEntropyLoss on the GPT head's logits with the
// given label smoothing: forward reads the logits and labels, backward
// reads them again and writes the logits' gradient.
func crossEntropyCase(smoothing float32) opCase {
	n, r := float64(gptRows*gptVocab)*f32Bytes, float64(gptRows)*f32Bytes
	return opCase{op: "CrossEntropyLoss", shape: fmt.Sprintf("%s smoothing %g", shapeName(gptLogits), smoothing),
		fwdBytes: n + r, bwdBytes: 2*n + r,
		setup: func(b tensor.Backend, rng *rand.Rand) (func(*tensor.Scope) *tensor.Tensor, []*tensor.Tensor) {
			x, y := benchUniform(b, rng, true, gptLogits...), benchLabels(b, rng, gptRows, gptVocab)
			opt := tensor.CrossEntropyOptions{LabelSmoothing: smoothing}
			return func(s *tensor.Scope) *tensor.Tensor {
				return tensor.CrossEntropyLoss(s.Borrow(x), s.Borrow(y), opt)
			}, []*tensor.Tensor{x, y}
		}}
}

// normCase is BatchNorm or LayerNorm on x of dims with parameters of
// params elements (weight and bias, which take gradients): forward reads x
// and the parameters and writes y, backward reads x, the parameters and
// the output's gradient and writes the gradients of all three.
func normCase(op, shape string, dims []int, params int, f func(x, w, bias *tensor.Tensor) *tensor.Tensor, stats bool) opCase {
	n, p := float64(numelOf(dims))*f32Bytes, float64(params)*f32Bytes
	return opCase{op: op, shape: shape, fwdBytes: 2*n + 2*p, bwdBytes: 3*n + 3*p,
		setup: func(b tensor.Backend, rng *rand.Rand) (func(*tensor.Scope) *tensor.Tensor, []*tensor.Tensor) {
			x := benchUniform(b, rng, true, dims...)
			pdims := dims[len(dims)-1:]
			if stats {
				pdims = dims[1:2]
			}
			w := tensor.Full(b, nil, 1, pdims...).SetRequiresGrad(true)
			bias := tensor.Zeros(b, nil, pdims...).SetRequiresGrad(true)
			return func(s *tensor.Scope) *tensor.Tensor {
				return f(s.Borrow(x), s.Borrow(w), s.Borrow(bias))
			}, []*tensor.Tensor{x, w, bias}
		}}
}

func batchNormCase(dims []int) opCase { return batchNormActCase(dims, tensor.OpIdentity) }

// batchNormActCase is BatchNorm followed by act (ResNet-9's ReLU,
// airbench's GELU) as nn's fusion runs it: one operation each way, the
// same traffic as BatchNorm's ("BatchNormReLU", "BatchNormGELU"; PyTorch's
// rows are its two operations).
func batchNormActCase(dims []int, act tensor.UnaryOp) opCase {
	c := dims[1]
	op := map[tensor.UnaryOp]string{tensor.OpIdentity: "BatchNorm", tensor.OpReLU: "BatchNormReLU", tensor.OpGELU: "BatchNormGELU"}[act]
	var mean, variance *tensor.Tensor // made by the first setup, freed with the inputs
	cs := normCase(op, shapeName(dims)+" train", dims, c, func(x, w, bias *tensor.Tensor) *tensor.Tensor {
		return tensor.BatchNormAct(x, w, bias, mean, variance, true, 0.1, 1e-5, act)
	}, true)
	setup := cs.setup
	cs.setup = func(b tensor.Backend, rng *rand.Rand) (func(*tensor.Scope) *tensor.Tensor, []*tensor.Tensor) {
		call, in := setup(b, rng)
		mean, variance = tensor.Zeros(b, nil, c), tensor.Full(b, nil, 1, c)
		return call, append(in, mean, variance)
	}
	return cs
}

// reduceCase is SumAxes or MeanAxes of x of dims over axes: forward reads
// x and writes the reduced tensor, backward reads its gradient and writes
// x's.
func reduceCase(op string, dims, axes []int, f func(x *tensor.Tensor, axes []int, keepdim bool) *tensor.Tensor) opCase {
	kept := numelOf(dims)
	for _, a := range axes {
		kept /= dims[(a+len(dims))%len(dims)]
	}
	n, r := float64(numelOf(dims))*f32Bytes, float64(kept)*f32Bytes
	over := ""
	for i, a := range axes {
		if i > 0 {
			over += ","
		}
		over += fmt.Sprint(a)
	}
	return opCase{op: op, shape: shapeName(dims) + " over " + over, fwdBytes: n + r, bwdBytes: r + n,
		setup: func(b tensor.Backend, rng *rand.Rand) (func(*tensor.Scope) *tensor.Tensor, []*tensor.Tensor) {
			x := benchUniform(b, rng, true, dims...)
			return func(s *tensor.Scope) *tensor.Tensor { return f(s.Borrow(x), axes, false) }, []*tensor.Tensor{x}
		}}
}

// opCases are the rows of the benchmark, in the order of ops_torch.py.
func opCases() []opCase {
	sum := func(dims []int) opCase {
		return unaryCase("Sum", shapeName(dims), dims, 1, 1, tensor.Sum)
	}
	softmax := func(dims []int) []opCase {
		return []opCase{
			unaryCase("Softmax", shapeName(dims), dims, 2, 3, func(x *tensor.Tensor) *tensor.Tensor { return tensor.Softmax(x, -1) }),
			unaryCase("LogSoftmax", shapeName(dims), dims, 2, 3, func(x *tensor.Tensor) *tensor.Tensor { return tensor.LogSoftmax(x, -1) }),
		}
	}
	// Attention: causal FLOPs (the masked half of q·kᵀ and p·v left out),
	// 2·2·T·T·D/2 per head forward, 2.5 times that backward (FlashAttention's
	// count).
	attnFwd := float64(2 * gptB * gptHeads * gptT * gptT * (gptWidth / gptHeads))
	m, k, n := float64(gptRows), float64(gptWidth), float64(gptQKVOut)
	rows := []int{gptRows, gptWidth}
	bias := []int{1, resnetAct[1], 1, 1}
	act, nb := float64(numelOf(resnetAct))*f32Bytes, float64(resnetAct[1])*f32Bytes
	gen := tensor.NewGenerator(1)
	cases := []opCase{
		binaryCase("Add", resnetAct, 3, 3, tensor.Add),
		{op: "Add", shape: shapeName(resnetAct) + "+" + shapeName(bias), fwdBytes: 2*act + nb, bwdBytes: 2*act + nb,
			setup: func(b tensor.Backend, rng *rand.Rand) (func(*tensor.Scope) *tensor.Tensor, []*tensor.Tensor) {
				x, y := benchUniform(b, rng, true, resnetAct...), benchUniform(b, rng, true, bias...)
				return func(s *tensor.Scope) *tensor.Tensor { return tensor.Add(s.Borrow(x), s.Borrow(y)) }, []*tensor.Tensor{x, y}
			}},
		binaryCase("Mul", resnetAct, 3, 5, tensor.Mul),
		unaryCase("ReLU", shapeName(gptMLP), gptMLP, 2, 3, tensor.ReLU),
		unaryCase("GELU", shapeName(gptMLP), gptMLP, 2, 3, func(x *tensor.Tensor) *tensor.Tensor { return tensor.GELU(x, false) }),
		reduceCase("SumAxes", rows, []int{-1}, tensor.SumAxes),
		reduceCase("MeanAxes", rows, []int{-1}, tensor.MeanAxes),
		reduceCase("SumAxes", resnetAct, []int{0, 2, 3}, tensor.SumAxes),
		reduceCase("MeanAxes", resnetAct, []int{0, 2, 3}, tensor.MeanAxes),
		reduceCase("SumAxes", []int{512, 128, 14, 14}, []int{0, 2, 3}, tensor.SumAxes), // ResNet-9's second stage
		// The two stages of the sum over 0, 2, 3 alone: rows of 784, then
		// the 512-long columns of [512, 64].
		reduceCase("SumAxes", []int{resnetAct[0] * resnetAct[1], resnetAct[2] * resnetAct[3]}, []int{-1}, tensor.SumAxes),
		reduceCase("SumAxes", resnetAct[:2], []int{0}, tensor.SumAxes),
		// What the same bytes cost read flat, and copied: an operation of 51
		// MB or less pays its launch and ramp on a fifth of the time a 1 GiB
		// copy amortises them over or less, so its share of the 1 GiB
		// copy's rate is read beside a copy of its own size (ops_table.py's
		// last column), one for each shape of the elementwise operations,
		// reductions and normalisations here.
		sum([]int{512, 128, 14, 14}),
		copyCase(resnetAct),
		copyCase([]int{512, 128, 14, 14}),
		copyCase(gptMLP),
		copyCase(gptScores),
		copyCase(gptAct),
		copyCase(rows),
		copyCase(gptLogits),
	}
	cases = append(cases, softmax(gptScores)...)
	cases = append(cases, softmax(gptLogits)...)
	cases = append(cases,
		normCase("LayerNorm", shapeName(gptAct)+" over 384", gptAct, gptWidth, func(x, w, bias *tensor.Tensor) *tensor.Tensor {
			return tensor.LayerNorm(x, []int{gptWidth}, w, bias, 1e-5)
		}, false),
		batchNormCase(resnetAct),
		batchNormCase([]int{512, 128, 14, 14}),
		batchNormCase([]int{512, 256, 7, 7}),
		batchNormCase([]int{1024, 256, 7, 7}),
		// fewer channels than SMs (a CIFAR ResNet's last stage)
		batchNormCase([]int{512, 64, 8, 8}),
		batchNormCase([]int{256, 32, 8, 8}),
		batchNormActCase([]int{512, 128, 14, 14}, tensor.OpReLU),
		batchNormActCase([]int{512, 256, 7, 7}, tensor.OpReLU),
		batchNormActCase([]int{1024, 256, 7, 7}, tensor.OpGELU),
		crossEntropyCase(0.1),
		crossEntropyCase(0),
		unaryCase("Dropout", shapeName(gptAct)+" p=0.2", gptAct, 2, 2, func(x *tensor.Tensor) *tensor.Tensor {
			return tensor.Dropout(x, 0.2, true, gen)
		}),
		opCase{op: "ScaledDotProductAttention", shape: shapeName(gptQKV) + " causal", fwdFlops: attnFwd, bwdFlops: 2.5 * attnFwd,
			setup: func(b tensor.Backend, rng *rand.Rand) (func(*tensor.Scope) *tensor.Tensor, []*tensor.Tensor) {
				q, k, v := benchUniform(b, rng, true, gptQKV...), benchUniform(b, rng, true, gptQKV...), benchUniform(b, rng, true, gptQKV...)
				return func(s *tensor.Scope) *tensor.Tensor {
					return tensor.ScaledDotProductAttention(s.Borrow(q), s.Borrow(k), s.Borrow(v), true, 0)
				}, []*tensor.Tensor{q, k, v}
			}},
		attnDropoutCase("", gen, false, false),
		attnDropoutCase(" composed", gen, false, true),
		attnDropoutCase(" autocast bf16", gen, true, false),
		attnDropoutCase(" autocast bf16 composed", gen, true, true),
		opCase{op: "MatMul", shape: fmt.Sprintf("[%d,%d]x[%d,%d]", gptRows, gptWidth, gptWidth, gptQKVOut), fwdFlops: 2 * m * n * k, bwdFlops: 4 * m * n * k,
			setup: func(b tensor.Backend, rng *rand.Rand) (func(*tensor.Scope) *tensor.Tensor, []*tensor.Tensor) {
				x, w := benchUniform(b, rng, true, gptRows, gptWidth), benchUniform(b, rng, true, gptWidth, gptQKVOut)
				return func(s *tensor.Scope) *tensor.Tensor { return tensor.MatMul(s.Borrow(x), s.Borrow(w)) }, []*tensor.Tensor{x, w}
			}},
		// The loss of the fwd+bwd passes alone, on the outputs' shapes.
		sum(resnetAct), sum(gptMLP), sum(gptScores), sum(gptAct), sum(gptLogits),
	)
	return cases
}
