package trainer_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/nn/parallel"
	"github.com/ember-ml/ember/nn/trainer"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// rankRun is one rank's run of the synthetic task with a batch of
// globalBatch/world per rank; its model starts from a seed of its own
// unless it is rank 0 (the broadcast must make them equal).
type rankRun struct {
	cfg   trainer.Config
	model *tiny
	log   strings.Builder
}

func newRankRun(t *testing.T, rank, world, globalBatch int, checkpoint string) *rankRun {
	t.Helper()
	seed := uint64(3)
	if rank != 0 {
		seed = uint64(100 + rank)
	}
	rr := &rankRun{model: newTiny(seed)}
	src, err := trainer.NewImages(tensor.CPU, syntheticSet(nTrain, 1), globalBatch/world, 1.0/255, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Release)
	o, err := optim.NewSGD(nn.Parameters(rr.model), optim.SGDConfig{LR: 0.05, Momentum: 0.9})
	if err != nil {
		t.Fatal(err)
	}
	rr.cfg = trainer.Config{
		Model: rr.model, Optimizer: o, Data: src, Epochs: 2, Seed: 5, LogInterval: 4,
		Log: &rr.log, Eager: true, Checkpoint: checkpoint,
	}
	return rr
}

// onFakeRanks runs f on world goroutine ranks with communicators of one
// FakeGroup; f returns the rank's error.
func onFakeRanks(world int, f func(c parallel.Communicator) error) []error {
	g := parallel.NewFakeGroup(world, 20*time.Second)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		wg.Go(func() { errs[r] = f(g.Comm(r, tensor.CPU)) })
	}
	wg.Wait()
	return errs
}

// worstRelDiff is the largest |a-b|/max(1,|b|) over the parameters.
func worstRelDiff(a, b map[string][]float32) float64 {
	worst := 0.0
	for name, va := range a {
		for i, v := range va {
			w := b[name][i]
			worst = math.Max(worst, math.Abs(float64(v-w))/math.Max(1, math.Abs(float64(w))))
		}
	}
	return worst
}

// TestParallelMatchesOneRank: Run on N ranks with a batch of B/N each
// (gradients averaged, with and without the overlapped buckets) ends with
// the weights of one rank with batch B, within the float32 regrouping of
// the batch sums that TestDataParallelMatchesOneRank explains (largest
// relative difference seen: logged; the bound 1e-5 is far below one
// step's change of about 1e-3), and the ranks end bitwise equal. Only rank
// 0 logs and writes the checkpoint.
func TestParallelMatchesOneRank(t *testing.T) {
	const global = 32
	one := newRankRun(t, 0, 1, global, "")
	if _, err := trainer.Run(context.Background(), one.cfg); err != nil {
		t.Fatal(err)
	}
	want := params(one.model)
	for _, world := range []int{2, 4} {
		for _, noOverlap := range []bool{false, true} {
			ckpt := filepath.Join(t.TempDir(), "model.safetensors")
			runs := make([]*rankRun, world)
			for r := range runs {
				runs[r] = newRankRun(t, r, world, global, ckpt)
			}
			errs := onFakeRanks(world, func(c parallel.Communicator) error {
				rr := runs[c.Rank()]
				rr.cfg.Parallel = &trainer.Parallel{Comm: c, NoOverlap: noOverlap, BucketBytes: 256}
				res, err := trainer.Run(context.Background(), rr.cfg)
				if err == nil && res.Steps != 2*nTrain/global {
					err = errors.New("wrong number of steps")
				}
				return err
			})
			for r, err := range errs {
				if err != nil {
					t.Fatalf("world %d, rank %d: %v", world, r, err)
				}
			}
			for r := 1; r < world; r++ {
				sameBits(t, "replicas", params(runs[0].model), params(runs[r].model))
				if runs[r].log.Len() != 0 {
					t.Errorf("rank %d logged:\n%s", r, runs[r].log.String())
				}
			}
			d := worstRelDiff(params(runs[0].model), want)
			t.Logf("world %d (overlap %v): largest relative difference from one rank of batch %d: %.2g", world, !noOverlap, global, d)
			if d > 1e-5 {
				t.Errorf("world %d (overlap %v): the weights differ from one rank's by %.3g relative", world, !noOverlap, d)
			}
			if !strings.Contains(runs[0].log.String(), "epoch 2/2") {
				t.Errorf("rank 0 did not log the epochs:\n%s", runs[0].log.String())
			}
			if _, err := os.Stat(ckpt); err != nil {
				t.Errorf("rank 0 wrote no checkpoint: %v", err)
			}
		}
	}
	if worstRelDiff(want, params(newTiny(3))) < 1e-3 {
		t.Error("training did not move the weights")
	}
}

// TestParallelInterruptAndResumeAtAnotherWorldSize: an interrupt that
// reaches rank 1 alone stops both ranks after the same step (agreed every
// LogInterval steps); rank 0 saves once, rank 1 saves nothing; the run
// resumed from that checkpoint on one process with the same global batch
// ends with the weights of an uninterrupted one-process run (within the
// tolerance of TestParallelMatchesOneRank).
func TestParallelInterruptAndResumeAtAnotherWorldSize(t *testing.T) {
	const global, world = 32, 2
	one := newRankRun(t, 0, 1, global, "")
	if _, err := trainer.Run(context.Background(), one.cfg); err != nil {
		t.Fatal(err)
	}
	ckpt := filepath.Join(t.TempDir(), "model.safetensors")
	runs := []*rankRun{newRankRun(t, 0, world, global, ckpt), newRankRun(t, 1, world, global, ckpt)}
	ies := make([]*trainer.InterruptedError, world)
	errs := onFakeRanks(world, func(c parallel.Communicator) error {
		rr := runs[c.Rank()]
		rr.cfg.Parallel = &trainer.Parallel{Comm: c}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		if c.Rank() == 1 {
			rr.cfg.Loss = cancelAfter(nTrain/global+3, cancel) // epoch 2, step 3
		}
		_, err := trainer.Run(ctx, rr.cfg)
		if !errors.As(err, &ies[c.Rank()]) {
			return err
		}
		return nil
	})
	for r, err := range errs {
		if err != nil || ies[r] == nil {
			t.Fatalf("rank %d: %v; want an interruption", r, err)
		}
	}
	// Agreed at the next multiple of LogInterval (4) steps into the epoch.
	if ies[0].Epoch != 1 || ies[0].Step != 4 || *ies[1] != (trainer.InterruptedError{Epoch: 1, Step: 4}) {
		t.Fatalf("rank 0 stopped at %+v, rank 1 at %+v; want both at epoch 2, step 4, only rank 0 saving", *ies[0], *ies[1])
	}
	if ies[0].Checkpoint != ckpt {
		t.Fatalf("rank 0 saved %q", ies[0].Checkpoint)
	}
	again := newRankRun(t, 0, 1, global, ckpt)
	st, err := nn.LoadCheckpoint(ckpt, again.model)
	if err != nil {
		t.Fatal(err)
	}
	again.cfg.Resume = st
	res, err := trainer.Run(context.Background(), again.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.GlobalStep != 2*nTrain/global {
		t.Fatalf("resumed to global step %d, want %d", res.GlobalStep, 2*nTrain/global)
	}
	d := worstRelDiff(params(again.model), params(one.model))
	t.Logf("resumed at world size 1: largest relative difference %.2g", d)
	if d > 1e-5 {
		t.Errorf("resumed at world size 1: the weights differ from an uninterrupted run by %.3g relative", d)
	}
}

// TestParallelDeadRank: a rank that stops taking part (its process died)
// ends the others' run with an error naming it, within the collective
// timeout, instead of a hang.
func TestParallelDeadRank(t *testing.T) {
	g := parallel.NewFakeGroup(2, 500*time.Millisecond)
	rr := newRankRun(t, 0, 2, 32, "")
	rr.cfg.Parallel = &trainer.Parallel{Comm: g.Comm(0, tensor.CPU), StepTimeout: -1}
	start := time.Now()
	_, err := trainer.Run(context.Background(), rr.cfg)
	if err == nil || !strings.Contains(err.Error(), "rank(s) [1]") {
		t.Fatalf("error %v; want one naming rank 1", err)
	}
	if time.Since(start) > 10*time.Second {
		t.Errorf("took %v to notice", time.Since(start))
	}
}

// bnNet is tiny with a batch norm between its layers.
type bnNet struct {
	FC1 *nn.Linear
	BN  *nn.BatchNorm1d
	FC2 *nn.Linear
}

func newBNNet(seed uint64) *bnNet { return newBNNetOn(tensor.CPU, seed) }

func newBNNetOn(b tensor.Backend, seed uint64) *bnNet {
	rng := rand.New(rand.NewPCG(seed, 1))
	return &bnNet{FC1: nn.NewLinear(b, rng, side*side, 16), BN: nn.NewBatchNorm1d(b, 16), FC2: nn.NewLinear(b, rng, 16, classes)}
}

func (m *bnNet) Forward(x *tensor.Tensor) *tensor.Tensor {
	return m.FC2.Forward(tensor.ReLU(m.BN.Forward(m.FC1.Forward(x.Reshape(x.Dim(0), side*side)))))
}

// stateOf is every state tensor of m (parameters and running statistics).
func stateOf(m nn.Module) map[string][]float32 {
	out := map[string][]float32{}
	for _, p := range nn.StateTensors(m) {
		out[p.Name] = p.Tensor.Float32s()
	}
	return out
}

// TestParallelSyncBatchNorm: with a batch norm layer, N ranks of B/N with
// SyncBatchNorm (and the overlapped buckets) end with the weights and
// running statistics of one rank of B (the tolerance of
// TestParallelMatchesOneRank, and nn's TestSyncBatchNorm's), while per-rank
// statistics (DDP's default) end elsewhere.
func TestParallelSyncBatchNorm(t *testing.T) {
	const global = 32
	runWith := func(world int, syncBN bool) map[string][]float32 {
		models := make([]*bnNet, world)
		errs := onFakeRanks(world, func(c parallel.Communicator) error {
			seed := uint64(3)
			if c.Rank() != 0 {
				seed = uint64(50 + c.Rank())
			}
			m := newBNNet(seed)
			models[c.Rank()] = m
			src, err := trainer.NewImages(tensor.CPU, syntheticSet(nTrain, 1), global/world, 1.0/255, 0)
			if err != nil {
				return err
			}
			defer src.Release()
			o, err := optim.NewSGD(nn.Parameters(m), optim.SGDConfig{LR: 0.05, Momentum: 0.9})
			if err != nil {
				return err
			}
			cfg := trainer.Config{Model: m, Optimizer: o, Data: src, Epochs: 2, Seed: 5, LogInterval: 4, Eager: true}
			if world > 1 {
				cfg.Parallel = &trainer.Parallel{Comm: c, SyncBatchNorm: syncBN}
			}
			_, err = trainer.Run(context.Background(), cfg)
			return err
		})
		for r, err := range errs {
			if err != nil {
				t.Fatalf("world %d, rank %d: %v", world, r, err)
			}
		}
		for r := 1; r < world; r++ {
			if syncBN {
				sameBits(t, "replicas' state", stateOf(models[0]), stateOf(models[r]))
			}
		}
		return stateOf(models[0])
	}
	want := runWith(1, false)
	for _, world := range []int{2, 4} {
		d := worstRelDiff(runWith(world, true), want)
		t.Logf("world %d, SyncBatchNorm: largest relative difference from one rank of batch %d: %.2g", world, global, d)
		if d > 1e-5 {
			t.Errorf("world %d with SyncBatchNorm: the state differs from one rank's by %.3g relative", world, d)
		}
	}
	if d := worstRelDiff(runWith(2, false), want); d < 1e-4 {
		t.Errorf("per-rank batch statistics end %.2g from the whole batch's: the test cannot tell the sync apart", d)
	}
}

// TestParallelHungRankWatchdog: a peer that hangs (never reaches the first
// collective; the fake's own timeout is a minute away) is found by the
// watchdog's step deadline, which aborts the communicator: the run ends
// within about StepTimeout with an error naming the rank it waits for.
func TestParallelHungRankWatchdog(t *testing.T) {
	g := parallel.NewFakeGroup(2, time.Minute)
	rr := newRankRun(t, 0, 2, 32, "")
	rr.cfg.Parallel = &trainer.Parallel{Comm: g.Comm(0, tensor.CPU), StepTimeout: 300 * time.Millisecond}
	// Rank 1 joins the broadcast at the start, then hangs.
	other := newRankRun(t, 1, 2, 32, "")
	go func() {
		c := g.Comm(1, tensor.CPU)
		dp, err := parallel.NewDataParallel(c, other.cfg.Optimizer.Parameters(), parallel.DataParallelOptions{Buffers: nn.Buffers(other.model)})
		if err == nil {
			dp.BroadcastParameters()
		}
	}()
	start := time.Now()
	_, err := trainer.Run(context.Background(), rr.cfg)
	took := time.Since(start)
	if err == nil || !strings.Contains(err.Error(), "waiting for rank(s) [1]") || !strings.Contains(err.Error(), "communicator aborted") {
		t.Fatalf("error %v; want the watchdog's, naming rank 1", err)
	}
	if took > 10*time.Second {
		t.Errorf("took %v to end; the step deadline is 300 ms", took)
	}
}
