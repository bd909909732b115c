package nn_test

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// Dropout in training zeroes a fraction p of 20000 ones and scales the
// rest to 1/(1-p); the fraction is within 5 standard deviations
// (√(p(1-p)/n) ≈ 0.0032) of p. The same seed gives the same mask. In
// evaluation, and with p = 0, the input comes back unchanged.
func TestDropoutLayer(t *testing.T) {
	const n, p = 20000, 0.3
	s := tensor.NewScope()
	defer s.Release()
	x := tensor.Full(tensor.CPU, s, 1, n)
	d := nn.NewDropout(p)
	d.Source = tensor.NewGenerator(42)
	if !d.Training() {
		t.Fatal("a new Dropout is not in training mode (torch's modules start in it)")
	}
	y := d.Forward(x).Float32s()
	zeros := 0
	for i, v := range y {
		switch v {
		case 0:
			zeros++
		case float32(1 / (1 - p)):
		default:
			t.Fatalf("y[%d] = %v, want 0 or %v", i, v, float32(1/(1-p)))
		}
	}
	if frac := float64(zeros) / n; math.Abs(frac-p) > 5*math.Sqrt(p*(1-p)/n) {
		t.Errorf("dropped fraction %v, want %v", frac, p)
	}
	d2 := &nn.Dropout{P: p, Source: tensor.NewGenerator(42)}
	if !slices.Equal(d2.Forward(x).Float32s(), y) {
		t.Error("the same seed gave another mask")
	}
	if slices.Equal(d2.Forward(x).Float32s(), y) {
		t.Error("the next draw repeated the mask")
	}
	nn.SetTraining(d, false)
	if got := d.Forward(x); got != x {
		t.Error("Dropout in evaluation mode did not return its input")
	}
	if got := nn.NewDropout(0).Forward(x); got != x {
		t.Error("Dropout(0) did not return its input")
	}
	// Without a source the layer draws from DefaultRandomSource.
	if got := nn.NewDropout(0.5).Forward(x).Float32s(); !slices.Contains(got, 0) {
		t.Error("Dropout(0.5) with the default source dropped nothing of 20000")
	}
	panics(t, "want a value in [0, 1]", func() { nn.NewDropout(1.5) })
}

// Embedding looks up rows of its N(0, 1) table: over 100×100 values the
// mean is within 0.05 of 0 and the standard deviation within 0.05 of 1
// (5 standard errors are 0.05 and 0.035).
func TestEmbeddingLayer(t *testing.T) {
	e := nn.NewEmbedding(tensor.CPU, rand.New(rand.NewPCG(15, 1)), 100, 100)
	defer releaseState(e)
	if got := stateKeys(e); !slices.Equal(got, []string{"weight [100,100]"}) {
		t.Errorf("state dict %v", got)
	}
	w := e.Weight.Float32s()
	mean, sq := 0.0, 0.0
	for _, v := range w {
		mean += float64(v)
		sq += float64(v) * float64(v)
	}
	mean /= float64(len(w))
	std := math.Sqrt(sq/float64(len(w)) - mean*mean)
	if math.Abs(mean) > 0.05 || math.Abs(std-1) > 0.05 {
		t.Errorf("init mean %v, std %v; want N(0, 1)", mean, std)
	}
	s := tensor.NewScope()
	defer s.Release()
	ids := []int32{3, 0, 99, 3, 7, 1}
	y := e.Forward(tensor.FromInt32(tensor.CPU, s, ids, 2, 3))
	if !slices.Equal(y.Shape(), []int{2, 3, 100}) {
		t.Fatalf("shape %v", y.Shape())
	}
	got := y.Float32s()
	for i, id := range ids {
		sameValues(t, "row", got[i*100:(i+1)*100], w[int(id)*100:(int(id)+1)*100], 0)
	}
}

// Residual is x + Fn(x), its child named fn as in torch's
// self.fn = fn.
func TestResidualLayer(t *testing.T) {
	rng := rand.New(rand.NewPCG(16, 1))
	r := nn.NewResidual(nn.NewSequential(nn.NewLinear(tensor.CPU, rng, 4, 4), nn.GELU{}))
	defer releaseState(r)
	if got, want := stateKeys(r), []string{"fn.0.weight [4,4]", "fn.0.bias [4]"}; !slices.Equal(got, want) {
		t.Errorf("state dict %v, want %v", got, want)
	}
	s := tensor.NewScope()
	defer s.Release()
	x := tensor.FromFloat32(tensor.CPU, s, layerNormals(rng, 12), 3, 4)
	sameValues(t, "residual", r.Forward(x).Float32s(), tensor.Add(x, r.Fn.Forward(x)).Float32s(), 0)
}

// convNet is a user's model: a struct of layers, with BatchNorm and
// Dropout inside a Sequential and as fields.
type convNet struct {
	Features *nn.Sequential
	Norm     *nn.BatchNorm1d
	Drop     *nn.Dropout
	Head     *nn.Linear
}

func (m *convNet) Forward(x *tensor.Tensor) *tensor.Tensor {
	return m.Head.Forward(m.Drop.Forward(m.Norm.Forward(m.Features.Forward(x))))
}

// SetTraining reaches every BatchNorm and Dropout of a model, in fields
// and inside a Sequential; the state dict has torch's names.
func TestSetTrainingReachesEveryLayer(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 1))
	m := &convNet{
		Features: nn.NewSequential(
			nn.NewConv2dWith(tensor.CPU, rng, 1, 4, nn.Conv2dOptions{Kernel: [2]int{3, 3}, Padding: [2]int{1, 1}, NoBias: true}),
			nn.NewBatchNorm2d(tensor.CPU, 4), nn.ReLU{}, nn.NewAdaptiveAvgPool2d(1, 1), nn.Flatten{}, nn.NewDropout(0.1)),
		Norm: nn.NewBatchNorm1d(tensor.CPU, 4),
		Drop: nn.NewDropout(0.2),
		Head: nn.NewLinear(tensor.CPU, rng, 4, 3),
	}
	defer releaseState(m)
	type moder interface{ Training() bool }
	layers := []moder{m.Features.Layers[1].Module.(*nn.BatchNorm2d), m.Features.Layers[5].Module.(*nn.Dropout), m.Norm, m.Drop}
	for _, on := range []bool{false, true, false} {
		nn.SetTraining(m, on)
		for i, l := range layers {
			if l.Training() != on {
				t.Errorf("layer %d: training %v after SetTraining(%v)", i, l.Training(), on)
			}
		}
	}
	want := []string{
		"features.0.weight [4,1,3,3]", "features.1.weight [4]", "features.1.bias [4]",
		"norm.weight [4]", "norm.bias [4]", "head.weight [3,4]", "head.bias [3]",
		"features.1.running_mean [4]", "features.1.running_var [4]", "features.1.num_batches_tracked []",
		"norm.running_mean [4]", "norm.running_var [4]", "norm.num_batches_tracked []",
	}
	if got := stateKeys(m); !slices.Equal(got, want) {
		t.Errorf("state dict\n got %v\nwant %v", got, want)
	}
}
