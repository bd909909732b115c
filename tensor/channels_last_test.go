package tensor_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// clNet is a convolution net that walks every path of the channels-last
// form: a convolution with a bias from a plain input, GELU, max pooling,
// batch norm with its activation, a convolution with its ReLU, batch norm
// and ReLU apart, a residual sum whose operand also feeds a convolution
// (two gradients in the form), pooling again, and a reader that knows
// nothing of the form (Sum) next to one that does (MaxPool2d), then
// Flatten, a linear layer and the loss.
type clNet struct {
	w1, b1, w2, w3, g1, be1, g2, be2, lw *tensor.Tensor
	rm1, rv1, rm2, rv2                   *tensor.Tensor
}

func newCLNet(b tensor.Backend, seed uint64) *clNet {
	rng := rand.New(rand.NewPCG(seed, 1))
	p := func(scale float64, shape ...int) *tensor.Tensor { return randParam(b, rng, scale, shape...) }
	st := func(v float32) *tensor.Tensor { return tensor.Full(b, nil, v, 16) }
	return &clNet{
		w1: p(0.5, 16, 3, 2, 2), b1: p(0.1, 16), w2: p(0.15, 16, 16, 3, 3), w3: p(0.15, 16, 16, 3, 3),
		g1: p(0.3, 16), be1: p(0.1, 16), g2: p(0.3, 16), be2: p(0.1, 16), lw: p(0.2, 5, 16*2*2),
		rm1: st(0), rv1: st(1), rm2: st(0), rv2: st(1),
	}
}

func (m *clNet) params() []*tensor.Tensor {
	return []*tensor.Tensor{m.w1, m.b1, m.w2, m.w3, m.g1, m.be1, m.g2, m.be2, m.lw}
}

// forward runs the net on x; held collects whether each stage's output
// was held channels-last.
func (m *clNet) forward(x *tensor.Tensor, training bool, held map[string]bool) *tensor.Tensor {
	note := func(name string, t *tensor.Tensor) *tensor.Tensor { held[name] = t.IsChannelsLast(); return t }
	h := note("conv bias", tensor.Conv2dWith(x, m.w1, m.b1, tensor.ConvOptions{}))
	h = note("gelu", tensor.GELU(h, false))
	h = note("conv", tensor.Conv2dWith(h, m.w2, nil, tensor.ConvOptions{Padding: [2]int{1, 1}}))
	h = note("maxpool", tensor.MaxPool2d(h, 2, 2))
	h = note("batchnorm+gelu", tensor.BatchNormAct(h, m.g1, m.be1, m.rm1, m.rv1, training, 0.1, 1e-5, tensor.OpGELU))
	r := note("conv+relu", tensor.Conv2dWithReLU(h, m.w3, nil, tensor.ConvOptions{Padding: [2]int{1, 1}}))
	r = note("batchnorm", tensor.BatchNorm(r, m.g2, m.be2, m.rm2, m.rv2, training, 0.1, 1e-5))
	r = note("relu", tensor.ReLU(r))
	r = note("residual", tensor.Add(r, h))
	p := note("maxpool 2", tensor.MaxPool2d(r, 2, 2))
	side := tensor.MulScalar(tensor.Sum(r), 1e-3) // reads r plain: r is converted
	logits := tensor.Linear(p.Reshape(x.Shape()[0], 16*2*2), m.lw, nil)
	labels := tensor.FromInt32(x.Backend(), x.Scope(), []int32{1, 4, 0}, 3)
	return tensor.Add(tensor.CrossEntropy(logits, labels), side)
}

// clStep runs a training step (and an evaluation) of clNet on b, under
// autocast or not, channels-last on or off: the loss, the evaluation's output, the
// gradients, the running statistics and which stages held the form.
func clStep(t *testing.T, b tensor.Backend, autocast, on bool) (loss, eval float32, grads [][]float32, stats [][]float32, held map[string]bool) {
	t.Helper()
	m := newCLNet(b, 7)
	rng := rand.New(rand.NewPCG(3, 5))
	in := make([]float32, 3*3*9*9)
	for i := range in {
		in[i] = float32(rng.NormFloat64())
	}
	s := tensor.NewScope()
	defer s.Release()
	if autocast {
		s.SetAutocast(tensor.BFloat16)
	}
	s.SetChannelsLast(on)
	s.SetReleaseInBackward(true)
	x := tensor.FromFloat32(b, s, in, 3, 3, 9, 9)
	held = map[string]bool{}
	l := m.forward(x, true, held)
	l.Backward()
	loss = l.Float32s()[0]
	for _, p := range m.params() {
		grads = append(grads, p.Grad().Float32s())
	}
	e := tensor.NewNoGradScope()
	defer e.Release()
	e.SetAutocast(tensor.BFloat16)
	e.SetChannelsLast(on)
	xe := tensor.FromFloat32(b, e, in, 3, 3, 9, 9)
	eval = m.forward(xe, false, map[string]bool{}).Float32s()[0]
	for _, r := range []*tensor.Tensor{m.rm1, m.rv1, m.rm2, m.rv2} {
		stats = append(stats, r.Float32s())
	}
	return loss, eval, grads, stats, held
}

// relErr is ‖got - want‖₂ / ‖want‖₂.
func relErr(got, want []float32) float64 {
	var d, n float64
	for i := range want {
		d += (float64(got[i]) - float64(want[i])) * (float64(got[i]) - float64(want[i]))
		n += float64(want[i]) * float64(want[i])
	}
	return math.Sqrt(d / n)
}

// TestChannelsLastNetMatchesPlanar: the net under autocast with the form
// on is as close to float32 arithmetic as with it off. The form rounds
// batch norm's, GELU's and the sum's outputs and the activations'
// gradients to bfloat16 where the plain path keeps them float32; in so
// small a net (batch norm over 48 values a channel) either path's
// gradients are 1-10% from float32's, so each gradient of the form must
// be within twice the plain path's error (or 3%), the loss and the
// evaluation's output within 1% of the plain path's. A wrong index or a
// lost gradient gives errors of order 1. Every stage that should hold the
// form does, and none does with it off.
func TestChannelsLastNetMatchesPlanar(t *testing.T) {
	onLoss, onEval, onGrads, onStats, onHeld := clStep(t, tensor.CPU, true, true)
	offLoss, offEval, offGrads, offStats, offHeld := clStep(t, tensor.CPU, true, false)
	_, _, f32Grads, _, _ := clStep(t, tensor.CPU, false, false)
	for name, h := range onHeld {
		if !h {
			t.Errorf("%s: not held channels-last with the form on", name)
		}
		if offHeld[name] {
			t.Errorf("%s: held channels-last with the form off", name)
		}
	}
	if d := math.Abs(float64(onLoss-offLoss)) / math.Abs(float64(offLoss)); d > 0.01 {
		t.Errorf("loss %v with the form, %v without (relative %.3g)", onLoss, offLoss, d)
	}
	if d := math.Abs(float64(onEval-offEval)) / math.Abs(float64(offEval)); d > 0.01 {
		t.Errorf("evaluation %v with the form, %v without (relative %.3g)", onEval, offEval, d)
	}
	for i := range f32Grads {
		on, off := relErr(onGrads[i], f32Grads[i]), relErr(offGrads[i], f32Grads[i])
		t.Logf("gradient %d: relative error from float32's %.3g with the form, %.3g without", i, on, off)
		if !(on <= max(2*off, 0.03)) {
			t.Errorf("gradient %d: relative error from float32's %.3g with the form, %.3g without", i, on, off)
		}
	}
	for i := range offStats {
		if e := relErr(onStats[i], offStats[i]); !(e <= 0.01) {
			t.Errorf("running statistic %d: relative error %.3g", i, e)
		}
	}
}

// TestChannelsLastExactOps: where the form's operation computes what the
// plain one does and rounds it (a convolution, whose autocast output is
// bfloat16-valued already; max pooling; ReLU), the two agree bit for bit.
func TestChannelsLastExactOps(t *testing.T) {
	b := tensor.CPU
	rng := rand.New(rand.NewPCG(9, 9))
	in := make([]float32, 2*8*7*7)
	for i := range in {
		in[i] = float32(rng.NormFloat64())
	}
	w := make([]float32, 16*8*3*3)
	for i := range w {
		w[i] = float32(rng.NormFloat64() * 0.2)
	}
	run := func(on bool) []float32 {
		s := tensor.NewScope()
		defer s.Release()
		s.SetAutocast(tensor.BFloat16)
		s.SetChannelsLast(on)
		x := tensor.FromFloat32(b, s, in, 2, 8, 7, 7)
		y := tensor.Conv2dWith(x, tensor.FromFloat32(b, s, w, 16, 8, 3, 3), nil, tensor.ConvOptions{Padding: [2]int{1, 1}})
		if y.IsChannelsLast() != on {
			t.Fatalf("convolution held channels-last %v, want %v", y.IsChannelsLast(), on)
		}
		y = tensor.MaxPool2dWith(tensor.ReLU(y), tensor.PoolOptions{Kernel: [2]int{2, 2}, CeilMode: true})
		return y.Float32s()
	}
	on, off := run(true), run(false)
	for i := range off {
		if math.Float32bits(on[i]) != math.Float32bits(off[i]) {
			t.Fatalf("[%d] = %v with the form, %v without", i, on[i], off[i])
		}
	}
}

// TestChannelsLastHalvesMemory: a stack of convolutions and batch norms
// keeps about half the bytes for its backward pass with the form
// (measured on CountingCPU at the end of the forward pass).
func TestChannelsLastHalvesMemory(t *testing.T) {
	peak := func(on bool) int {
		b := tensor.NewCountingCPU()
		rng := rand.New(rand.NewPCG(2, 2))
		param := func(shape ...int) *tensor.Tensor { return randParam(b, rng, 0.1, shape...) }
		ws := []*tensor.Tensor{param(32, 32, 3, 3), param(32, 32, 3, 3), param(32, 32, 3, 3)}
		s := tensor.NewScope()
		defer s.Release()
		s.SetAutocast(tensor.BFloat16)
		s.SetChannelsLast(on)
		x := tensor.Zeros(b, s, 4, 32, 16, 16)
		before := b.Live()
		h := x
		for _, w := range ws {
			h = tensor.Conv2dWith(h, w, nil, tensor.ConvOptions{Padding: [2]int{1, 1}})
			h = tensor.BatchNormAct(h, nil, nil, nil, nil, true, 0.1, 1e-5, tensor.OpReLU)
		}
		return b.Live() - before
	}
	on, off := peak(true), peak(false)
	t.Logf("bytes held after the forward pass: %d with the form, %d without", on, off)
	if !(float64(on) <= 0.6*float64(off)) {
		t.Errorf("%d bytes with the form, %d without: want about half", on, off)
	}
}

func ExampleScope_SetChannelsLast() {
	s := tensor.NewScope()
	defer s.Release()
	s.SetAutocast(tensor.BFloat16)
	x := tensor.Full(tensor.CPU, s, 1, 2, 8, 4, 4)
	w := tensor.Full(tensor.CPU, s, 0.5, 16, 8, 1, 1)
	y := tensor.Conv2dWith(x, w, nil, tensor.ConvOptions{})
	fmt.Println(y.Shape(), y.DType(), y.IsChannelsLast())
	y = tensor.ReLU(y)
	fmt.Println(y.IsChannelsLast(), y.Float32s()[0]) // a plain read converts it
	fmt.Println(y.IsChannelsLast())
	// Output:
	// [2 16 4 4] float32 true
	// true 4
	// false
}

// TestChannelsLastOperandSharesInput: a convolution whose weight shares
// its input's memory (x and x.Detach()) reads the plain weight before it
// takes the input's form, so that turning the weight plain frees nothing
// the convolution then reads (CountingCPU fills freed memory with NaN).
func TestChannelsLastOperandSharesInput(t *testing.T) {
	run := func(on bool) []float32 {
		b := tensor.NewCountingCPU()
		rng := rand.New(rand.NewPCG(4, 4))
		normal := func(n int, scale float64) []float32 {
			v := make([]float32, n)
			for i := range v {
				v[i] = float32(rng.NormFloat64() * scale)
			}
			return v
		}
		w0 := tensor.FromFloat32(b, nil, normal(8*3*9, 0.3), 8, 3, 3, 3).SetRequiresGrad(true)
		s := tensor.NewScope()
		defer s.Release()
		s.SetAutocast(tensor.BFloat16)
		s.SetChannelsLast(on)
		in := tensor.FromFloat32(b, s, normal(8*3*9, 1), 8, 3, 3, 3)
		x := tensor.Conv2dWith(in, w0, nil, tensor.ConvOptions{Padding: [2]int{1, 1}}) // [8, 8, 3, 3]
		if x.IsChannelsLast() != on {
			t.Fatalf("convolution held channels-last %v, want %v", x.IsChannelsLast(), on)
		}
		return tensor.Conv2dWith(x, x.Detach(), nil, tensor.ConvOptions{Padding: [2]int{1, 1}}).Float32s()
	}
	on, off := run(true), run(false)
	if e := relErr(on, off); !(e <= 0.02) {
		t.Errorf("relative error %.3g with the form against without (first values %v)", e, on[:3])
	}
}

// clCPU is the CPU backend seen through the interfaces the form needs
// alone, so that the wrappers below differ from each other only in
// tensor.ChannelsLastFilterBackend.
type clCPU interface {
	tensor.Backend
	tensor.LowPrecisionBackend
	tensor.ChannelsLastBackend
}

// plainCL is the CPU backend without the filter's form.
type plainCL struct{ clCPU }

// filterFormCL is the CPU backend with the filter's form: a bfloat16 copy
// of the filter that its convolutions check (it must equal a fresh cast of
// w when read, forward and backward) and then ignore, computing what
// plainCL computes. It counts the casts and the passes that read one.
type filterFormCL struct {
	clCPU
	t                     *testing.T
	casts, fwd, bwd, miss int
}

func (b *filterFormCL) FilterFormLen(g tensor.ConvGeom) int {
	groups := max(g.Groups, 1)
	return g.K * g.C / groups * g.R * g.S
}

func (b *filterFormCL) ToFilterForm(wf, w tensor.Buffer, g tensor.ConvGeom) {
	b.casts++
	b.Cast(wf, w)
}

// check fails the test unless wf holds bfloat16(w).
func (b *filterFormCL) check(what string, w, wf tensor.Buffer) {
	b.t.Helper()
	h, err := b.Alloc(w.Len, tensor.BFloat16)
	if err != nil {
		b.t.Fatal(err)
	}
	defer b.Free(h)
	b.Cast(h, w)
	got, want := make([]float32, w.Len), make([]float32, w.Len)
	gf, _ := b.Alloc(w.Len, tensor.Float32)
	defer b.Free(gf)
	b.Cast(gf, wf)
	b.Download(got, gf)
	b.Cast(gf, h)
	b.Download(want, gf)
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			b.t.Errorf("%s: the filter's form [%d] = %v, a fresh cast %v", what, i, got[i], want[i])
			return
		}
	}
}

func (b *filterFormCL) Conv2dChannelsLastFilter(y, x, w, wf, bias tensor.Buffer, g tensor.ConvGeom) {
	b.fwd++
	b.check("forward", w, wf)
	b.Conv2dChannelsLast(y, x, w, bias, g)
}

func (b *filterFormCL) Conv2dBackwardChannelsLastFilter(dx, dw, db, dy, x, w, wf tensor.Buffer, g tensor.ConvGeom) {
	b.bwd++
	b.check("backward", w, wf)
	b.clCPU.Conv2dBackwardChannelsLast(dx, dw, db, dy, x, w, g)
}

// Conv2dBackwardChannelsLast counts the backward passes that cast the
// filter themselves where they want dx.
func (b *filterFormCL) Conv2dBackwardChannelsLast(dx, dw, db, dy, x, w tensor.Buffer, g tensor.ConvGeom) {
	if !dx.Empty() {
		b.miss++
	}
	b.clCPU.Conv2dBackwardChannelsLast(dx, dw, db, dy, x, w, g)
}

// TestChannelsLastFilterCastOnce: on a backend with the filter's form, a
// training step casts each filter once (ToFilterForm) and both of its
// passes read that copy, which equals a fresh cast when the backward pass
// reads it; the step's loss, gradients and statistics are the bits of the
// same step without the form; and an evaluation casts but keeps nothing.
func TestChannelsLastFilterCastOnce(t *testing.T) {
	cpu := tensor.CPU.(clCPU)
	ff := &filterFormCL{clCPU: cpu, t: t}
	loss, eval, grads, stats, _ := clStep(t, ff, true, true)
	wantLoss, wantEval, wantGrads, wantStats, _ := clStep(t, plainCL{cpu}, true, true)
	// Three convolutions, in a training step and an evaluation; the
	// first's input (the data) wants no gradient, so its backward pass
	// reads no filter and its form goes at once.
	if ff.casts != 6 || ff.fwd != 6 || ff.bwd != 2 || ff.miss != 0 {
		t.Errorf("casts %d, forward passes on the form %d, backward %d, backward passes casting again %d; want 6, 6, 2, 0",
			ff.casts, ff.fwd, ff.bwd, ff.miss)
	}
	if math.Float32bits(loss) != math.Float32bits(wantLoss) || math.Float32bits(eval) != math.Float32bits(wantEval) {
		t.Errorf("loss %v and evaluation %v with the form, %v and %v without", loss, eval, wantLoss, wantEval)
	}
	for i := range wantGrads {
		for j := range wantGrads[i] {
			if math.Float32bits(grads[i][j]) != math.Float32bits(wantGrads[i][j]) {
				t.Errorf("gradient %d [%d] = %v with the form, %v without", i, j, grads[i][j], wantGrads[i][j])
				break
			}
		}
	}
	for i := range wantStats {
		if relErr(stats[i], wantStats[i]) != 0 {
			t.Errorf("running statistic %d differs with the form", i)
		}
	}
}

// TestChannelsLastFilterFormSeparable: a net the form was not written
// around (a depthwise-separable block: a strided convolution, a depthwise
// one of 8 groups, a pointwise one, global average pooling) on the
// backend with the filter's form: every convolution casts its filter
// once, the backward passes that want dx read the copies, and the loss
// and gradients are the bits of the same step without the form.
func TestChannelsLastFilterFormSeparable(t *testing.T) {
	cpu := tensor.CPU.(clCPU)
	step := func(b tensor.Backend) (float32, [][]float32) {
		rng := rand.New(rand.NewPCG(11, 13))
		p := func(shape ...int) *tensor.Tensor { return randParam(b, rng, 0.3, shape...) }
		w1, dw, pw, lw := p(8, 3, 3, 3), p(8, 1, 3, 3), p(16, 8, 1, 1), p(4, 16)
		in := make([]float32, 2*3*10*10)
		for i := range in {
			in[i] = float32(rng.NormFloat64())
		}
		s := tensor.NewScope()
		defer s.Release()
		s.SetAutocast(tensor.BFloat16)
		s.SetChannelsLast(true)
		x := tensor.FromFloat32(b, s, in, 2, 3, 10, 10)
		h := tensor.GELU(tensor.Conv2dWith(x, w1, nil, tensor.ConvOptions{Stride: [2]int{2, 2}, Padding: [2]int{1, 1}}), false)
		h = tensor.Conv2dWithReLU(h, dw, nil, tensor.ConvOptions{Padding: [2]int{1, 1}, Groups: 8})
		h = tensor.Conv2dWith(h, pw, nil, tensor.ConvOptions{})
		h = tensor.AdaptiveAvgPool2d(h, 1, 1).Reshape(2, 16)
		l := tensor.CrossEntropy(tensor.Linear(h, lw, nil), tensor.FromInt32(b, s, []int32{3, 0}, 2))
		l.Backward()
		var grads [][]float32
		for _, w := range []*tensor.Tensor{w1, dw, pw, lw} {
			grads = append(grads, w.Grad().Float32s())
		}
		return l.Float32s()[0], grads
	}
	ff := &filterFormCL{clCPU: cpu, t: t}
	loss, grads := step(ff)
	wantLoss, wantGrads := step(plainCL{cpu})
	if ff.casts != 3 || ff.fwd != 3 || ff.bwd != 2 || ff.miss != 0 {
		t.Errorf("casts %d, forward passes on the form %d, backward %d, backward passes casting again %d; want 3, 3, 2, 0",
			ff.casts, ff.fwd, ff.bwd, ff.miss)
	}
	if math.Float32bits(loss) != math.Float32bits(wantLoss) {
		t.Errorf("loss %v with the form, %v without", loss, wantLoss)
	}
	for i := range wantGrads {
		for j := range wantGrads[i] {
			if math.Float32bits(grads[i][j]) != math.Float32bits(wantGrads[i][j]) {
				t.Errorf("gradient %d [%d] = %v with the form, %v without", i, j, grads[i][j], wantGrads[i][j])
				break
			}
		}
	}
}
