package cuda

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// TestGPUAttentionGPTShape runs the fused attention at the GPT's head shape
// (T = S = 256, D = 64, causal, dropout 0.2 from a DeviceGenerator, inside
// and outside a captured graph) against the CPU's composed operators from
// the same seed: the output and the three gradients must agree normwise
// within 1e-5 (float32 sums of 256 terms in different orders), which they
// can only do if both drop the same weights. A replayed graph must draw a
// new mask (a different output) and leave the generator where two draws
// leave it.
func TestGPUAttentionGPTShape(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	const bsz, heads, T, D, p = 2, 3, 256, 64, 0.2
	rng := rand.New(rand.NewPCG(7, 18))
	shape := []int{bsz, heads, T, D}
	host := make([][]float32, 4)
	for i := range host {
		host[i] = make([]float32, bsz*heads*T*D)
		for j := range host[i] {
			host[i][j] = float32(rng.NormFloat64())
		}
	}
	run := func(be tensor.Backend) (out []float32, grads [3][]float32) {
		s := tensor.NewScope()
		defer s.Release()
		var in [3]*tensor.Tensor
		for i := range in {
			in[i] = tensor.FromFloat32(be, s, host[i], shape...).SetRequiresGrad(true)
		}
		gen := tensor.NewDeviceGenerator(be, 18)
		defer gen.Release()
		y := tensor.ScaledDotProductAttentionDropout(in[0], in[1], in[2], true, 0, p, gen)
		tensor.Sum(tensor.Mul(y, tensor.FromFloat32(be, s, host[3], shape...))).Backward()
		for i := range in {
			grads[i] = in[i].Grad().Float32s()
		}
		return y.Float32s(), grads
	}
	gotOut, gotGrads := run(b)
	wantOut, wantGrads := run(tensor.CPU)
	near := func(what string, got, want []float32) {
		m, worst := 0.0, 0.0
		for i := range want {
			m = math.Max(m, math.Abs(float64(want[i])))
			worst = math.Max(worst, math.Abs(float64(got[i]-want[i])))
		}
		if worst > 1e-5*m {
			t.Errorf("%s: largest difference %g, %g of the largest value %g", what, worst, worst/m, m)
		}
	}
	near("output", gotOut, wantOut)
	for i, name := range []string{"dq", "dk", "dv"} {
		near(name, gotGrads[i], wantGrads[i])
	}

	// Captured: each replay draws at the generator's current offset.
	s := tensor.NewScope()
	defer s.Release()
	q := tensor.FromFloat32(b, nil, host[0], shape...)
	defer q.Release()
	gen := tensor.NewDeviceGenerator(b, 18)
	defer gen.Release()
	var y *tensor.Tensor
	g, err := b.Capture(func() {
		s.Reset()
		x := s.Borrow(q)
		y = tensor.ScaledDotProductAttentionDropout(x, x, x, true, 0, p, gen)
	})
	if err != nil {
		t.Fatalf("Capture: %v", err)
	}
	defer g.Close()
	if err := g.Replay(); err != nil {
		t.Fatal(err)
	}
	first := y.Float32s()
	if err := g.Replay(); err != nil {
		t.Fatal(err)
	}
	second := y.Float32s()
	same := true
	for i := range first {
		same = same && first[i] == second[i]
	}
	if same {
		t.Error("two replays of a captured attention dropped the same weights")
	}
	if _, off := gen.SeedOffset(); off != 2*uint64(bsz*heads*T*T)/4 {
		t.Errorf("generator offset %d after a capture and two replays; want %d", off, 2*bsz*heads*T*T/4)
	}
}
