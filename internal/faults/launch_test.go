//go:build linux

package faults

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ember-ml/ember/nn"
)

// Faults of a data-parallel job started by the built train with
// --nproc-per-node 2 on the CPU (the ranks talk over TCP): an interrupt of
// the launcher and a rank killed during training.

// lockedBuffer is stderr of the job, read while the ranks write it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startJob starts train --nproc-per-node 2 on a data set of 3200 images
// (50 steps of 64, logged every step) and waits until step 3 is logged.
func startJob(t *testing.T, save string) (*exec.Cmd, *lockedBuffer, *lockedBuffer) {
	t.Helper()
	data := filepath.Join(t.TempDir(), "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := writeMNIST(data, 3200, 32, 28, 0); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(trainBin, "--device", "cpu", "--data", data, "--batch-size", "64", "--test-limit", "32", "--epochs", "1",
		"--log-interval", "1", "--save", save, "--nproc-per-node", "2")
	cmd.Env = append(os.Environ(), "MNIST_DIR=")
	out, errOut := &lockedBuffer{}, &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	deadline := time.Now().Add(caseTimeout)
	for !strings.Contains(errOut.String(), "step 3/") {
		if time.Now().After(deadline) {
			t.Fatalf("training did not start:\n%s%s", out, errOut)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return cmd, out, errOut
}

// waitJob waits for the launcher, at most caseTimeout, and returns its
// exit status.
func waitJob(t *testing.T, cmd *exec.Cmd) int {
	t.Helper()
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(caseTimeout):
		t.Fatal("the job did not end: it hangs")
	}
	return cmd.ProcessState.ExitCode()
}

// noStack fails on a stack trace in the output.
func noStack(t *testing.T, s string) {
	t.Helper()
	if strings.Contains(s, "panic") || strings.Contains(s, "goroutine ") {
		t.Errorf("stack trace in the output:\n%s", s)
	}
}

// SIGINT to the launcher reaches both ranks: they stop after the same
// step, rank 0 saves once (a complete checkpoint), every process exits
// 130.
func TestLaunchSIGINT(t *testing.T) {
	save := filepath.Join(t.TempDir(), "m.safetensors")
	cmd, out, errOut := startJob(t, save)
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	code := waitJob(t, cmd)
	e := errOut.String()
	if code != 130 {
		t.Fatalf("exit %d, want 130\n%s%s", code, out, e)
	}
	if n := strings.Count(e, "; saved "+save); n != 1 {
		t.Errorf("%d lines say the checkpoint was saved; want one (rank 0's):\n%s", n, e)
	}
	if _, err := nn.ReadSafetensorsFile(save); err != nil {
		t.Errorf("the checkpoint: %v", err)
	}
	noStack(t, out.String()+e)
}

// A rank killed during training ends the job within seconds: one line
// names it, the status is 1, no checkpoint is written.
func TestLaunchRankKilled(t *testing.T) {
	save := filepath.Join(t.TempDir(), "m.safetensors")
	cmd, out, errOut := startJob(t, save)
	// A Go program forks from any of its threads: the children are
	// listed under the thread that started each.
	tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/task/*/children")
	var ranks []string
	for _, f := range tasks {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Skipf("cannot list the launcher's processes: %v", err)
		}
		ranks = append(ranks, strings.Fields(string(raw))...)
	}
	if len(ranks) != 2 {
		t.Fatalf("the launcher has %d child processes, want 2", len(ranks))
	}
	victim, _ := strconv.Atoi(ranks[1])
	start := time.Now()
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	code := waitJob(t, cmd)
	e := errOut.String()
	if code != 1 || !regexp.MustCompile(`(?m)^train: parallel: rank [01] \(of 2\) failed: signal: killed; stopping the others$`).MatchString(e) {
		t.Fatalf("exit %d; want 1 and one line naming the killed rank:\n%s%s", code, out, e)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("the job took %v to end", took)
	}
	if _, err := os.Stat(save); err == nil {
		t.Error("a checkpoint was written")
	}
	noStack(t, out.String()+e)
}
