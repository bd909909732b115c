package trainer_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/ember-ml/ember/data"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/nn/trainer"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// Sizes of the synthetic task: 8×8 grey images of 4 classes, each class a
// bright 4×4 square in its own quadrant over noise, so that a small MLP
// learns it within a few epochs (chance is 25%).
const (
	side, classes = 8, 4
	nTrain        = 256
	batchSize     = 16
)

// syntheticSet is the task's data, a function of seed only.
func syntheticSet(n int, seed uint64) *data.Dataset {
	rng := rand.New(rand.NewPCG(seed, 7))
	d := &data.Dataset{Images: make([]uint8, n*side*side), Labels: make([]uint8, n), N: n, Rows: side, Cols: side, Classes: classes}
	for i := range n {
		y := rng.IntN(classes)
		d.Labels[i] = uint8(y)
		img := d.Images[i*side*side : (i+1)*side*side]
		for j := range img {
			img[j] = uint8(rng.IntN(60))
		}
		r0, c0 := 4*(y/2), 4*(y%2)
		for r := r0; r < r0+4; r++ {
			for c := c0; c < c0+4; c++ {
				img[r*side+c] = 200 + uint8(rng.IntN(56))
			}
		}
	}
	return d
}

// tiny is a 64-16-4 MLP: it has no fused loss, so the trainer takes the
// general path (CrossEntropy of Forward).
type tiny struct{ FC1, FC2 *nn.Linear }

func newTiny(seed uint64) *tiny {
	rng := rand.New(rand.NewPCG(seed, 1))
	return &tiny{FC1: nn.NewLinear(tensor.CPU, rng, side*side, 16), FC2: nn.NewLinear(tensor.CPU, rng, 16, classes)}
}

func (m *tiny) Forward(x *tensor.Tensor) *tensor.Tensor {
	return m.FC2.Forward(tensor.ReLU(m.FC1.Forward(x.Reshape(x.Dim(0), side*side))))
}

func (m *tiny) Parameters() []nn.Parameter {
	return append(nn.Prefixed("fc1", m.FC1.Parameters()), nn.Prefixed("fc2", m.FC2.Parameters())...)
}

// summing is tiny with a fused loss: the trainer must take LossSum.
type summing struct {
	*tiny
	calls *int
}

func (m summing) LossSum(x, labels, sum *tensor.Tensor) *tensor.Tensor {
	*m.calls++
	return tensor.LinearCrossEntropySum(tensor.ReLU(m.FC1.Forward(x.Reshape(x.Dim(0), side*side))), m.FC2.Weight, m.FC2.Bias, labels, sum)
}

// setup is one run's configuration on the synthetic task; evals collects
// the (loss, accuracy) of every epoch's evaluation on the training set.
type setup struct {
	cfg   trainer.Config
	model *tiny
	evals [][2]float64
	log   strings.Builder
}

func newSetup(t *testing.T, opt string, lr float64) *setup {
	t.Helper()
	s := &setup{model: newTiny(3)}
	set := syntheticSet(nTrain, 1)
	src, err := trainer.NewImages(tensor.CPU, set, batchSize, 1.0/255, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Release)
	var o trainer.Optimizer
	switch opt {
	case "sgd":
		o, err = optim.NewSGD(nn.Parameters(s.model), optim.SGDConfig{LR: lr, Momentum: 0.9})
	case "adamw":
		cfg := optim.DefaultAdamWConfig()
		cfg.LR = lr
		o, err = optim.NewAdamW(nn.Parameters(s.model), cfg)
	}
	if err != nil {
		t.Fatal(err)
	}
	s.cfg = trainer.Config{
		Model: s.model, Optimizer: o, Data: src, Epochs: 4, Seed: 5, LogInterval: 4,
		Evaluate: func(m nn.Module) (float64, float64, error) {
			l, a, err := src.Evaluate(m, 64)
			s.evals = append(s.evals, [2]float64{l, a})
			return l, a, err
		},
		Log: &s.log, Eager: true,
	}
	return s
}

func params(m nn.Module) map[string][]float32 {
	out := map[string][]float32{}
	for _, p := range nn.Parameters(m) {
		out[p.Name] = p.Tensor.Float32s()
	}
	return out
}

func sameBits(t *testing.T, what string, a, b map[string][]float32) {
	t.Helper()
	for name, va := range a {
		vb := b[name]
		for i := range va {
			if math.Float32bits(va[i]) != math.Float32bits(vb[i]) {
				t.Fatalf("%s: %s[%d] is %v in one run, %v in the other", what, name, i, va[i], vb[i])
			}
		}
	}
}

// TestLossFalls: four epochs of SGD on the synthetic task take the loss
// from its initial value (about ln 4 = 1.39, chance) to under a quarter of
// it, and the accuracy to 90% or more; a broken gradient, update or data
// order stays near chance (25%).
func TestLossFalls(t *testing.T) {
	s := newSetup(t, "sgd", 0.05)
	initial, initialAcc, err := s.cfg.Data.(*trainer.Images).Evaluate(s.model, 64)
	if err != nil {
		t.Fatal(err)
	}
	res, err := trainer.Run(context.Background(), s.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.evals) != 4 || res.Steps != 4*nTrain/batchSize || res.GlobalStep != res.Steps {
		t.Fatalf("%d evaluations, %d steps, global step %d", len(s.evals), res.Steps, res.GlobalStep)
	}
	last := s.evals[3]
	t.Logf("loss %.4f → %.4f, accuracy %.1f%% → %.1f%%", initial, last[0], initialAcc, last[1])
	if initial < 1 || !(last[0] < initial/4) || last[1] < 90 {
		t.Errorf("loss %.4f at first, %.4f after 4 epochs, accuracy %.1f%%; want under a quarter and at least 90%%", initial, last[0], last[1])
	}
	if n := strings.Count(s.log.String(), "\n"); n != 4 || !strings.HasPrefix(s.log.String(), "epoch 1/4: train loss ") {
		t.Errorf("want one line per epoch, got:\n%s", s.log.String())
	}
}

// TestLossSummerIsUsed: a model with its own LossSum is trained through it,
// and gives the same weights as the general path (the same operations).
func TestLossSummerIsUsed(t *testing.T) {
	a := newSetup(t, "sgd", 0.05)
	a.cfg.Epochs = 1
	if _, err := trainer.Run(context.Background(), a.cfg); err != nil {
		t.Fatal(err)
	}
	b := newSetup(t, "sgd", 0.05)
	b.cfg.Epochs = 1
	calls := 0
	b.cfg.Model = summing{b.model, &calls}
	if _, err := trainer.Run(context.Background(), b.cfg); err != nil {
		t.Fatal(err)
	}
	if calls != nTrain/batchSize {
		t.Fatalf("LossSum called %d times, want %d", calls, nTrain/batchSize)
	}
	for name, va := range params(a.model) {
		vb := params(b.model)[name]
		for i := range va {
			if d := math.Abs(float64(va[i] - vb[i])); d > 1e-5 {
				t.Fatalf("%s[%d]: %v and %v", name, i, va[i], vb[i])
			}
		}
	}
}

// TestResumeIsBitwise: on the CPU, four epochs in one run and two, a
// checkpoint, a resume and two more give bit-identical weights, for SGD
// with momentum and for AdamW under a one-cycle schedule (the learning
// rate and Adam's bias corrections depend on the restored step counts).
func TestResumeIsBitwise(t *testing.T) {
	for _, opt := range []string{"sgd", "adamw"} {
		t.Run(opt, func(t *testing.T) {
			lr := 0.05
			if opt == "adamw" {
				lr = 0.01
			}
			dir := t.TempDir()
			schedule := func(s *setup) {
				if opt == "adamw" {
					s.cfg.Schedule = optim.NewOneCycleLR(lr, s.cfg.Epochs*nTrain/batchSize)
				}
			}
			once := newSetup(t, opt, lr)
			once.cfg.Checkpoint = filepath.Join(dir, "once.safetensors")
			schedule(once)
			if _, err := trainer.Run(context.Background(), once.cfg); err != nil {
				t.Fatal(err)
			}

			split := newSetup(t, opt, lr)
			split.cfg.Checkpoint = filepath.Join(dir, "split.safetensors")
			schedule(split) // over the four epochs
			split.cfg.Epochs = 2
			if _, err := trainer.Run(context.Background(), split.cfg); err != nil {
				t.Fatal(err)
			}
			again := newSetup(t, opt, lr)
			schedule(again)
			st, err := nn.LoadCheckpoint(split.cfg.Checkpoint, again.model)
			if err != nil {
				t.Fatal(err)
			}
			if st.Epoch != 2 || st.GlobalStep != 2*nTrain/batchSize {
				t.Fatalf("checkpoint at epoch %d, global step %d", st.Epoch, st.GlobalStep)
			}
			again.cfg.Resume, again.cfg.Checkpoint = st, split.cfg.Checkpoint
			res, err := trainer.Run(context.Background(), again.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if res.Steps != 2*nTrain/batchSize || len(again.evals) != 2 {
				t.Fatalf("the resumed run made %d steps and %d evaluations", res.Steps, len(again.evals))
			}
			sameBits(t, "resumed", params(once.model), params(again.model))
		})
	}
}

// cancelAfter is a loss that cancels the run's context in its step-th call.
func cancelAfter(step int, cancel context.CancelFunc) trainer.LossFunc {
	calls := 0
	return func(m nn.Module, b trainer.Batch) *tensor.Tensor {
		calls++
		if calls == step {
			cancel()
		}
		return tensor.CrossEntropy(m.Forward(b.Inputs), b.Labels)
	}
}

// TestInterruptSaves: a context cancelled during step 3 of epoch 2 lets
// that step finish, saves a checkpoint at epoch 2, step 3, returns an
// *InterruptedError (ErrInterrupted), and a resume from it ends with the
// weights of an uninterrupted run.
func TestInterruptSaves(t *testing.T) {
	dir := t.TempDir()
	full := newSetup(t, "sgd", 0.05)
	full.cfg.Epochs = 2
	if _, err := trainer.Run(context.Background(), full.cfg); err != nil {
		t.Fatal(err)
	}

	cut := newSetup(t, "sgd", 0.05)
	cut.cfg.Epochs = 2
	cut.cfg.Checkpoint = filepath.Join(dir, "cut.safetensors")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	perEpoch := nTrain / batchSize
	cut.cfg.Loss = cancelAfter(perEpoch+3, cancel)
	_, err := trainer.Run(ctx, cut.cfg)
	var ie *trainer.InterruptedError
	if !errors.As(err, &ie) || !errors.Is(err, trainer.ErrInterrupted) {
		t.Fatalf("error %v, want an InterruptedError", err)
	}
	if ie.Epoch != 1 || ie.Step != 3 || ie.Checkpoint != cut.cfg.Checkpoint || ie.SaveErr != nil {
		t.Fatalf("interrupted %+v; want epoch 1 (0-based), step 3, saved", ie)
	}
	again := newSetup(t, "sgd", 0.05)
	again.cfg.Epochs = 2
	st, err := nn.LoadCheckpoint(cut.cfg.Checkpoint, again.model)
	if err != nil {
		t.Fatal(err)
	}
	if st.Epoch != 1 || st.Step != 3 || st.GlobalStep != perEpoch+3 || st.OptimizerSteps != perEpoch+3 {
		t.Fatalf("saved epoch %d, step %d, global step %d, optimizer steps %d", st.Epoch, st.Step, st.GlobalStep, st.OptimizerSteps)
	}
	again.cfg.Resume = st
	if _, err := trainer.Run(context.Background(), again.cfg); err != nil {
		t.Fatal(err)
	}
	sameBits(t, "after the interrupt", params(full.model), params(again.model))
}

// TestNaNStops: a learning rate that blows the weights up stops the run at
// a loss check with a DivergedError naming the epoch and step, and no
// checkpoint of the broken model is written.
func TestNaNStops(t *testing.T) {
	s := newSetup(t, "sgd", 1e30)
	s.cfg.LogInterval = 1
	s.cfg.Checkpoint = filepath.Join(t.TempDir(), "nan.safetensors")
	_, err := trainer.Run(context.Background(), s.cfg)
	var de *trainer.DivergedError
	if !errors.As(err, &de) {
		t.Fatalf("error %v, want a DivergedError", err)
	}
	if !strings.HasPrefix(err.Error(), "loss is ") || !strings.Contains(err.Error(), "at epoch 1, step ") || !strings.HasSuffix(err.Error(), "no checkpoint was saved") {
		t.Errorf("message %q", err)
	}
	if _, err := os.Stat(s.cfg.Checkpoint); err == nil {
		t.Error("a checkpoint of the diverged model was written")
	}
}

// TestCaptureFallbackCPU: on the CPU the step cannot be captured; it runs
// eagerly, says why once, and does the work of every Run.
func TestCaptureFallbackCPU(t *testing.T) {
	var lines []string
	logf := func(format string, args ...any) { lines = append(lines, format) }
	x := tensor.FromFloat32(tensor.CPU, nil, []float32{1}, 1)
	defer x.Release()
	runs := 0
	step, err := trainer.CaptureStep(tensor.CPU, func(s *tensor.Scope) *tensor.Tensor {
		runs++
		return tensor.FromFloat32(tensor.CPU, s, []float32{float32(runs)}, 1)
	}, trainer.StepOptions{Logf: logf})
	if err != nil {
		t.Fatal(err)
	}
	defer step.Close()
	for i := range 3 {
		loss, err := step.Run(1)
		if err != nil {
			t.Fatal(err)
		}
		if got := loss.Item(); got != float32(i+1) {
			t.Fatalf("run %d returned %v", i+1, got)
		}
	}
	if runs != 3 || len(lines) != 1 || !strings.Contains(step.Reason(), "cpu backend cannot capture") || step.Captured(1) {
		t.Errorf("%d runs, lines %q, reason %q; want 3 eager runs and the reason said once", runs, lines, step.Reason())
	}
	// Capture turned off by the caller runs eagerly without a word.
	lines = nil
	quiet, _ := trainer.CaptureStep(tensor.CPU, func(s *tensor.Scope) *tensor.Tensor { return x }, trainer.StepOptions{Logf: logf, Eager: true})
	defer quiet.Close()
	quiet.Run(1)
	if len(lines) != 0 {
		t.Errorf("Eager said %q", lines)
	}
	if _, err := trainer.CaptureStep(tensor.CPU, nil, trainer.StepOptions{}); err == nil {
		t.Error("CaptureStep of no step function: no error")
	}
}

// TestRunSaysFallback: the trainer, asked to capture on the CPU, says once
// in its log why it runs eagerly.
func TestRunSaysFallback(t *testing.T) {
	s := newSetup(t, "sgd", 0.05)
	s.cfg.Epochs, s.cfg.Eager = 1, false
	if _, err := trainer.Run(context.Background(), s.cfg); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(s.log.String(), "cuda graph: launching eagerly: the cpu backend cannot capture a graph"); n != 1 {
		t.Errorf("said %d times:\n%s", n, s.log.String())
	}
}

// TestRunLeavesNothingToTheCollector: a run releases every tensor it made
// (the step's scopes, the running loss), so that once the caller releases
// the model, the optimiser and the data, the garbage collector finds no
// tensor storage left unreleased.
func TestRunLeavesNothingToTheCollector(t *testing.T) {
	collect := func() {
		for range 3 {
			runtime.GC()
		}
	}
	collect()
	before := tensor.Leaks()
	func() {
		s := newSetup(t, "adamw", 0.01)
		s.cfg.Epochs = 1
		s.cfg.Checkpoint = filepath.Join(t.TempDir(), "c.safetensors")
		if _, err := trainer.Run(context.Background(), s.cfg); err != nil {
			t.Fatal(err)
		}
		s.cfg.Optimizer.(*optim.Adam).Release()
		s.cfg.Data.(*trainer.Images).Release()
		for _, p := range nn.Parameters(s.model) {
			p.Tensor.Release()
		}
	}()
	collect()
	if n := tensor.Leaks() - before; n != 0 {
		t.Errorf("%d tensor storages left to the garbage collector", n)
	}
}

// TestShouldSave: a process that ShouldSave says does not save (a rank
// other than 0 of data-parallel training) writes no checkpoint, and an
// interrupt says that nothing was saved.
func TestShouldSave(t *testing.T) {
	s := newSetup(t, "sgd", 0.05)
	s.cfg.Epochs = 1
	s.cfg.Checkpoint = filepath.Join(t.TempDir(), "rank1.safetensors")
	s.cfg.ShouldSave = func() bool { return false }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s.cfg.Loss = cancelAfter(2, cancel)
	_, err := trainer.Run(ctx, s.cfg)
	var ie *trainer.InterruptedError
	if !errors.As(err, &ie) || ie.Checkpoint != "" || ie.SaveErr != nil {
		t.Fatalf("error %v (%+v), want an interruption that saved nothing", err, ie)
	}
	if _, err := os.Stat(s.cfg.Checkpoint); err == nil {
		t.Error("a checkpoint was written")
	}
}

// TestAutocastOption: Config.Autocast bfloat16 runs the steps' products in
// bfloat16 (the weights after training differ from float32's, and the
// loss still falls), the scopes the steps get carry it, and another
// element type is an error naming the option.
func TestAutocastOption(t *testing.T) {
	f32 := newSetup(t, "sgd", 0.05)
	if _, err := trainer.Run(context.Background(), f32.cfg); err != nil {
		t.Fatal(err)
	}
	bf := newSetup(t, "sgd", 0.05)
	bf.cfg.Autocast = tensor.BFloat16
	if _, err := trainer.Run(context.Background(), bf.cfg); err != nil {
		t.Fatal(err)
	}
	a, b := params(f32.model), params(bf.model)
	same := true
	for k := range a {
		for i := range a[k] {
			same = same && a[k][i] == b[k][i]
		}
	}
	if same {
		t.Error("the weights trained with Autocast bfloat16 equal float32's: the products did not run in bfloat16")
	}
	if last := bf.evals[len(bf.evals)-1]; last[1] < 90 {
		t.Errorf("accuracy %.1f%% after training in bfloat16; want at least 90%%", last[1])
	}
	var seen tensor.DType = tensor.Int32
	step, err := trainer.CaptureStep(tensor.CPU, func(s *tensor.Scope) *tensor.Tensor {
		seen = s.Autocast()
		return tensor.FromFloat32(tensor.CPU, s, []float32{1}, 1)
	}, trainer.StepOptions{Eager: true, Autocast: tensor.BFloat16})
	if err != nil {
		t.Fatal(err)
	}
	defer step.Close()
	if _, err := step.Run(1); err != nil || seen != tensor.BFloat16 {
		t.Errorf("the step's scope has autocast %v (err %v), want bfloat16", seen, err)
	}
	bad := newSetup(t, "sgd", 0.05)
	bad.cfg.Autocast = tensor.Int32
	if _, err := trainer.Run(context.Background(), bad.cfg); err == nil || !strings.Contains(err.Error(), "Autocast") {
		t.Errorf("Autocast int32: error %v, want one naming Autocast", err)
	}
}

// Run applies a one-cycle schedule's momentum before every step, as
// torch's OneCycleLR(cycle_momentum=True): the SGD ends with the
// schedule's last momentum and the weights differ from a run whose
// schedule leaves the momentum alone.
func TestRunCyclesMomentum(t *testing.T) {
	run := func(cycle bool) (map[string][]float32, float64) {
		s := newSetup(t, "sgd", 0.05)
		s.cfg.Epochs = 1
		total := nTrain / batchSize
		sched := optim.NewOneCycleLR(0.05, total)
		sched.CycleMomentum = cycle
		s.cfg.Schedule = sched
		if _, err := trainer.Run(context.Background(), s.cfg); err != nil {
			t.Fatal(err)
		}
		return params(s.model), s.cfg.Optimizer.(*optim.SGD).Momentum
	}
	cycled, m := run(true)
	sched := optim.NewOneCycleLR(0.05, nTrain/batchSize)
	if want := sched.Momentum(nTrain/batchSize - 1); m != want {
		t.Errorf("momentum after the run %v; want the schedule's last, %v", m, want)
	}
	plain, m0 := run(false)
	if m0 != 0.9 {
		t.Errorf("momentum %v without cycling; want the configured 0.9", m0)
	}
	same := true
	for k, v := range cycled {
		for i := range v {
			same = same && v[i] == plain[k][i]
		}
	}
	if same {
		t.Error("cycling the momentum left the weights unchanged")
	}
	// An SGD without momentum cannot take a cycled one: a clear error.
	s := newSetup(t, "sgd", 0.05)
	o, err := optim.NewSGD(nn.Parameters(s.model), optim.SGDConfig{LR: 0.05})
	if err != nil {
		t.Fatal(err)
	}
	s.cfg.Optimizer, s.cfg.Schedule = o, optim.NewOneCycleLR(0.05, 100)
	if _, err := trainer.Run(context.Background(), s.cfg); err == nil || !strings.Contains(err.Error(), "without momentum") {
		t.Errorf("Run cycling the momentum of an SGD without it: %v", err)
	}
}
