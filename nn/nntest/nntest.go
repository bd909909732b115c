// Package nntest checks the layers of package nn on a backend against the
// CPU backend: RunLayers builds every layer twice from the same seed, once
// on the CPU and once on the backend, runs training steps and an
// evaluation step on the same inputs, and compares outputs, the gradients
// of the input and of every parameter, and the buffers (running
// statistics, step counts). The layers' arithmetic is checked against
// float64 references in package nn's tests on the CPU; this suite carries
// those checks to another backend (the CUDA backend's tests call it).
package nntest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// Tolerance of every comparison: |got - want| ≤ Tolerance·(|want| +
// max|want|), per tensor. The two backends sum in different orders
// (float32 products over at most a few hundred terms here, no TF32); 1e-4
// is a hundred times the error such sums show, and far below that of a
// wrong index or a missing term.
const Tolerance = 1e-4

// seedEnv replays a run: NNTEST_SEED=<seed>.
const seedEnv = "NNTEST_SEED"

// reporter is the part of testing.T the suite reports to (a recorder in
// the suite's own tests).
type reporter interface {
	Helper()
	Errorf(format string, args ...any)
}

// RunLayers runs every layer case on b against the CPU backend. Inputs
// are drawn from a seed taken from the clock (printed with every failure;
// NNTEST_SEED replays it).
func RunLayers(t *testing.T, b tensor.Backend) {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(seedEnv); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("nntest: bad %s=%q: %v", seedEnv, s, err)
		}
		seed = v
	}
	for _, c := range Cases {
		t.Run(c.Name, func(t *testing.T) { c.run(t, b, seed) })
	}
}

// Case is one layer to check: Build makes it on a backend from rng, Input
// is the shape of its float32 input (or of its int32 ids below IDs, when
// IDs > 0), Steps training steps run before one evaluation step. With
// Classes > 0 the module is a classifier (a Classifier) and the output
// checked is its CrossEntropyLoss against labels below Classes.
type Case struct {
	Name    string
	Build   func(b tensor.Backend, rng *rand.Rand) nn.Module
	Input   []int
	IDs     int
	Steps   int
	Classes int
}

// Classifier is a module with its own cross-entropy loss (nn.Sequential,
// whose last Linear layer and loss run fused).
type Classifier interface {
	CrossEntropyLoss(x, labels *tensor.Tensor) *tensor.Tensor
}

// fusedNet is a Sequential of every pattern nn fuses (convolution + ReLU +
// disjoint pooling, convolution + ReLU, Linear + ReLU, and the last Linear
// with the loss), with layers beside them that must not be fused.
func fusedNet(b tensor.Backend, rng *rand.Rand) nn.Module {
	return nn.NewSequential(
		nn.NewConv2d(b, rng, 3, 8, 3), nn.ReLU{}, nn.NewMaxPool2d(2), // 14 -> 12 -> 6
		nn.NewConv2dWith(b, rng, 8, 8, nn.Conv2dOptions{Kernel: [2]int{3, 3}, Padding: [2]int{1, 1}, Groups: 2}), nn.ReLU{},
		nn.NewMaxPool2dWith(tensor.PoolOptions{Kernel: [2]int{3, 3}, Stride: [2]int{2, 2}}), // 6 -> 2
		nn.Flatten{},
		nn.NewLinear(b, rng, 32, 24), nn.ReLU{},
		nn.NewLinear(b, rng, 24, 7))
}

// bnActNet has batch norm before each activation it fuses with: ResNet-9's
// convolution, batch norm and ReLU, airbench's pooling, convolution, batch
// norm and GELU, and BatchNorm1d with the tanh form of GELU. No parameter's
// gradient is zero by construction, so that the comparison with the CPU
// is not one of rounding noise: the layers before a batch norm have no
// bias (batch norm removes it), and a convolution stands between the
// first batch norm and the second (which would otherwise undo any
// positive scale of the first's weight: ReLU and max pooling commute with
// it).
func bnActNet(b tensor.Backend, rng *rand.Rand) nn.Module {
	conv := func(in, out int) *nn.Conv2d {
		return nn.NewConv2dWith(b, rng, in, out, nn.Conv2dOptions{Kernel: [2]int{3, 3}, Padding: [2]int{1, 1}, NoBias: true})
	}
	return nn.NewSequential(
		conv(3, 8), nn.NewBatchNorm2d(b, 8), nn.ReLU{},
		nn.NewMaxPool2d(2), conv(8, 8), nn.NewBatchNorm2d(b, 8), nn.GELU{}, // 8 -> 4
		nn.Flatten{}, nn.NewLinearNoBias(b, rng, 128, 6), nn.NewBatchNorm1d(b, 6), &nn.GELU{Tanh: true})
}

// BatchNormFusionPlan is bnActNet's plan: each batch norm with its
// activation.
var BatchNormFusionPlan = []string{"0", "1+2 (batchnorm+act)", "3", "4", "5+6 (batchnorm+act)", "7", "8", "9+10 (batchnorm+act)"}

// RunBatchNormFusion runs bnActNet on b fused and with fusion off from the
// same seed, two training steps and an evaluation step, in float32 and
// under bfloat16 autocast: outputs, every gradient and the running
// statistics must agree bit for bit, since the fused kernels compute the
// unfused operations' values in the same order. The exception is autocast
// on a backend that holds activations channels-last
// (tensor.ChannelsLastBackend): there a fused batch norm and GELU rounds
// its result to bfloat16 once where the two layers round twice, as
// torch's do, so the two runs agree to bfloat16's rounding carried
// through the net (relative error of each vector, in the 2-norm, within
// 5%).
func RunBatchNormFusion(t *testing.T, b tensor.Backend) {
	t.Helper()
	for _, autocast := range []bool{false, true} {
		t.Run(fmt.Sprintf("autocast=%v", autocast), func(t *testing.T) {
			sameBits := sameBits
			if _, cl := b.(tensor.ChannelsLastBackend); cl && autocast {
				sameBits = closeNorm(0.05)
			}
			c := Case{Name: "bnActNet", Build: bnActNet, Input: []int{4, 3, 8, 8}}
			fused, plain := c.build(b, 11), c.build(b, 11)
			defer fused.release()
			defer plain.release()
			nn.SetFusion(fused.m, true)
			nn.SetFusion(plain.m, false)
			if got := fused.m.(*nn.Sequential).FusionPlan(); !slices.Equal(got, BatchNormFusionPlan) {
				t.Fatalf("plan %q, want %q", got, BatchNormFusionPlan)
			}
			rng := rand.New(rand.NewPCG(12, 13))
			in := make([]float32, 4*3*8*8)
			for step := 0; step < 3; step++ {
				training := step < 2
				if !training {
					nn.SetTraining(fused.m, false)
					nn.SetTraining(plain.m, false)
				}
				for j := range in {
					in[j] = float32(rng.NormFloat64())
				}
				ws := rng.Uint64()
				run := func(md model) ([]float32, [][]float32) {
					if !autocast {
						return md.step(c, in, nil, nil, ws, training)
					}
					return md.stepAutocast(c, in, ws, training)
				}
				fo, fg := run(fused)
				po, pg := run(plain)
				sameBits(t, fmt.Sprintf("step %d: output", step), fo, po)
				for k := range pg {
					sameBits(t, fmt.Sprintf("step %d: gradient %d", step, k), fg[k], pg[k])
				}
			}
			fb, pb := nn.Buffers(fused.m), nn.Buffers(plain.m)
			for k := range pb {
				sameBits(t, "buffer "+pb[k].Name, fb[k].Tensor.Float32s(), pb[k].Tensor.Float32s())
			}
		})
	}
}

// stepAutocast is step under bfloat16 autocast.
func (md model) stepAutocast(c Case, in []float32, weightSeed uint64, training bool) (out []float32, grads [][]float32) {
	s := tensor.NewScope()
	defer s.Release()
	s.SetAutocast(tensor.BFloat16)
	x := tensor.FromFloat32(md.b, s, in, c.Input...).SetRequiresGrad(training)
	y := md.m.Forward(x)
	out = y.Float32s()
	if !training {
		return out, nil
	}
	wr := rand.New(rand.NewPCG(weightSeed, 2))
	weights := make([]float32, len(out))
	for j := range weights {
		weights[j] = float32(wr.NormFloat64())
	}
	ps := nn.Parameters(md.m)
	for _, p := range ps {
		p.Tensor.ZeroGrad()
	}
	tensor.Sum(tensor.Mul(y, tensor.FromFloat32(md.b, s, weights, y.Shape()...))).Backward()
	grads = append(grads, x.Grad().Float32s())
	for _, p := range ps {
		grads = append(grads, p.Tensor.Grad().Float32s())
	}
	return out, grads
}

// sameBits fails unless got and want are the same float32 values bit for
// bit.
func sameBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d values, want %d", what, len(got), len(want))
		return
	}
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Errorf("%s: [%d] = %v fused, %v unfused (of %d values)", what, i, got[i], want[i], len(want))
			return
		}
	}
}

// closeNorm is a comparison of two vectors: ‖got - want‖₂ ≤ tol·‖want‖₂.
func closeNorm(tol float64) func(t *testing.T, what string, got, want []float32) {
	return func(t *testing.T, what string, got, want []float32) {
		t.Helper()
		if len(got) != len(want) {
			t.Errorf("%s: %d values, want %d", what, len(got), len(want))
			return
		}
		var d, n float64
		for i := range want {
			d += (float64(got[i]) - float64(want[i])) * (float64(got[i]) - float64(want[i]))
			n += float64(want[i]) * float64(want[i])
		}
		if !(math.Sqrt(d) <= tol*math.Sqrt(n)) {
			t.Errorf("%s: relative error %.3g fused against unfused (of %d values), want at most %g", what, math.Sqrt(d/n), len(want), tol)
		}
	}
}

// Cases are the layers RunLayers checks.
var Cases = []Case{
	{"Conv2dWith/groups,dilation,no bias", func(b tensor.Backend, rng *rand.Rand) nn.Module {
		return nn.NewConv2dWith(b, rng, 4, 6, nn.Conv2dOptions{Kernel: [2]int{3, 2}, Stride: [2]int{2, 1}, Padding: [2]int{1, 0}, Dilation: [2]int{1, 2}, Groups: 2, NoBias: true})
	}, []int{2, 4, 9, 8}, 0, 1, 0},
	{"Conv2dWith/depthwise", func(b tensor.Backend, rng *rand.Rand) nn.Module {
		return nn.NewConv2dWith(b, rng, 4, 4, nn.Conv2dOptions{Kernel: [2]int{3, 3}, Padding: [2]int{1, 1}, Groups: 4})
	}, []int{2, 4, 6, 6}, 0, 1, 0},
	{"LinearNoBias/[B,T,In]", func(b tensor.Backend, rng *rand.Rand) nn.Module {
		return nn.NewLinearNoBias(b, rng, 8, 5)
	}, []int{2, 3, 8}, 0, 1, 0},
	{"MaxPool2dWith", func(tensor.Backend, *rand.Rand) nn.Module {
		return nn.NewMaxPool2dWith(tensor.PoolOptions{Kernel: [2]int{3, 2}, Stride: [2]int{2, 2}, Padding: [2]int{1, 1}, CeilMode: true})
	}, []int{2, 3, 8, 9}, 0, 1, 0},
	{"AvgPool2dWith", func(tensor.Backend, *rand.Rand) nn.Module {
		return nn.NewAvgPool2dWith(tensor.AvgPoolOptions{PoolOptions: tensor.PoolOptions{Kernel: [2]int{3, 3}, Stride: [2]int{2, 2}, Padding: [2]int{1, 1}, CeilMode: true}, ExcludePad: true})
	}, []int{2, 3, 8, 9}, 0, 1, 0},
	{"AdaptivePools", func(tensor.Backend, *rand.Rand) nn.Module {
		return nn.NewSequential(nn.NewAdaptiveAvgPool2d(5, 4), nn.NewAdaptiveMaxPool2d(2, 3))
	}, []int{2, 3, 7, 9}, 0, 1, 0},
	{"Activations", func(tensor.Backend, *rand.Rand) nn.Module {
		return nn.NewSequential(nn.GELU{}, nn.GELU{Tanh: true}, nn.SiLU{}, nn.Tanh{}, nn.Sigmoid{}, nn.NewLeakyReLU(0.1), nn.Identity{})
	}, []int{4, 16}, 0, 1, 0},
	{"BatchNorm2d", func(b tensor.Backend, _ *rand.Rand) nn.Module { return nn.NewBatchNorm2d(b, 3) }, []int{4, 3, 5, 5}, 0, 2, 0},
	{"BatchNorm1d/[N,C,L]", func(b tensor.Backend, _ *rand.Rand) nn.Module { return nn.NewBatchNorm1d(b, 4) }, []int{6, 4, 3}, 0, 2, 0},
	{"LayerNorm", func(b tensor.Backend, _ *rand.Rand) nn.Module { return nn.NewLayerNorm(b, 3, 8) }, []int{2, 3, 8}, 0, 1, 0},
	{"Embedding", func(b tensor.Backend, rng *rand.Rand) nn.Module { return nn.NewEmbedding(b, rng, 11, 6) }, []int{2, 5}, 11, 1, 0},
	{"Dropout", func(tensor.Backend, *rand.Rand) nn.Module { return nn.NewDropout(0.3) }, []int{64, 64}, 0, 2, 0},
	{"Residual", func(b tensor.Backend, rng *rand.Rand) nn.Module {
		return nn.NewResidual(nn.NewSequential(nn.NewLinear(b, rng, 8, 8), nn.GELU{}))
	}, []int{3, 8}, 0, 1, 0},
	{"MultiheadSelfAttention/causal", func(b tensor.Backend, rng *rand.Rand) nn.Module {
		return nn.NewMultiheadSelfAttention(b, rng, 8, 2, true)
	}, []int{2, 5, 8}, 0, 1, 0},
	{"TransformerBlock", func(b tensor.Backend, rng *rand.Rand) nn.Module {
		return nn.NewTransformerBlock(b, rng, 16, 4, 0.25)
	}, []int{2, 6, 16}, 0, 2, 0},
	{"BatchNorm2d/160 channels", func(b tensor.Backend, _ *rand.Rand) nn.Module { return nn.NewBatchNorm2d(b, 160) }, []int{4, 160, 3, 3}, 0, 2, 0},
	// The fused forms nn picks, against the CPU's layers one by one.
	{Name: "Sequential/batchnorm+activation", Build: bnActNet, Input: []int{4, 3, 8, 8}, Steps: 2},
	{Name: "Sequential/batchnorm+gelu, 160 channels", Build: func(b tensor.Backend, _ *rand.Rand) nn.Module {
		return nn.NewSequential(nn.NewBatchNorm2d(b, 160), nn.GELU{Tanh: true})
	}, Input: []int{4, 160, 3, 3}, Steps: 2},
	{Name: "Sequential/fused", Build: fusedNet, Input: []int{5, 3, 14, 14}, Steps: 2},
	{Name: "Sequential/fused with loss", Build: fusedNet, Input: []int{5, 3, 14, 14}, Steps: 2, Classes: 7},
	{Name: "Residual/fused activations", Build: func(b tensor.Backend, rng *rand.Rand) nn.Module {
		return nn.NewSequential(nn.NewResidual(nn.NewSequential(nn.NewLinear(b, rng, 16, 16), nn.SiLU{}, nn.GELU{Tanh: true}, nn.Tanh{})), nn.Sigmoid{}, nn.SiLU{})
	}, Input: []int{3, 4, 16}, Steps: 1},
}

// model is one side of a comparison: a layer on a backend and where its
// dropout masks come from.
type model struct {
	b   tensor.Backend
	m   nn.Module
	gen *tensor.DeviceGenerator
}

func (c Case) build(b tensor.Backend, seed uint64) model {
	rng := rand.New(rand.NewPCG(seed, 0x6e6e))
	md := model{b: b, m: c.Build(b, rng), gen: tensor.NewDeviceGenerator(b, seed)}
	if b == tensor.CPU {
		// The reference runs each layer on its own.
		nn.SetFusion(md.m, false)
	}
	// The same seed gives the same masks on every backend (the device
	// generator's numbers are a host generator's).
	nn.SetRandomSource(md.m, md.gen)
	return md
}

func (md model) release() {
	for _, p := range nn.StateTensors(md.m) {
		if g := p.Tensor.Grad(); g != nil {
			g.Release()
		}
		p.Tensor.Release()
	}
	md.gen.Release()
}

// step runs one forward pass on in (or ids) and, in training, the
// backward pass of Σ out·r, r drawn from weightSeed, and returns the
// output and the gradients: of the input first (when it is float32), then
// of the parameters in order (nil where a parameter got none).
func (md model) step(c Case, in []float32, ids []int32, labels []int32, weightSeed uint64, training bool) (out []float32, grads [][]float32) {
	s := tensor.NewScope()
	defer s.Release()
	var x *tensor.Tensor
	if c.IDs > 0 {
		x = tensor.FromInt32(md.b, s, ids, c.Input...)
	} else {
		x = tensor.FromFloat32(md.b, s, in, c.Input...).SetRequiresGrad(training)
	}
	var y *tensor.Tensor
	if c.Classes > 0 {
		y = md.m.(Classifier).CrossEntropyLoss(x, tensor.FromInt32(md.b, s, labels, c.Input[0]))
	} else {
		y = md.m.Forward(x)
	}
	out = y.Float32s()
	if !training {
		return out, nil
	}
	wr := rand.New(rand.NewPCG(weightSeed, 2))
	weights := make([]float32, len(out))
	for j := range weights {
		weights[j] = float32(wr.NormFloat64())
	}
	ps := nn.Parameters(md.m)
	for _, p := range ps {
		p.Tensor.ZeroGrad()
	}
	tensor.Sum(tensor.Mul(y, tensor.FromFloat32(md.b, s, weights, y.Shape()...))).Backward()
	if c.IDs == 0 {
		grads = append(grads, x.Grad().Float32s())
	}
	for _, p := range ps {
		var g []float32
		if p.Tensor.Grad() != nil {
			g = p.Tensor.Grad().Float32s()
		}
		grads = append(grads, g)
	}
	return out, grads
}

func (c Case) run(r reporter, b tensor.Backend, seed uint64) {
	r.Helper()
	seed ^= hashName(c.Name)
	fail := func(format string, args ...any) {
		r.Helper()
		r.Errorf("%s on %s: %s (rerun with %s=%d)", c.Name, b.Name(), fmt.Sprintf(format, args...), seedEnv, seed)
	}
	defer func() {
		if p := recover(); p != nil {
			fail("panic: %v\n%s", p, debug.Stack())
		}
	}()
	ref, got := c.build(tensor.CPU, seed), c.build(b, seed)
	defer ref.release()
	defer got.release()
	rng := rand.New(rand.NewPCG(seed, 1))
	n := 1
	for _, d := range c.Input {
		n *= d
	}
	var names []string
	if c.IDs == 0 {
		names = append(names, "input")
	}
	for _, p := range nn.Parameters(ref.m) {
		names = append(names, p.Name)
	}
	for i := 0; i <= c.Steps; i++ {
		training := i < c.Steps
		step := fmt.Sprintf("training step %d", i+1)
		if !training {
			step = "evaluation"
			nn.SetTraining(ref.m, false)
			nn.SetTraining(got.m, false)
		}
		in, ids := make([]float32, n), make([]int32, n)
		for j := range in {
			in[j] = float32(rng.NormFloat64())
			ids[j] = int32(rng.IntN(max(c.IDs, 1)))
		}
		labels := make([]int32, c.Input[0])
		for j := range labels {
			labels[j] = int32(rng.IntN(max(c.Classes, 1)))
		}
		weightSeed := rng.Uint64()
		w, wg := ref.step(c, in, ids, labels, weightSeed, training)
		g, gg := got.step(c, in, ids, labels, weightSeed, training)
		compare(fail, step+": output", g, w)
		for k := range wg {
			switch {
			case wg[k] == nil:
				fail("%s: no gradient of %s on the CPU", step, names[k])
			case gg[k] == nil:
				fail("%s: no gradient of %s", step, names[k])
			default:
				compare(fail, step+": gradient of "+names[k], gg[k], wg[k])
			}
		}
	}
	rb, gb := nn.Buffers(ref.m), nn.Buffers(got.m)
	for k := range rb {
		compare(fail, "buffer "+rb[k].Name, gb[k].Tensor.Float32s(), rb[k].Tensor.Float32s())
		if strings.HasSuffix(rb[k].Name, "num_batches_tracked") {
			if v := gb[k].Tensor.Float32s(); len(v) != 1 || v[0] != float32(c.Steps) {
				fail("%s = %v after %d training steps and an evaluation step, want %d", gb[k].Name, v, c.Steps, c.Steps)
			}
		}
	}
}

// compare reports the first element of got out of Tolerance of want.
func compare(fail func(string, ...any), what string, got, want []float32) {
	if len(got) != len(want) {
		fail("%s: %d values, want %d", what, len(got), len(want))
		return
	}
	scale := 0.0
	for _, v := range want {
		scale = math.Max(scale, math.Abs(float64(v)))
	}
	for i := range want {
		d := math.Abs(float64(got[i]) - float64(want[i]))
		if !(d <= Tolerance*(math.Abs(float64(want[i]))+scale)) {
			fail("%s: [%d] = %v, want %v (of %d values)", what, i, got[i], want[i], len(want))
			return
		}
	}
}

func hashName(s string) uint64 {
	h := uint64(14695981039346656037) // FNV-1a
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * 1099511628211
	}
	return h
}
