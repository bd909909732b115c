package trainer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ember-ml/ember/data"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// LossFunc is a training loss: a scalar tensor computed from the model and
// a batch, recorded for the backward pass.
type LossFunc func(m nn.Module, b Batch) *tensor.Tensor

// EvalFunc evaluates the model after each epoch: the mean loss and the
// accuracy in percent on held-out data.
type EvalFunc func(m nn.Module) (loss, accuracy float64, err error)

// LossSummer is a classifier with its own fused cross entropy that also
// adds the loss into a running sum on the device (models.LeNet, say). When
// Config.Loss is nil and the model is one, the trainer uses it: the last
// layer, the loss and the epoch's running total are one operation where
// the backend fuses them.
type LossSummer interface {
	LossSum(x, labels, sum *tensor.Tensor) *tensor.Tensor
}

// Optimizer is what the trainer drives: optim.SGD and optim.Adam (AdamW).
type Optimizer interface {
	optim.Optimizer
	Replayer
}

// Config is one training run.
type Config struct {
	Model     nn.Module
	Optimizer Optimizer
	Data      Source
	// Loss is the training loss; nil means the model's LossSum when it is
	// a LossSummer, else the cross entropy of Forward against the labels.
	Loss LossFunc
	// Evaluate runs after each epoch (nil: none).
	Evaluate EvalFunc
	// EvalNote follows the accuracy on the epoch's line (say, which part
	// of the test set was used).
	EvalNote string
	// Schedule, when not nil, sets the learning rate before every step
	// from the run's global step count (opt.SetLR, a device scalar, so that
	// a replayed graph uses it), and the momentum too when it is an
	// optim.MomentumSchedule that cycles it (OneCycleLR: the optimiser's
	// SetMomentum, also a device scalar).
	Schedule optim.Schedule

	Epochs int
	// Seed fixes the data order: epoch e visits the examples in the order
	// data.Permutation(Data.Len(), Seed, e).
	Seed uint64
	// LogInterval is the number of steps between progress lines and loss
	// checks (NaN stops the run at the first check after it).
	LogInterval int

	// Checkpoint is where the model is saved after each epoch and when
	// interrupted, with the training state beside it (nn.SaveCheckpoint);
	// "" saves nothing.
	Checkpoint string
	// Flags are the run's settings, recorded in the training state.
	Flags map[string]string
	// ModelMetadata goes into the model file (models.Metadata: the
	// architecture, so that the model can be rebuilt from the file alone).
	ModelMetadata map[string]string
	// ShouldSave, when not nil, says whether this process writes
	// checkpoints (in data-parallel training, rank 0 only).
	ShouldSave func() bool
	// Metrics, when not nil, gets one row per epoch.
	Metrics *Metrics

	// Resume is the training state to continue from (nil: a fresh run):
	// the optimiser's state is loaded and the run starts at its epoch and
	// step. The model's weights are the caller's to load.
	Resume *nn.TrainingState
	// LastCheckpoint is the newest complete checkpoint before this run
	// (the one resumed), named when the run fails.
	LastCheckpoint string

	// Autocast is the element type of the training step's matrix products
	// and convolutions: BFloat16 runs them in bfloat16 with float32 sums
	// (tensor.Scope.SetAutocast; tensor.BF16's part of a precision), the
	// weights, gradients and optimiser state staying float32. The zero
	// value and Float32 keep float32. Evaluation runs in float32.
	Autocast tensor.DType

	// Eager turns off the capture of the step as a CUDA graph; on a
	// backend that cannot capture, the step runs eagerly anyway and says
	// so once.
	Eager bool
	// GraphHint ends the line that says the step is replayed.
	GraphHint string

	// Log gets the run's lines (the epochs, the graph line); Progress the
	// progress bar (a live bar when it is a terminal, else plain lines).
	Log, Progress io.Writer
	// Monitor, when not nil, reports device memory on the epoch lines.
	Monitor Monitor

	// Parallel, when not nil, makes this run one rank of a data-parallel
	// job (see Parallel).
	Parallel *Parallel
}

// Result is what a run did.
type Result struct {
	// Saved reports whether a checkpoint was written.
	Saved bool
	// GlobalStep counts the steps of the whole training, those before a
	// resume included; Steps those of this run.
	GlobalStep, Steps int
	// StepTimes are the mean seconds per step of each log window but the
	// run's first (which captures the graph).
	StepTimes []float64
	// EpochSeconds is each epoch's wall time.
	EpochSeconds []float64
	// StepDriverAllocs counts the driver allocations of the training steps
	// after the first.
	StepDriverAllocs int64
	// Accuracy is the last evaluation's.
	Accuracy float64
}

// ErrInterrupted is wrapped by the error of a run whose context was
// cancelled (SIGINT, SIGTERM): see InterruptedError.
var ErrInterrupted = errors.New("interrupted")

// InterruptedError is returned when the context is cancelled: the step in
// flight finished, the checkpoint was saved (unless SaveErr says why not)
// and the run can be resumed at Epoch (0-based), Step.
type InterruptedError struct {
	Epoch, Step int
	Checkpoint  string // "" when nothing was saved
	SaveErr     error
}

func (e *InterruptedError) Error() string {
	if e.SaveErr != nil {
		return fmt.Sprintf("interrupted, and saving failed: %v", e.SaveErr)
	}
	if e.Checkpoint == "" {
		return fmt.Sprintf("interrupted at epoch %d, step %d", e.Epoch+1, e.Step)
	}
	return fmt.Sprintf("interrupted at epoch %d, step %d; saved %s", e.Epoch+1, e.Step, e.Checkpoint)
}

func (e *InterruptedError) Unwrap() error { return ErrInterrupted }

// DivergedError is returned when the loss or the weights stop being
// finite; the run stops without saving them.
type DivergedError struct {
	Message        string // what and where
	Weights        bool   // the weights (found when saving), not the loss
	LastCheckpoint string // the newest good checkpoint, "" if none
}

func (e *DivergedError) Error() string {
	last := "no checkpoint was saved"
	if e.LastCheckpoint != "" {
		last = "the last good checkpoint is " + e.LastCheckpoint
	}
	if e.Weights {
		return fmt.Sprintf("%s; stopped without saving them, %s", e.Message, last)
	}
	return fmt.Sprintf("%s; stopped, %s", e.Message, last)
}

// ResumeError is returned when Config.Resume does not fit the optimiser.
type ResumeError struct{ Err error }

func (e *ResumeError) Error() string {
	return "the training state does not fit the optimiser: " + e.Err.Error()
}
func (e *ResumeError) Unwrap() error { return e.Err }

// run is one Run in progress.
type run struct {
	cfg       Config
	b         tensor.Backend
	res       *Result
	lastSaved string
	saves     int    // checkpoints written by this run
	par       *ranks // the data-parallel side (single when alone)
}

// Run trains cfg.Model for cfg.Epochs epochs over cfg.Data: each step
// loads a batch, runs the loss, the backward pass and the optimiser
// (captured once as a CUDA graph and replayed where the backend allows),
// every LogInterval steps the progress is shown and the loss checked,
// and after each epoch the model is evaluated, a line and a metrics row
// written and the checkpoint saved. A cancelled ctx finishes the step in
// flight, saves and returns an *InterruptedError. Device errors (out of
// memory, a failed launch) are returned, not panicked.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	r := &run{cfg: cfg, res: &Result{}, lastSaved: cfg.LastCheckpoint}
	if err := r.check(); err != nil {
		return nil, err
	}
	var err error
	if gerr := tensor.Guard(func() { err = r.loop(ctx) }); gerr != nil {
		err = r.stepError(gerr) // the watchdog's fault explains a device error
	}
	return r.res, err
}

func (r *run) check() error {
	c := &r.cfg
	switch {
	case c.Model == nil || c.Optimizer == nil || c.Data == nil:
		return errors.New("trainer: Config needs a Model, an Optimizer and Data")
	case c.Epochs < 1:
		return fmt.Errorf("trainer: %d epochs; want at least 1", c.Epochs)
	case c.Data.BatchSize() < 1 || c.Data.Len() < c.Data.BatchSize():
		return fmt.Errorf("trainer: batch size %d for %d examples; want 1 to %d", c.Data.BatchSize(), c.Data.Len(), c.Data.Len())
	}
	if c.LogInterval < 1 {
		c.LogInterval = 100
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	ps := c.Optimizer.Parameters()
	if len(ps) == 0 {
		return errors.New("trainer: the optimiser has no parameters")
	}
	r.b = ps[0].Tensor.Backend()
	switch c.Autocast {
	case tensor.Float32:
	case tensor.BFloat16:
		if _, ok := r.b.(tensor.LowPrecisionBackend); !ok {
			return fmt.Errorf("trainer: Autocast bfloat16 on backend %s, which has no bfloat16 products", r.b.Name())
		}
	default:
		return fmt.Errorf("trainer: Autocast %v; want float32 (off) or bfloat16", c.Autocast)
	}
	return r.prepareParallel()
}

func (r *run) logf(format string, args ...any) { fmt.Fprintf(r.cfg.Log, format+"\n", args...) }

func finite(v float32) bool { return !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0) }

// ModelLoss is a model with a training loss of its own (label smoothing,
// a scale on the logits: models.ResNet9), which Run uses when Config.Loss
// is nil and the model is no LossSummer.
type ModelLoss interface {
	Loss(x, labels *tensor.Tensor) *tensor.Tensor
}

// lossOf is the step's loss, added into the epoch's running sum.
func (r *run) lossOf(batch Batch, sum *tensor.Tensor) *tensor.Tensor {
	if r.cfg.Loss == nil {
		if ls, ok := r.cfg.Model.(LossSummer); ok {
			return ls.LossSum(batch.Inputs, batch.Labels, sum)
		}
	}
	var loss *tensor.Tensor
	if r.cfg.Loss != nil {
		loss = r.cfg.Loss(r.cfg.Model, batch)
	} else if ml, ok := r.cfg.Model.(ModelLoss); ok {
		loss = ml.Loss(batch.Inputs, batch.Labels)
	} else {
		loss = tensor.CrossEntropy(r.cfg.Model.Forward(batch.Inputs), batch.Labels)
	}
	if loss.Len() != 1 {
		panic(fmt.Sprintf("trainer: the loss is %v; want a scalar", loss.Shape()))
	}
	tensor.Complete(r.b).Axpy(sum.Buffer(), 1, loss.Contiguous().Buffer())
	return loss
}

func (r *run) loop(ctx context.Context) error {
	c := r.cfg
	opt, src := c.Optimizer, c.Data
	bs := src.BatchSize() // this rank's part of the batch
	if global := bs * r.par.world; src.Len() < global {
		return fmt.Errorf("trainer: a batch of %d on each of %d ranks is %d examples; the data set has %d", bs, r.par.world, global, src.Len())
	}
	steps := src.Len() / (bs * r.par.world) // the last partial batch is dropped
	startEpoch, startStep := 0, 0
	if st := c.Resume; st != nil {
		if err := opt.LoadState(optim.LoadTraining(st)); err != nil {
			return &ResumeError{err}
		}
		startEpoch, startStep, r.res.GlobalStep = st.Epoch, st.Step, st.GlobalStep
	}
	if startEpoch >= c.Epochs {
		return nil
	}
	if err := r.startParallel(); err != nil {
		return err
	}
	defer r.stopParallel()
	if c.Monitor != nil {
		c.Monitor.Start()
	}

	lossSum := tensor.Zeros(r.b, nil, 1)
	defer lossSum.Release()
	opt.ZeroGrad() // once: each step's update zeroes them after reading them
	step, err := CaptureStep(r.b, func(s *tensor.Scope) *tensor.Tensor {
		loss := r.lossOf(src.Batch(s), lossSum)
		if r.par.dp != nil {
			// Afresh: a capture that failed mid-backward, retried
			// eagerly, left the overlap's counts of its pass.
			r.par.dp.BeginGradients()
		}
		loss.Backward()
		r.reduceGradients()
		opt.StepAndZeroGrad()
		return loss
	}, StepOptions{Optimizer: opt, Eager: c.Eager, Logf: r.logf, Hint: c.GraphHint, Autocast: c.Autocast, ZeroesGrads: true,
		// A rehearsal would queue collectives that never run, which the
		// other ranks' communicators would count.
		NoMemoryPlan: r.par.world > 1})
	if err != nil {
		return err
	}
	defer step.Close()

	res := r.res
	var shard []int32
	for epoch := startEpoch; epoch < c.Epochs; epoch++ {
		perm := data.Permutation(src.Len(), c.Seed, epoch)
		if es, ok := src.(EpochSetter); ok {
			es.SetEpoch(epoch)
		}
		first := 0
		if epoch == startEpoch {
			first = startStep
		}
		r.b.Fill(lossSum.Buffer(), 0)
		bar := newProgress(c.Progress, steps, fmt.Sprintf("epoch %d/%d", epoch+1, c.Epochs))
		// Driver allocations made by training steps after the first (the
		// steady state, which should make none); evaluation is not counted.
		epochAllocs := r.driverAllocs()
		epochStart := time.Now()
		lastCheck := first - 1 // the last step whose loss was checked
		windowStart, windowSteps, firstInWindow := epochStart, 0, false
		for i := first; i < steps; i++ {
			r.beginStep(i) // the watchdog times the step from here
			stop, err := r.agreeToStop(ctx.Err() != nil, i, first)
			if err != nil {
				return r.stepError(err)
			}
			if stop {
				return r.interrupted(epoch, i)
			}
			shard = r.shardIndices(perm, i, bs, shard)
			src.Load(shard)
			if c.Schedule != nil {
				opt.SetLR(c.Schedule.LR(res.GlobalStep))
				if err := r.setMomentum(res.GlobalStep); err != nil {
					return err
				}
			}
			loss, err := step.Run(bs)
			if err = r.stepError(err); err != nil {
				return err
			}
			res.GlobalStep++
			res.Steps++
			windowSteps++
			if res.Steps == 1 || (res.Steps == 2 && step.warmedUp()) {
				// The run's first step allocates and captures the graph
				// (the second, after an eager warm-up step, with cuDNN).
				epochAllocs = r.driverAllocs()
				firstInWindow = true
			}
			if (i+1)%c.LogInterval == 0 || i == steps-1 {
				l := loss.Item() // waits for the queued steps
				now := time.Now()
				// Not the window of the run's first step, which captures
				// the graph (at batch 1024 an epoch is one window).
				if !firstInWindow {
					res.StepTimes = append(res.StepTimes, now.Sub(windowStart).Seconds()/float64(windowSteps))
				}
				windowStart, windowSteps, firstInWindow = now, 0, false
				// The running sum turns NaN or Inf with the first bad step,
				// so checking it here catches one between two checks too.
				if sum := lossSum.Item(); !finite(l) || !finite(sum) {
					bad := l
					if finite(l) {
						bad = sum
					}
					where := fmt.Sprintf("step %d", i+1)
					if i > lastCheck+1 {
						where = fmt.Sprintf("a step from %d to %d", lastCheck+2, i+1)
					}
					return &DivergedError{Message: fmt.Sprintf("loss is %v at epoch %d, %s", bad, epoch+1, where), LastCheckpoint: r.lastSaved}
				}
				lastCheck = i
				imgs := float64((i+1-first)*bs*r.par.world) / now.Sub(epochStart).Seconds()
				bar.update(i+1, l, imgs)
			}
			r.endStep()
		}
		// The end of the epoch's collectives are watched as one more
		// step; the evaluation and the save are not (below).
		r.beginStep(steps)
		if err := r.b.Synchronize(); err != nil {
			return r.stepError(err)
		}
		secs := time.Since(epochStart).Seconds()
		if c.Monitor != nil {
			c.Monitor.TrainingDone()
		}
		res.StepDriverAllocs += r.driverAllocs() - epochAllocs
		bar.finish()
		res.EpochSeconds = append(res.EpochSeconds, secs)
		trainLoss, err := r.meanOverRanks(float64(lossSum.Item()) / float64(steps-first))
		if err != nil {
			return r.stepError(err)
		}
		// Rank 0 alone evaluates and writes the checkpoint, which may take
		// far longer than a step, while the other ranks wait for it in the
		// save's collective: the watchdog's step deadline is paused on
		// every rank until all meet there (a communicator's failure still
		// ends the wait), so that a long evaluation is not taken for a
		// hung peer.
		r.endStep()
		testLoss, acc := math.NaN(), math.NaN()
		if c.Evaluate != nil {
			// In the memory of the captured step's transient tensors,
			// idle until the next replay (Step.Lend).
			if err := step.Lend(func() (err error) {
				testLoss, acc, err = c.Evaluate(c.Model)
				return err
			}); err != nil {
				return err
			}
			res.Accuracy = acc
		}
		memory := ""
		if c.Monitor != nil {
			c.Monitor.EvaluationDone()
			memory = c.Monitor.MemoryLine()
		}
		imgsPerSec := float64((steps-first)*bs*r.par.world) / secs
		if c.Evaluate != nil {
			r.logf("epoch %d/%d: train loss %.4f, test loss %.4f, test accuracy %.2f%%%s, %.2f s, %.0f images/s%s",
				epoch+1, c.Epochs, trainLoss, testLoss, acc, c.EvalNote, secs, imgsPerSec, memory)
		} else {
			r.logf("epoch %d/%d: train loss %.4f, %.2f s, %.0f images/s%s", epoch+1, c.Epochs, trainLoss, secs, imgsPerSec, memory)
		}
		if err := c.Metrics.write(epoch+1, trainLoss, testLoss, acc, secs, imgsPerSec); err != nil {
			return err
		}
		if err := r.save(epoch+1, 0); err != nil {
			return r.stepError(err)
		}
		if c.Checkpoint == "" && epoch+1 < c.Epochs {
			// No save to wait in: wait for rank 0's evaluation here,
			// unwatched, rather than in the next step's (watched)
			// collective.
			if err := r.onMain(func() error { return nil }); err != nil {
				return r.stepError(err)
			}
		}
	}
	return nil
}

// setMomentum applies the schedule's momentum of step, if it sets one.
func (r *run) setMomentum(step int) error {
	ms, ok := r.cfg.Schedule.(optim.MomentumSchedule)
	if !ok {
		return nil
	}
	m, cycles := ms.MomentumAt(step)
	if !cycles {
		return nil
	}
	set, ok := r.cfg.Optimizer.(optim.MomentumSetter)
	if !ok {
		return fmt.Errorf("trainer: the schedule sets the momentum, and the optimiser %T has no SetMomentum", r.cfg.Optimizer)
	}
	if err := set.SetMomentum(m); err != nil {
		return fmt.Errorf("trainer: the schedule's momentum at step %d: %w", step, err)
	}
	return nil
}

func (r *run) driverAllocs() int64 {
	if r.cfg.Monitor == nil {
		return 0
	}
	return r.cfg.Monitor.DriverAllocs()
}

// save writes the model and the training state, each atomically.
func (r *run) save(epoch, step int) error {
	if r.cfg.Checkpoint == "" {
		return nil
	}
	// In data-parallel training rank 0 writes and the others wait for it.
	return r.onMain(func() error { return r.saveHere(epoch, step) })
}

// saveHere writes the checkpoint from this process.
func (r *run) saveHere(epoch, step int) error {
	c := r.cfg
	if c.ShouldSave != nil && !c.ShouldSave() {
		return nil
	}
	if dir := filepath.Dir(c.Checkpoint); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("checkpoint %s: %w", c.Checkpoint, err)
		}
	}
	st := &nn.TrainingState{
		Epoch: epoch, Step: step, GlobalStep: r.res.GlobalStep, Seed: c.Seed,
		Flags: c.Flags, ModelMetadata: c.ModelMetadata,
	}
	optim.SaveTraining(st, c.Optimizer.State())
	if err := nn.SaveCheckpoint(c.Checkpoint, c.Model, st); err != nil {
		if errors.Is(err, nn.ErrNonFinite) {
			where := fmt.Sprintf("after epoch %d", epoch)
			if step > 0 {
				where = fmt.Sprintf("at epoch %d, step %d", epoch+1, step)
			}
			what := err.Error()
			var ce *nn.CheckpointError
			if errors.As(err, &ce) {
				what, _, _ = strings.Cut(ce.Problem, ": the values are broken")
			}
			return &DivergedError{Message: fmt.Sprintf("the weights are not finite %s (%s)", where, what), Weights: true, LastCheckpoint: r.lastSaved}
		}
		return err
	}
	r.lastSaved, r.res.Saved = c.Checkpoint, true
	r.saves++
	return nil
}

// interrupted saves where training stopped.
func (r *run) interrupted(epoch, step int) error {
	e := &InterruptedError{Epoch: epoch, Step: step}
	before := r.saves
	if err := r.save(epoch, step); err != nil {
		e.SaveErr = err
		return e
	}
	if r.saves > before {
		e.Checkpoint = r.lastSaved
	}
	return e
}
