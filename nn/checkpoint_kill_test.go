package nn

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/ember-ml/ember/internal/atomicfile"
	"github.com/ember-ml/ember/tensor"
)

const checkpointKillEnv = "NN_CHECKPOINT_KILL_TEST_PATH"

// killNet is big enough (about 260 KB a file) that a kill often lands in
// the middle of writing one.
func killNet() *Sequential {
	return &Sequential{Layers: []Layer{{"fc", NewLinear(tensor.CPU, nil, 256, 256)}}}
}

// fillCheckpoint sets every parameter and momentum value to k.
func fillCheckpoint(m Module, k int) *TrainingState {
	for _, p := range Parameters(m) {
		v := make([]float32, p.Tensor.Len())
		for i := range v {
			v[i] = float32(k)
		}
		p.Tensor.CopyFrom(v)
	}
	mom := make([]float32, NumParameters(m))
	for i := range mom {
		mom[i] = float32(k)
	}
	return &TrainingState{
		Epoch: k / 10, Step: k % 10, GlobalStep: k, Seed: 7, OptimizerSteps: k, Momentum: mom,
		Flags: map[string]string{"k": strconv.Itoa(k)},
	}
}

// TestCheckpointKillChild is the child of TestCheckpointKill: it resumes
// from the checkpoint if there is one and saves checkpoints in a loop until
// it is killed.
func TestCheckpointKillChild(t *testing.T) {
	path := os.Getenv(checkpointKillEnv)
	if path == "" {
		t.Skip("only runs as the child of TestCheckpointKill")
	}
	m := killNet()
	k := 0
	st, err := LoadCheckpoint(path, m)
	switch {
	case err == nil:
		k = st.GlobalStep
	case !errors.Is(err, fs.ErrNotExist):
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(3)
	}
	for {
		k++
		if err := SaveCheckpoint(path, m, fillCheckpoint(m, k)); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(3)
		}
	}
}

// savedStep is the global step of the committed training state, -1 if none.
func savedStep(path string) int {
	f, err := ReadSafetensorsFile(StatePath(path))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(f.Metadata["global_step"])
	if err != nil {
		return -1
	}
	return n
}

// TestCheckpointKill SIGKILLs a process that saves checkpoints in a loop
// (and resumes from the last one each time it starts) at random moments.
// After each kill the checkpoint must resume (LoadCheckpoint succeeds, with
// weights, momentum and counters all from the same save, not older than the
// last one seen), the model file alone must load and hold one save's
// weights (not a torn mixture), and at most one temporary file per target
// may be left: that of the save in flight. Those are then removed with
// RemoveCheckpointTemps, as a training run starting up would.
func TestCheckpointKill(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	path := filepath.Join(t.TempDir(), "ckpt.safetensors")
	rng := rand.New(rand.NewPCG(3, 4))
	last := 0
	for round := range 8 {
		elapsed := killAtRandom(t, path, rng, func() bool { return savedStep(path) > last })
		m := killNet()
		st, err := LoadCheckpoint(path, m)
		if err != nil {
			t.Fatalf("round %d: checkpoint does not resume after a kill: %v", round, err)
		}
		k := st.GlobalStep
		if k < last {
			t.Fatalf("round %d: checkpoint went back from step %d to %d", round, last, k)
		}
		want := fillCheckpoint(killNet(), k)
		if !sameValues(paramValues(m), paramValues(fillCheckpointNet(k))) || !sameValues([][]float32{st.Momentum}, [][]float32{want.Momentum}) ||
			st.OptimizerSteps != k || st.Epoch != k/10 || st.Step != k%10 || st.Flags["k"] != strconv.Itoa(k) {
			t.Fatalf("round %d: resumed state is not that of one save (step %d)", round, k)
		}
		alone := killNet()
		if err := LoadFile(path, alone); err != nil {
			t.Fatalf("round %d: model file: %v", round, err)
		}
		v := alone.Parameters()[0].Tensor.Float32s()
		for _, p := range alone.Parameters() {
			for _, x := range p.Tensor.Float32s() {
				if x != v[0] || x > float32(k) {
					t.Fatalf("round %d: model file mixes saves (%g and %g, state at %d)", round, v[0], x, k)
				}
			}
		}
		mt, _ := atomicfile.Temps(path)
		stt, _ := atomicfile.Temps(StatePath(path))
		if len(mt) > 1 || len(stt) > 1 {
			t.Fatalf("round %d: temporary files left: %v %v", round, mt, stt)
		}
		removed, err := RemoveCheckpointTemps(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: killed after %v at step %d; model file at step %g; %d temporary file(s) removed", round, elapsed, k, v[0], len(removed))
		last = k
	}
}

func fillCheckpointNet(k int) *Sequential {
	m := killNet()
	fillCheckpoint(m, k)
	return m
}

// killAtRandom starts the test binary running only TestCheckpointKillChild,
// waits until started() (it has saved something new), lets it run a random
// 0-30 ms more and kills it.
func killAtRandom(t *testing.T, path string, rng *rand.Rand, started func() bool) time.Duration {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCheckpointKillChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), checkpointKillEnv+"="+path)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(20 * time.Second)
	for !started() {
		select {
		case err := <-exited:
			t.Fatalf("child exited: %v: %s", err, stderr.Bytes())
		case <-time.After(time.Millisecond):
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-exited
			t.Fatalf("child saved nothing in 20 s: %s", stderr.Bytes())
		}
	}
	time.Sleep(time.Duration(rng.IntN(30_000)) * time.Microsecond)
	select {
	case err := <-exited:
		t.Fatalf("child exited: %v: %s", err, stderr.Bytes())
	default:
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-exited
	return time.Since(start).Round(time.Millisecond)
}
