package main

import (
	"bytes"
	"context"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// Tests of train --nproc-per-node on the CPU: the ranks are this test
// binary run as train (TestTrainChild), joined by the TCP communicator.

// syncBuffer is a buffer the launcher's ranks write while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// launched runs the launcher in-process (in a goroutine) with ranks that
// are this test binary running args. (internal/faults runs the built
// train's launcher: a killed rank, SIGINT.)
func launched(t *testing.T, ctx context.Context, args ...string) (wait func() int, out, errOut *syncBuffer) {
	t.Helper()
	self := selfCommand
	selfCommand = func([]string) ([]string, error) { return []string{os.Args[0], "-test.run=^TestTrainChild$"}, nil }
	t.Cleanup(func() { selfCommand = self })
	t.Setenv("EMBER_TRAIN_CHILD", "1")
	t.Setenv("EMBER_TRAIN_ARGS", strings.Join(args, "\x1f"))
	out, errOut = &syncBuffer{}, &syncBuffer{}
	done := make(chan int, 1)
	go func() { done <- run(ctx, args, out, errOut) }()
	return func() int { return <-done }, out, errOut
}

// randomMNIST writes a data set in the MNIST layout of random images and
// labels (seeded): small, so that a rank loads it at once, and with
// gradients in every weight, unlike fakeMNIST's blank images.
func randomMNIST(t *testing.T, nTrain, nTest int) string {
	t.Helper()
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(uint64(nTrain), uint64(nTest)))
	for _, s := range []struct {
		name string
		n    int
	}{{"train", nTrain}, {"t10k", nTest}} {
		px, labels := make([]byte, s.n*784), make([]byte, s.n)
		for i := range px {
			px[i] = byte(rng.IntN(256))
		}
		for i := range labels {
			labels[i] = byte(rng.IntN(10))
		}
		writeIDX(t, filepath.Join(dir, s.name+"-images-idx3-ubyte.gz"), 0x803, []uint32{uint32(s.n), 28, 28}, px, true)
		writeIDX(t, filepath.Join(dir, s.name+"-labels-idx1-ubyte.gz"), 0x801, []uint32{uint32(s.n)}, labels, true)
	}
	return dir
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func maxRelDiff(t *testing.T, a, b map[string][]float32) float64 {
	t.Helper()
	if len(a) == 0 || len(a) != len(b) {
		t.Fatalf("%d and %d tensors", len(a), len(b))
	}
	worst := 0.0
	for name, va := range a {
		vb := b[name]
		for i := range va {
			worst = math.Max(worst, math.Abs(float64(va[i]-vb[i]))/math.Max(1, math.Abs(float64(vb[i]))))
		}
	}
	return worst
}

// TestLaunchMatchesOneProcess: 2 ranks with --batch-size 64 (32 each)
// end with the weights of one process with batch 64, to the float32
// regrouping of the batch sums (see nn/parallel's
// TestDataParallelMatchesOneRank; seen: about 1e-7 relative), only rank
// 0 speaks and saves, and the job exits 0.
func TestLaunchMatchesOneProcess(t *testing.T) {
	dir := t.TempDir()
	common := []string{"--device", "cpu", "--data", randomMNIST(t, 640, 100), "--epochs", "1", "--batch-size", "64", "--log-interval", "1000"}
	one := filepath.Join(dir, "one.safetensors")
	if code, out, errOut := train(t, append(common, "--save", one)...); code != 0 {
		t.Fatalf("one process: exit %d\n%s%s", code, out, errOut)
	}
	two := filepath.Join(dir, "two.safetensors")
	wait, out, errOut := launched(t, context.Background(), append(common, "--save", two, "--nproc-per-node", "2")...)
	if code := wait(); code != 0 {
		t.Fatalf("2 ranks: exit %d\n%s%s", code, out, errOut)
	}
	o := out.String()
	if strings.Count(o, "device:") != 1 || strings.Count(o, "epoch 1/1:") != 1 || !strings.Contains(o, "parallel: 2 ranks (ember), TCP, a batch of 32 per rank") {
		t.Errorf("want one rank speaking for the job, got:\n%s", o)
	}
	d := maxRelDiff(t, readParams(t, two), readParams(t, one))
	t.Logf("2 ranks of batch 32 against 1 of 64: largest relative difference %.2g", d)
	if d > 1e-5 {
		t.Errorf("the weights differ by %.3g relative", d)
	}
}

// TestLaunchInterrupt: an interrupt of the launcher (train's SIGINT
// cancels its context) reaches both ranks; they stop after the same step,
// rank 0 saves once, the job exits 130, and the checkpoint resumes on one
// process (another world size, the same global batch) to the end.
func TestLaunchInterrupt(t *testing.T) {
	save := filepath.Join(t.TempDir(), "m.safetensors")
	common := []string{"--device", "cpu", "--data", randomMNIST(t, 2560, 100), "--epochs", "1", "--log-interval", "2", "--save", save}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wait, out, errOut := launched(t, ctx, append(common, "--nproc-per-node", "2")...)
	waitFor(t, "training to start", func() bool { return strings.Contains(errOut.String(), "step 4/") })
	cancel()
	code := wait()
	e := errOut.String()
	if code != exitInterrupted {
		t.Fatalf("exit %d, want %d\n%s%s", code, exitInterrupted, out, e)
	}
	if n := strings.Count(e, "; saved "+save); n != 1 {
		t.Fatalf("%d ranks said they saved; want rank 0 alone:\n%s", n, e)
	}
	m := regexp.MustCompile(`interrupted at epoch 1, step (\d+)`).FindStringSubmatch(e)
	if m == nil {
		t.Fatalf("no step in:\n%s", e)
	}
	code, o, e2 := train(t, append(common, "--resume", save)...)
	if code != 0 || !strings.Contains(o, "at epoch 1, step "+m[1]) {
		t.Fatalf("resume on one process: exit %d\n%s%s", code, o, e2)
	}
}

// TestLaunchBadFlags: the launcher's flags are checked before anything
// starts.
func TestLaunchBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--nproc-per-node", "-1"}, "--nproc-per-node -1: want a number of processes"},
		{[]string{"--nproc-per-node", "3", "--batch-size", "64"}, "--batch-size 64 is not a multiple of the 3 ranks"},
		{[]string{"--nproc-per-node", "2", "--nnodes", "2"}, "--nnodes 2: give --master-addr and --master-port"},
		{[]string{"--nproc-per-node", "2", "--node-rank", "1"}, "--node-rank 1: want 0 to 0"},
		{[]string{"--master-port", "29500"}, "apply with --nproc-per-node"},
		{[]string{"--nproc-per-node", "2", "--rank-env", "NOEQUALS"}, "want NAME=VALUE"},
		{[]string{"--nproc-per-node", "2", "--gpu", "1"}, "--gpu 1 does not apply with --nproc-per-node"},
	} {
		code, _, errOut := train(t, c.args...)
		if code != exitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, %q; want %d and %q", c.args, code, errOut, exitUsage, c.want)
		}
	}
}
