package trainer_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ember-ml/ember/cuda"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/nn/parallel"
	"github.com/ember-ml/ember/nn/trainer"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// TestParallelNCCLCapturedStep runs Run data parallel at world size 1
// through real NCCL on the GPU, with the step captured as a CUDA graph:
// the buckets' all-reduces (on NCCL's second stream, from the backward
// pass's hooks, or after it) and SyncBatchNorm's become nodes of the graph,
// and the replayed steps end with the state of the CPU's run of one
// process within gpuTolerance (the GPU's kernels round differently, by a
// few ulps an operation; 1e-4 relative after 16 steps is a thousand times
// below what a step changes). It skips without a GPU or NCCL, and fails
// instead with EMBER_REQUIRE_GPU=1.
func TestParallelNCCLCapturedStep(t *testing.T) {
	const gpuTolerance = 1e-4
	skip := func(why string) {
		if os.Getenv("EMBER_REQUIRE_GPU") == "1" {
			t.Fatalf("EMBER_REQUIRE_GPU=1 but: %s", why)
		}
		t.Skip(why)
	}
	if err := cuda.Available(); err != nil {
		skip("no CUDA device: " + err.Error())
	}
	if err := cuda.NCCLAvailable(); err != nil {
		skip(err.Error())
	}
	b, err := cuda.NewBackend(0, cuda.BackendOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const batch = 32
	run := func(be tensor.Backend, p *trainer.Parallel, eager bool) (map[string][]float32, string) {
		m := newBNNetOn(be, 3)
		src, err := trainer.NewImages(be, syntheticSet(nTrain, 1), batch, 1.0/255, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer src.Release()
		o, err := optim.NewSGD(nn.Parameters(m), optim.SGDConfig{LR: 0.05, Momentum: 0.9})
		if err != nil {
			t.Fatal(err)
		}
		var log strings.Builder
		cfg := trainer.Config{Model: m, Optimizer: o, Data: src, Epochs: 2, Seed: 5, LogInterval: 4, Eager: eager, Log: &log, Parallel: p}
		if _, err := trainer.Run(context.Background(), cfg); err != nil {
			t.Fatalf("%v\n%s", err, log.String())
		}
		return stateOf(m), log.String()
	}
	want, _ := run(tensor.CPU, nil, true)
	env, err := parallel.EnvironmentFrom(func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		noOverlap bool
		syncBN    bool
	}{{"overlap+syncbn", false, true}, {"overlap", false, false}, {"after backward", true, false}} {
		comm, err := parallel.NewNCCL(context.Background(), env, b, parallel.RendezvousOptions{Timeout: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		got, log := run(b, &trainer.Parallel{Comm: comm, NoOverlap: c.noOverlap, SyncBatchNorm: c.syncBN}, false)
		if err := comm.Close(); err != nil {
			t.Errorf("%s: closing NCCL: %v", c.name, err)
		}
		if !strings.Contains(log, "the training step is captured once and replayed") {
			t.Errorf("%s: the step was not captured:\n%s", c.name, log)
		}
		d := worstRelDiff(got, want)
		t.Logf("%s: largest relative difference from the CPU's single process: %.2g", c.name, d)
		if d > gpuTolerance {
			t.Errorf("%s: the state differs from the CPU's by %.3g relative", c.name, d)
		}
	}
}
