package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/ember-ml/ember/cuda"
	"github.com/ember-ml/ember/data"
	"github.com/ember-ml/ember/models"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// trainer holds one run of the command.
type trainer struct {
	opt         *options
	out, errOut io.Writer

	dev   *device
	model *models.LeNet
	sgd   *optim.SGD

	src                 data.Source
	train, test         *data.Dataset
	trainImgs, testImgs *tensor.Tensor // whole sets on the device, as bytes

	resumed     *models.TrainingState // from --resume, or nil
	resumeModel *models.LeNet         // its weights, on the CPU until the device model exists
	lastSaved   string                // the newest complete checkpoint of this run (or --resume), "" if none

	dataFromCheckpoint bool // --data is the one the checkpoint recorded
	savedThisRun       bool

	startEpoch, startStep int
	globalStep            int
	runSteps              int       // steps of this run (globalStep counts those before a --resume too)
	stepTimes             []float64 // seconds per step, one per log window but the first step's
	stepDriverAllocs      int64     // driver allocations by training steps after the first
	epochSeconds          []float64
	lastAccuracy          float64
}

// The normalisation (x/255 - mean)/std as one multiply-add on bytes.
var (
	pixelScale = float32(1 / (255 * data.Std))
	pixelShift = float32(-data.Mean / data.Std)
)

func (t *trainer) logf(format string, args ...any) { fmt.Fprintf(t.out, format+"\n", args...) }

func (t *trainer) main(ctx context.Context) (code int) {
	start := time.Now()
	defer func() {
		if t.dev != nil {
			t.dev.close()
		}
	}()
	err := t.setup(ctx)
	if err == nil {
		err = guarded(func() error { return t.loop(ctx) })
	}
	switch {
	case err == nil:
		if t.savedThisRun {
			t.logf("done in %.1f s; model saved to %s", time.Since(start).Seconds(), t.opt.save)
		}
		if t.opt.bench {
			t.printBench()
		}
		return exitOK
	case errors.Is(err, errInterrupted):
		return exitInterrupted
	default:
		var u usageError
		switch {
		case isOutOfMemory(err):
			fmt.Fprintf(t.errOut, "train: %v; try a smaller --batch-size (now %d) or a larger --memory-limit\n", oneLine(err), t.opt.batchSize)
			return exitUsage
		case errors.As(err, &u):
			fmt.Fprintf(t.errOut, "train: %v\n", oneLine(err))
			return exitUsage
		}
		fmt.Fprintf(t.errOut, "train: %v\n", oneLine(err))
		return exitFailure
	}
}

var errInterrupted = errors.New("interrupted")

func (t *trainer) setup(ctx context.Context) error {
	o := t.opt
	// Everything the flags name is checked before the data is loaded and
	// long before the first step: the checkpoint to resume (whose settings
	// then apply), where to save, the metrics file.
	if o.resume != "" {
		if err := t.loadResume(); err != nil {
			return err
		}
	}
	if err := t.checkOutputs(); err != nil {
		return err
	}
	if o.download {
		dir := o.dataDir
		if dir == "" {
			dir = "mnist"
			o.dataDir = dir
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return usageError{fmt.Errorf("--download: %w", err)}
		}
		if err := data.Download(ctx, dir, data.DownloadOptions{Log: t.errOut}); err != nil {
			return usageError{err}
		}
	}
	src, err := data.Locate(o.dataDir)
	if err != nil {
		if t.dataFromCheckpoint {
			return usageError{fmt.Errorf("%v (the data set %s was trained on; give --data to use another)", err, o.resume)}
		}
		return usageError{err}
	}
	t.src = src
	t.logf("data: %s", src.Describe())
	if err := t.checkResumeData(src); err != nil {
		return err
	}
	// The size from the headers, before the files are read.
	if src.Rows != models.Side || src.Cols != models.Side {
		return usageError{fmt.Errorf("%s: the images are %dx%d; LeNet takes %dx%d images (MNIST's size)", src.Dir, src.Rows, src.Cols, models.Side, models.Side)}
	}
	t.train, t.test, err = data.LoadMNIST(src.Dir)
	if err != nil {
		return usageError{err}
	}
	if o.limit > 0 && o.limit < t.train.N {
		t.train = firstN(t.train, o.limit)
	}
	if o.testLimit > 0 && o.testLimit < t.test.N {
		t.test = firstN(t.test, o.testLimit)
	}
	if t.train.N < o.batchSize {
		return usageError{fmt.Errorf("--batch-size %d is larger than the %d training images", o.batchSize, t.train.N)}
	}

	// This run is the only writer of --save: clear temporary files that a
	// save killed half-way left behind.
	if removed, err := models.RemoveCheckpointTemps(o.save); err == nil && len(removed) > 0 {
		t.logf("removed %d temporary file(s) of an interrupted save", len(removed))
	}

	t.dev, err = openDevice(o)
	if err != nil {
		return err
	}
	t.logf("device: %s", t.dev.description)

	return guarded(func() (err error) {
		b := t.dev.backend
		t.trainImgs = tensor.FromUint8(b, nil, t.train.Images, t.train.N, t.train.Rows*t.train.Cols)
		t.testImgs = tensor.FromUint8(b, nil, t.test.Images, t.test.N, t.test.Rows*t.test.Cols)
		t.dev.markDataset(len(t.train.Images) + len(t.test.Images))
		t.model = models.NewLeNet(b, o.seed)
		t.sgd, err = optim.NewSGD(nn.Parameters(t.model), optim.SGDConfig{LR: o.lr, Momentum: o.momentum})
		if err != nil {
			return usageError{err}
		}
		if t.resumed != nil {
			if err := t.applyResume(); err != nil {
				return err
			}
		}
		t.dev.resetPeak()
		return nil
	})
}

// guarded runs f and returns its error, or the device error (out of memory,
// a failed launch) that an operation inside it panicked with.
func guarded(f func() error) error {
	var err error
	if gerr := tensor.Guard(func() { err = f() }); gerr != nil {
		return gerr
	}
	return err
}

func finite(v float32) bool { return !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0) }

func firstN(d *data.Dataset, n int) *data.Dataset {
	return &data.Dataset{Images: d.Images[:n*d.Rows*d.Cols], Labels: d.Labels[:n], N: n, Rows: d.Rows, Cols: d.Cols}
}

func (t *trainer) loop(ctx context.Context) error {
	o := t.opt
	b := t.dev.backend
	if t.startEpoch >= o.epochs {
		t.logf("nothing to do: the checkpoint already has %d epochs (ask for more with --epochs)", t.startEpoch)
		return nil
	}
	metrics, err := openMetrics(o.metrics, t.startEpoch > 0 || t.startStep > 0)
	if err != nil {
		return usageError{err}
	}
	defer metrics.close()

	steps := t.train.N / o.batchSize // drop the last partial batch, as reference.py does
	scope := tensor.NewScope()
	defer scope.Release()
	lossSum := tensor.Zeros(b, nil, 1)
	defer lossSum.Release()
	// The batch's indices and labels go to the same device tensors every
	// step, which is what lets a captured step be replayed: side by side in
	// one allocation, one upload per step.
	idxDev := tensor.EmptyOf(b, nil, tensor.Int32, o.batchSize)
	labelsDev := tensor.EmptyOf(b, nil, tensor.Int32, o.batchSize)
	batchDev := tensor.Pack([]*tensor.Tensor{idxDev, labelsDev})
	defer batchDev.Release()
	batch := make([]int32, 2*o.batchSize) // the indices, then the labels
	runner := t.newStepper(scope, idxDev, labelsDev, lossSum)
	defer runner.close()

	for epoch := t.startEpoch; epoch < o.epochs; epoch++ {
		perm := data.Permutation(t.train.N, o.seed, epoch)
		first := 0
		if epoch == t.startEpoch {
			first = t.startStep
		}
		b.Fill(lossSum.Buffer(), 0)
		bar := newProgress(t.errOut, steps, fmt.Sprintf("epoch %d/%d", epoch+1, o.epochs))
		// Driver allocations made by training steps after the first (the
		// steady state, which should make none); evaluation is not counted.
		epochAllocs := t.dev.driverAllocs()
		epochStart := time.Now()
		lastCheck := first - 1 // the last step whose loss was checked
		windowStart, windowSteps, firstInWindow := epochStart, 0, false
		for step := first; step < steps; step++ {
			if ctx.Err() != nil {
				return t.interrupted(epoch, step)
			}
			idx := perm[step*o.batchSize : (step+1)*o.batchSize]
			copy(batch, idx)
			for i, j := range idx {
				batch[o.batchSize+i] = int32(t.train.Labels[j])
			}
			b.Upload(batchDev.Buffer(), batch)
			loss := runner.run()
			t.globalStep++
			t.runSteps++
			windowSteps++
			if t.runSteps == 1 {
				// The run's first step allocates and captures the graph.
				epochAllocs = t.dev.driverAllocs()
				firstInWindow = true
			}
			if (step+1)%o.logInterval == 0 || step == steps-1 {
				l := loss.Item() // waits for the queued steps
				now := time.Now()
				// Not the window of the run's first step, which captures
				// the graph (at batch 1024 an epoch is one window).
				if !firstInWindow {
					t.stepTimes = append(t.stepTimes, now.Sub(windowStart).Seconds()/float64(windowSteps))
				}
				windowStart, windowSteps, firstInWindow = now, 0, false
				// The running sum turns NaN or Inf with the first bad step,
				// so checking it here catches one between two checks too.
				if sum := lossSum.Item(); !finite(l) || !finite(sum) {
					bad := l
					if finite(l) {
						bad = sum
					}
					where := fmt.Sprintf("step %d", step+1)
					if step > lastCheck+1 {
						where = fmt.Sprintf("a step from %d to %d", lastCheck+2, step+1)
					}
					last := "no checkpoint was saved"
					if t.lastSaved != "" {
						last = "the last good checkpoint is " + t.lastSaved
					}
					return fmt.Errorf("loss is %v at epoch %d, %s; stopped, %s (try a smaller --lr, now %g)", bad, epoch+1, where, last, o.lr)
				}
				lastCheck = step
				imgs := float64((step+1-first)*o.batchSize) / now.Sub(epochStart).Seconds()
				bar.update(step+1, l, imgs)
			}
		}
		if err := b.Synchronize(); err != nil {
			return err
		}
		secs := time.Since(epochStart).Seconds()
		t.dev.markTrainingPeak()
		t.stepDriverAllocs += t.dev.driverAllocs() - epochAllocs
		bar.finish()
		t.epochSeconds = append(t.epochSeconds, secs)
		trainLoss := float64(lossSum.Item()) / float64(steps-first)
		testLoss, acc := t.evaluate()
		// Evaluation's batches are not the step's: hand their cached blocks
		// back so that the training step runs in only its own memory.
		t.dev.emptyCache()
		t.lastAccuracy = acc
		imgsPerSec := float64((steps-first)*o.batchSize) / secs
		testSet := ""
		if t.test.N < 10000 {
			testSet = fmt.Sprintf(" (first %d test images)", t.test.N)
		}
		t.logf("epoch %d/%d: train loss %.4f, test loss %.4f, test accuracy %.2f%%%s, %.2f s, %.0f images/s%s",
			epoch+1, o.epochs, trainLoss, testLoss, acc, testSet, secs, imgsPerSec, t.dev.memoryLine())
		if err := metrics.write(epoch+1, trainLoss, testLoss, acc, secs, imgsPerSec); err != nil {
			return err
		}
		if err := t.save(epoch+1, 0); err != nil {
			return err
		}
	}
	return nil
}

// stepper runs training steps on the batch held in idx and labels: eagerly,
// or on the GPU by replaying a CUDA graph of the step captured once.
type stepper struct {
	t                *trainer
	scope            *tensor.Scope
	idx, labels, sum *tensor.Tensor
	graph            *cuda.StepGraph
	graphLoss        *tensor.Tensor
	tryGraph         bool
}

func (t *trainer) newStepper(scope *tensor.Scope, idx, labels, lossSum *tensor.Tensor) *stepper {
	t.sgd.ZeroGrad() // once: each step's update zeroes them after reading them
	return &stepper{t: t, scope: scope, idx: idx, labels: labels, sum: lossSum,
		tryGraph: t.dev.gpu != nil && !t.opt.noGraph}
}

// eager queues one training step and returns its loss (not read back).
func (s *stepper) eager() *tensor.Tensor {
	t := s.t
	s.scope.Reset()
	n := s.idx.Len()
	x := tensor.GatherNormalize(s.scope, t.trainImgs, s.idx, pixelScale, pixelShift).Reshape(n, 1, t.train.Rows, t.train.Cols)
	loss := t.model.LossSum(x, s.labels, s.sum) // the epoch's running sum too
	loss.Backward()
	t.sgd.StepAndZeroGrad() // the gradients start at zero (newStepper)
	return loss
}

func (s *stepper) run() *tensor.Tensor {
	if s.graph != nil {
		if err := s.graph.Replay(); err != nil {
			panic(&tensor.Error{Op: "replay", Err: err})
		}
		s.t.sgd.Replayed()
		return s.graphLoss
	}
	if s.tryGraph && s.t.sgd.Replayable() {
		s.tryGraph = false
		var loss *tensor.Tensor
		before := s.t.sgd.Steps()
		g, err := s.t.dev.gpu.Capture(func() { loss = s.eager() })
		if err == nil {
			s.t.logf("cuda graph: the training step is captured once and replayed (--no-graph launches eagerly)")
			s.graph, s.graphLoss = g, loss
			return s.run()
		}
		// The capture ran no work, but the host side of the step may have
		// counted an optimiser step (not when the capture failed first).
		if s.t.sgd.Steps() > before {
			s.t.sgd.Rewind()
		}
		s.t.logf("cuda graph: capture failed, launching eagerly: %v", oneLine(err))
	}
	return s.eager()
}

func (s *stepper) close() {
	if s.graph != nil {
		s.scope.Reset()
		s.graph.Close()
	}
}

// evaluate returns the mean loss and the accuracy in percent on the test set.
func (t *trainer) evaluate() (loss, accuracy float64) {
	// Evaluate in batches no larger than the training batch (at most 1000),
	// so that evaluation never needs more device memory than training.
	batch := min(t.opt.batchSize, 1000)
	b := t.dev.backend
	rows, cols := t.test.Rows, t.test.Cols
	var lossSum float64
	correct := 0
	idx := make([]int32, batch)
	labels := make([]int32, batch)
	for start := 0; start < t.test.N; start += batch {
		n := min(batch, t.test.N-start)
		for i := 0; i < n; i++ {
			idx[i] = int32(start + i)
			labels[i] = int32(t.test.Labels[start+i])
		}
		s := tensor.NewNoGradScope()
		ix := tensor.FromInt32(b, s, idx[:n], n)
		x := tensor.GatherNormalize(s, t.testImgs, ix, pixelScale, pixelShift).Reshape(n, 1, rows, cols)
		y := tensor.FromInt32(b, s, labels[:n], n)
		logits := t.model.Forward(x)
		lossSum += float64(tensor.CrossEntropy(logits, y).Item()) * float64(n)
		for i, p := range tensor.Argmax(logits).Int32s() {
			if p == labels[i] {
				correct++
			}
		}
		s.Release()
	}
	return lossSum / float64(t.test.N), 100 * float64(correct) / float64(t.test.N)
}

// save writes the model and the training state, each atomically.
func (t *trainer) save(epoch, step int) error {
	if dir := filepath.Dir(t.opt.save); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return usageError{fmt.Errorf("--save %s: %w", t.opt.save, err)}
		}
	}
	var momentum []float32
	if m := t.sgd.MomentumBuffer(); m != nil {
		momentum = m.Float32s()
	}
	o := t.opt
	flags := map[string]string{
		dataIdentityKey: t.src.Identity(),
		"device":        t.dev.backend.Name(),
	}
	for _, s := range settings {
		flags[s.name] = s.get(o)
	}
	if t.src.Origin == data.OriginModuleCache {
		flags["data"] = "" // found again by the default search, wherever the cache is
	}
	st := &models.TrainingState{
		Epoch: epoch, Step: step, GlobalStep: t.globalStep, Seed: o.seed,
		Momentum: momentum, OptimizerSteps: t.sgd.Steps(), Flags: flags,
	}
	if err := models.SaveCheckpoint(o.save, t.model, st); err != nil {
		if errors.Is(err, nn.ErrNonFinite) {
			last := "no checkpoint was saved"
			if t.lastSaved != "" {
				last = "the last good checkpoint is " + t.lastSaved
			}
			where := fmt.Sprintf("after epoch %d", epoch)
			if step > 0 {
				where = fmt.Sprintf("at epoch %d, step %d", epoch+1, step)
			}
			what := oneLine(err)
			var ce *nn.CheckpointError
			if errors.As(err, &ce) {
				what, _, _ = strings.Cut(ce.Problem, ": the values are broken")
			}
			return fmt.Errorf("the weights are not finite %s (%s); stopped without saving them, %s (try a smaller --lr, now %g)", where, what, last, o.lr)
		}
		return err
	}
	t.lastSaved, t.savedThisRun = o.save, true
	return nil
}

// interrupted saves where training stopped and says how to continue.
func (t *trainer) interrupted(epoch, step int) error {
	if err := t.save(epoch, step); err != nil {
		fmt.Fprintf(t.errOut, "train: interrupted, and saving failed: %v\n", oneLine(err))
		return errInterrupted
	}
	fmt.Fprintf(t.errOut, "train: interrupted at epoch %d, step %d; saved %s\n", epoch+1, step, t.opt.save)
	// The state records the settings; only the per-run flags need saying.
	hint := "train --resume " + t.opt.save
	for _, f := range []string{"device", "metrics"} {
		if t.opt.set[f] {
			v := t.opt.device
			if f == "metrics" {
				v = t.opt.metrics
			}
			hint += " --" + f + " " + v
		}
	}
	fmt.Fprintf(t.errOut, "resume with: %s\n", hint)
	return errInterrupted
}

func (t *trainer) printBench() {
	med := median(t.stepTimes)
	epochs := append([]float64(nil), t.epochSeconds...)
	t.logf("\n| metric | value |\n| --- | --- |")
	t.logf("| device | %s |", t.dev.backend.Name())
	t.logf("| batch size | %d |", t.opt.batchSize)
	for i, s := range epochs {
		t.logf("| epoch %d seconds | %.4f |", i+1, s)
		t.logf("| epoch %d images/s | %.0f |", i+1, float64(t.train.N/t.opt.batchSize*t.opt.batchSize)/s)
	}
	if len(t.stepTimes) > 0 {
		t.logf("| step time (median over log windows, without the first step's) | %.1f us |", med*1e6)
	} else {
		t.logf("| step time (median over log windows, without the first step's) | none: one window |")
	}
	t.dev.benchRows(t.logf, t.runSteps, t.stepDriverAllocs)
	t.logf("| test accuracy | %.2f%% |", t.lastAccuracy)
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// oneLine keeps an error message on one line.
func oneLine(err error) string {
	msg := err.Error()
	for i, r := range msg {
		if r == '\n' {
			return msg[:i]
		}
	}
	return msg
}
