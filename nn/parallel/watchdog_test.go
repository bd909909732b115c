package parallel

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ember-ml/ember/tensor"
)

// A rank that hangs: rank 1 never reaches the step's all-reduce. Rank 0's
// watchdog sees the step run past its deadline, aborts the communicator,
// and the all-reduce rank 0 is blocked in returns; the one line names rank
// 0 (who noticed), the step, and rank 1 (who hangs). The fake's own
// timeout (a minute) is far off: the watchdog is what ends the wait.
func TestWatchdogStepDeadline(t *testing.T) {
	g := NewFakeGroup(2, time.Minute)
	c := g.Comm(0, tensor.CPU)
	var fault error
	var once sync.WaitGroup
	once.Add(1)
	w := StartWatchdog(c, WatchdogOptions{Poll: 10 * time.Millisecond, StepTimeout: 150 * time.Millisecond, OnFault: func(err error) { fault = err; once.Done() }})
	defer w.Stop()
	x := tensor.Zeros(tensor.CPU, nil, 3)
	start := time.Now()
	w.BeginStep(7)
	err := AllReduceAverage(c, x)
	w.EndStep()
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the hung all-reduce returned after %v", d)
	}
	once.Wait()
	want := "parallel: rank 0: step 7 still running after 150ms (waiting for rank(s) [1]); communicator aborted"
	if w.Err() == nil || w.Err().Error() != want || fault == nil || fault.Error() != want {
		t.Errorf("watchdog error %v (OnFault %v), want %q", w.Err(), fault, want)
	}
	if err == nil || err.Error() != want {
		t.Errorf("the blocked all-reduce returned %v, want the watchdog's fault", err)
	}
	select {
	case <-w.Fault():
	default:
		t.Error("Fault() not closed")
	}
	// Every later collective fails at once.
	if err := g.Comm(1, tensor.CPU).Barrier(); err == nil {
		t.Error("rank 1's Barrier after the abort: no error")
	}
}

// A peer that died, as NCCL reports it: the communicator's asynchronous
// error. The watchdog aborts without waiting for a deadline.
func TestWatchdogAsyncError(t *testing.T) {
	g := NewFakeGroup(2, time.Minute)
	c := g.Comm(1, tensor.CPU)
	w := StartWatchdog(c, WatchdogOptions{Poll: 10 * time.Millisecond})
	defer w.Stop()
	dead := errors.New("ncclRemoteError: remote process exited or there was a network error")
	time.AfterFunc(50*time.Millisecond, func() { g.InjectAsyncError(1, dead) })
	select {
	case <-w.Fault():
	case <-time.After(5 * time.Second):
		t.Fatal("no fault 5 s after the asynchronous error")
	}
	var re *RankError
	if err := w.Err(); !errors.As(err, &re) || re.Rank != 1 || !strings.Contains(err.Error(), "remote process exited") {
		t.Errorf("watchdog error %v, want rank 1's, naming the NCCL error", err)
	}
	if err := c.Barrier(); err == nil {
		t.Error("Barrier after the abort: no error")
	}
}

// A healthy job: steps inside their deadline, no fault, Stop returns.
func TestWatchdogQuiet(t *testing.T) {
	errs := onRanks(2, 10*time.Second, func(c *FakeComm) error {
		w := StartWatchdog(c, WatchdogOptions{Poll: 5 * time.Millisecond, StepTimeout: 5 * time.Second})
		defer w.Stop()
		for step := range 5 {
			w.BeginStep(step)
			if err := c.Barrier(); err != nil {
				return err
			}
			w.EndStep()
			time.Sleep(10 * time.Millisecond) // between steps the deadline does not run
		}
		return w.Err()
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}
