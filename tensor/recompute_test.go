package tensor_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// maybeRecompute is tensor.Recompute(f, x) when on, else f(x): a test's
// network with and without recomputation.
func maybeRecompute(on bool, f func(in ...*tensor.Tensor) *tensor.Tensor, x *tensor.Tensor) *tensor.Tensor {
	if on {
		return tensor.Recompute(f, x)
	}
	return f(x)
}

// gptBlocks is a stack of pre-norm transformer blocks (layer norm, causal
// attention with dropout, GELU MLP, dropout, residual additions) between
// an embedding and a tied head, each block through tensor.Recompute when
// recompute is set. Its dropout draws from gen.
func gptBlocks(recompute bool, gen func(c *tensor.CountingCPU) tensor.RandomSource) func(c *tensor.CountingCPU) ([]*tensor.Tensor, func(*tensor.Scope) *tensor.Tensor) {
	const batch, seq, ch, heads, vocab, blocks = 2, 8, 16, 2, 11, 3
	return func(c *tensor.CountingCPU) ([]*tensor.Tensor, func(*tensor.Scope) *tensor.Tensor) {
		rng := rand.New(rand.NewPCG(5, 5))
		emb := randParam(c, rng, 0.3, vocab, ch)
		ps := []*tensor.Tensor{emb}
		type block struct{ lnw, lnb, qkv, fc, proj *tensor.Tensor }
		var bs []block
		for range blocks {
			b := block{randParam(c, rng, 0.1, ch), randParam(c, rng, 0.1, ch), randParam(c, rng, 0.2, 3*ch, ch),
				randParam(c, rng, 0.2, 4*ch, ch), randParam(c, rng, 0.2, ch, 4*ch)}
			bs = append(bs, b)
			ps = append(ps, b.lnw, b.lnb, b.qkv, b.fc, b.proj)
		}
		src := gen(c)
		return ps, func(s *tensor.Scope) *tensor.Tensor {
			ids := make([]int32, batch*seq)
			for i := range ids {
				ids[i] = int32(i * 5 % vocab)
			}
			idT := tensor.FromInt32(c, s, ids, batch, seq)
			scopedLeafBytes += 4 * len(ids)
			x := tensor.Embedding(emb, idT) // [B, T, C]
			for _, b := range bs {
				f := func(in ...*tensor.Tensor) *tensor.Tensor {
					x := in[0]
					h := tensor.LayerNorm(x, []int{ch}, b.lnw, b.lnb, 1e-5)
					q3 := tensor.Linear(h, b.qkv, nil).Reshape(batch, seq, 3, heads, ch/heads).Permute(2, 0, 3, 1, 4)
					q, k, v := q3.Narrow(0, 0, 1).Squeeze(0), q3.Narrow(0, 1, 1).Squeeze(0), q3.Narrow(0, 2, 1).Squeeze(0)
					a := tensor.ScaledDotProductAttentionDropout(q, k, v, true, 0, 0.2, src)
					x = tensor.Add(x, a.Permute(0, 2, 1, 3).Reshape(batch, seq, ch))
					m := tensor.Linear(tensor.GELU(tensor.Linear(tensor.LayerNorm(x, []int{ch}, b.lnw, b.lnb, 1e-5), b.fc, nil), true), b.proj, nil)
					return tensor.Add(x, tensor.Dropout(m, 0.2, true, src))
				}
				x = maybeRecompute(recompute, f, x)
			}
			logits := tensor.Linear(x, emb, nil).Reshape(batch*seq, vocab) // weight tying
			return tensor.CrossEntropyLoss(logits, idT.Reshape(batch*seq), tensor.CrossEntropyOptions{})
		}
	}
}

// sameRun fails unless two runs gave the same loss and gradients, bit for
// bit (and no NaN from memory given back too early).
func sameRun(t *testing.T, what string, want, got memRun) {
	t.Helper()
	if math.Float32bits(want.loss) != math.Float32bits(got.loss) || math.IsNaN(float64(got.loss)) {
		t.Fatalf("%s: loss %v, want %v", what, got.loss, want.loss)
	}
	for i := range want.grads {
		for j := range want.grads[i] {
			if math.Float32bits(want.grads[i][j]) != math.Float32bits(got.grads[i][j]) {
				t.Fatalf("%s: gradient %d element %d: %v, want %v", what, i, j, got.grads[i][j], want.grads[i][j])
			}
		}
	}
}

// Recompute gives the same loss and gradients as the plain network, bit
// for bit (the dropout masks drawn again where the first run drew them),
// with a forward pass that holds the blocks' inputs and outputs only.
func TestRecomputeTransformerBlocks(t *testing.T) {
	gens := map[string]func(*tensor.CountingCPU) tensor.RandomSource{
		"Generator":       func(*tensor.CountingCPU) tensor.RandomSource { return tensor.NewGenerator(9) },
		"DeviceGenerator": func(c *tensor.CountingCPU) tensor.RandomSource { return tensor.NewDeviceGenerator(c, 9) },
	}
	type build = func(c *tensor.CountingCPU) ([]*tensor.Tensor, func(*tensor.Scope) *tensor.Tensor)
	autocast := func(b build) build {
		return func(c *tensor.CountingCPU) ([]*tensor.Tensor, func(*tensor.Scope) *tensor.Tensor) {
			ps, loss := b(c)
			return ps, func(s *tensor.Scope) *tensor.Tensor {
				s.SetAutocast(tensor.BFloat16)
				return loss(s)
			}
		}
	}
	for name, gen := range gens {
		t.Run(name, func(t *testing.T) {
			for _, early := range []bool{false, true} {
				plain := stepMemory(t, early, gptBlocks(false, gen))
				re := stepMemory(t, early, gptBlocks(true, gen))
				sameRun(t, "recomputed blocks under autocast", stepMemory(t, early, autocast(gptBlocks(false, gen))), stepMemory(t, early, autocast(gptBlocks(true, gen))))
				sameRun(t, "recomputed blocks", plain, re)
				t.Logf("early release %v: forward %d -> %d B, Backward's peak %d -> %d B", early, plain.forward, re.forward, plain.peak, re.peak)
				// Three blocks of about 40 tensors each: kept, they are
				// most of the forward's memory; recomputed, a block's
				// input and output.
				if 3*re.forward > plain.forward {
					t.Errorf("early release %v: the forward held %d B with Recompute, %d B without: want at most a third", early, re.forward, plain.forward)
				}
				if early && re.peak >= plain.peak {
					t.Errorf("Backward's peak %d B with Recompute, %d B without", re.peak, plain.peak)
				}
			}
		})
	}
}

// The random sources end where the plain network leaves them: the second
// run draws at the first run's positions and puts them back after.
func TestRecomputeLeavesRandomSourcesWhereTheyWere(t *testing.T) {
	for _, recompute := range []bool{false, true} {
		c := tensor.NewCountingCPU()
		gen, dev := tensor.NewGenerator(3), tensor.NewDeviceGenerator(c, 3)
		s := tensor.NewScope()
		x := randInput(c, s, rand.New(rand.NewPCG(1, 2)), 4, 6)
		w := tensor.FromFloat32(c, nil, make([]float32, 6), 6).SetRequiresGrad(true)
		f := func(in ...*tensor.Tensor) *tensor.Tensor {
			y := tensor.Dropout(tensor.Add(in[0], w), 0.5, true, gen)
			return tensor.Dropout(y, 0.5, true, dev)
		}
		y := maybeRecompute(recompute, f, x)
		tensor.Sum(y).Backward()
		_, off := dev.SeedOffset()
		if gen.Offset() != 6 || off != 6 {
			t.Errorf("recompute %v: offsets %d and %d after the step; want 6 and 6", recompute, gen.Offset(), off)
		}
		s.Release()
		dev.Release()
	}
}

// Batch norm in a recomputed block updates its running statistics once,
// and its gradients are the plain network's.
func TestRecomputeBatchNormUpdatesOnce(t *testing.T) {
	run := func(recompute bool) (mean, variance, grad []float32) {
		c := tensor.NewCountingCPU()
		rng := rand.New(rand.NewPCG(7, 7))
		w := randParam(c, rng, 0.3, 4, 3, 3, 3)
		gamma := tensor.Full(c, nil, 1, 4).SetRequiresGrad(true)
		beta := tensor.Zeros(c, nil, 4).SetRequiresGrad(true)
		rm, rv := tensor.Zeros(c, nil, 4), tensor.Full(c, nil, 1, 4)
		s := tensor.NewScope()
		x := randInput(c, s, rng, 2, 3, 6, 6)
		f := func(in ...*tensor.Tensor) *tensor.Tensor {
			h := tensor.Conv2d(in[0], w, nil, 1, 1)
			return tensor.ReLU(tensor.BatchNorm(h, gamma, beta, rm, rv, true, 0.1, 1e-5))
		}
		y := maybeRecompute(recompute, f, x)
		tensor.Sum(tensor.Mul(y, y)).Backward()
		defer s.Release()
		return rm.Float32s(), rv.Float32s(), w.Grad().Float32s()
	}
	m0, v0, g0 := run(false)
	m1, v1, g1 := run(true)
	for i := range m0 {
		if m0[i] != m1[i] || v0[i] != v1[i] {
			t.Fatalf("running statistics %v %v with Recompute, %v %v without", m1, v1, m0, v0)
		}
	}
	for i := range g0 {
		if g0[i] != g1[i] {
			t.Fatalf("weight gradient %d: %v with Recompute, %v without", i, g1[i], g0[i])
		}
	}
}

// Each parameter's SetGradReadyHook runs once, when its gradient is
// complete, for parameters read inside a recomputed block and outside it.
func TestRecomputeGradReadyHooks(t *testing.T) {
	c := tensor.NewCountingCPU()
	rng := rand.New(rand.NewPCG(2, 9))
	w1, w2 := randParam(c, rng, 0.5, 5, 5), randParam(c, rng, 0.5, 5, 5)
	calls := map[*tensor.Tensor][]float32{}
	for _, w := range []*tensor.Tensor{w1, w2} {
		w.SetGradReadyHook(func(p *tensor.Tensor) {
			if _, twice := calls[p]; twice {
				t.Errorf("hook ran twice")
			}
			calls[p] = p.Grad().Float32s()
		})
	}
	s := tensor.NewScope()
	s.SetReleaseInBackward(true)
	x := randInput(c, s, rng, 3, 5)
	// w1 inside the block twice and after it; w2 inside only.
	y := tensor.Recompute(func(in ...*tensor.Tensor) *tensor.Tensor {
		return tensor.Tanh(tensor.Linear(tensor.Tanh(tensor.Linear(tensor.Linear(in[0], w1, nil), w2, nil)), w1, nil))
	}, x)
	tensor.Sum(tensor.Linear(y, w1, nil)).Backward()
	for name, w := range map[string]*tensor.Tensor{"w1": w1, "w2": w2} {
		got, ok := calls[w]
		if !ok {
			t.Fatalf("%s: hook did not run", name)
		}
		final := w.Grad().Float32s()
		for i := range final {
			if got[i] != final[i] {
				t.Fatalf("%s: hook saw %v at element %d, final gradient %v", name, got[i], i, final[i])
			}
		}
	}
	s.Release()
}

// Recompute passes gradients to inputs that need them and to none that do
// not, takes several inputs (one of them twice), returns a view of an
// input as it is, and is the function itself without a graph.
func TestRecomputeInputs(t *testing.T) {
	c := tensor.NewCountingCPU()
	rng := rand.New(rand.NewPCG(4, 4))
	a, b := randParam(c, rng, 1, 3, 4), randParam(c, rng, 1, 3, 4)
	s := tensor.NewScope()
	x := randInput(c, s, rng, 3, 4) // no gradient
	f := func(in ...*tensor.Tensor) *tensor.Tensor {
		return tensor.Add(tensor.Mul(in[0], in[1]), tensor.Mul(in[2], in[1]))
	}
	tensor.Sum(tensor.Recompute(f, a, b, x)).Backward()
	ga, gb := a.Grad().Float32s(), b.Grad().Float32s()
	av, bv, xv := a.Float32s(), b.Float32s(), x.Float32s()
	for i := range ga {
		if ga[i] != bv[i] || gb[i] != av[i]+xv[i] {
			t.Fatalf("element %d: gradients %v, %v; want %v, %v", i, ga[i], gb[i], bv[i], av[i]+xv[i])
		}
	}
	if x.Grad() != nil {
		t.Errorf("an input without RequiresGrad got a gradient")
	}
	a.ZeroGrad()
	// The same input twice, and a view of it as the result.
	tensor.Sum(tensor.Mul(tensor.Recompute(func(in ...*tensor.Tensor) *tensor.Tensor {
		return tensor.Add(in[0], in[1]).Reshape(12)
	}, a, a), tensor.Full(c, s, 3, 12))).Backward()
	for i, g := range a.Grad().Float32s() {
		if g != 6 {
			t.Fatalf("element %d: gradient %v of an input given twice; want 6", i, g)
		}
	}
	a.ZeroGrad()
	tensor.Sum(tensor.Recompute(func(in ...*tensor.Tensor) *tensor.Tensor { return in[0].Reshape(12) }, tensor.Mul(a, x))).Backward()
	for i, g := range a.Grad().Float32s() {
		if g != xv[i] {
			t.Fatalf("element %d: gradient %v through a returned view; want %v", i, g, xv[i])
		}
	}
	s.Release()
	ng := tensor.NewNoGradScope()
	y := tensor.Recompute(f, ng.Borrow(a), ng.Borrow(b), ng.Borrow(b))
	if y.RequiresGrad() {
		t.Errorf("Recompute in a no-grad scope made a tensor that requires grad")
	}
	ng.Release()
}
