package nn

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

func TestFansAndGains(t *testing.T) {
	if in, out := Fans([]int{64, 32, 3, 3}); in != 288 || out != 576 {
		t.Errorf("Fans(conv 64x32x3x3) = %d, %d; want 288, 576", in, out)
	}
	if in, out := Fans([]int{10, 500}); in != 500 || out != 10 {
		t.Errorf("Fans(linear 10x500) = %d, %d; want 500, 10", in, out)
	}
	// torch.nn.init.calculate_gain('leaky_relu', 0.2) = sqrt(2/1.04).
	if g := Gain("leaky_relu", 0.2); math.Abs(g-math.Sqrt(2/1.04)) > 1e-15 {
		t.Errorf("Gain(leaky_relu, 0.2) = %v", g)
	}
}

// The sample moments of 64k draws match the distributions' to within a few
// standard errors (the standard error of a variance estimate from n draws
// is about σ²·√(2/n) ≈ 0.6% here; we allow 3%).
func TestInitialiserMoments(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	w := tensor.Empty(tensor.CPU, nil, 256, 128, 2) // fan_in 256, fan_out 512
	check := func(name string, wantVar float64, wantMax float64) {
		t.Helper()
		v := w.Float32s()
		var s, s2, mx float64
		for _, x := range v {
			s += float64(x)
			s2 += float64(x) * float64(x)
			mx = math.Max(mx, math.Abs(float64(x)))
		}
		n := float64(len(v))
		mean, variance := s/n, s2/n-(s/n)*(s/n)
		if math.Abs(mean) > 3*math.Sqrt(wantVar/n)+1e-12 || math.Abs(variance/wantVar-1) > 0.03 {
			t.Errorf("%s: mean %.3g variance %.4g, want 0 and %.4g", name, mean, variance, wantVar)
		}
		if wantMax > 0 && mx > wantMax {
			t.Errorf("%s: |x| reaches %v, above the bound %v", name, mx, wantMax)
		}
	}
	KaimingUniform(w, rng, 0, "fan_in", "relu")
	b := math.Sqrt2 * math.Sqrt(3.0/256)
	check("kaiming_uniform", b*b/3, b)
	KaimingNormal(w, rng, 0, "fan_out", "relu")
	check("kaiming_normal", 2.0/512, 0)
	XavierUniform(w, rng, 1)
	xb := math.Sqrt(6.0 / (256 + 512))
	check("xavier_uniform", xb*xb/3, xb)
	XavierNormal(w, rng, 1)
	check("xavier_normal", 2.0/(256+512), 0)
	Constant(w, 0.5)
	for _, x := range w.Float32s() {
		if x != 0.5 {
			t.Fatalf("Constant(0.5) left %v", x)
		}
	}
}
