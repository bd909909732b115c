package nn

import (
	"math/rand/v2"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// Attention dropout acts in training only: with P = 1 every weight is
// dropped, so the heads output zeros and the layer returns the projection's
// bias; in evaluation the layer is the plain attention.
func TestAttentionDropout(t *testing.T) {
	b := tensor.CPU
	rng := rand.New(rand.NewPCG(5, 6))
	a := NewMultiheadSelfAttention(b, rng, 8, 2, true)
	plain := NewMultiheadSelfAttention(b, nil, 8, 2, true)
	plain.QKV, plain.Proj = a.QKV, a.Proj
	a.AttnDrop = NewDropout(1)
	s := tensor.NewNoGradScope()
	defer s.Release()
	x := tensor.FromFloat32(b, s, randomValues(rng, 2*5*8), 2, 5, 8)
	got := a.Forward(x).Float32s()
	bias := a.Proj.Bias.Float32s()
	for i, v := range got {
		if v != bias[i%8] {
			t.Fatalf("training, P = 1: output %d is %v, want the projection's bias %v", i, v, bias[i%8])
		}
	}
	SetTraining(a, false)
	want := plain.Forward(x).Float32s()
	for i, v := range a.Forward(x).Float32s() {
		if v != want[i] {
			t.Fatalf("evaluation: output %d is %v, want the plain attention's %v", i, v, want[i])
		}
	}
	if names(Parameters(a)) == nil || len(Buffers(a)) != 0 {
		t.Errorf("attention dropout added state: %v", names(Buffers(a)))
	}
}

func randomValues(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}
