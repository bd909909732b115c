package parallel

import (
	"errors"
	"fmt"

	"github.com/ember-ml/ember/tensor"
)

// Op is a reduction of AllReduce.
type Op int

const (
	// Sum adds the ranks' values.
	Sum Op = iota
	// Average adds the ranks' values and divides by the number of ranks:
	// the gradient of DDP.
	Average
)

func (o Op) String() string {
	switch o {
	case Sum:
		return "sum"
	case Average:
		return "average"
	}
	return fmt.Sprintf("Op(%d)", int(o))
}

// Communicator joins the ranks of a data-parallel job. Its collectives
// take float32 buffers of the Backend it was made for, work in place, and
// must be called in the same order, with the same lengths, on every rank.
// Two implementations: NCCL (NewNCCL, GPUs) and the in-process fake
// (NewFakeGroup, goroutines, for tests on the CPU).
//
// Errors are final: after a collective fails (a rank died, the watchdog
// aborted) the communicator is unusable on every rank; the job ends and
// resumes from its last checkpoint.
type Communicator interface {
	// Rank is this process's rank, Size the number of ranks.
	Rank() int
	Size() int
	// Backend is where the buffers of the collectives live.
	Backend() tensor.Backend

	// AllReduce replaces buf on every rank by the op of all ranks' buf.
	AllReduce(buf tensor.Buffer, op Op) error
	// Broadcast replaces buf on every rank by root's.
	Broadcast(buf tensor.Buffer, root int) error
	// AllReduceValues is AllReduce of a few host values (a status, a loss
	// to log): the host waits for the result.
	AllReduceValues(vals []float32, op Op) error
	// Barrier returns when every rank has called it and all work queued
	// before it on this rank has finished.
	Barrier() error

	// AsyncError reports a fault seen in the background (a peer gone),
	// nil while there is none; the watchdog polls it.
	AsyncError() error
	// Abort ends the communicator at once, from any goroutine: collectives
	// blocked in it return an error that wraps cause.
	Abort(cause error)
	// Close releases the communicator after its work has finished.
	Close() error
}

// AllReduceSum sums the float32 tensor t over all ranks, in place.
func AllReduceSum(c Communicator, t *tensor.Tensor) error { return allReduceTensor(c, t, Sum) }

// AllReduceAverage averages the float32 tensor t over all ranks, in place.
func AllReduceAverage(c Communicator, t *tensor.Tensor) error {
	return allReduceTensor(c, t, Average)
}

func allReduceTensor(c Communicator, t *tensor.Tensor, op Op) (err error) {
	if err := checkTensor(c, t); err != nil {
		return err
	}
	return c.AllReduce(t.Buffer(), op)
}

// BroadcastTensor overwrites t on every rank with root's t.
func BroadcastTensor(c Communicator, t *tensor.Tensor, root int) error {
	if err := checkTensor(c, t); err != nil {
		return err
	}
	return c.Broadcast(t.Buffer(), root)
}

func checkTensor(c Communicator, t *tensor.Tensor) error {
	switch {
	case t.DType() != tensor.Float32:
		return fmt.Errorf("parallel: collective of a %v tensor; only float32 is reduced", t.DType())
	case !t.IsContiguous():
		return fmt.Errorf("parallel: collective of a strided view %v; call Contiguous", t.Shape())
	case t.Backend() != c.Backend():
		return fmt.Errorf("parallel: tensor on %s, communicator on %s", t.Backend().Name(), c.Backend().Name())
	}
	return nil
}

// RankError is a fault that ends a job, named by the rank that saw it.
type RankError struct {
	Rank int
	Err  error
}

// rankError names rank in err, unless err already names a rank.
func rankError(rank int, err error) error {
	var re *RankError
	if err == nil || errors.As(err, &re) {
		return err
	}
	return &RankError{Rank: rank, Err: err}
}

func (e *RankError) Error() string { return fmt.Sprintf("parallel: rank %d: %v", e.Rank, e.Err) }
func (e *RankError) Unwrap() error { return e.Err }
