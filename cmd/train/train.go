package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"time"

	"github.com/ember-ml/ember/data"
	"github.com/ember-ml/ember/models"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/nn/trainer"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// job is one run of the command: what the flags ask for, found and
// checked, handed to trainer.Run, and its outcome printed.
type job struct {
	opt         *options
	out, errOut io.Writer

	dev       *device
	model     nn.Module
	modelCfg  models.Config
	optimizer trainer.Optimizer

	dataDesc     string // the data: line
	dataIdentity string // what the training state records of the data
	dataDefault  bool   // found by the default search: record --data ""
	train, test  *data.Dataset
	trainSet     *trainer.Images
	testSet      *trainer.Images

	resumed     *models.TrainingState // from --resume, or nil
	resumeModel nn.Module             // its weights, on the CPU until the device model exists

	dataFromCheckpoint bool // --data is the one the checkpoint recorded
	result             *trainer.Result
}

func (t *job) logf(format string, args ...any) { fmt.Fprintf(t.out, format+"\n", args...) }

func (t *job) main(ctx context.Context) (code int) {
	start := time.Now()
	defer func() {
		for _, s := range []*trainer.Images{t.trainSet, t.testSet} {
			if s != nil {
				s.Release()
			}
		}
		if t.dev != nil {
			t.dev.close()
		}
	}()
	err := t.setup(ctx)
	if err == nil {
		err = t.run(ctx)
	}
	var interrupted *trainer.InterruptedError
	var diverged *trainer.DivergedError
	var resumeErr *trainer.ResumeError
	switch {
	case err == nil:
		if t.result != nil && t.result.Saved {
			t.logf("done in %.1f s; model saved to %s", time.Since(start).Seconds(), t.opt.save)
		}
		if t.opt.bench && t.result != nil {
			t.printBench()
		}
		return exitOK
	case errors.As(err, &interrupted):
		t.sayInterrupted(interrupted)
		return exitInterrupted
	case errors.As(err, &diverged):
		fmt.Fprintf(t.errOut, "train: %v (try a smaller --lr, now %g)\n", oneLine(err), t.opt.lr)
		return exitFailure
	case errors.As(err, &resumeErr):
		fmt.Fprintf(t.errOut, "train: %s: %v\n", models.StatePath(t.opt.resume), oneLine(err))
		return exitUsage
	}
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

func (t *job) setup(ctx context.Context) error {
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
	if err := t.loadData(ctx); err != nil {
		return err
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

	var err error
	t.dev, err = openDevice(o)
	if err != nil {
		return err
	}
	t.logf("device: %s", t.dev.description)

	return guarded(func() (err error) {
		b := t.dev.backend
		scale, shift := trainer.MNISTScale, trainer.MNISTShift
		var mean, std float32
		if o.dataset != "mnist" {
			// Other data sets are normalised by their own training
			// set's statistics, as zoo.py does.
			mean, std = pixelStats(t.train.Images)
			scale, shift = 1/(255*std), -mean/std
		}
		if t.trainSet, err = trainer.NewImages(b, t.train, o.batchSize, scale, shift); err != nil {
			return err
		}
		if t.testSet, err = trainer.NewImages(b, t.test, 0, scale, shift); err != nil {
			return err
		}
		if o.augment {
			if std == 0 {
				mean, std = float32(data.Mean), float32(data.Std)
			}
			means, stds := make([]float32, t.train.NumChannels()), make([]float32, t.train.NumChannels())
			for c := range means {
				means[c], stds[c] = mean, std
			}
			a := &trainer.Augmentation{Pad: 2, FlipProb: 0.5, Mean: means, Std: stds, Seed: o.seed}
			if err := t.trainSet.SetAugmentation(a); err != nil {
				return usageError{fmt.Errorf("--augment: %v", err)}
			}
		}
		if t.dev.memory != nil {
			t.dev.memory.MarkDataset(t.trainSet.Bytes() + t.testSet.Bytes())
		}
		t.modelCfg = models.Config{InputShape: []int{t.train.NumChannels(), t.train.Rows, t.train.Cols}, Classes: t.train.NumClasses(), Seed: o.seed}
		if t.model, err = models.New(o.model, b, t.modelCfg); err != nil {
			return usageError{err}
		}
		if t.optimizer, err = t.newOptimizer(); err != nil {
			return usageError{err}
		}
		return nil
	})
}

// loadData finds the data set --dataset and --data name (downloading MNIST
// first with --download), checks it against the resumed checkpoint's, and
// loads it.
func (t *job) loadData(ctx context.Context) error {
	o := t.opt
	if o.dataset == "fashion-mnist" {
		loc, err := data.LocateFashionMNIST(o.dataDir)
		if err != nil {
			return t.dataError(err)
		}
		t.dataDesc, t.dataIdentity, t.dataDefault = loc.Describe(), "fashion-mnist", loc.Origin == data.OriginDebian
		t.logf("data: %s", t.dataDesc)
		if err := t.checkResumeData(t.dataIdentity, loc.Dir); err != nil {
			return err
		}
		if t.train, t.test, err = data.LoadFashionMNIST(loc.Dir); err != nil {
			return usageError{err}
		}
		return nil
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
		return t.dataError(err)
	}
	t.dataDesc, t.dataIdentity, t.dataDefault = src.Describe(), src.Identity(), src.Origin == data.OriginModuleCache
	t.logf("data: %s", t.dataDesc)
	if err := t.checkResumeData(t.dataIdentity, src.Dir); err != nil {
		return err
	}
	// The size from the headers, before the files are read.
	if o.model == "lenet" && (src.Rows != models.Side || src.Cols != models.Side) {
		return usageError{fmt.Errorf("%s: the images are %dx%d; LeNet takes %dx%d images (MNIST's size)", src.Dir, src.Rows, src.Cols, models.Side, models.Side)}
	}
	if t.train, t.test, err = data.LoadMNIST(src.Dir); err != nil {
		return usageError{err}
	}
	return nil
}

func (t *job) dataError(err error) error {
	if t.dataFromCheckpoint {
		return usageError{fmt.Errorf("%v (the data set %s was trained on; give --data to use another)", err, t.opt.resume)}
	}
	return usageError{err}
}

// pixelStats is the mean and (unbiased) standard deviation of the pixels
// on a 0-1 scale, over every channel.
func pixelStats(px []uint8) (mean, std float32) {
	var hist [256]float64
	for _, p := range px {
		hist[p]++
	}
	var n, sum, sq float64
	for v, c := range hist {
		x := float64(v) / 255
		n, sum, sq = n+c, sum+c*x, sq+c*x*x
	}
	m := sum / n
	return float32(m), float32(math.Sqrt((sq - n*m*m) / (n - 1)))
}

// newOptimizer builds the optimiser --optimizer names.
func (t *job) newOptimizer() (trainer.Optimizer, error) {
	o := t.opt
	params := nn.Parameters(t.model)
	if o.optimizer == "adamw" {
		cfg := optim.DefaultAdamWConfig()
		cfg.LR = o.lr
		return optim.NewAdamGroups(optim.DecayGroups(params, o.lr, cfg.WeightDecay), cfg, true)
	}
	return optim.NewSGD(params, optim.SGDConfig{LR: o.lr, Momentum: o.momentum, Nesterov: o.nesterov, WeightDecay: o.weightDecay})
}

// schedule is the learning-rate schedule --schedule names over the whole
// run, nil for none.
func (t *job) schedule() optim.Schedule {
	o := t.opt
	total := o.epochs * (t.train.N / o.batchSize)
	switch o.schedule {
	case "onecycle":
		return optim.NewOneCycleLR(o.lr, total)
	case "cosine":
		return optim.CosineAnnealingLR{BaseLR: o.lr, TMax: total}
	}
	return nil
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

func firstN(d *data.Dataset, n int) *data.Dataset {
	c := *d
	size := d.ImageSize()
	c.Images, c.Labels, c.N = d.Images[:n*size], d.Labels[:n], n
	return &c
}

// run trains with package trainer.
func (t *job) run(ctx context.Context) error {
	o := t.opt
	cfg := trainer.Config{
		Model: t.model, Optimizer: t.optimizer, Data: t.trainSet,
		Evaluate: func(m nn.Module) (float64, float64, error) {
			// Batches no larger than the training batch (at most 1000), so
			// that evaluation never needs more device memory than training.
			return t.testSet.Evaluate(m, min(o.batchSize, 1000))
		},
		Schedule: t.schedule(), Epochs: o.epochs, Seed: o.seed, LogInterval: o.logInterval,
		Checkpoint: o.save, Flags: t.flags(), ModelMetadata: models.Metadata(o.model, t.modelCfg),
		Eager: t.dev.gpu == nil || o.noGraph, GraphHint: " (--no-graph launches eagerly)",
		Log: t.out, Progress: t.errOut,
	}
	if t.test.N < 10000 {
		cfg.EvalNote = fmt.Sprintf(" (first %d test images)", t.test.N)
	}
	if t.dev.memory != nil {
		cfg.Monitor = t.dev.memory
	}
	startEpoch := 0
	if t.resumed != nil {
		if err := guarded(func() error { cfg.Resume = t.applyResume(); return nil }); err != nil {
			return err
		}
		cfg.LastCheckpoint = o.resume
		startEpoch = cfg.Resume.Epoch
	}
	if startEpoch >= o.epochs {
		t.logf("nothing to do: the checkpoint already has %d epochs (ask for more with --epochs)", startEpoch)
		return nil
	}
	if o.metrics != "" {
		m, err := trainer.OpenMetrics(o.metrics, t.resumed != nil && (t.resumed.Epoch > 0 || t.resumed.Step > 0))
		if err != nil {
			return usageError{fmt.Errorf("--metrics: %w", err)}
		}
		defer m.Close()
		cfg.Metrics = m
	}
	var err error
	t.result, err = trainer.Run(ctx, cfg)
	return err
}

// flags are the settings the training state records.
func (t *job) flags() map[string]string {
	flags := map[string]string{
		dataIdentityKey: t.dataIdentity,
		"device":        t.dev.backend.Name(),
	}
	for _, s := range settings {
		flags[s.name] = s.get(t.opt)
	}
	if t.dataDefault {
		flags["data"] = "" // found again by the default search, wherever it is
	}
	return flags
}

// sayInterrupted says where training stopped and how to continue.
func (t *job) sayInterrupted(e *trainer.InterruptedError) {
	if e.SaveErr != nil {
		fmt.Fprintf(t.errOut, "train: interrupted, and saving failed: %v\n", oneLine(e.SaveErr))
		return
	}
	fmt.Fprintf(t.errOut, "train: interrupted at epoch %d, step %d; saved %s\n", e.Epoch+1, e.Step, t.opt.save)
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
}

func (t *job) printBench() {
	r := t.result
	med := median(r.StepTimes)
	t.logf("\n| metric | value |\n| --- | --- |")
	t.logf("| device | %s |", t.dev.backend.Name())
	t.logf("| batch size | %d |", t.opt.batchSize)
	for i, s := range r.EpochSeconds {
		t.logf("| epoch %d seconds | %.4f |", i+1, s)
		t.logf("| epoch %d images/s | %.0f |", i+1, float64(t.train.N/t.opt.batchSize*t.opt.batchSize)/s)
	}
	if len(r.StepTimes) > 0 {
		t.logf("| step time (median over log windows, without the first step's) | %.1f us |", med*1e6)
	} else {
		t.logf("| step time (median over log windows, without the first step's) | none: one window |")
	}
	if t.dev.memory != nil {
		t.dev.memory.BenchRows(t.logf, r.Steps, r.StepDriverAllocs)
	}
	t.logf("| test accuracy | %.2f%% |", r.Accuracy)
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
