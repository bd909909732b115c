package tensor_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// The tests of Scope.SetReleaseInBackward run each network twice on a
// CountingCPU, keeping its intermediates until Reset and giving them back
// during Backward, and check that the second holds less at its peak and
// after Backward, gives bit for bit the same loss and gradients (a freed
// float32 buffer is NaN-filled, so a read of memory given back too early
// shows), and frees nothing twice (Reset after the early frees).

// memRun is what one step of a network left.
type memRun struct {
	loss       float32
	grads      [][]float32
	forward    int // live bytes the forward pass added
	peak       int // most live bytes above the start during Backward
	afterwards int // live bytes above the start after Backward
	leaves     int // bytes of the scoped tensors without a history
}

// stepMemory runs build (which makes its parameters on c, requiring
// gradients, and returns the loss of a step in s) once, with the scope
// giving memory back in backward or not.
func stepMemory(t *testing.T, early bool, build func(c *tensor.CountingCPU) (params []*tensor.Tensor, loss func(s *tensor.Scope) *tensor.Tensor)) memRun {
	t.Helper()
	c := tensor.NewCountingCPU()
	params, loss := build(c)
	for _, p := range params { // as an optimiser does, before the step
		p.SetGrad(tensor.Zeros(c, nil, p.Shape()...))
	}
	s := tensor.NewScope()
	s.SetReleaseInBackward(early)
	start := c.Live()
	allocs := c.Allocs()
	scopedLeafBytes = 0
	l := loss(s)
	r := memRun{forward: c.Live() - start, leaves: scopedLeafBytes}
	c.ResetPeak()
	l.Backward()
	r.peak, r.afterwards = c.Peak()-start, c.Live()-start
	r.loss = l.Item() // the root stays readable
	for _, p := range params {
		r.grads = append(r.grads, p.Grad().Float32s())
	}
	if c.Allocs() == allocs {
		t.Fatal("the step allocated nothing")
	}
	s.Release()
	for _, p := range params {
		p.Release()
		if p.Grad() != nil {
			p.Grad().Release()
		}
	}
	if n := c.BadFrees(); n != 0 {
		t.Errorf("early=%v: %d frees of memory not live (double frees)", early, n)
	}
	return r
}

// compareRuns checks that the early run computed the same bits as the
// late one, and that it held less during and after Backward.
func compareRuns(t *testing.T, late, early memRun) {
	t.Helper()
	if math.Float32bits(late.loss) != math.Float32bits(early.loss) || math.IsNaN(float64(early.loss)) {
		t.Errorf("loss %v with early release, %v without", early.loss, late.loss)
	}
	for i := range late.grads {
		for j := range late.grads[i] {
			if math.Float32bits(late.grads[i][j]) != math.Float32bits(early.grads[i][j]) {
				t.Fatalf("gradient %d element %d: %v with early release, %v without", i, j, early.grads[i][j], late.grads[i][j])
			}
		}
	}
	t.Logf("forward %d B; Backward's peak %d B -> %d B, after it %d B -> %d B", late.forward, late.peak, early.peak, late.afterwards, early.afterwards)
	if early.forward != late.forward {
		t.Errorf("the forward passes differ: %d and %d bytes", early.forward, late.forward)
	}
	// Without early release the backward pass holds every activation
	// and, at its end, the gradients of the first layers on top; with it
	// the activations go as the gradients come: what the pass adds to the
	// forward's total at its peak at least halves (in these networks it
	// falls by 60-90%).
	if early.peak >= late.peak || early.peak-early.forward > (late.peak-late.forward)/2 {
		t.Errorf("Backward's peak %d B with early release, %d B without (forward %d B)", early.peak, late.peak, early.forward)
	}
	// After Backward only the loss, its seed and the leaves the caller
	// made (the input batch, labels) remain.
	if early.afterwards > early.leaves+16 || 10*late.afterwards < 9*late.forward {
		t.Errorf("after Backward %d B remain with early release, %d B without (forward %d B)", early.afterwards, late.afterwards, early.forward)
	}
}

// randParam is a parameter of the shape on b, normal with standard
// deviation scale, requiring its gradient.
func randParam(b tensor.Backend, rng *rand.Rand, scale float64, shape ...int) *tensor.Tensor {
	n := 1
	for _, d := range shape {
		n *= d
	}
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64() * scale)
	}
	return tensor.FromFloat32(b, nil, v, shape...).SetRequiresGrad(true)
}

// scopedLeafBytes counts the bytes of the inputs and labels that
// randInput and labels made in a scope (stepMemory resets it).
var scopedLeafBytes int

func randInput(c *tensor.CountingCPU, s *tensor.Scope, rng *rand.Rand, shape ...int) *tensor.Tensor {
	n := 1
	for _, d := range shape {
		n *= d
	}
	if s != nil {
		scopedLeafBytes += 4 * n
	}
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return tensor.FromFloat32(c, s, v, shape...)
}

func labels(c *tensor.CountingCPU, s *tensor.Scope, n, classes int) *tensor.Tensor {
	y := make([]int32, n)
	for i := range y {
		y[i] = int32(i * 7 % classes)
	}
	scopedLeafBytes += 4 * n
	return tensor.FromInt32(c, s, y, n)
}

// A deep MLP, wide at the input as most are (784-1024-...), of
// Linear+ReLU layers and a cross entropy.
func TestReleaseInBackwardMLP(t *testing.T) {
	const n, classes = 32, 10
	widths := []int{256, 256, 192, 160, 128, 96, 64, 48, 32}
	depth := len(widths) - 1
	build := func(c *tensor.CountingCPU) ([]*tensor.Tensor, func(*tensor.Scope) *tensor.Tensor) {
		rng := rand.New(rand.NewPCG(1, 1))
		var ps []*tensor.Tensor
		for i := range depth {
			ps = append(ps, randParam(c, rng, 0.1, widths[i+1], widths[i]), randParam(c, rng, 0.1, widths[i+1]))
		}
		ps = append(ps, randParam(c, rng, 0.2, classes, widths[depth]))
		return ps, func(s *tensor.Scope) *tensor.Tensor {
			rng := rand.New(rand.NewPCG(2, 2))
			h := randInput(c, s, rng, n, widths[0])
			for i := range depth {
				h = tensor.ReLU(tensor.Linear(h, ps[2*i], ps[2*i+1]))
			}
			return tensor.CrossEntropy(tensor.Linear(h, ps[len(ps)-1], nil), labels(c, s, n, classes))
		}
	}
	compareRuns(t, stepMemory(t, false, build), stepMemory(t, true, build))
}

// A convolutional chain in ResNet-9's manner: convolution, batch norm,
// ReLU and pooling, a residual block, a scaled smoothed cross entropy.
func TestReleaseInBackwardConvChain(t *testing.T) {
	const n, classes = 4, 10
	build := func(c *tensor.CountingCPU) ([]*tensor.Tensor, func(*tensor.Scope) *tensor.Tensor) {
		rng := rand.New(rand.NewPCG(3, 3))
		chans := []int{1, 8, 16, 16}
		var ps []*tensor.Tensor
		for i := 1; i < len(chans); i++ {
			ps = append(ps, randParam(c, rng, 0.3, chans[i], chans[i-1], 3, 3), randParam(c, rng, 0.1, chans[i]), randParam(c, rng, 0.1, chans[i]))
		}
		res := randParam(c, rng, 0.2, 16, 16, 3, 3)
		head := randParam(c, rng, 0.2, classes, 16)
		ps = append(ps, res, head)
		stats := func(k int) (*tensor.Tensor, *tensor.Tensor) {
			return tensor.Zeros(c, nil, k), tensor.Full(c, nil, 1, k)
		}
		return ps, func(s *tensor.Scope) *tensor.Tensor {
			rng := rand.New(rand.NewPCG(4, 4))
			h := randInput(c, s, rng, n, 1, 16, 16)
			for i := 1; i < len(chans); i++ {
				rm, rv := stats(chans[i])
				h = tensor.Conv2dWith(h, ps[3*(i-1)], nil, tensor.ConvOptions{Padding: [2]int{1, 1}})
				h = tensor.ReLU(tensor.BatchNorm(h, ps[3*(i-1)+1], ps[3*(i-1)+2], rm, rv, true, 0.1, 1e-5))
				rm.Release()
				rv.Release()
				if i < 3 {
					h = tensor.MaxPool2d(h, 2, 2)
				}
			}
			h = tensor.Add(h, tensor.ReLU(tensor.Conv2d(h, res, nil, 1, 1))) // a residual: h read twice
			h = tensor.AdaptiveMaxPool2d(h, 1, 1).Flatten()
			logits := tensor.MulScalar(tensor.Linear(h, head, nil), 0.125)
			return tensor.CrossEntropyLoss(logits, labels(c, s, n, classes), tensor.CrossEntropyOptions{LabelSmoothing: 0.1})
		}
	}
	compareRuns(t, stepMemory(t, false, build), stepMemory(t, true, build))
}

// A transformer block in GPT's manner: embedding, layer norm, causal
// attention with dropout, GELU, residual additions, a transposed head.
func TestReleaseInBackwardTransformer(t *testing.T) {
	const batch, seq, ch, heads, vocab = 2, 8, 16, 2, 11
	build := func(c *tensor.CountingCPU) ([]*tensor.Tensor, func(*tensor.Scope) *tensor.Tensor) {
		rng := rand.New(rand.NewPCG(5, 5))
		emb := randParam(c, rng, 0.3, vocab, ch)
		lnw, lnb := randParam(c, rng, 0.1, ch), randParam(c, rng, 0.1, ch)
		qkv := randParam(c, rng, 0.2, 3*ch, ch)
		fc := randParam(c, rng, 0.2, 4*ch, ch)
		proj := randParam(c, rng, 0.2, ch, 4*ch)
		ps := []*tensor.Tensor{emb, lnw, lnb, qkv, fc, proj}
		return ps, func(s *tensor.Scope) *tensor.Tensor {
			ids := make([]int32, batch*seq)
			for i := range ids {
				ids[i] = int32(i * 5 % vocab)
			}
			idT := tensor.FromInt32(c, s, ids, batch, seq)
			scopedLeafBytes += 4 * len(ids)
			gen := tensor.NewGenerator(9)
			x := tensor.Embedding(emb, idT) // [B, T, C]
			h := tensor.LayerNorm(x, []int{ch}, lnw, lnb, 1e-5)
			q3 := tensor.Linear(h, qkv, nil).Reshape(batch, seq, 3, heads, ch/heads).Permute(2, 0, 3, 1, 4)
			q, k, v := q3.Narrow(0, 0, 1).Squeeze(0), q3.Narrow(0, 1, 1).Squeeze(0), q3.Narrow(0, 2, 1).Squeeze(0)
			a := tensor.ScaledDotProductAttentionDropout(q, k, v, true, 0, 0.2, gen) // [B, H, T, D]
			x = tensor.Add(x, a.Permute(0, 2, 1, 3).Reshape(batch, seq, ch))
			m := tensor.Linear(tensor.GELU(tensor.Linear(tensor.LayerNorm(x, []int{ch}, lnw, lnb, 1e-5), fc, nil), true), proj, nil)
			x = tensor.Add(x, tensor.Dropout(m, 0.2, true, gen))
			logits := tensor.Linear(x, emb, nil).Reshape(batch*seq, vocab) // weight tying
			return tensor.CrossEntropyLoss(logits, idT.Reshape(batch*seq), tensor.CrossEntropyOptions{})
		}
	}
	compareRuns(t, stepMemory(t, false, build), stepMemory(t, true, build))
}

// What Backward must keep in a scope that releases: a tensor read by
// several operations until the last of them (the bits show it), the root,
// leaves, a view or Detach taken outside the graph, a Retain'd tensor and
// a Borrow'd long-lived one; what it frees says so when read.
func TestReleaseInBackwardKeepsWhatIsHeld(t *testing.T) {
	run := func(early bool) (grads [][]float32, held map[string][]float32) {
		c := tensor.NewCountingCPU()
		rng := rand.New(rand.NewPCG(7, 7))
		w := randParam(c, rng, 0.5, 6, 6)
		long := randInput(c, nil, rng, 4, 6) // long-lived, borrowed
		s := tensor.NewScope()
		s.SetReleaseInBackward(early)
		xin := randInput(c, s, rng, 4, 6).SetRequiresGrad(true) // a scoped leaf
		y := tensor.ReLU(tensor.Linear(tensor.Add(xin, s.Borrow(long)), w, nil))
		// y is read by three operations; its memory must outlive them all.
		z := tensor.Add(tensor.Mul(y, y), tensor.Tanh(y))
		outside := tensor.Exp(z).Reshape(24)    // a view of a graph tensor, not in the loss
		detached := tensor.Sigmoid(z).Detach()  // computed in the graph, detached outside it
		kept := tensor.MulScalar(z, 2).Retain() // retained
		freed := tensor.MulScalar(z, 3)         // neither
		xview := xin.Reshape(24)                // a view of the leaf, in the graph
		loss := tensor.Sum(tensor.Add(tensor.Add(tensor.Add(tensor.Mul(z, z), tensor.Sigmoid(z)), tensor.MulScalar(kept, 0.5)), tensor.Add(tensor.Exp(z), freed)))
		loss = tensor.Add(loss, tensor.Sum(tensor.Mul(xview, xview)))
		before := freed.Float32s()
		loss.Backward()
		held = map[string][]float32{"loss": loss.Float32s(), "outside": outside.Float32s(), "detached": detached.Float32s(),
			"kept": kept.Float32s(), "leaf": xin.Float32s(), "leaf view": xview.Float32s(), "long": long.Float32s()}
		if early {
			mustPanic(t, "reading a tensor Backward freed", "given back early", func() { freed.Float32s() })
			mustPanic(t, "reading y, freed", "Retain", func() { y.Float32s() })
		} else {
			equalF32(t, "an intermediate without early release", freed.Float32s(), before)
		}
		grads = [][]float32{w.Grad().Float32s(), xin.Grad().Float32s()}
		s.Release()
		if n := c.BadFrees(); n != 0 {
			t.Errorf("%d double frees", n)
		}
		return grads, held
	}
	lg, lh := run(false)
	eg, eh := run(true)
	for i := range lg {
		sameBits(t, "gradient", eg[i], lg[i])
	}
	for k, v := range lh {
		sameBits(t, k, eh[k], v)
	}
}

// A second Backward through a graph that an earlier one consumed (and,
// releasing, freed) fails before it adds anything, saying why; so does
// one from a loss whose scope was reset.
func TestReleaseInBackwardSecondPass(t *testing.T) {
	for _, early := range []bool{false, true} {
		c := tensor.NewCountingCPU()
		rng := rand.New(rand.NewPCG(8, 8))
		w := randParam(c, rng, 0.5, 3, 3)
		s := tensor.NewScope()
		s.SetReleaseInBackward(early)
		y := tensor.Tanh(tensor.Linear(randInput(c, s, rng, 2, 3), w, nil))
		l1 := tensor.Sum(y)
		l2 := tensor.Sum(tensor.Mul(y, y)) // shares y with l1
		l1.Backward()
		g := w.Grad().Float32s()
		mustPanic(t, "Backward twice", "already consumed", l1.Backward)
		mustPanic(t, "Backward of a graph sharing a consumed part", "already consumed", l2.Backward)
		equalF32(t, "the gradient after the failed passes", w.Grad().Float32s(), g)
		l3 := tensor.Sum(tensor.Tanh(tensor.Linear(randInput(c, s, rng, 2, 3), w, nil)))
		s.Reset()
		mustPanic(t, "Backward after Reset", "released", l3.Backward)
		s.Release()
		if n := c.BadFrees(); n != 0 {
			t.Errorf("early=%v: %d double frees", early, n)
		}
	}
}

// The gradient-ready hooks of data-parallel training see the same final
// gradients, in the same order, when activations go during the pass; and a
// Function (an operation this package does not know) still gets its
// inputs and output.
func TestReleaseInBackwardHooksAndFunctions(t *testing.T) {
	run := func(early bool) (order []int, grads [][]float32) {
		c := tensor.NewCountingCPU()
		rng := rand.New(rand.NewPCG(9, 9))
		ws := []*tensor.Tensor{randParam(c, rng, 0.4, 5, 5), randParam(c, rng, 0.4, 5, 5), randParam(c, rng, 0.4, 5, 5)}
		for i, w := range ws {
			w.SetGradReadyHook(func(p *tensor.Tensor) {
				order = append(order, i)
				grads = append(grads, p.Grad().Float32s())
			})
		}
		s := tensor.NewScope()
		s.SetReleaseInBackward(early)
		h := randInput(c, s, rng, 3, 5)
		for i, w := range ws {
			h = tensor.Linear(h, w, nil)
			if i == 1 {
				// a custom square whose backward reads its input and output
				in := h
				out := tensor.Empty(c, s, in.Shape()...)
				v := in.Float32s()
				for j := range v {
					v[j] *= v[j]
				}
				out.CopyFrom(v)
				h = tensor.Function("square", out, func(g *tensor.Tensor) []*tensor.Tensor {
					gv, iv, ov := g.Float32s(), in.Float32s(), out.Float32s()
					for j := range gv {
						gv[j] *= 2 * iv[j] * float32(math.Sqrt(float64(ov[j]))/math.Max(1e-30, math.Abs(float64(iv[j]))))
					}
					return []*tensor.Tensor{tensor.FromFloat32(c, s, gv, in.Shape()...)}
				}, in)
			}
			h = tensor.Tanh(h)
		}
		tensor.Sum(h).Backward()
		s.Release()
		if n := c.BadFrees(); n != 0 {
			t.Errorf("%d double frees", n)
		}
		return order, grads
	}
	lo, lg := run(false)
	eo, eg := run(true)
	if len(lo) != 3 || len(eo) != 3 {
		t.Fatalf("hooks ran %v and %v; want each parameter once", lo, eo)
	}
	for i := range lo {
		if lo[i] != eo[i] {
			t.Fatalf("hook order %v with early release, %v without", eo, lo)
		}
		sameBits(t, "hooked gradient", eg[i], lg[i])
	}
}

// Without SetReleaseInBackward nothing changes: intermediates stay
// readable after Backward until Reset.
func TestScopeKeepsIntermediatesByDefault(t *testing.T) {
	c := tensor.NewCountingCPU()
	rng := rand.New(rand.NewPCG(10, 10))
	w := randParam(c, rng, 0.5, 4, 4)
	s := tensor.NewScope()
	if s.ReleasesInBackward() {
		t.Fatal("a new scope releases in backward")
	}
	h := tensor.ReLU(tensor.Linear(randInput(c, s, rng, 3, 4), w, nil))
	want := h.Float32s()
	live := c.Live()
	tensor.Sum(tensor.Mul(h, h)).Backward()
	equalF32(t, "an intermediate after Backward", h.Float32s(), want)
	if c.Live() < live {
		t.Errorf("live bytes fell from %d to %d in a scope that does not release", live, c.Live())
	}
	s.Release()
}

// ReleaseInput in an evaluation: a chain of layers run in a no-grad scope
// that releases early holds a couple of activations at a time, with the
// same result; it never frees a tensor something else may read.
func TestReleaseInputInEvaluation(t *testing.T) {
	run := func(early bool) (out []float32, peak int) {
		c := tensor.NewCountingCPU()
		rng := rand.New(rand.NewPCG(11, 11))
		var ws []*tensor.Tensor
		for range 6 {
			ws = append(ws, randParam(c, rng, 0.3, 8, 8, 3, 3))
		}
		s := tensor.NewNoGradScope()
		s.SetReleaseInBackward(early)
		x := randInput(c, s, rng, 4, 8, 16, 16)
		start := c.Live()
		c.ResetPeak()
		// Twelve links, as a Sequential of convolutions and ReLUs runs.
		var links []func(*tensor.Tensor) *tensor.Tensor
		for _, w := range ws {
			links = append(links, func(h *tensor.Tensor) *tensor.Tensor { return tensor.Conv2d(h, w, nil, 1, 1) }, tensor.ReLU)
		}
		h := x
		for _, link := range links {
			in := h
			h = link(in)
			if in != x { // the chain's input is the caller's
				tensor.ReleaseInput(in, h)
			}
		}
		peak = c.Peak() - start
		out = h.Float32s()
		if x.Released() || math.IsNaN(float64(x.Float32s()[0])) {
			t.Error("the chain's input was freed")
		}
		s.Release()
		if c.BadFrees() != 0 {
			t.Errorf("%d double frees", c.BadFrees())
		}
		return out, peak
	}
	late, latePeak := run(false)
	early, earlyPeak := run(true)
	sameBits(t, "the evaluation's output", early, late)
	const act = 4 * 8 * 16 * 16 * 4 // one activation's bytes
	t.Logf("peak %d B keeping, %d B releasing (an activation is %d B)", latePeak, earlyPeak, act)
	if latePeak < 11*act || earlyPeak > 3*act {
		t.Errorf("peak %d B keeping, %d B releasing; want about 12 and at most 3 activations of %d B", latePeak, earlyPeak, act)
	}

	// What ReleaseInput leaves alone.
	c := tensor.NewCountingCPU()
	rng := rand.New(rand.NewPCG(12, 12))
	ng := tensor.NewNoGradScope()
	ng.SetReleaseInBackward(true)
	a := tensor.Tanh(randInput(c, ng, rng, 3, 4))
	view := a.Reshape(12)
	if tensor.ReleaseInput(a, tensor.Tanh(a)) || a.Released() {
		t.Error("ReleaseInput freed a tensor with a view")
	}
	_ = view
	b := tensor.Tanh(randInput(c, ng, rng, 3, 4))
	if tensor.ReleaseInput(b, b) || tensor.ReleaseInput(b, b.Reshape(12)) {
		t.Error("ReleaseInput freed the output's own memory")
	}
	kept := tensor.Tanh(randInput(c, ng, rng, 3, 4)).Retain()
	if tensor.ReleaseInput(kept, tensor.Tanh(kept)) {
		t.Error("ReleaseInput freed a retained tensor")
	}
	d := tensor.Tanh(randInput(c, ng, rng, 3, 4))
	if !tensor.ReleaseInput(d, tensor.Tanh(d)) {
		t.Error("ReleaseInput kept a tensor nothing else reads")
	}
	mustPanic(t, "reading what ReleaseInput freed", "given back early", func() { d.Float32s() })
	ng.Release()
	off := tensor.NewNoGradScope() // not releasing early
	e := tensor.Tanh(randInput(c, off, rng, 3, 4))
	if tensor.ReleaseInput(e, tensor.Tanh(e)) {
		t.Error("ReleaseInput freed a tensor of a scope that does not release early")
	}
	off.Release()
	g := tensor.NewScope() // recording a graph
	g.SetReleaseInBackward(true)
	w := randParam(c, rng, 0.3, 4, 4)
	f := tensor.Tanh(randInput(c, g, rng, 3, 4)) // no gradient flows to it, but Linear's backward reads it for w
	if tensor.ReleaseInput(f, tensor.Linear(f, w, nil)) {
		t.Error("ReleaseInput freed an input a backward pass reads")
	}
	g.Release()
	if c.BadFrees() != 0 {
		t.Errorf("%d double frees", c.BadFrees())
	}
}

// TestReleaseInputWithGraph: with a graph recorded, ReleaseInput frees an
// activation during the forward pass only when no backward function
// reads its memory: a layer norm's output that an autocast product took
// (the product keeps its bfloat16 copy), a GELU's output likewise; not
// the input of a GELU (its backward reads it), not one a float32 product
// took (its backward reads it), not a ReLU's output (its backward reads
// it), not one the caller holds a view of. The gradients are the same
// bits as when everything is kept.
func TestReleaseInputWithGraph(t *testing.T) {
	type result struct {
		freed []bool
		grads [][]float32
	}
	run := func(autocast, release bool) result {
		c := tensor.NewCountingCPU()
		rng := rand.New(rand.NewPCG(13, 13))
		w1, w2, w3 := randParam(c, rng, 0.3, 6, 4), randParam(c, rng, 0.3, 5, 6), randParam(c, rng, 0.3, 3, 5)
		s := tensor.NewScope()
		defer s.Release()
		if autocast {
			s.SetAutocast(tensor.BFloat16)
		}
		s.SetReleaseInBackward(release)
		x := randInput(c, s, rng, 2, 7, 4)
		var r result
		h := tensor.LayerNorm(x, []int{4}, nil, nil, 1e-5)
		y := tensor.Linear(h, w1, nil)
		r.freed = append(r.freed, tensor.ReleaseInput(h, y))
		z := tensor.GELU(y, false)
		r.freed = append(r.freed, tensor.ReleaseInput(y, z))
		u := tensor.Linear(z, w2, nil)
		r.freed = append(r.freed, tensor.ReleaseInput(z, u))
		v := tensor.ReLU(u)
		o := tensor.Linear(v, w3, nil)
		r.freed = append(r.freed, tensor.ReleaseInput(v, o))
		held := tensor.GELU(o, false)
		_ = held.Reshape(-1) // the caller's view
		loss := tensor.Sum(tensor.Linear(held, randParam(c, rng, 0.3, 2, 3), nil))
		r.freed = append(r.freed, tensor.ReleaseInput(held, loss))
		if r.freed[0] {
			mustPanic(t, "reading a freed activation", "given back early", func() { h.Float32s() })
		}
		loss.Backward()
		for _, w := range []*tensor.Tensor{w1, w2, w3} {
			r.grads = append(r.grads, w.Grad().Float32s())
		}
		if n := c.BadFrees(); n != 0 {
			t.Errorf("%d frees of memory not live", n)
		}
		return r
	}
	for _, autocast := range []bool{true, false} {
		kept, released := run(autocast, false), run(autocast, true)
		want := []bool{autocast, false, autocast, false, false}
		if !slices.Equal(released.freed, want) || slices.Contains(kept.freed, true) {
			t.Errorf("autocast %v: freed %v releasing (want %v), %v keeping (want none)", autocast, released.freed, want, kept.freed)
		}
		for i := range kept.grads {
			sameBits(t, fmt.Sprintf("autocast %v: weight %d's gradient", autocast, i+1), released.grads[i], kept.grads[i])
		}
	}
}

// TestReleaseInputKeepsWhatBackwardReads: a gather's indices, Where's
// condition and a tensor that an operation recorded in another scope
// reads stay through ReleaseInput, and so does a Recompute's result that
// the caller holds a view of; Backward then runs.
func TestReleaseInputKeepsWhatBackwardReads(t *testing.T) {
	c := tensor.NewCountingCPU()
	rng := rand.New(rand.NewPCG(1, 2))
	newScope := func() *tensor.Scope {
		s := tensor.NewScope()
		s.SetReleaseInBackward(true)
		return s
	}
	check := func(what string, in, out *tensor.Tensor, loss func() *tensor.Tensor) {
		t.Helper()
		if tensor.ReleaseInput(in, out) {
			t.Errorf("%s: ReleaseInput freed what the backward pass reads", what)
		}
		loss().Backward()
	}

	s := newScope()
	w := randParam(c, rng, 0.3, 5, 3)
	ids := tensor.Argmax(randInput(c, s, rng, 4, 5)) // a step's int32 intermediate
	emb := tensor.Embedding(w, ids)
	check("Embedding's ids", ids, emb, func() *tensor.Tensor { return tensor.Sum(emb) })
	s.Release()

	s = newScope()
	w = randParam(c, rng, 0.3, 4, 5)
	cond := tensor.Gt(randInput(c, s, rng, 4, 5), tensor.Zeros(c, s, 1))
	y := tensor.Where(cond, w, tensor.Zeros(c, s, 4, 5))
	check("Where's condition", cond, y, func() *tensor.Tensor { return tensor.Sum(y) })
	s.Release()

	ev := tensor.NewNoGradScope()
	ev.SetReleaseInBackward(true)
	s = newScope()
	w = randParam(c, rng, 0.3, 4, 4)
	h := tensor.Full(c, ev, 0.5, 3, 4) // a no-grad scope's tensor, read by s's Mul
	m := tensor.Mul(tensor.Linear(randInput(c, s, rng, 3, 4), w, nil), h)
	check("another scope's operand", h, m, func() *tensor.Tensor { return tensor.Sum(m) })
	s.Release()
	ev.Release()

	s = newScope()
	s.SetAutocast(tensor.BFloat16)
	w1, w2 := randParam(c, rng, 0.3, 5, 4), randParam(c, rng, 0.3, 3, 5)
	r := tensor.Recompute(func(in ...*tensor.Tensor) *tensor.Tensor { return tensor.Linear(in[0], w1, nil) }, randInput(c, s, rng, 2, 3, 4))
	view := r.Reshape(6, 5) // the caller's
	z := tensor.Linear(r, w2, nil)
	check("a Recompute's result with a view", r, z, func() *tensor.Tensor { return tensor.Sum(z) })
	_ = view.Float32s()
	s.Release()
	if n := c.BadFrees(); n != 0 {
		t.Errorf("%d frees of memory not live", n)
	}
}
