package parallel

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/ember-ml/ember/cuda"
	"github.com/ember-ml/ember/tensor"
)

// NCCL is a Communicator over NCCL for one GPU per process: the
// collectives are queued on the backend's stream after the work queued
// before them (so they can sit inside a captured step) and the host does
// not wait for them, except in AllReduceValues and Barrier.
type NCCL struct {
	b      *cuda.Backend
	comm   *cuda.NCCLComm
	cause  atomic.Pointer[error] // why Abort was called
	closed atomic.Bool           // Close or Abort: no more faults to report
	side   *ncclSide             // the second stream of AllReduceAsync, made on first use
}

var _ Communicator = (*NCCL)(nil)

// NewNCCL joins the job of env on backend b: rank 0 makes the NCCL unique
// id, the rendezvous hands it to every rank, and all create the
// communicator together. b must be the GPU of this rank (ordinal
// env.LocalRank, or 0 when the launcher gives each process one visible GPU
// with CUDA_VISIBLE_DEVICES). A rank 0 that cannot make the NCCL id tells
// the others (RefuseRendezvous), so that every rank fails with its reason.
func NewNCCL(ctx context.Context, env Environment, b *cuda.Backend, opt RendezvousOptions) (*NCCL, error) {
	if err := cuda.NCCLAvailable(); err != nil {
		return nil, &RankError{Rank: env.Rank, Err: err}
	}
	var id cuda.NCCLUniqueID
	var payload []byte
	if env.Rank == 0 {
		var err error
		if id, err = cuda.NewNCCLUniqueID(); err != nil {
			return nil, RefuseRendezvous(ctx, env, err, opt)
		}
		payload = id.Internal[:]
	}
	got, err := Rendezvous(ctx, env, payload, opt)
	if err != nil {
		return nil, err
	}
	if len(got) != cuda.NCCLUniqueIDBytes {
		return nil, &RankError{Rank: env.Rank, Err: fmt.Errorf("rank 0 sent an NCCL id of %d bytes, want %d", len(got), cuda.NCCLUniqueIDBytes)}
	}
	copy(id.Internal[:], got)
	comm, err := b.Device().NewNCCLComm(env.WorldSize, env.Rank, id)
	if err != nil {
		return nil, &RankError{Rank: env.Rank, Err: err}
	}
	return &NCCL{b: b, comm: comm}, nil
}

// Rank is this process's rank.
func (n *NCCL) Rank() int { return n.comm.Rank() }

// Size is the world size.
func (n *NCCL) Size() int { return n.comm.Size() }

// Backend is the GPU backend the buffers live on.
func (n *NCCL) Backend() tensor.Backend { return n.b }

// Comm is the underlying NCCL communicator.
func (n *NCCL) Comm() *cuda.NCCLComm { return n.comm }

func (n *NCCL) wrap(err error) error {
	if err == nil {
		return nil
	}
	if c := n.cause.Load(); c != nil {
		err = fmt.Errorf("%w (after an abort: %v)", err, *c)
	}
	return rankError(n.Rank(), err)
}

func ncclOp(op Op) (cuda.NCCLRedOp, error) {
	switch op {
	case Sum:
		return cuda.NCCLSum, nil
	case Average:
		return cuda.NCCLAvg, nil
	}
	return 0, fmt.Errorf("parallel: AllReduce with %v", op)
}

// AllReduce reduces buf in place (ncclAllReduce; Average is ncclAvg).
func (n *NCCL) AllReduce(buf tensor.Buffer, op Op) error {
	o, err := ncclOp(op)
	if err != nil {
		return err
	}
	return n.wrap(n.comm.AllReduceFloat32(n.b, buf, o))
}

// Broadcast copies root's buf to every rank (ncclBroadcast).
func (n *NCCL) Broadcast(buf tensor.Buffer, root int) error {
	return n.wrap(n.comm.BroadcastFloat32(n.b, buf, root))
}

// AllReduceValues uploads vals, reduces them and downloads the result.
func (n *NCCL) AllReduceValues(vals []float32, op Op) (err error) {
	if len(vals) == 0 {
		return nil
	}
	o, err := ncclOp(op)
	if err != nil {
		return err
	}
	var opErr error
	err = tensor.Guard(func() {
		t := tensor.FromFloat32(n.b, nil, vals, len(vals))
		defer t.Release()
		if opErr = n.comm.AllReduceFloat32(n.b, t.Buffer(), o); opErr != nil {
			return
		}
		copy(vals, t.Float32s()) // waits for the all-reduce
	})
	return n.wrap(errors.Join(opErr, err))
}

// Barrier all-reduces one value and waits for it.
func (n *NCCL) Barrier() error { return n.AllReduceValues([]float32{0}, Sum) }

// AsyncError is ncclCommGetAsyncError's fault, if any.
func (n *NCCL) AsyncError() error {
	if n.closed.Load() {
		return nil
	}
	return n.comm.AsyncError()
}

// Abort aborts the NCCL communicator (ncclCommAbort), from any goroutine.
func (n *NCCL) Abort(cause error) {
	if cause == nil {
		cause = errors.New("aborted")
	}
	n.cause.CompareAndSwap(nil, &cause)
	n.closed.Store(true)
	n.comm.Abort()
}

// Close waits for the backend's queued work and destroys the communicator.
func (n *NCCL) Close() error {
	n.closed.Store(true)
	return errors.Join(n.b.Synchronize(), n.closeSide(), n.comm.Destroy())
}
