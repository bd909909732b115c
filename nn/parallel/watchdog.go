package parallel

import (
	"fmt"
	"sync"
	"time"
)

// WatchdogOptions tune StartWatchdog.
type WatchdogOptions struct {
	// Poll is how often the communicator's AsyncError and the step's age are
	// checked (default 100 ms).
	Poll time.Duration
	// StepTimeout is how long one step (BeginStep to EndStep) may take
	// before the watchdog decides a rank died or hangs (0: no deadline, only
	// AsyncError). Set it well above the slowest step, checkpoints included.
	StepTimeout time.Duration
	// OnFault, when set, is called once with the fault, from the watchdog's
	// goroutine, after the communicator was aborted: print the one line
	// and exit, say.
	OnFault func(error)
}

// Watchdog ends a job whose ranks can no longer agree: a goroutine polls
// the communicator's asynchronous error (NCCL's ncclCommGetAsyncError) and
// the age of the current step; on a fault it aborts the communicator, so
// that a collective this rank is blocked in returns an error instead of
// waiting for a peer that will never come, and records one line naming
// this rank and what happened (RankError). With each rank running its own
// watchdog, a rank that dies or hangs ends every rank within StepTimeout.
type Watchdog struct {
	c   Communicator
	opt WatchdogOptions

	mu        sync.Mutex
	step      int
	stepStart time.Time // zero between steps
	err       error

	fault chan struct{}
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
}

// pender is a communicator that can say which ranks a collective waits
// for (the fake); the watchdog names them.
type pender interface{ Pending() []int }

// StartWatchdog starts watching c. Stop it when training ends.
func StartWatchdog(c Communicator, opt WatchdogOptions) *Watchdog {
	if opt.Poll <= 0 {
		opt.Poll = 100 * time.Millisecond
	}
	w := &Watchdog{c: c, opt: opt, fault: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	go w.run()
	return w
}

// BeginStep marks the start of step (a number for the message); the
// deadline runs from now.
func (w *Watchdog) BeginStep(step int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.step, w.stepStart = step, time.Now()
}

// EndStep marks the end of the current step.
func (w *Watchdog) EndStep() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stepStart = time.Time{}
}

// Err is the fault, nil while there is none.
func (w *Watchdog) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Fault is closed when the watchdog has found a fault and aborted.
func (w *Watchdog) Fault() <-chan struct{} { return w.fault }

// Stop ends the watching; it returns once the goroutine has.
func (w *Watchdog) Stop() {
	w.once.Do(func() { close(w.stop) })
	<-w.done
}

func (w *Watchdog) run() {
	defer close(w.done)
	t := time.NewTicker(w.opt.Poll)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
		if err := w.check(); err != nil {
			w.mu.Lock()
			w.err = err
			w.mu.Unlock()
			w.c.Abort(err)
			close(w.fault)
			if w.opt.OnFault != nil {
				w.opt.OnFault(err)
			}
			return
		}
	}
}

// check returns the fault, if any.
func (w *Watchdog) check() error {
	if err := w.c.AsyncError(); err != nil {
		return &RankError{Rank: w.c.Rank(), Err: fmt.Errorf("the communicator failed: %v; aborted", err)}
	}
	w.mu.Lock()
	step, start := w.step, w.stepStart
	w.mu.Unlock()
	if w.opt.StepTimeout > 0 && !start.IsZero() && time.Since(start) > w.opt.StepTimeout {
		waiting := "a rank died or hangs"
		if p, ok := w.c.(pender); ok {
			if ranks := p.Pending(); len(ranks) > 0 {
				waiting = fmt.Sprintf("waiting for rank(s) %v", ranks)
			}
		}
		return &RankError{Rank: w.c.Rank(), Err: fmt.Errorf("step %d still running after %v (%s); communicator aborted", step, w.opt.StepTimeout, waiting)}
	}
	return nil
}
