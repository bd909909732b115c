package trainer_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ember-ml/ember/data"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/nn/trainer"
	"github.com/ember-ml/ember/tensor"
)

// TestEvaluatePerChannel: a set given an augmentation evaluates with its
// per-channel normalisation (and none of the random parts), the inputs
// training saw: the loss equals the model's on explicitly normalised
// images.
func TestEvaluatePerChannel(t *testing.T) {
	b := tensor.CPU
	rng := rand.New(rand.NewPCG(1, 2))
	const n, c, side = 6, 3, 4
	set := &data.Dataset{N: n, Rows: side, Cols: side, Channels: c, Classes: 3,
		Images: make([]uint8, n*c*side*side), Labels: make([]uint8, n)}
	for i := range set.Images {
		set.Images[i] = uint8(rng.IntN(256))
	}
	for i := range set.Labels {
		set.Labels[i] = uint8(i % 3)
	}
	means, stds := []float32{0.2, 0.5, 0.7}, []float32{0.1, 0.3, 0.2}
	im, err := trainer.NewImages(b, set, 0, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer im.Release()
	if err := im.SetAugmentation(&trainer.Augmentation{Mean: means, Std: stds}); err != nil {
		t.Fatal(err)
	}
	m := nn.NewSequential(nn.Flatten{}, nn.NewLinear(b, rng, c*side*side, 3))
	got, _, err := im.Evaluate(m, 4)
	if err != nil {
		t.Fatal(err)
	}
	x := make([]float32, len(set.Images))
	for i, p := range set.Images {
		ch := (i / (side * side)) % c
		x[i] = float32(p)*(1/(255*stds[ch])) + (-means[ch] / stds[ch])
	}
	s := tensor.NewNoGradScope()
	defer s.Release()
	labels := make([]int32, n)
	for i, l := range set.Labels {
		labels[i] = int32(l)
	}
	want := tensor.CrossEntropy(m.Forward(tensor.FromFloat32(b, s, x, n, c, side, side)), tensor.FromInt32(b, s, labels, n)).Item()
	if math.Abs(got-float64(want)) > 1e-5*math.Abs(float64(want)) {
		t.Errorf("Evaluate's loss %v, want %v on per-channel normalised images", got, want)
	}
}
