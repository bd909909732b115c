package models_test

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ember-ml/ember/cuda"
	"github.com/ember-ml/ember/data"
	"github.com/ember-ml/ember/models"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// The zoo's GPU benchmark: each workload of zoo.py (the PyTorch anchors)
// run the same way with the same model, batch size, optimiser and schedule,
// printing zoo.py's JSON lines plus the GPU memory it reserved at peak.
//
//	EMBER_ZOO=resnet9 EMBER_ZOO_FMNIST=DIR [EMBER_ZOO_EPOCHS=8] go test ./models -run TestZooGPU -v -timeout 1h
//	EMBER_ZOO=airbench go test ./models -run TestZooGPU -v
//	EMBER_ZOO=gpt EMBER_ZOO_CORPUS=FILE go test ./models -run TestZooGPU -v
//
// EMBER_ZOO=all runs the three (resnet9 and gpt only when their data is
// given). It skips without a GPU or without EMBER_ZOO. EMBER_ZOO_TF32=1
// lets cuBLAS use TF32 (torch's "fp32" mode leaves cuDNN convolutions on
// TF32 but not matrix products). EMBER_ZOO_GRAPH=0 launches every step
// eagerly instead of replaying a captured CUDA graph.
func TestZooGPU(t *testing.T) {
	what := os.Getenv("EMBER_ZOO")
	if what == "" {
		t.Skip("EMBER_ZOO is not set (resnet9, airbench, gpt or all)")
	}
	if err := cuda.Available(); err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	opt, err := cuda.OptionsFromEnv(cuda.BackendOptions{TF32: os.Getenv("EMBER_ZOO_TF32") == "1"})
	if err != nil {
		t.Fatal(err)
	}
	runs := map[string]func(*testing.T, *cuda.Backend){"resnet9": zooResNet9, "airbench": zooAirbench, "gpt": zooGPT}
	var names []string
	switch what {
	case "all":
		names = []string{"airbench"}
		if os.Getenv("EMBER_ZOO_FMNIST") != "" {
			names = append(names, "resnet9")
		}
		if os.Getenv("EMBER_ZOO_CORPUS") != "" {
			names = append(names, "gpt")
		}
	case "resnet9", "airbench", "gpt":
		names = []string{what}
	default:
		t.Fatalf("EMBER_ZOO=%q; want resnet9, airbench, gpt or all", what)
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			b, err := cuda.NewBackend(0, opt)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			runs[name](t, b)
		})
	}
}

// zooOut prints one JSON line as zoo.py's out does, with mode "ember".
func zooOut(t *testing.T, what string, kv ...any) {
	m := map[string]any{"what": what, "mode": "ember"}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	line, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println(string(line))
}

func mib(n int) float64 { return math.Round(float64(n)/(1<<20)*10) / 10 }

func zooSync(t *testing.T, b *cuda.Backend) {
	t.Helper()
	if err := b.Synchronize(); err != nil {
		t.Fatal(err)
	}
}

// replayer is what an optimiser offers for a captured step (SGD, Adam).
type replayer interface {
	Replayable() bool
	Replayed()
	Rewind()
	Steps() int
}

// zooStepper runs a training step eagerly or, after capturing it once, by
// replaying its CUDA graph, as cmd/train's stepper does. step queues the
// work (no host transfers) and returns the loss; the caller does the
// host's part (uploads, the optimiser's Prepare) before each run.
type zooStepper struct {
	b      *cuda.Backend
	scope  *tensor.Scope
	step   func(s *tensor.Scope) *tensor.Tensor
	opt    replayer
	graph  *cuda.StepGraph
	loss   *tensor.Tensor
	try    bool
	logged string
}

func newZooStepper(b *cuda.Backend, opt replayer, step func(s *tensor.Scope) *tensor.Tensor) *zooStepper {
	return &zooStepper{b: b, scope: tensor.NewScope(), step: step, opt: opt, try: os.Getenv("EMBER_ZOO_GRAPH") != "0"}
}

// scoped copies x into a new tensor of s: the operations on it put their
// results in s too, so that resetting s frees a step's tensors (the fixed
// input tensors a captured step reads belong to no scope).
func scoped(s *tensor.Scope, x *tensor.Tensor) *tensor.Tensor {
	c := tensor.EmptyOf(x.Backend(), s, x.DType(), x.Shape()...)
	tensor.CopyTensor(c, x)
	return c
}

func (z *zooStepper) eager() *tensor.Tensor {
	z.scope.Reset()
	return z.step(z.scope)
}

func (z *zooStepper) run() *tensor.Tensor {
	if z.graph != nil {
		if err := z.graph.Replay(); err != nil {
			panic(err)
		}
		z.opt.Replayed()
		return z.loss
	}
	if z.try && z.opt.Replayable() {
		z.try = false
		before := z.opt.Steps()
		var loss *tensor.Tensor
		g, err := z.b.Capture(func() { loss = z.eager() })
		if err == nil {
			z.graph, z.loss, z.logged = g, loss, "captured"
			return z.run()
		}
		if z.opt.Steps() > before {
			z.opt.Rewind()
		}
		z.logged = "capture failed: " + strings.ReplaceAll(err.Error(), "\n", " ")
	}
	if z.logged == "" {
		z.logged = "eager"
	}
	return z.eager()
}

func (z *zooStepper) close() {
	if z.graph != nil {
		z.graph.Close()
	}
	z.scope.Release()
}

// zooResNet9 is zoo.py's resnet9 case: Fashion-MNIST normalised by the
// training set's mean and (unbiased) standard deviation, batch 512, SGD
// (lr 0.2, Nesterov momentum 0.9, weight decay 5e-4 on every parameter)
// under OneCycleLR (max 0.2, pct_start 0.25, linear annealing, momentum
// cycled between 0.85 and 0.95 as torch's cycle_momentum default does),
// label smoothing 0.1 on logits·0.125, a random translation by up to 2
// pixels (zero padding of the normalised images, then a crop) and a
// horizontal flip with probability 1/2 drawn afresh every epoch.
//
// The augmentation is made on the host with a seeded generator and
// uploaded once per epoch (this branch has no augmentation op on the
// device); its time is reported apart ("augment_s"), and "s" counts the
// upload and the steps. The steps run eagerly: the cycled momentum is a
// launch argument of the SGD kernel, so a captured step would keep the
// momentum of its capture.
func zooResNet9(t *testing.T, b *cuda.Backend) {
	dir := os.Getenv("EMBER_ZOO_FMNIST")
	if dir == "" {
		t.Skip("EMBER_ZOO_FMNIST is not set (a directory with Fashion-MNIST's four files)")
	}
	epochs := 8
	if v := os.Getenv("EMBER_ZOO_EPOCHS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("EMBER_ZOO_EPOCHS=%q; want a positive whole number", v)
		}
		epochs = n
	}
	train, test, err := data.LoadFashionMNIST(dir)
	if err != nil {
		t.Logf("not the canonical Fashion-MNIST (%v); reading the MNIST layout", err)
		if train, test, err = data.LoadMNIST(dir); err != nil {
			t.Fatal(err)
		}
	}
	const side, pad, bs = 28, 2, 512
	mu, sd := meanStd(train.Images)
	normalise := func(px []uint8) []float32 {
		out := make([]float32, len(px))
		for i, p := range px {
			out[i] = (float32(p)/255 - mu) / sd
		}
		return out
	}
	trainX := normalise(train.Images)
	testX := tensor.FromFloat32(b, nil, normalise(test.Images), test.N, 1, side, side)
	defer testX.Release()
	labels := make([]int32, train.N)
	for i, l := range train.Labels {
		labels[i] = int32(l)
	}
	trainY := tensor.FromInt32(b, nil, labels, train.N)
	defer trainY.Release()

	m := models.NewResNet9(b, 1, models.DefaultResNet9Config())
	defer m.Release()
	stepsPerEpoch := train.N / bs
	sgd, err := optim.NewSGD(nn.Parameters(m), optim.SGDConfig{LR: 0.2, Momentum: 0.9, Nesterov: true, WeightDecay: 5e-4})
	if err != nil {
		t.Fatal(err)
	}
	defer sgd.Release()
	sched := optim.NewOneCycleLR(0.2, epochs*stepsPerEpoch)
	sched.PctStart, sched.AnnealLinear = 0.25, true

	rng := rand.New(rand.NewPCG(1, 1))
	augmented := make([]float32, len(trainX))
	idx := make([]int32, bs)
	scope := tensor.NewScope()
	defer scope.Release()
	sgd.ZeroGrad()
	step := 0
	for e := range epochs {
		nn.SetTraining(m, true)
		augStart := time.Now()
		augmentTranslateFlip(augmented, trainX, train.N, side, pad, rng)
		perm := rng.Perm(train.N)
		augSecs := time.Since(augStart).Seconds()
		zooSync(t, b)
		start := time.Now()
		xa := tensor.FromFloat32(b, nil, augmented, train.N, 1, side, side)
		var loss *tensor.Tensor
		for i := range stepsPerEpoch {
			for j := range idx {
				idx[j] = int32(perm[i*bs+j])
			}
			scope.Reset()
			batch := tensor.FromInt32(b, scope, idx, bs) // the step's tensors join its scope
			sgd.SetLR(sched.LR(step))
			sgd.Momentum = sched.Momentum(step)
			loss = m.Loss(tensor.IndexSelect(xa, 0, batch), tensor.IndexSelect(trainY, 0, batch))
			loss.Backward()
			sgd.StepAndZeroGrad()
			step++
		}
		zooSync(t, b)
		secs := time.Since(start).Seconds()
		lastLoss := loss.Item()
		xa.Release()
		acc := zooAccuracy(m, testX, test.Labels, 2000)
		zooOut(t, "resnet9", "epoch", e+1, "s", round(secs, 3), "augment_s", round(augSecs, 3), "loss", round(float64(lastLoss), 4),
			"test_acc", acc, "peak_reserved_mib", mib(b.MemoryStats().Reserved.Peak), "step", "eager")
	}
}

// meanStd is the mean and unbiased standard deviation of the pixels /255,
// as torch's Xtr.mean() and Xtr.std().
func meanStd(px []uint8) (float32, float32) {
	var sum, sq float64
	for _, p := range px {
		v := float64(p) / 255
		sum += v
		sq += v * v
	}
	n := float64(len(px))
	mean := sum / n
	return float32(mean), float32(math.Sqrt((sq - n*mean*mean) / (n - 1)))
}

// augmentTranslateFlip writes into dst each of the n one-channel images of
// src (side×side) shifted as zoo.py does: padded by pad zeros on each
// side, cropped at a random offset (dy, dx) in [0, 2·pad], and mirrored
// left to right with probability 1/2.
func augmentTranslateFlip(dst, src []float32, n, side, pad int, rng *rand.Rand) {
	for i := range n {
		dy, dx := rng.IntN(2*pad+1)-pad, rng.IntN(2*pad+1)-pad
		flip := rng.IntN(2) == 1
		img, out := src[i*side*side:(i+1)*side*side], dst[i*side*side:(i+1)*side*side]
		for r := range side {
			for c := range side {
				sc := c
				if flip {
					sc = side - 1 - c
				}
				y, x := r+dy, sc+dx
				v := float32(0)
				if y >= 0 && y < side && x >= 0 && x < side {
					v = img[y*side+x]
				}
				out[r*side+c] = v
			}
		}
	}
}

// zooAccuracy is the percentage of test images (on the device) whose
// largest logit is their label, in evaluation mode, in batches.
func zooAccuracy(m *models.ResNet9, x *tensor.Tensor, labels []uint8, batch int) float64 {
	nn.SetTraining(m, false)
	defer nn.SetTraining(m, true)
	n, correct := x.Dim(0), 0
	for start := 0; start < n; start += batch {
		k := min(batch, n-start)
		s := tensor.NewNoGradScope()
		xs := tensor.Empty(x.Backend(), s, k, x.Dim(1), x.Dim(2), x.Dim(3)) // in s, so is all that derives from it
		tensor.CopyTensor(xs, x.Narrow(0, start, k))
		pred := tensor.Argmax(m.Logits(xs)).Int32s()
		for i, p := range pred {
			if p == int32(labels[start+i]) {
				correct++
			}
		}
		s.Release()
	}
	return float64(correct) * 100 / float64(n)
}

func round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

// zooAirbench is zoo.py's airbench case: N(0, 1) images [50000, 3, 32,
// 32] and random labels on the device, batch 1024, SGD (lr 0.1, Nesterov
// momentum 0.85, weight decay 5e-4), label smoothing 0.2 on logits / 9,
// three epochs timed. Each batch is copied into the captured step's input
// tensors on the device before its replay.
func zooAirbench(t *testing.T, b *cuda.Backend) {
	const n, bs = 50000, 1024
	gen := tensor.NewGenerator(1)
	x := tensor.RandN(b, nil, gen, n, 3, 32, 32)
	defer x.Release()
	rng := rand.New(rand.NewPCG(1, 2))
	y := tensor.FromInt32(b, nil, randomLabels(rng, n, 10), n)
	defer y.Release()
	xb, yb := tensor.Zeros(b, nil, bs, 3, 32, 32), tensor.FromInt32(b, nil, make([]int32, bs), bs)
	defer xb.Release()
	defer yb.Release()

	m := models.NewAirbench(b, 1, models.DefaultAirbenchConfig())
	defer m.Release()
	sgd, err := optim.NewSGD(nn.Parameters(m), optim.SGDConfig{LR: 0.1, Momentum: 0.85, Nesterov: true, WeightDecay: 5e-4})
	if err != nil {
		t.Fatal(err)
	}
	defer sgd.Release()
	sgd.ZeroGrad()
	st := newZooStepper(b, sgd, func(s *tensor.Scope) *tensor.Tensor {
		loss := m.Loss(scoped(s, xb), yb)
		loss.Backward()
		sgd.StepAndZeroGrad()
		return loss
	})
	defer st.close()
	for e := range 3 {
		zooSync(t, b)
		start := time.Now()
		var loss *tensor.Tensor
		for i := range n / bs {
			tensor.CopyTensor(xb, x.Narrow(0, i*bs, bs))
			tensor.CopyTensor(yb, y.Narrow(0, i*bs, bs))
			loss = st.run()
		}
		zooSync(t, b)
		secs := time.Since(start).Seconds()
		zooOut(t, "airbench", "epoch", e+1, "s", round(secs, 4), "loss", round(float64(loss.Item()), 4),
			"peak_reserved_mib", mib(b.MemoryStats().Reserved.Peak), "step", st.logged)
	}
}

// zooGPT is zoo.py's gpt case: the corpus's bytes as tokens (the distinct
// bytes, sorted, as the vocabulary), the first 90% for training, random
// windows of 256 tokens in batches of 64, AdamW (lr 1e-3, torch's betas,
// eps and weight decay 0.01), gradients clipped to norm 1, dropout 0.2
// drawn on the device; three rounds of 100 steps, each timed.
//
// zoo.py's Block also drops attention probabilities (dropout_p=0.2 in
// scaled_dot_product_attention); nn.TransformerBlock does not, so this
// run does a little less work per step than torch's.
func zooGPT(t *testing.T, b *cuda.Backend) {
	path := os.Getenv("EMBER_ZOO_CORPUS")
	if path == "" {
		t.Skip("EMBER_ZOO_CORPUS is not set (a text file)")
	}
	text, err := data.LoadText(path, data.TextOptions{Level: data.ByteLevel})
	if err != nil {
		t.Fatal(err)
	}
	const bsz, ctx, steps = 64, 256, 100
	v := text.Vocab.Size()
	cut := int(0.9 * float64(len(text.Train)))
	// zoo.py draws starts in [0, cut-T-2]: the sampler over the first
	// cut-1 tokens draws them in [0, cut-1-T-1].
	sampler, err := data.NewWindowSampler(text.Train[:cut-1], ctx, bsz, 1)
	if err != nil {
		t.Fatal(err)
	}
	m := models.NewGPT(b, 1, models.DefaultGPTConfig(v))
	defer m.Release()
	dg := tensor.NewDeviceGenerator(b, 1)
	defer dg.Release()
	nn.SetRandomSource(m, dg)
	adam, err := optim.NewAdamW(nn.Parameters(m), optim.DefaultAdamWConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer adam.Release()
	ids, targets := tensor.FromInt32(b, nil, make([]int32, bsz*ctx), bsz, ctx), tensor.FromInt32(b, nil, make([]int32, bsz*ctx), bsz, ctx)
	defer ids.Release()
	defer targets.Release()
	hx, hy := make([]int32, bsz*ctx), make([]int32, bsz*ctx)
	adam.ZeroGrad()
	st := newZooStepper(b, adam, func(s *tensor.Scope) *tensor.Tensor {
		loss := m.Loss(scoped(s, ids), targets)
		loss.Backward()
		optim.ClipGradNorm(s, adam.Gradients(), 1.0)
		adam.StepAndZeroGrad()
		return loss
	})
	defer st.close()
	for r := range 3 {
		zooSync(t, b)
		start := time.Now()
		var loss *tensor.Tensor
		for i := range steps {
			sampler.BatchInto(r*steps+i, hx, hy)
			b.Upload(ids.Buffer(), hx)
			b.Upload(targets.Buffer(), hy)
			adam.Prepare()
			loss = st.run()
		}
		zooSync(t, b)
		secs := time.Since(start).Seconds()
		zooOut(t, "gpt", "round", r+1, "steps", steps, "s", round(secs, 3), "tokens_per_s", math.Round(steps*bsz*ctx/secs),
			"loss", round(float64(loss.Item()), 4), "vocab", v, "peak_reserved_mib", mib(b.MemoryStats().Reserved.Peak), "step", st.logged)
	}
}
