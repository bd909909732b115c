package parallel

import (
	"errors"
	"fmt"

	"github.com/ember-ml/ember/cuda"
	"github.com/ember-ml/ember/tensor"
)

// AsyncAllReducer is a Communicator that can run all-reduces beside the
// work queued after them: NCCL on a second stream. AllReduceAsync starts
// one after everything queued so far; JoinAsync makes the work queued
// after it wait for all those started. Both can be captured.
// Communicators without it (TCP, the fake) reduce at once, which gives the
// same values.
type AsyncAllReducer interface {
	AllReduceAsync(buf tensor.Buffer, op Op) error
	JoinAsync() error
}

// ncclSide is the second stream of an NCCL communicator and the events
// that fork it from the backend's stream and join it back.
type ncclSide struct {
	stream     cuda.Stream
	fork, join cuda.Event
	pending    bool // an all-reduce was started since the last join
}

var _ AsyncAllReducer = (*NCCL)(nil)

// sideStream makes the second stream on first use. DataParallel.Overlap
// calls Prepare, so that it exists before a step is captured (a capture
// cannot create streams or events).
func (n *NCCL) sideStream() (*ncclSide, error) {
	if n.side != nil {
		return n.side, nil
	}
	d := n.b.Device()
	s, err := d.NewStream()
	if err != nil {
		return nil, err
	}
	fork, err := d.NewEvent(false)
	if err != nil {
		return nil, errors.Join(err, d.DestroyStream(s))
	}
	join, err := d.NewEvent(false)
	if err != nil {
		return nil, errors.Join(err, d.EventDestroy(fork), d.DestroyStream(s))
	}
	n.side = &ncclSide{stream: s, fork: fork, join: join}
	return n.side, nil
}

// Prepare creates the second stream and its events now: call it before a
// capture, where creating them is not allowed.
func (n *NCCL) Prepare() error {
	_, err := n.sideStream()
	return n.wrap(err)
}

// AllReduceAsync queues the all-reduce of buf on the second stream, after
// the work queued on the backend's stream so far.
func (n *NCCL) AllReduceAsync(buf tensor.Buffer, op Op) error {
	o, err := ncclOp(op)
	if err != nil {
		return err
	}
	s, err := n.sideStream()
	if err != nil {
		return n.wrap(err)
	}
	if err := n.comm.AllReduceFloat32On(n.b, buf, o, s.stream, s.fork); err != nil {
		return n.wrap(err)
	}
	s.pending = true
	return nil
}

// JoinAsync makes the backend's stream wait for the all-reduces started.
func (n *NCCL) JoinAsync() error {
	s := n.side
	if s == nil || !s.pending {
		return nil
	}
	d := n.b.Device()
	if err := d.RecordEvent(s.join, s.stream); err != nil {
		return n.wrap(err)
	}
	if err := d.StreamWaitEvent(n.b.Stream(), s.join); err != nil {
		return n.wrap(err)
	}
	s.pending = false
	return nil
}

func (n *NCCL) closeSide() error {
	s := n.side
	if s == nil {
		return nil
	}
	n.side = nil
	d := n.b.Device()
	return errors.Join(d.Synchronize(s.stream), d.EventDestroy(s.fork), d.EventDestroy(s.join), d.DestroyStream(s.stream))
}

// Overlap makes the all-reduce of each bucket start as soon as the
// gradients of its parameters are final in the backward pass (a
// tensor.SetGradReadyHook on every parameter), instead of after it, as
// PyTorch DDP overlaps communication with computation: with NCCL on a
// second stream (AsyncAllReducer), joined back in FinishGradients, before
// the optimiser reads them. Buckets start in their order (Buckets) on
// every rank, whatever the order of the hooks, so that the ranks' NCCL
// calls match. With Overlap on, call BeginGradients before each Backward
// and FinishGradients after it instead of AllReduceGradients. Inside a
// captured step the hooks run during the capture and the all-reduces
// become nodes of the graph.
func (d *DataParallel) Overlap() error {
	if d.overlap {
		return nil
	}
	if p, ok := d.c.(interface{ Prepare() error }); ok {
		if err := p.Prepare(); err != nil {
			return err
		}
	}
	d.bucketOf = make([]int, len(d.params))
	for bi, b := range d.buckets {
		for _, pi := range b.Params {
			d.bucketOf[pi] = bi
		}
	}
	d.ready = make([]int, len(d.buckets))
	for i, p := range d.params {
		i := i
		p.Tensor.SetGradReadyHook(func(*tensor.Tensor) { d.gradReady(i) })
	}
	d.overlap = true
	return nil
}

// StopOverlap removes the hooks of Overlap.
func (d *DataParallel) StopOverlap() {
	if !d.overlap {
		return
	}
	for _, p := range d.params {
		p.Tensor.SetGradReadyHook(nil)
	}
	d.overlap = false
}

// BeginGradients starts the bookkeeping of a backward pass afresh: no
// bucket started, no gradient ready, no error. With Overlap on, call it
// before each Backward: FinishGradients resets the same state, but a pass
// that never reached it (a captured step that failed mid-backward and is
// retried eagerly, a panic) would otherwise leave its counts to the next
// pass, whose buckets then never start or start early, and its error.
func (d *DataParallel) BeginGradients() {
	d.asyncErr, d.next = nil, 0
	clear(d.ready)
}

// Launched is the number of buckets whose all-reduce has started in the
// current backward pass (tests check that it happens during the pass).
func (d *DataParallel) Launched() int { return d.next }

// gradReady counts parameter i's gradient as final and starts every bucket
// that is complete and next in order.
func (d *DataParallel) gradReady(i int) {
	b := d.bucketOf[i]
	d.ready[b]++
	for d.next < len(d.buckets) && d.ready[d.next] == len(d.buckets[d.next].Params) {
		d.launch(d.next)
		d.next++
	}
}

// launch starts bucket bi's all-reduce; the first error is kept for
// FinishGradients (a hook cannot return one).
func (d *DataParallel) launch(bi int) {
	if d.asyncErr != nil {
		return
	}
	b := d.buckets[bi]
	for _, pi := range b.Params {
		if g := d.params[pi].Tensor.Grad(); g == nil || g.Buffer() != d.grads[pi] {
			d.asyncErr = fmt.Errorf("parallel: the gradient of %s moved since NewDataParallel (a new optimiser repacked it?): make a new DataParallel", d.params[pi].Name)
			return
		}
	}
	if a, ok := d.c.(AsyncAllReducer); ok {
		d.asyncErr = a.AllReduceAsync(b.Buffer, Average)
		return
	}
	d.asyncErr = d.c.AllReduce(b.Buffer, Average)
}

// FinishGradients completes what Overlap started for this backward pass:
// the buckets not started yet (parameters the pass did not reach) are
// reduced now, and the backend's stream is made to wait for all of them.
// Afterwards every rank holds the averaged gradients, as after
// AllReduceGradients. Without Overlap it is AllReduceGradients.
func (d *DataParallel) FinishGradients() error {
	if !d.overlap {
		return d.AllReduceGradients()
	}
	for ; d.next < len(d.buckets); d.next++ {
		d.launch(d.next)
	}
	err := d.asyncErr
	d.BeginGradients()
	if a, ok := d.c.(AsyncAllReducer); ok {
		err = errors.Join(err, a.JoinAsync())
	}
	return err
}
