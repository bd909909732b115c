package main

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"time"
	"unicode/utf8"

	"github.com/ember-ml/ember/data"
	"github.com/ember-ml/ember/models"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/nn/parallel"
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
	norm      *models.Normalization // nil: MNIST's
	optimizer trainer.Optimizer

	dataDesc     string // the data: line
	dataIdentity string // what the training state records of the data
	dataDefault  bool   // found by the default search: record --data ""
	train, test  *data.Dataset
	trainSet     *trainer.Images
	testSet      *trainer.Images

	text                *data.Text    // --dataset text: the tokens and the vocabulary
	trainText, testText *trainer.Text // its windows on the device
	source              trainer.Source
	dropout             *tensor.DeviceGenerator // the model's dropout masks, drawn on the device
	resumeMeta          map[string]string       // the resumed model file's metadata

	resumed     *models.TrainingState // from --resume, or nil
	resumeModel nn.Module             // its weights, on the CPU until the device model exists

	dataFromCheckpoint bool // --data is the one the checkpoint recorded
	result             *trainer.Result

	env  parallel.Environment  // where this process stands in a data-parallel job
	comm parallel.Communicator // its communicator, nil when alone
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
		for _, s := range []*trainer.Text{t.trainText, t.testText} {
			if s != nil {
				s.Release()
			}
		}
		if t.dropout != nil {
			t.dropout.Release()
		}
		if t.comm != nil {
			t.comm.Close()
		}
		if t.dev != nil {
			t.dev.close()
		}
	}()
	err := t.joinJob()
	if err == nil {
		err = t.setup(ctx)
	}
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
	if err := t.checkWorldBatch(); err != nil {
		return err
	}
	if err := t.checkOutputs(); err != nil {
		return err
	}
	if err := t.loadData(ctx); err != nil {
		return err
	}
	if t.text != nil {
		if err := t.limitText(); err != nil {
			return err
		}
	} else {
		if o.limit > 0 && o.limit < t.train.N {
			t.train = firstN(t.train, o.limit)
		}
		if o.testLimit > 0 && o.testLimit < t.test.N {
			t.test = firstN(t.test, o.testLimit)
		}
		if t.train.N < o.batchSize {
			return usageError{fmt.Errorf("--batch-size %d is larger than the %d training images", o.batchSize, t.train.N)}
		}
	}

	// This run is the only writer of --save: clear temporary files that a
	// save killed half-way left behind.
	if removed, err := models.RemoveCheckpointTemps(o.save); t.isMain() && err == nil && len(removed) > 0 {
		t.logf("removed %d temporary file(s) of an interrupted save", len(removed))
	}

	var err error
	t.dev, err = openDevice(o)
	if err != nil {
		return err
	}
	t.logf("device: %s", t.dev.description)
	if err := t.connect(ctx); err != nil {
		return err
	}

	return guarded(func() (err error) {
		b := t.dev.backend
		if t.text != nil {
			if t.trainText, err = trainer.NewText(b, t.text.Train, o.context, t.rankBatch()); err != nil {
				return err
			}
			if t.testText, err = trainer.NewText(b, t.text.Val, o.context, 0); err != nil {
				return err
			}
			t.source = t.trainText
			if t.dev.memory != nil {
				// The tokens stay on the host (each step uploads its
				// windows); marking them takes cuBLAS's workspace out of
				// the training figures, as their label says.
				t.dev.memory.MarkDataset(0)
			}
			t.modelCfg = models.Config{InputShape: []int{o.context}, Classes: t.text.Vocab.Size(), Seed: o.seed}
		} else {
			if err := t.setupImages(b); err != nil {
				return err
			}
			t.source = t.trainSet
			t.modelCfg = models.Config{InputShape: []int{t.train.NumChannels(), t.train.Rows, t.train.Cols}, Classes: t.train.NumClasses(), Seed: o.seed}
		}
		if t.model, err = models.New(o.model, b, t.modelCfg); err != nil {
			return usageError{err}
		}
		if o.recompute {
			n := nn.RecomputeBlocks(t.model)
			if n == 0 {
				return usageError{fmt.Errorf("--recompute: --model %s has no blocks to recompute (layers made of layers); it keeps every activation", o.model)}
			}
			t.logf("recompute: %d blocks keep their inputs and outputs only and run again in the backward pass", n)
		}
		// Dropout masks are drawn on the device (so that a captured step
		// draws new ones on every replay), from a stream fixed by the seed
		// and, after a resume, by the step the run continues from.
		seed := o.seed
		if t.resumed != nil {
			seed = mixSeed(o.seed, uint64(t.resumed.GlobalStep))
		}
		t.dropout = tensor.NewDeviceGenerator(b, seed)
		nn.SetRandomSource(t.model, t.dropout)
		if t.optimizer, err = t.newOptimizer(); err != nil {
			return usageError{err}
		}
		return nil
	})
}

// mixSeed derives the seed of a resumed run's dropout stream (splitmix64's
// finaliser of seed and step), so that it differs from the stream of the
// steps already taken.
func mixSeed(seed, step uint64) uint64 {
	z := seed + (step+1)*0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// setupImages uploads the image sets, normalised as the data set asks:
// MNIST by its usual constants, other sets by their own training set's
// statistics (as zoo.py does): one scale and shift over all channels for
// the plain gather, the mean and deviation of each channel for --augment.
func (t *job) setupImages(b tensor.Backend) (err error) {
	o := t.opt
	scale, shift := trainer.MNISTScale, trainer.MNISTShift
	channels := t.train.NumChannels()
	means, stds := make([]float32, channels), make([]float32, channels)
	for c := range means {
		means[c], stds[c] = float32(data.Mean), float32(data.Std)
	}
	if o.dataset != "mnist" {
		mean, std := pixelStats(t.train.Images)
		t.norm = &models.Normalization{Mean: mean, Std: std}
		scale, shift = t.norm.ScaleShift()
		means, stds = channelStats(t.train)
	}
	if t.trainSet, err = trainer.NewImages(b, t.train, t.rankBatch(), scale, shift); err != nil {
		return err
	}
	if t.testSet, err = trainer.NewImages(b, t.test, 0, scale, shift); err != nil {
		return err
	}
	if o.augment {
		a := &trainer.Augmentation{Pad: 2, FlipProb: 0.5, Mean: means, Std: stds, Seed: o.seed}
		if err := t.trainSet.SetAugmentation(a); err != nil {
			return usageError{fmt.Errorf("--augment: %v", err)}
		}
		// The test set per channel too (Evaluate gathers it without the
		// random parts).
		if err := t.testSet.SetAugmentation(&trainer.Augmentation{Mean: means, Std: stds, Seed: o.seed}); err != nil {
			return usageError{fmt.Errorf("--augment: %v", err)}
		}
	}
	if t.dev.memory != nil {
		t.dev.memory.MarkDataset(t.trainSet.Bytes() + t.testSet.Bytes())
	}
	return nil
}

// limitText applies --limit and --test-limit (counted in windows) to the
// text and checks that there are enough windows for a batch and for
// validation.
func (t *job) limitText() error {
	o, tx := t.opt, t.text
	ctx := o.context
	if o.limit > 0 && o.limit < trainer.TextWindows(len(tx.Train), ctx) {
		tx.Train = tx.Train[:o.limit*ctx+1]
	}
	if o.testLimit > 0 && o.testLimit < trainer.TextWindows(len(tx.Val), ctx) {
		tx.Val = tx.Val[:o.testLimit*ctx+1]
	}
	if n := trainer.TextWindows(len(tx.Train), ctx); n < o.batchSize {
		return usageError{fmt.Errorf("--batch-size %d is larger than the %d training windows of --context %d tokens in %s (%d tokens)", o.batchSize, n, ctx, o.dataDir, len(tx.Train))}
	}
	if trainer.TextWindows(len(tx.Val), ctx) == 0 {
		return usageError{fmt.Errorf("%s: its validation part (the last 10%%, %d tokens) holds no window of --context %d tokens and its next token; give a longer text or a smaller --context", o.dataDir, len(tx.Val), ctx)}
	}
	return nil
}

// loadData finds the data set --dataset and --data name (downloading MNIST
// first with --download), checks it against the resumed checkpoint's, and
// loads it.
func (t *job) loadData(ctx context.Context) error {
	o := t.opt
	switch o.dataset {
	case "text":
		return t.loadText()
	case "cifar10", "cifar100":
		name := map[string]string{"cifar10": "CIFAR-10", "cifar100": "CIFAR-100 (fine labels)"}[o.dataset]
		t.dataDesc, t.dataIdentity = name+" in "+o.dataDir, o.dataset
		t.logf("data: %s", t.dataDesc)
		if err := t.checkResumeData(t.dataIdentity, o.dataDir); err != nil {
			return err
		}
		var err error
		if o.dataset == "cifar10" {
			t.train, t.test, err = data.LoadCIFAR10(o.dataDir)
		} else {
			t.train, t.test, err = data.LoadCIFAR100(o.dataDir, data.CIFAR100Fine)
		}
		if err != nil {
			return t.dataError(err)
		}
		return nil
	}
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

// loadText reads --data as a text file of bytes (the vocabulary is its
// distinct bytes, or the resumed checkpoint's), the last 10% of the tokens
// held out for validation. The data's identity is the file's MD5.
func (t *job) loadText() error {
	o := t.opt
	opt := data.TextOptions{Level: data.ByteLevel, ValFraction: 0.1}
	if t.resumeMeta != nil {
		if v, err := models.VocabFromMetadata(o.resume, t.resumeMeta); err == nil {
			opt.Vocab = v
		}
	}
	text, err := data.LoadText(o.dataDir, opt)
	if err != nil {
		if opt.Vocab != nil {
			err = fmt.Errorf("%v (of the checkpoint %s)", err, o.resume)
		}
		return t.dataError(err)
	}
	raw, err := os.ReadFile(o.dataDir)
	if err != nil {
		return t.dataError(err)
	}
	if err := checkText(raw); err != nil {
		return t.dataError(fmt.Errorf("--data %s: %v; --dataset text reads a UTF-8 text file", o.dataDir, err))
	}
	sum := md5.Sum(raw)
	t.text = text
	t.dataIdentity = "text md5 " + hex.EncodeToString(sum[:])
	t.dataDesc = fmt.Sprintf("%s: %d bytes, a vocabulary of %d byte values, %d tokens for training and %d for validation", o.dataDir, len(raw), text.Vocab.Size(), len(text.Train), len(text.Val))
	t.logf("data: %s", t.dataDesc)
	return t.checkResumeData(t.dataIdentity, o.dataDir)
}

// checkText refuses what is not text: an empty file, a NUL byte or bytes
// that are not UTF-8 (a binary file given by mistake).
func checkText(b []byte) error {
	if len(b) == 0 {
		return errors.New("the file is empty")
	}
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return fmt.Errorf("a NUL byte at offset %d: not text", i)
	}
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n == 1 {
			return fmt.Errorf("the bytes at offset %d are not UTF-8: not text", i)
		}
		i += n
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

// channelStats is the mean and (unbiased) standard deviation of each
// channel's pixels on a 0-1 scale.
func channelStats(d *data.Dataset) (means, stds []float32) {
	c, plane := d.NumChannels(), d.Rows*d.Cols
	means, stds = make([]float32, c), make([]float32, c)
	for ch := range c {
		var px []uint8
		for i := 0; i < d.N; i++ {
			start := (i*c + ch) * plane
			px = append(px, d.Images[start:start+plane]...)
		}
		means[ch], stds[ch] = pixelStats(px)
	}
	return means, stds
}

// newOptimizer builds the optimiser --optimizer names.
func (t *job) newOptimizer() (trainer.Optimizer, error) {
	o := t.opt
	params := nn.Parameters(t.model)
	var opt gradOptimizer
	var err error
	if o.optimizer == "adamw" {
		cfg := optim.DefaultAdamWConfig()
		cfg.LR = o.lr
		opt, err = optim.NewAdamGroups(optim.DecayGroups(params, o.lr, cfg.WeightDecay), cfg, true)
	} else {
		opt, err = optim.NewSGD(params, optim.SGDConfig{LR: o.lr, Momentum: o.momentum, Nesterov: o.nesterov, WeightDecay: o.weightDecay})
	}
	if err != nil || o.clipNorm == 0 {
		return opt, err
	}
	return clippedOptimizer{opt, o.clipNorm}, nil
}

// gradOptimizer is an optimiser whose gradients are one packed tensor
// and whose momentum a one-cycle schedule sets (SGD's, Adam's beta1).
type gradOptimizer interface {
	trainer.Optimizer
	optim.MomentumSetter
	Gradients() *tensor.Tensor
}

// clippedOptimizer clips the gradients to a global norm before each
// update (--clip-grad-norm), on the device, so that the clip is part of
// the captured step.
type clippedOptimizer struct {
	gradOptimizer
	maxNorm float64
}

func (c clippedOptimizer) StepAndZeroGrad() {
	optim.ClipGradNorm(nil, c.Gradients(), c.maxNorm).Release()
	c.gradOptimizer.StepAndZeroGrad()
}

// schedule is the learning-rate schedule --schedule names over the whole
// run, nil for none.
func (t *job) schedule() optim.Schedule {
	o := t.opt
	total := o.epochs * (t.source.Len() / o.batchSize)
	switch o.schedule {
	case "onecycle":
		// torch's cycle_momentum: SGD's momentum (or AdamW's beta1) goes
		// 0.95 → 0.85 → 0.95 against the rate; an SGD without momentum
		// (--momentum 0) keeps none.
		sched := optim.NewOneCycleLR(o.lr, total)
		sched.CycleMomentum = o.optimizer == "adamw" || o.momentum != 0
		return sched
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
	meta := models.Metadata(o.model, t.modelCfg)
	if t.norm != nil {
		// predict normalises as training did.
		meta = models.NormalizationMetadata(meta, *t.norm)
	}
	if t.text != nil {
		var err error
		if meta, err = models.VocabMetadata(meta, t.text.Vocab); err != nil {
			return err
		}
	}
	// Evaluation runs under the training's autocast, as torch evaluates
	// inside its autocast region.
	if t.text != nil {
		t.testText.SetAutocast(o.prec.Autocast())
	} else {
		t.testSet.SetAutocast(o.prec.Autocast())
	}
	cfg := trainer.Config{
		Model: t.model, Optimizer: t.optimizer, Data: t.source,
		Evaluate: func(m nn.Module) (float64, float64, error) {
			// In evaluation mode (no dropout, batch norm's running
			// statistics), in batches no larger than the training batch
			// (at most 1000), so that evaluation never needs more device
			// memory than training.
			nn.SetTraining(m, false)
			defer nn.SetTraining(m, true)
			if t.text != nil {
				return t.testText.Evaluate(t.dev.backend, m, o.batchSize)
			}
			return t.testSet.Evaluate(m, min(o.batchSize, 1000))
		},
		Schedule: t.schedule(), Epochs: o.epochs, Seed: o.seed, LogInterval: o.logInterval,
		Checkpoint: o.save, Flags: t.flags(), ModelMetadata: meta,
		Eager: t.dev.gpu == nil || o.noGraph, GraphHint: " (--no-graph launches eagerly)",
		Autocast: o.prec.Autocast(),
		Log:      t.out, Progress: t.errOut, Parallel: t.parallelConfig(),
	}
	switch {
	case t.text != nil && o.testLimit > 0:
		cfg.EvalNote = fmt.Sprintf(" (first %d validation windows)", t.testText.Len())
	case t.text == nil && t.test.N < 10000:
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
	if o.metrics != "" && t.isMain() {
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
	if !t.isMain() && e.SaveErr == nil {
		return // rank 0 says where the job stopped
	}
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
		unit := "images"
		if t.text != nil {
			unit = "windows"
		}
		t.logf("| epoch %d %s/s | %.0f |", i+1, unit, float64(t.source.Len()/t.opt.batchSize*t.opt.batchSize)/s)
	}
	if len(r.StepTimes) > 0 {
		t.logf("| step time (median over log windows, without the first step's) | %.1f us |", med*1e6)
	} else {
		t.logf("| step time (median over log windows, without the first step's) | none: one window |")
	}
	if t.dev.memory != nil {
		t.dev.memory.BenchRows(t.logf, r.Steps, r.StepDriverAllocs)
	}
	if g := t.dev.gpu; g != nil {
		if n, took := g.ConvSearches(); n > 0 {
			t.logf("| cuDNN algorithm searches (at each geometry's first call) | %d in %.3f s |", n, took.Seconds())
		}
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
