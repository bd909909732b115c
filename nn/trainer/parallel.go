package trainer

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/ember-ml/ember/cuda"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/nn/parallel"
	"github.com/ember-ml/ember/tensor"
)

// Parallel makes Run train data parallel, as PyTorch's
// DistributedDataParallel does: this process is one rank of Comm's job,
// every rank runs Run with the same Config (the same model, data set,
// seed and flags) and:
//
//   - the parameters and buffers are broadcast from rank 0 before the
//     first step (so a checkpoint need only be right on rank 0);
//   - each epoch's one seeded permutation of the data set is shared among
//     the ranks (parallel.Sharder's layout: step k's batches of the ranks
//     are together positions kB to (k+1)B, B = Data.BatchSize() times the
//     world size), so that a step of N ranks is the step of one rank with
//     a batch N times as large;
//   - the gradients are averaged over the ranks in buckets started from
//     the backward pass as each bucket's gradients become final
//     (parallel.DataParallel.Overlap; with NCCL on a second stream, inside
//     the captured step);
//   - batch norm layers use each rank's statistics, or with SyncBatchNorm
//     those of the global batch;
//   - rank 0 alone logs, shows progress, writes metrics, evaluates and
//     saves checkpoints; the others wait for its save (parallel.OnMain);
//   - an interrupt is agreed on every LogInterval steps
//     (parallel.AgreeToStop), so that all ranks stop after the same step
//     and rank 0 saves once;
//   - a watchdog polls the communicator's asynchronous error and the age
//     of the step, and aborts the communicator so that a dead or hung peer
//     ends every rank within StepTimeout.
//
// The saved position (epoch, step) counts steps of the global batch, so a
// run resumes at another world size with the same global batch.
type Parallel struct {
	Comm parallel.Communicator
	// NoOverlap all-reduces the gradients after the backward pass instead
	// of from it.
	NoOverlap bool
	// BucketBytes caps a bucket (default parallel.DefaultBucketBytes).
	BucketBytes int
	// StepTimeout is the watchdog's deadline for one step (default 5
	// minutes); negative turns the watchdog off.
	StepTimeout time.Duration
	// SyncBatchNorm makes the model's batch norm layers normalise by the
	// statistics of the whole global batch (nn.SetSyncBatchNorm, torch's
	// SyncBatchNorm) instead of each rank's own (DDP's default).
	SyncBatchNorm bool
}

// ranks is the data-parallel side of a run.
type ranks struct {
	comm  parallel.Communicator
	dp    *parallel.DataParallel
	wd    *parallel.Watchdog
	rank  int
	world int
	err   error // the first error of the all-reduce inside a step
}

// single is the state of a run of one process.
var single = &ranks{world: 1}

// isMain reports whether this rank logs and saves.
func (p *ranks) isMain() bool { return p.rank == 0 }

// prepareParallel quiets the ranks other than 0 (their Log, Progress,
// Metrics and Evaluate), before the run starts.
func (r *run) prepareParallel() error {
	r.par = single
	p := r.cfg.Parallel
	if p == nil {
		return nil
	}
	if p.Comm == nil {
		return errors.New("trainer: Config.Parallel needs a Comm")
	}
	r.par = &ranks{comm: p.Comm, rank: p.Comm.Rank(), world: p.Comm.Size()}
	c := &r.cfg
	if !r.par.isMain() {
		c.Log, c.Progress, c.Metrics, c.Evaluate = io.Discard, io.Discard, nil, nil
	}
	// A communicator that goes through the host (TCP, the fake) cannot be
	// part of a CUDA graph: a capture would fail half-way through the
	// ranks' exchanges. Say so once and run eagerly.
	if _, gpu := r.b.(*cuda.Backend); gpu && !c.Eager {
		if _, ok := p.Comm.(*parallel.NCCL); !ok {
			c.Eager = true
			r.logf("cuda graph: launching eagerly: the %T communicator exchanges through the host", p.Comm)
		}
	}
	return nil
}

// startParallel broadcasts rank 0's parameters and buffers, prepares the
// gradients' all-reduce and starts the watchdog. It is a collective.
func (r *run) startParallel() error {
	p := r.cfg.Parallel
	if p == nil {
		return nil
	}
	var bufs []nn.Parameter
	for _, b := range nn.Buffers(r.cfg.Model) {
		if t := b.Tensor; t.DType() == tensor.Float32 && t.IsContiguous() {
			bufs = append(bufs, b)
		}
	}
	dp, err := parallel.NewDataParallel(p.Comm, r.cfg.Optimizer.Parameters(), parallel.DataParallelOptions{BucketBytes: p.BucketBytes, Buffers: bufs})
	if err != nil {
		return err
	}
	if err := dp.BroadcastParameters(); err != nil {
		return err
	}
	if !p.NoOverlap {
		if err := dp.Overlap(); err != nil {
			return err
		}
	}
	r.par.dp = dp
	if p.SyncBatchNorm {
		n := nn.SetSyncBatchNorm(r.cfg.Model, statsReducer{r.par})
		r.logf("parallel: batch norm over the whole batch of the %d ranks in %d layer(s)", r.par.world, n)
	}
	if timeout := p.StepTimeout; timeout >= 0 {
		if timeout == 0 {
			timeout = 5 * time.Minute
		}
		r.par.wd = parallel.StartWatchdog(p.Comm, parallel.WatchdogOptions{StepTimeout: timeout})
	}
	return nil
}

// stopParallel stops the watchdog and removes the hooks.
func (r *run) stopParallel() {
	if r.par.dp != nil {
		r.par.dp.StopOverlap()
		if r.cfg.Parallel.SyncBatchNorm {
			nn.SetSyncBatchNorm(r.cfg.Model, nil)
		}
	}
	if r.par.wd != nil {
		r.par.wd.Stop()
	}
}

// reduceGradients is the step's all-reduce, after the backward pass (what
// Overlap left to do). An error is kept for after the step: the step
// function cannot return one.
func (r *run) reduceGradients() {
	if r.par.dp == nil {
		return
	}
	if err := r.par.dp.FinishGradients(); err != nil && r.par.err == nil {
		r.par.err = err
	}
}

// stepError is the error of the step's all-reduce, or the watchdog's
// fault, which explains it better.
func (r *run) stepError(err error) error {
	if r.par.err != nil && err == nil {
		err = r.par.err
	}
	if err != nil && r.par.wd != nil {
		if werr := r.par.wd.Err(); werr != nil {
			return werr
		}
	}
	return err
}

// beginStep and endStep bracket the work the watchdog times.
func (r *run) beginStep(i int) {
	if r.par.wd != nil {
		r.par.wd.BeginStep(i)
	}
}

func (r *run) endStep() {
	if r.par.wd != nil {
		r.par.wd.EndStep()
	}
}

// shardIndices is this rank's part of step i's global batch of perm: the
// positions i·B + rank + k·world, k < bs (parallel.Sharder's layout).
func (r *run) shardIndices(perm []int32, i, bs int, out []int32) []int32 {
	if r.par.world == 1 {
		return perm[i*bs : (i+1)*bs]
	}
	out = out[:0]
	base := i*bs*r.par.world + r.par.rank
	for k := range bs {
		out = append(out, perm[base+k*r.par.world])
	}
	return out
}

// agreeToStop reports whether the run stops before step i: on one process
// when ctx is done; on several, every LogInterval steps (first among
// them), when any rank's ctx is done, the same answer on all.
func (r *run) agreeToStop(done bool, i, first int) (bool, error) {
	if r.par.comm == nil {
		return done, nil
	}
	if (i-first)%r.cfg.LogInterval != 0 {
		return false, nil
	}
	return parallel.AgreeToStop(r.par.comm, done)
}

// meanOverRanks averages a host value over the ranks (a collective).
func (r *run) meanOverRanks(v float64) (float64, error) {
	if r.par.comm == nil {
		return v, nil
	}
	vals := []float32{float32(v)}
	if err := r.par.comm.AllReduceValues(vals, parallel.Average); err != nil {
		return 0, err
	}
	return float64(vals[0]), nil
}

// onMain runs save on rank 0 and makes every rank wait for it.
func (r *run) onMain(save func() error) error {
	if r.par.comm == nil {
		return save()
	}
	return parallel.OnMain(r.par.comm, save)
}

func (p *ranks) String() string { return fmt.Sprintf("rank %d of %d", p.rank, p.world) }

// statsReducer sums batch norm statistics over the ranks for
// nn.SetSyncBatchNorm. With NCCL it goes through the second stream of the
// gradients' buckets and is joined at once: one communicator's collectives
// must not run concurrently on two streams, or ranks could meet in
// different ones. An error is kept for after the step.
type statsReducer struct{ p *ranks }

func (s statsReducer) SumOverRanks(t *tensor.Tensor) {
	var err error
	if a, ok := s.p.comm.(parallel.AsyncAllReducer); ok && t.IsContiguous() && t.DType() == tensor.Float32 && t.Backend() == s.p.comm.Backend() {
		if err = a.AllReduceAsync(t.Buffer(), parallel.Sum); err == nil {
			err = a.JoinAsync()
		}
	} else {
		err = parallel.AllReduceSum(s.p.comm, t)
	}
	if err != nil && s.p.err == nil {
		s.p.err = err
	}
}

// Ranks is the world size.
func (s statsReducer) Ranks() int { return s.p.world }

// Rank is this rank.
func (s statsReducer) Rank() int { return s.p.rank }
