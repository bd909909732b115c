package parallel

import (
	"fmt"

	"github.com/ember-ml/ember/nn"
)

// Checkpoints are written by rank 0 alone: after AllReduceGradients every
// rank holds the same parameters and optimiser state, so one copy is the
// whole state, and N ranks writing one file would race. The other ranks
// wait until rank 0 is done (so that none exits, or goes on to change the
// parameters in place, before the file is complete) and learn whether it
// succeeded, so that a failed save ends every rank, not just one.

// IsMain reports whether this process is rank 0 (or runs alone: c nil),
// the one that logs and writes files.
func IsMain(c Communicator) bool { return c == nil || c.Rank() == 0 }

// OnMain runs fn on rank 0 only, then makes every rank wait for it: each
// returns an error when fn failed (rank 0 its own error, the others one
// naming rank 0). It is a collective: every rank calls it at the same
// point. With c nil, fn just runs.
func OnMain(c Communicator, fn func() error) error {
	if c == nil {
		return fn()
	}
	var err error
	status := []float32{0}
	if c.Rank() == 0 {
		if err = fn(); err != nil {
			status[0] = 1
		}
	}
	if cerr := c.AllReduceValues(status, Sum); cerr != nil {
		if err != nil {
			return err
		}
		return cerr
	}
	if c.Rank() == 0 {
		return err
	}
	if status[0] != 0 {
		return &RankError{Rank: c.Rank(), Err: fmt.Errorf("rank 0 failed to write the checkpoint (its log has the reason)")}
	}
	return nil
}

// SaveCheckpoint writes the checkpoint of m and its training state on rank
// 0 (nn.SaveCheckpoint: atomic, a crash leaves the previous or the new
// checkpoint) and returns on every rank once it is written. The state's
// data position (Epoch, Step) counts global steps of the whole world, so a
// resume at another world size continues from the same place in the
// epoch's order; see Sharder.
func SaveCheckpoint(c Communicator, modelPath string, m nn.Module, st *nn.TrainingState) error {
	return OnMain(c, func() error { return nn.SaveCheckpoint(modelPath, m, st) })
}

// LoadCheckpoint reads the checkpoint on every rank from modelPath (a
// shared file system) and broadcasts rank 0's parameters afterwards (dp's
// BroadcastParameters), so that all ranks start identical even if their
// copies of the file differed. It is a collective.
func LoadCheckpoint(dp *DataParallel, modelPath string, m nn.Module) (*nn.TrainingState, error) {
	st, err := nn.LoadCheckpoint(modelPath, m)
	failed := []float32{0}
	if err != nil {
		failed[0] = 1
	}
	c := dp.Communicator()
	if cerr := c.AllReduceValues(failed, Sum); cerr != nil {
		return nil, cerr
	}
	if err != nil {
		return nil, err
	}
	if failed[0] != 0 {
		return nil, &RankError{Rank: c.Rank(), Err: fmt.Errorf("%d rank(s) could not read checkpoint %s", int(failed[0]), modelPath)}
	}
	if err := dp.BroadcastParameters(); err != nil {
		return nil, err
	}
	return st, nil
}

// AgreeToStop tells every rank whether any rank wants to stop (a SIGINT
// that reached only some ranks, or reached them during different steps):
// each passes its own wish and all get the same answer, so that all stop
// after the same step and save once (SaveCheckpoint) instead of waiting in
// different collectives. It is a collective with a host round trip: call
// it between steps, every step or every few.
func AgreeToStop(c Communicator, stop bool) (bool, error) {
	if c == nil {
		return stop, nil
	}
	v := []float32{0}
	if stop {
		v[0] = 1
	}
	if err := c.AllReduceValues(v, Sum); err != nil {
		return true, err
	}
	return v[0] > 0, nil
}
