package models_test

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ember-ml/ember/models"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

func lenetRelease(m nn.Module) {
	for _, p := range nn.Parameters(m) {
		if g := p.Tensor.Grad(); g != nil {
			g.Release()
		}
		p.Tensor.Release()
	}
}

// LeNet's parameters have the names, shapes and order of the PyTorch
// module's state dict, PyTorch's default initialisation bounds
// (±1/sqrt(fan_in)), and depend only on the seed.
func TestLeNetParameters(t *testing.T) {
	m := models.NewLeNet(tensor.CPU, 1)
	defer lenetRelease(m)
	want := []struct {
		name  string
		shape []int
		fanIn int
	}{
		{"conv1.weight", []int{20, 1, 5, 5}, 25}, {"conv1.bias", []int{20}, 25},
		{"conv2.weight", []int{50, 20, 5, 5}, 500}, {"conv2.bias", []int{50}, 500},
		{"fc1.weight", []int{500, 800}, 800}, {"fc1.bias", []int{500}, 800},
		{"fc2.weight", []int{10, 500}, 500}, {"fc2.bias", []int{10}, 500},
	}
	ps := nn.Parameters(m)
	if len(ps) != len(want) {
		t.Fatalf("%d parameters, want %d", len(ps), len(want))
	}
	for i, w := range want {
		p := ps[i]
		if p.Name != w.name || !lenetIntsEqual(p.Tensor.Shape(), w.shape) {
			t.Errorf("parameter %d: %s %v, want %s %v", i, p.Name, p.Tensor.Shape(), w.name, w.shape)
		}
		if !p.Tensor.RequiresGrad() || !p.Tensor.IsLeaf() || p.Tensor.Scope() != nil {
			t.Errorf("%s: requires grad %v, leaf %v, scope %v", p.Name, p.Tensor.RequiresGrad(), p.Tensor.IsLeaf(), p.Tensor.Scope())
		}
		bound := 1 / math.Sqrt(float64(w.fanIn))
		var maxAbs, sum float64
		vals := p.Tensor.Float32s()
		for _, v := range vals {
			maxAbs = math.Max(maxAbs, math.Abs(float64(v)))
			sum += float64(v)
		}
		if maxAbs > bound {
			t.Errorf("%s: |value| up to %g, beyond the init bound %g", p.Name, maxAbs, bound)
		}
		if len(vals) >= 500 && (maxAbs < 0.9*bound || math.Abs(sum/float64(len(vals))) > 0.1*bound) {
			t.Errorf("%s: values do not look uniform in ±%g (max %g, mean %g)", p.Name, bound, maxAbs, sum/float64(len(vals)))
		}
	}
	if n := nn.NumParameters(m); n != 431080 {
		t.Errorf("NumParameters = %d, want 431080", n)
	}

	same := models.NewLeNet(tensor.CPU, 1)
	defer lenetRelease(same)
	other := models.NewLeNet(tensor.CPU, 2)
	defer lenetRelease(other)
	a, b, c := ps[4].Tensor.Float32s(), same.Parameters()[4].Tensor.Float32s(), other.Parameters()[4].Tensor.Float32s()
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("two LeNets with seed 1 differ at fc1.weight[%d]", i)
		}
	}
	if a[0] == c[0] && a[1] == c[1] {
		t.Errorf("seeds 1 and 2 give the same fc1.weight")
	}
}

// Forward maps [N,1,28,28] to [N,10], one image independently of the
// others in the batch.
func TestLeNetForward(t *testing.T) {
	m := models.NewLeNet(tensor.CPU, 5)
	defer lenetRelease(m)
	s := tensor.NewNoGradScope()
	defer s.Release()
	img := make([]float32, 3*784)
	for i := range img {
		img[i] = float32(math.Sin(float64(i)))
	}
	out := m.Forward(tensor.FromFloat32(tensor.CPU, s, img, 3, 1, 28, 28))
	if !lenetIntsEqual(out.Shape(), []int{3, 10}) {
		t.Fatalf("output shape %v", out.Shape())
	}
	one := m.Forward(tensor.FromFloat32(tensor.CPU, s, img[784:1568], 1, 1, 28, 28)).Float32s()
	all := out.Float32s()
	for j := 0; j < 10; j++ {
		if math.Abs(float64(all[10+j]-one[j])) > 1e-5*(1+math.Abs(float64(one[j]))) {
			t.Fatalf("logit %d of image 1: %v in a batch, %v alone", j, all[10+j], one[j])
		}
	}
}

func lenetIntsEqual(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// LeNet's fused kernels are what the Sequential's fusion picks for its
// layers: both convolutions with their ReLU and pooling, fc1 with its ReLU;
// with fusion off every layer runs on its own and computes the same loss.
func TestLeNetFusionPlan(t *testing.T) {
	m := models.NewLeNet(tensor.CPU, 1)
	defer lenetRelease(m)
	want := []string{
		"conv1+relu1+pool1 (conv2d+relu+maxpool2d)",
		"conv2+relu2+pool2 (conv2d+relu+maxpool2d)",
		"flatten",
		"fc1+relu3 (linear+relu)",
		"fc2",
	}
	if got := m.FusionPlan(); !slices.Equal(got, want) {
		t.Errorf("LeNet runs as %q, want %q", got, want)
	}
	s := tensor.NewScope()
	defer s.Release()
	rng := rand.New(rand.NewPCG(2, 2))
	xs := make([]float32, 3*28*28)
	for i := range xs {
		xs[i] = float32(rng.NormFloat64())
	}
	x := tensor.FromFloat32(tensor.CPU, s, xs, 3, 1, 28, 28)
	y := tensor.FromInt32(tensor.CPU, s, []int32{3, 1, 4}, 3)
	fused := m.Loss(x, y).Item()
	nn.SetFusion(m, false)
	if got := m.FusionPlan(); len(got) != 10 {
		t.Errorf("with fusion off LeNet runs as %q, want its 10 layers", got)
	}
	if unfused := m.Loss(x, y).Item(); math.Abs(float64(fused-unfused)) > 1e-6*math.Abs(float64(unfused)) {
		t.Errorf("loss fused %v, unfused %v", fused, unfused)
	}
}
