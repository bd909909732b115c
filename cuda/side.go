package cuda

import (
	"errors"
	"sync"
	"sync/atomic"
)

// sideLane is a second stream for work that need not wait for the main
// stream's next operations, used while a graph is captured (capturing):
// there its work becomes a parallel branch of the graph. Launched eagerly,
// the event calls of a fork and a join cost the host more than the overlap
// saves on the device, so outside a capture everything runs in order on the
// main stream. The backend's own kernels run there, and cuBLASLt products
// whose algorithms need no workspace (the workspace is the main stream's);
// no cuBLAS.
//
// Two forms, both joined by events, so the host never blocks:
//
//   - parallel: both parts of one operation, forked and joined inside it
//     (a convolution's weight gradient on the side while its input gradient
//     runs on the main stream: both read the same output gradient, and each
//     alone leaves most of an H200 idle at batch 64).
//   - detach: a side task that outlives the call queuing it (a last layer's
//     weight gradient, beside the next layer's backward pass; the last
//     step of a bias gradient). The main stream joins it before its next
//     operation, unless that operation runs through beside and shares no
//     memory with the task, other than memory both only read. Memory of the
//     task freed before the join (a tensor's, or a workspace's) goes back to
//     the allocator at the join, so that nothing queued meanwhile can be
//     given it. A capture joins the detached tasks before it ends.
//
// mu guards the events and the detached tasks' state; it is not held while
// the work of either form is queued, which may free memory (hold) or
// detach a task itself. Invariant: a capture is one goroutine's work, as
// the stream's capture mode requires, so fork...join sequences do not
// interleave (mu alone does not keep them apart).
type sideLane struct {
	mu             sync.Mutex
	stream         Stream
	forkEv, joinEv Event
	capturing      atomic.Bool

	forks atomic.Int64 // parallel branches and detached tasks so far (tests)

	detached  atomic.Bool // a detached task awaits its join
	suspended atomic.Bool // beside runs operations checked against it
	uses      []span      // the detached tasks' memory
	held      []Block     // blocks of it freed meanwhile, for alloc at the join
	alloc     *Allocator
}

// span is a range of device memory an operation reads or writes.
type span struct {
	p     uintptr
	bytes int
	write bool
}

// conflicts says whether operations touching a and b must be ordered: they
// share a byte that one of them writes.
func conflicts(a, b []span) bool {
	for _, x := range a {
		for _, y := range b {
			if (x.write || y.write) && overlaps(x.p, x.bytes, y.p, y.bytes) {
				return true
			}
		}
	}
	return false
}

// openSideLane makes the side stream and its events.
func (b *Backend) openSideLane() error {
	l := &sideLane{}
	b.side = l
	var err error
	if l.stream, err = b.dev.NewStream(); err != nil {
		return err
	}
	if l.forkEv, err = b.dev.NewEvent(false); err != nil {
		return err
	}
	l.joinEv, err = b.dev.NewEvent(false)
	return err
}

// closeSideLane releases what openSideLane made.
func (b *Backend) closeSideLane() []error {
	l := b.side
	if l == nil {
		return nil
	}
	var errs []error
	for _, e := range []Event{l.forkEv, l.joinEv} {
		if e != 0 {
			errs = append(errs, b.dev.EventDestroy(e))
		}
	}
	if l.stream != 0 {
		errs = append(errs, b.dev.DestroyStream(l.stream))
	}
	return errs
}

// hold keeps blk (of which bytes are in use) from the allocator while a
// detached task uses it; it reports whether it did (settle frees blk at the
// join).
func (l *sideLane) hold(blk Block, bytes int) bool {
	if l == nil || !l.detached.Load() {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.detached.Load() || !conflicts(l.uses, []span{{blk.Ptr(), bytes, true}}) {
		return false
	}
	l.held = append(l.held, blk)
	return true
}

// fork makes the side stream wait for g's work so far.
func (g *gpuExec) fork(l *sideLane) error {
	if err := g.dev.RecordEvent(l.forkEv, g.stream); err != nil {
		return err
	}
	return g.dev.StreamWaitEvent(l.stream, l.forkEv)
}

// join makes g's stream wait for the side stream's work so far.
func (g *gpuExec) join(l *sideLane) error {
	if err := g.dev.RecordEvent(l.joinEv, l.stream); err != nil {
		return err
	}
	return g.dev.StreamWaitEvent(g.stream, l.joinEv)
}

// parallel queues side on the side lane's stream and main on this one
// between a fork and a join. Without a side lane, or outside a graph
// capture, both go to this stream, side first.
func (g *gpuExec) parallel(side func(x executor), main func()) (err error) {
	if !g.detaching() {
		side(g)
		main()
		return nil
	}
	if err := g.settle(); err != nil {
		return err
	}
	l := g.side
	l.mu.Lock()
	err = g.fork(l)
	l.mu.Unlock()
	if err != nil {
		return err
	}
	l.forks.Add(1)
	// The join runs even when side or main panics (a failed launch), so
	// that the capture never ends with the side stream unjoined and
	// nothing freed after a failure is still in use there.
	defer func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if e := g.join(l); err == nil {
			err = e
		}
	}()
	side(&gpuExec{dev: g.dev, stream: l.stream, lt: g.lt, rehearsing: g.rehearsing})
	main()
	return nil
}

// detaching says whether detach and parallel would use the side stream.
func (g *gpuExec) detaching() bool {
	return g.side != nil && g.side.capturing.Load()
}

// detach forks side onto the side lane's stream and leaves it there, to be
// joined by settle (see sideLane); tasks detached before the join queue
// there one after the other. Outside a capture side runs at once on this
// stream.
func (g *gpuExec) detach(uses []span, side func(x executor)) error {
	if !g.detaching() {
		side(g)
		return nil
	}
	l := g.side
	l.mu.Lock()
	err := g.fork(l)
	if err == nil {
		// Detached before side runs, so that a capture failing inside it
		// still joins the side stream before it ends.
		l.uses = append(l.uses, uses...)
		l.detached.Store(true)
	}
	l.mu.Unlock()
	if err != nil {
		return err
	}
	l.forks.Add(1)
	side(&gpuExec{dev: g.dev, stream: l.stream, rehearsing: g.rehearsing})
	return nil
}

// beside runs main without joining a detached task first when the memory
// main touches (uses) does not conflict with the task's; otherwise it joins
// first.
func (g *gpuExec) beside(uses []span, main func()) error {
	l := g.side
	if l == nil || !l.detached.Load() {
		main()
		return nil
	}
	l.mu.Lock()
	apart := !conflicts(l.uses, uses)
	l.mu.Unlock()
	if !apart {
		if err := g.settle(); err != nil {
			return err
		}
		main()
		return nil
	}
	l.suspended.Store(true)
	defer l.suspended.Store(false)
	main()
	return nil
}

// settle joins a detached task into this stream and frees the memory held
// for it. The task counts as joined even when the join fails (a capture
// already broken), so that a failed capture leaves no state behind.
func (g *gpuExec) settle() error {
	l := g.side
	if l == nil || !l.detached.Load() || l.suspended.Load() {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.detached.Load() {
		return nil
	}
	err := g.join(l)
	l.detached.Store(false)
	l.uses = nil
	for _, blk := range l.held {
		if e := l.alloc.Free(blk); e != nil {
			err = errors.Join(err, e)
		}
	}
	l.held = nil
	return err
}
