package models_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ember-ml/ember/cuda"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/nn/trainer"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// squareConv is a convolution of k×k kernels drawn from rng, padded by
// k/2, without a bias: the unseen networks' layers.
func squareConv(b tensor.Backend, rng *rand.Rand, in, out, k, stride, groups int) *nn.Conv2d {
	return nn.NewConv2dWith(b, rng, in, out, nn.Conv2dOptions{Kernel: [2]int{k, k}, Stride: [2]int{stride, stride},
		Padding: [2]int{k / 2, k / 2}, Groups: groups, NoBias: true})
}

// mobileNetLike is a network none of the package's models is: a strided
// stem, depthwise-separable blocks (a depthwise 3x3 of one channel per
// group, then a pointwise 1x1) with a residual connection, SiLU, odd
// channel counts (12, 20) beside ones tensor cores take (16, 32, 48),
// adaptive average pooling, dropout and a linear head; the same weights
// on any backend (one seeded generator).
func mobileNetLike(b tensor.Backend) *nn.Sequential {
	rng := rand.New(rand.NewPCG(7, 11))
	conv := func(in, out, k, stride, groups int) *nn.Conv2d { return squareConv(b, rng, in, out, k, stride, groups) }
	separable := func(in, out, stride int) *nn.Sequential {
		return nn.NewSequential(conv(in, in, 3, stride, in), nn.NewBatchNorm2d(b, in), nn.SiLU{},
			conv(in, out, 1, 1, 1), nn.NewBatchNorm2d(b, out), nn.SiLU{})
	}
	return nn.NewSequential(
		conv(3, 16, 3, 2, 1), nn.NewBatchNorm2d(b, 16), nn.SiLU{}, // 16x16
		separable(16, 12, 1),
		separable(12, 20, 2), // 8x8
		nn.NewResidual(separable(20, 20, 1)),
		separable(20, 32, 1),
		conv(32, 48, 3, 2, 2), nn.NewBatchNorm2d(b, 48), nn.SiLU{}, // grouped, 4x4
		nn.NewAdaptiveAvgPool2d(1, 1), nn.Flatten{}, nn.NewDropout(0.1),
		nn.NewLinear(b, rng, 48, 10),
	)
}

// TestUnseenConvNetGPU trains mobileNetLike on the GPU with cuDNN, in
// bfloat16 autocast, its step captured: the first loss agrees with the
// CPU's float32 one from the same weights and batch, the convolution
// searches ran (the depthwise and odd-channel geometries among them), and
// the net memorises a few random batches.
func TestUnseenConvNetGPU(t *testing.T) {
	requireGPU(t)
	const bs, batches, epochs, side = 64, 4, 20, 32
	rng := rand.New(rand.NewPCG(3, 5))
	images := make([]float32, batches*bs*3*side*side)
	for i := range images {
		images[i] = float32(rng.NormFloat64())
	}
	labels := make([]int32, batches*bs)
	for i := range labels {
		labels[i] = int32(rng.IntN(10))
	}
	batch := func(i int) ([]float32, []int32) {
		n := bs * 3 * side * side
		return images[i*n : (i+1)*n], labels[i*bs : (i+1)*bs]
	}

	// The CPU's first loss, float32.
	cpu := tensor.CPU
	mc := mobileNetLike(cpu)
	x0, y0 := batch(0)
	s := tensor.NewScope()
	want := mc.CrossEntropyLoss(tensor.FromFloat32(cpu, s, x0, bs, 3, side, side), tensor.FromInt32(cpu, s, y0, bs)).Item()
	s.Release()

	b := newGPU(t, cuda.BackendOptions{})
	defer b.Close()
	if _, err := b.CuDNN(); err != nil {
		t.Skipf("cuDNN: %v", err)
	}
	m := mobileNetLike(b)
	sgd, err := optim.NewSGD(nn.Parameters(m), optim.SGDConfig{LR: 0.05, Momentum: 0.9, Nesterov: true, WeightDecay: 5e-4})
	if err != nil {
		t.Fatal(err)
	}
	defer sgd.Release()
	x, y := tensor.Zeros(b, nil, bs, 3, side, side), tensor.FromInt32(b, nil, make([]int32, bs), bs)
	defer x.Release()
	defer y.Release()
	sgd.ZeroGrad()
	st, err := trainer.CaptureStep(b, func(s *tensor.Scope) *tensor.Tensor {
		loss := m.CrossEntropyLoss(s.Borrow(x), y)
		loss.Backward()
		sgd.StepAndZeroGrad()
		return loss
	}, trainer.StepOptions{Optimizer: sgd, Autocast: tensor.BFloat16, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var first, last float64
	for e := range epochs {
		var sum float64
		for i := range batches {
			xi, yi := batch(i)
			b.Upload(x.Buffer(), xi)
			b.Upload(y.Buffer(), yi)
			loss, err := st.Run(bs)
			if err != nil {
				t.Fatal(err)
			}
			l := float64(loss.Item())
			if e == 0 && i == 0 {
				first = l
			}
			sum += l
		}
		last = sum / batches
	}
	n, took := b.ConvSearches()
	t.Logf("first loss %.5f (CPU float32 %.5f), last epoch's mean %.4f; %d convolution searches in %v", first, want, last, n, took)
	if d := math.Abs(first - float64(want)); d > 0.02*math.Abs(float64(want)) {
		t.Errorf("first loss %.5f on the GPU (bfloat16), %.5f on the CPU (float32): differ by more than 2%%", first, want)
	}
	if n == 0 {
		t.Error("no convolution algorithm search ran")
	}
	if !(last < 0.5*first) {
		t.Errorf("the last epoch's mean loss %.4f is not below half the first loss %.4f: the net does not learn its four batches", last, first)
	}
}

// seNet is a second network none of the package's models is, built from
// the core operations rather than layers: convolutions with biases, a
// squeeze-and-excitation gate (the mean of each plane, two small linear
// layers, a sigmoid, the planes scaled by it through broadcasting), GELU,
// the activations centred per channel over the batch and the plane (a mean
// over (0, 2, 3) kept as [1, C, 1, 1]), and global average pooling. Its
// backward pass sums the broadcast gradients over the same axes.
type seNet struct {
	Conv1, Conv2    *nn.Conv2d
	Squeeze, Excite *nn.Linear
	Head            *nn.Linear
}

// newSENet makes a seNet whose second convolution has width channels.
func newSENet(b tensor.Backend, width int) *seNet {
	rng := rand.New(rand.NewPCG(5, 9))
	conv := func(in, out, stride int) *nn.Conv2d {
		return nn.NewConv2dWith(b, rng, in, out, nn.Conv2dOptions{Kernel: [2]int{3, 3}, Stride: [2]int{stride, stride}, Padding: [2]int{1, 1}})
	}
	return &seNet{Conv1: conv(3, 16, 1), Conv2: conv(16, width, 2),
		Squeeze: nn.NewLinear(b, rng, 16, 4), Excite: nn.NewLinear(b, rng, 4, 16), Head: nn.NewLinear(b, rng, width, 10)}
}

func (m *seNet) Forward(x *tensor.Tensor) *tensor.Tensor {
	h := tensor.ReLU(m.Conv1.Forward(x))
	gate := tensor.Sigmoid(m.Excite.Forward(tensor.ReLU(m.Squeeze.Forward(tensor.MeanAxes(h, []int{2, 3}, false)))))
	h = tensor.Mul(h, gate.Reshape(gate.Shape()[0], 16, 1, 1))
	h = tensor.GELU(m.Conv2.Forward(h), false)
	h = tensor.Sub(h, tensor.MeanAxes(h, []int{0, 2, 3}, true))
	return m.Head.Forward(tensor.MeanAxes(h, []int{2, 3}, false))
}

// TestUnseenSENetGPU runs seNet's loss and gradients in float32 on the GPU
// and the CPU from the same weights and batch (8 images of 32x32), at two
// widths of its second convolution: 24 channels, whose per-channel means
// (and their broadcast gradients) read rows of 256 floats split over
// blocks joined by the last to arrive, and 72, which a block a channel
// sums: the loss within 1e-5 and every gradient within 1e-4 of its largest
// magnitude. Then 30 eager SGD steps on the GPU take a fifth off the loss.
func TestUnseenSENetGPU(t *testing.T) {
	requireGPU(t)
	for _, width := range []int{24, 72} {
		t.Run(fmt.Sprintf("width%d", width), func(t *testing.T) { testSENetGPU(t, width) })
	}
}

func testSENetGPU(t *testing.T, width int) {
	const bs, side = 8, 32
	rng := rand.New(rand.NewPCG(4, 6))
	xv, yv := normals(rng, bs*3*side*side), randomLabels(rng, bs, 10)
	run := func(b tensor.Backend, m *seNet) (float32, [][]float32) {
		s := tensor.NewScope()
		defer s.Release()
		nn.ZeroGrad(m)
		loss := tensor.CrossEntropy(m.Forward(tensor.FromFloat32(b, s, xv, bs, 3, side, side)), tensor.FromInt32(b, s, yv, bs))
		loss.Backward()
		var grads [][]float32
		for _, p := range nn.Parameters(m) {
			grads = append(grads, p.Tensor.Grad().Float32s())
		}
		return loss.Item(), grads
	}
	wantLoss, want := run(tensor.CPU, newSENet(tensor.CPU, width))

	b := newGPU(t, cuda.BackendOptions{})
	defer b.Close()
	m := newSENet(b, width)
	loss, got := run(b, m)
	if d := math.Abs(float64(loss - wantLoss)); d > 1e-5*math.Abs(float64(wantLoss)) {
		t.Errorf("loss %v on the GPU, %v on the CPU", loss, wantLoss)
	}
	params := nn.Parameters(m)
	for i := range want {
		var scale float64
		for _, v := range want[i] {
			scale = math.Max(scale, math.Abs(float64(v)))
		}
		if d := maxAbsDiff(got[i], want[i]); d > 1e-4*scale {
			t.Errorf("%s's gradient differs by %g (largest magnitude %g)", params[i].Name, d, scale)
		}
	}

	sgd, err := optim.NewSGD(params, optim.SGDConfig{LR: 0.3, Momentum: 0.9})
	if err != nil {
		t.Fatal(err)
	}
	defer sgd.Release()
	first := loss
	for range 30 {
		loss, _ = run(b, m)
		sgd.Step()
	}
	t.Logf("loss %.5f (CPU %.5f), %.5f after 30 steps", first, wantLoss, loss)
	if !(loss < 0.8*first) { // on the CPU: width 24 2.358 to 1.728, width 72 2.323 to 1.712
		t.Errorf("loss %v after 30 steps from %v: seNet does not learn its batch", loss, first)
	}
}

// grayGELUNet is a third network none of the package's models is, for the
// channels-last form under autocast: a strided first layer on one channel
// with a bias (the form's tensor-core direct convolution, 32 channels),
// GELU, max pooling into batch norm with GELU (the fused pass), a layer of
// 40 channels (five groups of eight a row) with batch norm and GELU, and a
// linear head.
func grayGELUNet(b tensor.Backend) *nn.Sequential {
	rng := rand.New(rand.NewPCG(13, 17))
	conv := func(in, out, stride int, bias bool) *nn.Conv2d {
		return nn.NewConv2dWith(b, rng, in, out, nn.Conv2dOptions{Kernel: [2]int{3, 3}, Stride: [2]int{stride, stride},
			Padding: [2]int{1, 1}, NoBias: !bias})
	}
	return nn.NewSequential(
		conv(1, 32, 2, true), nn.GELU{}, // 10x10
		conv(32, 48, 1, false), nn.NewMaxPool2d(2), nn.NewBatchNorm2d(b, 48), nn.GELU{}, // 5x5
		conv(48, 40, 1, false), nn.NewBatchNorm2d(b, 40), nn.GELU{},
		nn.NewMaxPool2d(5), nn.Flatten{},
		nn.NewLinear(b, rng, 40, 10),
	)
}

// TestUnseenChannelsLastNetGPU trains grayGELUNet on the GPU eagerly in
// bfloat16 autocast with activations held channels-last: the first loss
// agrees with the CPU's float32 one from the same weights and batch, and
// the net memorises a few random batches.
func TestUnseenChannelsLastNetGPU(t *testing.T) {
	requireGPU(t)
	const bs, batches, epochs, side = 32, 3, 25, 20
	images, labels := randomBatches(8, batches, bs, side)
	batch := func(i int) ([]float32, []int32) {
		n := bs * side * side
		return images[i*n : (i+1)*n], labels[i*bs : (i+1)*bs]
	}

	cpu := tensor.CPU
	x0, y0 := batch(0)
	s := tensor.NewScope()
	want := grayGELUNet(cpu).CrossEntropyLoss(tensor.FromFloat32(cpu, s, x0, bs, 1, side, side), tensor.FromInt32(cpu, s, y0, bs)).Item()
	s.Release()

	b := newGPU(t, cuda.BackendOptions{})
	defer b.Close()
	if _, err := b.CuDNN(); err != nil {
		t.Skipf("cuDNN: %v", err)
	}
	m := grayGELUNet(b)
	sgd, err := optim.NewSGD(nn.Parameters(m), optim.SGDConfig{LR: 0.05, Momentum: 0.9, Nesterov: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sgd.Release()
	s = tensor.NewScope()
	defer s.Release()
	s.SetAutocast(tensor.BFloat16)
	s.SetChannelsLast(true)
	var first, last float64
	for e := range epochs {
		var sum float64
		for i := range batches {
			xi, yi := batch(i)
			s.Reset()
			sgd.ZeroGrad()
			loss := m.CrossEntropyLoss(tensor.FromFloat32(b, s, xi, bs, 1, side, side), tensor.FromInt32(b, s, yi, bs))
			loss.Backward()
			sgd.Step()
			l := float64(loss.Item())
			if e == 0 && i == 0 {
				first = l
			}
			sum += l
		}
		last = sum / batches
	}
	t.Logf("first loss %.5f (CPU float32 %.5f), last epoch's mean %.4f", first, want, last)
	if d := math.Abs(first - float64(want)); d > 0.02*math.Abs(float64(want)) {
		t.Errorf("first loss %.5f on the GPU (bfloat16, channels-last), %.5f on the CPU (float32): differ by more than 2%%", first, want)
	}
	if !(last < 0.5*first) {
		t.Errorf("the last epoch's mean loss %.4f is not below half the first loss %.4f: the net does not learn its batches", last, first)
	}
}
