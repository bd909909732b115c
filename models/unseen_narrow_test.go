package models_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ember-ml/ember/cuda"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// narrowResNet is a CIFAR-style residual network in float32 with fewer
// channels than the GPU has SMs: at batch 128 its batch norms normalise
// [128,16,32,32] (channels too large for one block: the split path),
// [128,32,16,16] (32 channels of 128 KiB: thread block clusters) and
// [128,64,8,8] (64 channels of 32 KiB: a block a channel), so that every
// training path of batch norm runs in one model. The same weights on any
// backend (one seeded generator).
func narrowResNet(b tensor.Backend) *nn.Sequential {
	rng := rand.New(rand.NewPCG(31, 37))
	block := func(in, out, stride int) *nn.Sequential {
		return nn.NewSequential(squareConv(b, rng, in, out, 3, stride, 1), nn.NewBatchNorm2d(b, out), nn.ReLU{})
	}
	return nn.NewSequential(
		block(3, 16, 1),
		block(16, 32, 2), // 16x16
		nn.NewResidual(block(32, 32, 1)),
		block(32, 64, 2), // 8x8
		nn.NewResidual(block(64, 64, 1)),
		nn.NewAdaptiveAvgPool2d(1, 1), nn.Flatten{},
		nn.NewLinear(b, rng, 64, 10),
	)
}

// TestUnseenNarrowResNetGPU: narrowResNet's loss and every gradient on the
// GPU in float32 against the CPU's from the same weights and batch (within
// 1e-4 of the loss and 1e-3 of each gradient's largest magnitude), and 40
// SGD steps on a few random batches on the GPU halve its loss.
func TestUnseenNarrowResNetGPU(t *testing.T) {
	requireGPU(t)
	const bs, batches, side = 128, 2, 32
	rng := rand.New(rand.NewPCG(41, 43))
	images := normals(rng, batches*bs*3*side*side)
	labels := make([]int32, batches*bs)
	for i := range labels {
		labels[i] = int32(rng.IntN(10))
	}
	run := func(b tensor.Backend, m *nn.Sequential, i int) (float32, [][]float32) {
		s := tensor.NewScope()
		defer s.Release()
		params := nn.Parameters(m)
		for _, p := range params {
			p.Tensor.ClearGrad()
		}
		n := bs * 3 * side * side
		loss := m.CrossEntropyLoss(tensor.FromFloat32(b, s, images[i*n:(i+1)*n], bs, 3, side, side),
			tensor.FromInt32(b, s, labels[i*bs:(i+1)*bs], bs))
		loss.Backward()
		var grads [][]float32
		for _, p := range params {
			grads = append(grads, p.Tensor.Grad().Float32s())
		}
		return loss.Item(), grads
	}
	wantLoss, want := run(tensor.CPU, narrowResNet(tensor.CPU), 0)

	b := newGPU(t, cuda.BackendOptions{})
	defer b.Close()
	m := narrowResNet(b)
	loss, got := run(b, m, 0)
	if d := math.Abs(float64(loss - wantLoss)); d > 1e-4*math.Abs(float64(wantLoss)) {
		t.Errorf("loss %v on the GPU, %v on the CPU", loss, wantLoss)
	}
	for i, p := range nn.Parameters(m) {
		var scale float64
		for _, v := range want[i] {
			scale = math.Max(scale, math.Abs(float64(v)))
		}
		if d := maxAbsDiff(got[i], want[i]); d > 1e-3*scale {
			t.Errorf("%s's gradient differs by %g (largest magnitude %g)", p.Name, d, scale)
		}
	}

	sgd, err := optim.NewSGD(nn.Parameters(m), optim.SGDConfig{LR: 0.05, Momentum: 0.9})
	if err != nil {
		t.Fatal(err)
	}
	defer sgd.Release()
	var last float32
	for step := range 40 {
		l, _ := run(b, m, step%batches)
		sgd.Step()
		last = l
	}
	t.Logf("first loss %.5f (CPU %.5f), after 40 steps %.5f", loss, wantLoss, last)
	if !(last < loss/2) {
		t.Errorf("40 SGD steps took the loss from %v to %v; want under half", loss, last)
	}
}
