package models_test

import (
	"encoding/json"
	"errors"
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
// printing zoo.py's JSON lines plus the GPU memory it reserved and
// allocated at peak (docs/bench/zoo_memory.sh puts them beside PyTorch's).
//
//	EMBER_ZOO=resnet9 EMBER_ZOO_FMNIST=DIR [EMBER_ZOO_EPOCHS=8] go test ./models -run TestZooGPU -v -timeout 1h
//	EMBER_ZOO=airbench go test ./models -run TestZooGPU -v
//	EMBER_ZOO=gpt EMBER_ZOO_CORPUS=FILE go test ./models -run TestZooGPU -v
//
// EMBER_ZOO=all runs the three (resnet9 and gpt only when their data is
// given). It skips without a GPU or without EMBER_ZOO.
// EMBER_ZOO_PRECISION=fp32|tf32|bf16 is train's --precision: fp32 (the
// default), tf32 (cuBLAS and cuDNN on TF32 tensor cores; torch's "fp32"
// mode leaves cuDNN convolutions on TF32 but not matrix products) or bf16
// (autocast: products and convolutions in bfloat16, float32 sums);
// EMBER_ZOO_TF32=1 is EMBER_ZOO_PRECISION=tf32. EMBER_ZOO_GRAPH=0
// launches every step eagerly instead of replaying a captured CUDA graph.
// EMBER_ZOO_ATTENTION=composed hides the backend's fused attention, so that
// attention is composed of products, softmax and dropout (to compare).
// EMBER_ZOO_RELEASE=0 keeps a step's activations until the next step
// instead of giving them back during Backward (to compare the memory).
// EMBER_ZOO_RECOMPUTE=1 recomputes each block's activations in the
// backward pass (nn.RecomputeBlocks, train's --recompute).
// EMBER_ZOO_CHANNELS_LAST=0 keeps autocast's convolution activations
// float32 [N, C, H, W] (tensor.Scope.SetChannelsLast), to compare.
// EMBER_ZOO_DATA=float32 keeps airbench's images in float32, as zoo.py
// does, rather than in bfloat16 under autocast (zooAirbench).
func TestZooGPU(t *testing.T) {
	what := os.Getenv("EMBER_ZOO")
	if what == "" {
		t.Skip("EMBER_ZOO is not set (resnet9, airbench, gpt or all)")
	}
	if err := cuda.Available(); err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	prec, err := tensor.ParsePrecision(os.Getenv("EMBER_ZOO_PRECISION"))
	if err != nil {
		t.Fatalf("EMBER_ZOO_PRECISION: %v", err)
	}
	if os.Getenv("EMBER_ZOO_TF32") == "1" {
		if prec == tensor.BF16 {
			t.Fatal("EMBER_ZOO_TF32=1 is EMBER_ZOO_PRECISION=tf32; it does not go with EMBER_ZOO_PRECISION=bf16")
		}
		prec = tensor.TF32
	}
	opt, err := cuda.OptionsFromEnv(cuda.BackendOptions{TF32: prec.AllowTF32()})
	if err != nil {
		t.Fatal(err)
	}
	sizes, err := zooBenchmarkSizes()
	if err != nil {
		t.Fatal(err)
	}
	runs := map[string]func(*testing.T, *zooEnv){"resnet9": zooResNet9Data, "airbench": zooAirbench, "gpt": zooGPTCorpus}
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
			var be tensor.Backend = b
			switch a := os.Getenv("EMBER_ZOO_ATTENTION"); a {
			case "", "fused":
			case "composed":
				be = zooComposedAttention{b}
			default:
				t.Fatalf("EMBER_ZOO_ATTENTION=%q; want fused or composed", a)
			}
			runs[name](t, &zooEnv{b: be, gpu: b, sizes: sizes, precision: prec})
		})
	}
}

// zooComposedAttention is the GPU backend without its fused attention.
type zooComposedAttention struct{ *cuda.Backend }

func (zooComposedAttention) AttentionSupported(d, dv int) bool { return false }

// zooEnv is where a workload runs: on the GPU (gpu set: capture, memory
// statistics) or, for the smoke test of this harness, on the CPU.
type zooEnv struct {
	b         tensor.Backend
	gpu       *cuda.Backend
	sizes     zooSizes
	precision tensor.Precision // "" is fp32
	lines     []map[string]any // what zooOut printed, for the smoke test
	// The allocator's peaks (bytes) folded in by memPhase: the run's, its
	// training steps' and its evaluations'.
	peak, train, eval struct{ reserved, allocated int }
}

// newScope is a scope for a workload's steps, with the run's autocast,
// giving the activations back during Backward as trainer.CaptureStep's
// scopes do (EMBER_ZOO_RELEASE=0: kept until the next step, to compare).
func (z *zooEnv) newScope() *tensor.Scope {
	s := tensor.NewScope()
	s.SetAutocast(z.precision.Autocast())
	s.SetChannelsLast(zooChannelsLast())
	s.SetReleaseInBackward(os.Getenv("EMBER_ZOO_RELEASE") != "0")
	return s
}

// zooChannelsLast is whether autocast holds the convolution nets'
// activations channels-last (EMBER_ZOO_CHANNELS_LAST=0: not, to compare).
func zooChannelsLast() bool { return os.Getenv("EMBER_ZOO_CHANNELS_LAST") != "0" }

// zooSizes are a workload's sizes: zoo.py's for the benchmark, tiny ones
// for the CPU smoke test.
type zooSizes struct {
	resnetWidth, resnetBatch, resnetEpochs, evalBatch int
	airN, airBatch, airEpochs                         int
	gpt                                               models.GPTConfig // Vocab comes from the corpus
	gptBatch, gptSteps, gptRounds                     int
}

func zooBenchmarkSizes() (zooSizes, error) {
	epochs := 8
	if v := os.Getenv("EMBER_ZOO_EPOCHS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return zooSizes{}, fmt.Errorf("EMBER_ZOO_EPOCHS=%q; want a positive whole number", v)
		}
		epochs = n
	}
	return zooSizes{
		resnetWidth: 64, resnetBatch: 512, resnetEpochs: epochs, evalBatch: 2000,
		airN: 50000, airBatch: 1024, airEpochs: 3,
		gpt: models.DefaultGPTConfig(0), gptBatch: 64, gptSteps: 100, gptRounds: 3,
	}, nil
}

func (z *zooEnv) sync(t *testing.T) {
	t.Helper()
	if z.gpu == nil {
		return
	}
	if err := z.gpu.Synchronize(); err != nil {
		t.Fatal(err)
	}
}

// memPhase folds the allocator's peaks since the last call into those of
// the phase that just ended (training steps, or an evaluation when eval)
// and the run's, and starts them afresh; nothing on the CPU.
func (z *zooEnv) memPhase(eval bool) {
	if z.gpu == nil {
		return
	}
	st := z.gpu.MemoryStats()
	ph := &z.train
	if eval {
		ph = &z.eval
	}
	for _, p := range []*struct{ reserved, allocated int }{ph, &z.peak} {
		p.reserved = max(p.reserved, st.Reserved.Peak)
		p.allocated = max(p.allocated, st.Allocated.Peak)
	}
	z.gpu.Allocator().ResetPeakStats()
}

// memory is the memory fields of a JSON line, in MiB as torch reports
// them: peak_reserved_mib and peak_allocated_mib are the run's so far
// (zoo_memory.py's torch.cuda.max_memory_reserved and
// max_memory_allocated), the train_ and eval_ ones those of the training
// steps and the evaluations (data sets and cuBLAS's workspace included in
// all). It folds in the phase that just ended (memPhase).
func (z *zooEnv) memory(eval bool) []any {
	z.memPhase(eval)
	kv := []any{"peak_reserved_mib", mib(z.peak.reserved), "peak_allocated_mib", mib(z.peak.allocated),
		"train_peak_reserved_mib", mib(z.train.reserved), "train_peak_allocated_mib", mib(z.train.allocated)}
	if z.eval.reserved > 0 {
		kv = append(kv, "eval_peak_reserved_mib", mib(z.eval.reserved), "eval_peak_allocated_mib", mib(z.eval.allocated))
	}
	kv = append(kv, "release_in_backward", os.Getenv("EMBER_ZOO_RELEASE") != "0", "recompute", os.Getenv("EMBER_ZOO_RECOMPUTE") == "1")
	if eval { // only workloads that evaluate lend
		kv = append(kv, "lend", zooLends())
	}
	return kv
}

// zooLends reports whether evaluations run in the captured step's idle
// memory (cuda.Backend.Lend, as trainer.Step.Lend does; EMBER_ZOO_LEND=0:
// in memory of their own).
func zooLends() bool { return os.Getenv("EMBER_ZOO_LEND") != "0" }

// recompute wraps m's blocks in nn.Recompute when EMBER_ZOO_RECOMPUTE=1.
func (z *zooEnv) recompute(t *testing.T, m nn.Module) {
	if os.Getenv("EMBER_ZOO_RECOMPUTE") != "1" {
		return
	}
	if n := nn.RecomputeBlocks(m); n == 0 {
		t.Fatal("EMBER_ZOO_RECOMPUTE=1: the model has no blocks to recompute")
	}
}

// out prints one JSON line as zoo.py's out does, with mode "ember".
func (z *zooEnv) out(t *testing.T, what string, kv ...any) {
	prec := z.precision
	if prec == "" {
		prec = tensor.FP32
	}
	m := map[string]any{"what": what, "mode": "ember", "precision": string(prec)}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	z.lines = append(z.lines, m)
	line, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println(string(line))
}

func mib(n int) float64 { return math.Round(float64(n)/(1<<20)*10) / 10 }

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
	gpu    *cuda.Backend // nil: eager only
	scope  *tensor.Scope
	step   func(s *tensor.Scope) *tensor.Tensor
	opt    replayer
	graph  *cuda.StepGraph
	loss   *tensor.Tensor
	try    bool
	warmed bool // one eager step ran before the capture
	logged string
	// The host's time in the first eager step and in the capture (with
	// the graph's instantiation), for the first epoch's breakdown.
	warmS, captureS float64
}

func newZooStepper(z *zooEnv, opt replayer, step func(s *tensor.Scope) *tensor.Tensor) *zooStepper {
	return &zooStepper{gpu: z.gpu, scope: z.newScope(), step: step, opt: opt, try: z.gpu != nil && os.Getenv("EMBER_ZOO_GRAPH") != "0"}
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
	if z.try && !z.warmed && z.usesCuDNN() && !z.gpu.PlansGraphMemory() {
		// cuDNN times its convolution algorithms at their first run,
		// which cannot happen inside a capture (trainer.Step does the
		// same).
		z.warmed = true
		t0 := time.Now()
		defer func() { z.warmS = time.Since(t0).Seconds() }()
		return z.eager()
	}
	if z.try && z.opt.Replayable() {
		z.try = false
		before := z.opt.Steps()
		var loss *tensor.Tensor
		z.scope.Reset() // the warm-up's tensors: Capture gives their memory back
		t0 := time.Now()
		g, err := z.gpu.CapturePlanned(func() { loss = z.eager() }, func() {
			z.scope.Reset()
			for z.opt.Steps() > before {
				z.opt.Rewind()
			}
		})
		z.captureS = time.Since(t0).Seconds()
		if err == nil {
			z.graph, z.loss, z.logged = g, loss, "captured"
			return z.run()
		}
		if z.opt.Steps() > before {
			z.opt.Rewind()
		}
		if errors.Is(err, cuda.ErrSearchFirst) {
			// cuDNN times the convolutions' algorithms in this eager
			// step; the next is captured (trainer.Step does the same).
			z.try, z.warmed = true, true
			t0 := time.Now()
			defer func() { z.warmS = time.Since(t0).Seconds() }()
			return z.eager()
		}
		if errors.Is(err, cuda.ErrLoadDuringCapture) {
			z.try = true // an older driver: this eager step compiles the kernels, the next is captured
			return z.eager()
		}
		z.logged = "capture failed: " + strings.ReplaceAll(err.Error(), "\n", " ")
	}
	if z.logged == "" {
		z.logged = "eager"
	}
	return z.eager()
}

// lend runs f, an evaluation between epochs, under the backend's Lend
// when the step is replayed and zooLends; it fails the run if f keeps
// any of the graph's memory (the trainer would capture again).
func (z *zooStepper) lend(t *testing.T, f func()) {
	if z.graph == nil || !zooLends() {
		f()
		return
	}
	if kept := z.gpu.Lend(f); kept > 0 {
		t.Fatalf("the evaluation kept %d blocks of the captured step's memory", kept)
	}
}

// startup is the first epoch's breakdown: the warm-up step, the capture,
// the convolution algorithm searches, and the kernel units loaded so far.
func (z *zooStepper) startup() []any {
	kv := []any{"warmup_s", round(z.warmS, 3), "capture_s", round(z.captureS, 3)}
	if z.gpu == nil {
		return kv
	}
	kv = append(kv, z.plan()...)
	n, took := z.gpu.ConvSearches()
	var units int
	var unitS float64
	for _, u := range z.gpu.KernelUnits() {
		if u.Loaded {
			units++
			unitS += u.Seconds
		}
	}
	return append(kv, "conv_searches", n, "conv_search_s", round(took.Seconds(), 3), "kernel_units", units, "kernel_units_s", round(unitS, 3))
}

// plan says how the captured step's memory was placed (by plan or as it
// came, and why), for the JSON lines.
func (z *zooStepper) plan() []any {
	if z.graph == nil {
		return nil
	}
	span, misses, err := z.graph.Planned()
	why := ""
	if err != nil {
		why = err.Error()
	}
	return []any{"graph_planned", err == nil, "graph_plan_mib", mib(span), "graph_plan_misses", misses, "graph_plan_error", why}
}

func (z *zooStepper) usesCuDNN() bool {
	_, err := z.gpu.CuDNN()
	return err == nil
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
// The augmentation runs in the batch gather on the device by default
// (EMBER_ZOO_AUG below); "s" counts the steps of an epoch, the gather
// included. The step is captured once and replayed (EMBER_ZOO_GRAPH=0:
// eagerly): the rate and the cycled momentum are device scalars of the
// SGD, the epoch's augmentation key a device tensor, and the batch's
// indices and labels are uploaded into fixed tensors before each step.
func zooResNet9Data(t *testing.T, z *zooEnv) {
	dir := os.Getenv("EMBER_ZOO_FMNIST")
	if dir == "" {
		t.Skip("EMBER_ZOO_FMNIST is not set (a directory with Fashion-MNIST's four files)")
	}
	train, test, err := data.LoadFashionMNIST(dir)
	if err != nil {
		t.Logf("not the canonical Fashion-MNIST (%v); reading the MNIST layout", err)
		if train, test, err = data.LoadMNIST(dir); err != nil {
			t.Fatal(err)
		}
	}
	zooResNet9(t, z, train, test)
}

func zooResNet9(t *testing.T, z *zooEnv, train, test *data.Dataset) {
	const side, pad = 28, 2
	b, bs, epochs := z.b, z.sizes.resnetBatch, z.sizes.resnetEpochs
	if train.Rows != side || train.Cols != side || train.NumChannels() != 1 {
		t.Fatalf("images of %d×%d×%d; zoo.py's resnet9 takes Fashion-MNIST's 1×28×28", train.NumChannels(), train.Rows, train.Cols)
	}
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

	cfg := models.DefaultResNet9Config()
	cfg.Width = z.sizes.resnetWidth
	m := models.NewResNet9(b, 1, cfg)
	z.recompute(t, m)
	defer m.Release()
	stepsPerEpoch := train.N / bs
	sgd, err := optim.NewSGD(nn.Parameters(m), optim.SGDConfig{LR: 0.2, Momentum: 0.9, Nesterov: true, WeightDecay: 5e-4})
	if err != nil {
		t.Fatal(err)
	}
	defer sgd.Release()
	sched := optim.NewOneCycleLR(0.2, epochs*stepsPerEpoch)
	sched.PctStart, sched.AnnealLinear = 0.25, true

	// EMBER_ZOO_AUG: "device" (the default: the batch gather crops, flips
	// and normalises on the device, tensor.AugmentGather), "none" (the
	// same gather without crop or flip, to measure what augmentation
	// costs) or "host" (augmented copies made on the host each epoch).
	mode := os.Getenv("EMBER_ZOO_AUG")
	if mode == "" {
		mode = "device"
	}
	rng := rand.New(rand.NewPCG(1, 1))
	var augmented []float32
	var pixels, norm, xa, state *tensor.Tensor
	spec := tensor.AugmentSpec{C: 1, H: side, W: side, Pad: pad, FlipProb: 0.5, Seed: 1,
		Fill: uint8(math.Round(float64(mu) * 255))} // zoo.py pads the normalised images with 0, the mean
	if mode == "host" {
		augmented = make([]float32, len(trainX))
		// One device copy of the augmented set, rewritten each epoch: the
		// captured step reads the same tensor every epoch.
		xa = tensor.Zeros(b, nil, train.N, 1, side, side)
		defer xa.Release()
	} else {
		if mode == "none" {
			spec.Pad, spec.FlipProb = 0, 0
		}
		pixels = tensor.FromUint8(b, nil, train.Images, train.N, 1, side, side)
		defer pixels.Release()
		norm = tensor.AugmentNorm(b, nil, []float32{mu}, []float32{sd})
		defer norm.Release()
		// The epoch's draws are keyed on the device (AugmentGatherAt), so
		// that a replayed step augments each epoch afresh.
		state = tensor.NewAugmentState(b, nil, spec.Seed, 0)
		defer state.Release()
	}
	// The batch's indices and labels go up into the same two tensors before
	// each step (2 KiB each), which the captured step reads.
	idx, labels := make([]int32, bs), make([]int32, bs)
	idxT, labelsT := tensor.FromInt32(b, nil, idx, bs), tensor.FromInt32(b, nil, labels, bs)
	defer idxT.Release()
	defer labelsT.Release()
	sgd.ZeroGrad()
	st := newZooStepper(z, sgd, func(s *tensor.Scope) *tensor.Tensor {
		var x *tensor.Tensor
		if mode == "host" {
			x = tensor.IndexSelect(s.Borrow(xa), 0, idxT)
		} else {
			x = tensor.AugmentGatherAt(s, pixels, idxT, norm, state, spec)
		}
		loss := m.Loss(x, labelsT)
		loss.Backward()
		sgd.StepAndZeroGrad()
		return loss
	})
	defer st.close()
	step := 0
	for e := range epochs {
		nn.SetTraining(m, true)
		augStart := time.Now()
		if mode == "host" {
			augmentTranslateFlip(augmented, trainX, train.N, side, pad, rng)
		}
		perm := rng.Perm(train.N)
		augSecs := time.Since(augStart).Seconds()
		z.sync(t)
		start := time.Now()
		if mode == "host" {
			b.Upload(xa.Buffer(), augmented)
		} else {
			tensor.SetAugmentState(state, spec.Seed, tensor.AugmentOffset(e, train.N))
		}
		var loss *tensor.Tensor
		for i := range stepsPerEpoch {
			for j := range idx {
				k := perm[i*bs+j]
				idx[j], labels[j] = int32(k), int32(train.Labels[k])
			}
			b.Upload(idxT.Buffer(), idx)
			b.Upload(labelsT.Buffer(), labels)
			// The schedule's rate and momentum, device scalars that the
			// captured update reads (uploaded only when they change).
			sgd.SetLR(sched.LR(step))
			if err := sgd.SetMomentum(sched.Momentum(step)); err != nil {
				t.Fatal(err)
			}
			loss = st.run()
			step++
		}
		z.sync(t)
		secs := time.Since(start).Seconds()
		startup := st.startup() // before the evaluation's own searches
		lastLoss := loss.Item()
		z.memPhase(false)
		var acc float64
		st.lend(t, func() { acc = zooAccuracy(m, testX, test.Labels, z.sizes.evalBatch, z.precision.Autocast()) })
		z.sync(t)
		z.out(t, "resnet9", append([]any{"epoch", e + 1, "s", round(secs, 3), "augment", mode, "augment_host_s", round(augSecs, 3), "loss", round(float64(lastLoss), 4),
			"test_acc", round(acc, 2), "step", st.logged}, append(startup, z.memory(true)...)...)...)
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
func zooAccuracy(m *models.ResNet9, x *tensor.Tensor, labels []uint8, batch int, autocast tensor.DType) float64 {
	nn.SetTraining(m, false)
	defer nn.SetTraining(m, true)
	n, correct := x.Dim(0), 0
	for start := 0; start < n; start += batch {
		k := min(batch, n-start)
		s := tensor.NewNoGradScope()
		// Layers that hand each input back once the next is done
		// (tensor.ReleaseInput) may, in this scope, as torch.no_grad does.
		s.SetReleaseInBackward(os.Getenv("EMBER_ZOO_RELEASE") != "0")
		s.SetAutocast(autocast) // as zoo.py evaluates under its autocast
		s.SetChannelsLast(zooChannelsLast())
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
//
// The images are kept in bfloat16 (293 MiB, where zoo.py keeps 586 of
// float32), drawn a batch at a time: under autocast the first convolution
// reads its input rounded to bfloat16, so the float32 batch widened from
// them gives the model the same values (EMBER_ZOO_DATA=float32 keeps
// float32 images, as zoo.py does).
func zooAirbench(t *testing.T, z *zooEnv) {
	b, n, bs := z.b, z.sizes.airN, z.sizes.airBatch
	gen := tensor.NewGenerator(1)
	x := zooImages(b, gen, n, bs, os.Getenv("EMBER_ZOO_DATA") != "float32" && z.precision.Autocast() == tensor.BFloat16)
	defer x.Release()
	rng := rand.New(rand.NewPCG(1, 2))
	y := tensor.FromInt32(b, nil, randomLabels(rng, n, 10), n)
	defer y.Release()
	xb, yb := tensor.Zeros(b, nil, bs, 3, 32, 32), tensor.FromInt32(b, nil, make([]int32, bs), bs)
	defer xb.Release()
	defer yb.Release()

	m := models.NewAirbench(b, 1, models.DefaultAirbenchConfig())
	z.recompute(t, m)
	defer m.Release()
	sgd, err := optim.NewSGD(nn.Parameters(m), optim.SGDConfig{LR: 0.1, Momentum: 0.85, Nesterov: true, WeightDecay: 5e-4})
	if err != nil {
		t.Fatal(err)
	}
	defer sgd.Release()
	sgd.ZeroGrad()
	st := newZooStepper(z, sgd, func(s *tensor.Scope) *tensor.Tensor {
		loss := m.Loss(s.Borrow(xb), yb)
		loss.Backward()
		sgd.StepAndZeroGrad()
		return loss
	})
	defer st.close()
	for e := range z.sizes.airEpochs {
		z.sync(t)
		start := time.Now()
		var loss *tensor.Tensor
		for i := range n / bs {
			tensor.CopyTensor(xb, x.Narrow(0, i*bs, bs))
			tensor.CopyTensor(yb, y.Narrow(0, i*bs, bs))
			loss = st.run()
		}
		z.sync(t)
		secs := time.Since(start).Seconds()
		// The loss unrounded: the two ways of keeping the images give the
		// same bits.
		z.out(t, "airbench", append([]any{"epoch", e + 1, "s", round(secs, 4), "loss", float64(loss.Item()),
			"step", st.logged}, append(st.startup(), z.memory(false)...)...)...)
	}
}

// zooImages draws n N(0, 1) images [n, 3, 32, 32] from gen, chunk at a
// time (the same values as one draw: the generator's offset advances by
// the values drawn), kept in bfloat16 when half.
func zooImages(b tensor.Backend, gen *tensor.Generator, n, chunk int, half bool) *tensor.Tensor {
	if !half {
		return tensor.RandN(b, nil, gen, n, 3, 32, 32)
	}
	x := tensor.EmptyOf(b, nil, tensor.BFloat16, n, 3, 32, 32)
	for i := 0; i < n; i += chunk {
		k := min(chunk, n-i)
		c := tensor.RandN(b, nil, gen, k, 3, 32, 32)
		tensor.CopyTensor(x.Narrow(0, i, k), c)
		c.Release()
	}
	return x
}

// zooGPT is zoo.py's gpt case: the corpus's bytes as tokens (the distinct
// bytes, sorted, as the vocabulary), the first 90% for training, random
// windows of 256 tokens in batches of 64, AdamW (lr 1e-3, torch's betas,
// eps and weight decay 0.01), gradients clipped to norm 1, dropout 0.2
// drawn on the device (on the attention probabilities too, as zoo.py's
// dropout_p=0.2); three rounds of 100 steps, each timed.
func zooGPTCorpus(t *testing.T, z *zooEnv) {
	path := os.Getenv("EMBER_ZOO_CORPUS")
	if path == "" {
		t.Skip("EMBER_ZOO_CORPUS is not set (a text file)")
	}
	text, err := data.LoadText(path, data.TextOptions{Level: data.ByteLevel})
	if err != nil {
		t.Fatal(err)
	}
	zooGPT(t, z, text)
}

func zooGPT(t *testing.T, z *zooEnv, text *data.Text) {
	cfg := z.sizes.gpt
	b, bsz, ctx, steps := z.b, z.sizes.gptBatch, cfg.Context, z.sizes.gptSteps
	v := text.Vocab.Size()
	cfg.Vocab = v
	cut := int(0.9 * float64(len(text.Train)))
	// zoo.py draws starts in [0, cut-T-2]: the sampler over the first
	// cut-1 tokens draws them in [0, cut-1-T-1].
	sampler, err := data.NewWindowSampler(text.Train[:cut-1], ctx, bsz, 1)
	if err != nil {
		t.Fatal(err)
	}
	m := models.NewGPT(b, 1, cfg)
	z.recompute(t, m)
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
	st := newZooStepper(z, adam, func(s *tensor.Scope) *tensor.Tensor {
		loss := m.Loss(s.Borrow(ids), targets)
		loss.Backward()
		optim.ClipGradNorm(s, adam.Gradients(), 1.0)
		adam.StepAndZeroGrad()
		return loss
	})
	defer st.close()
	for r := range z.sizes.gptRounds {
		z.sync(t)
		start := time.Now()
		var loss *tensor.Tensor
		for i := range steps {
			sampler.BatchInto(r*steps+i, hx, hy)
			b.Upload(ids.Buffer(), hx)
			b.Upload(targets.Buffer(), hy)
			adam.Prepare()
			loss = st.run()
		}
		z.sync(t)
		secs := time.Since(start).Seconds()
		z.out(t, "gpt", append([]any{"round", r + 1, "steps", steps, "s", round(secs, 3), "tokens_per_s", math.Round(float64(steps*bsz*ctx) / secs),
			"loss", round(float64(loss.Item()), 4), "vocab", v, "step", st.logged}, append(st.plan(), z.memory(false)...)...)...)
	}
}

// The harness itself, run on the CPU at tiny sizes on synthetic data, so
// that its bookkeeping (scopes, batches, schedules, evaluation, the JSON
// lines) is checked where there is no GPU; the GPU run differs only by
// synchronisation, capture and the memory statistics.
func TestZooHarnessCPU(t *testing.T) {
	z := &zooEnv{b: tensor.CPU, sizes: zooSizes{
		resnetWidth: 4, resnetBatch: 8, resnetEpochs: 2, evalBatch: 5,
		airN: 8, airBatch: 4, airEpochs: 2,
		gpt:      models.GPTConfig{Layers: 1, Heads: 2, Channels: 16, Context: 8, Dropout: 0.2},
		gptBatch: 2, gptSteps: 3, gptRounds: 2,
	}}
	rng := rand.New(rand.NewPCG(12, 1))
	images := func(n int) *data.Dataset {
		d := &data.Dataset{Images: make([]uint8, n*28*28), Labels: make([]uint8, n), N: n, Rows: 28, Cols: 28}
		for i := range d.Images {
			d.Images[i] = uint8(rng.IntN(256))
		}
		for i := range d.Labels {
			d.Labels[i] = uint8(rng.IntN(10))
		}
		return d
	}
	zooResNet9(t, z, images(24), images(12))
	zooAirbench(t, z)
	corpus := make([]byte, 400)
	for i := range corpus {
		corpus[i] = "abcdefgh\n"[rng.IntN(9)]
	}
	text, err := data.NewText(corpus, "corpus", data.TextOptions{})
	if err != nil {
		t.Fatal(err)
	}
	zooGPT(t, z, text)

	want := []string{"resnet9", "resnet9", "airbench", "airbench", "gpt", "gpt"}
	if len(z.lines) != len(want) {
		t.Fatalf("%d JSON lines, want %d: %v", len(z.lines), len(want), z.lines)
	}
	for i, l := range z.lines {
		loss, _ := l["loss"].(float64)
		if l["what"] != want[i] || !(loss > 0) || math.IsInf(loss, 0) {
			t.Errorf("line %d: %v; want %s with a finite positive loss", i, l, want[i])
		}
		for _, k := range []string{"peak_reserved_mib", "peak_allocated_mib", "train_peak_reserved_mib", "train_peak_allocated_mib", "release_in_backward"} {
			if _, ok := l[k]; !ok {
				t.Errorf("line %d has no %s (zoo_memory.sh reads it): %v", i, k, l)
			}
		}
	}
	if acc, _ := z.lines[1]["test_acc"].(float64); acc < 0 || acc > 100 || z.lines[1]["epoch"] != 2 {
		t.Errorf("resnet9's second line %v", z.lines[1])
	}
	if z.lines[5]["round"] != 2 || z.lines[5]["vocab"] != 9 {
		t.Errorf("gpt's second line %v", z.lines[5])
	}
}
