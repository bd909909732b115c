package optim

import (
	"fmt"
	"maps"
	"slices"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// State is an optimiser's training state: its update count and its
// buffers, each flat in the optimiser's packed parameter order, by name:
// "momentum" for SGD (absent without momentum), "exp_avg", "exp_avg_sq"
// and, with amsgrad, "max_exp_avg_sq" for Adam (torch's names). A State
// loads into an optimiser built the same way (same parameters, groups and
// configuration) and resumes it exactly: the values are copied bit for bit.
type State struct {
	Steps   int
	Buffers map[string][]float32
}

// Stateful is an optimiser whose state can be saved and restored.
type Stateful interface {
	State() State
	LoadState(State) error
}

var (
	_ Stateful = (*SGD)(nil)
	_ Stateful = (*Adam)(nil)
)

// State returns the step count and the momentum (if any), read from the
// device.
func (s *SGD) State() State {
	st := State{Steps: s.steps, Buffers: map[string][]float32{}}
	if s.momentum != nil {
		st.Buffers["momentum"] = s.momentum.Float32s()
	}
	return st
}

// LoadState restores a State saved from an SGD built the same way.
func (s *SGD) LoadState(st State) error {
	if err := checkBuffers("SGD", st, s.flatP.Len(), s.momentum != nil, "momentum"); err != nil {
		return err
	}
	return s.SetState(st.Steps, st.Buffers["momentum"])
}

// State returns the step count and the moments, read from the device.
func (a *Adam) State() State {
	st := State{Steps: a.steps, Buffers: map[string][]float32{
		"exp_avg": a.m.Float32s(), "exp_avg_sq": a.v.Float32s(),
	}}
	if a.vmax != nil {
		st.Buffers["max_exp_avg_sq"] = a.vmax.Float32s()
	}
	return st
}

// LoadState restores a State saved from an Adam built the same way.
func (a *Adam) LoadState(st State) error {
	if err := checkBuffers("Adam", st, a.flatP.Len(), true, "exp_avg", "exp_avg_sq"); err != nil {
		return err
	}
	if err := checkBuffers("Adam", st, a.flatP.Len(), a.vmax != nil, "max_exp_avg_sq"); err != nil {
		return err
	}
	for name := range st.Buffers {
		if name != "exp_avg" && name != "exp_avg_sq" && name != "max_exp_avg_sq" {
			return fmt.Errorf("optim: Adam state has a buffer %q, which Adam does not keep", name)
		}
	}
	a.m.CopyFrom(st.Buffers["exp_avg"])
	a.v.CopyFrom(st.Buffers["exp_avg_sq"])
	if a.vmax != nil {
		a.vmax.CopyFrom(st.Buffers["max_exp_avg_sq"])
	}
	a.steps, a.prepared = st.Steps, 0
	return nil
}

// checkBuffers checks that st has the named buffers, of n values each, when
// want, and none of them otherwise.
func checkBuffers(op string, st State, n int, want bool, names ...string) error {
	if st.Steps < 0 {
		return fmt.Errorf("optim: %s state with %d steps", op, st.Steps)
	}
	for _, name := range names {
		b, ok := st.Buffers[name]
		switch {
		case want && !ok:
			return fmt.Errorf("optim: %s state has no %q buffer", op, name)
		case !want && ok:
			return fmt.Errorf("optim: %s state has a %q buffer this optimiser does not keep", op, name)
		case ok && len(b) != n:
			return fmt.Errorf("optim: %s state's %q has %d values, the parameters need %d", op, name, len(b), n)
		}
	}
	return nil
}

// SaveTraining puts an optimiser's state into a checkpoint's training
// state: SGD's momentum in Momentum (the format SGD checkpoints have always
// had: tensor "optimizer.momentum"), any other buffer in OptimizerBuffers
// (tensors "optimizer.<name>"), the count in OptimizerSteps.
func SaveTraining(ts *nn.TrainingState, st State) {
	ts.OptimizerSteps = st.Steps
	ts.Momentum = nil
	ts.OptimizerBuffers = nil
	for _, name := range slices.Sorted(maps.Keys(st.Buffers)) {
		if name == "momentum" {
			ts.Momentum = st.Buffers[name]
			continue
		}
		if ts.OptimizerBuffers == nil {
			ts.OptimizerBuffers = map[string][]float32{}
		}
		ts.OptimizerBuffers[name] = st.Buffers[name]
	}
}

// LoadTraining is the optimiser State held in a checkpoint's training
// state (the inverse of SaveTraining).
func LoadTraining(ts *nn.TrainingState) State {
	st := State{Steps: ts.OptimizerSteps, Buffers: map[string][]float32{}}
	if ts.Momentum != nil {
		st.Buffers["momentum"] = ts.Momentum
	}
	maps.Copy(st.Buffers, ts.OptimizerBuffers)
	return st
}

// The optimisers all have these; Optimizer names what a training loop needs.
var (
	_ Optimizer = (*SGD)(nil)
	_ Optimizer = (*Adam)(nil)
)

// Optimizer is what a training loop drives: SGD and Adam (AdamW) both are.
type Optimizer interface {
	ZeroGrad()
	Step()
	StepAndZeroGrad()
	// SetLR sets the learning rate (of every group) for the next steps.
	SetLR(lr float64)
	// Prepare writes the coming step's device scalars; call it before
	// replaying a captured step (Step calls it itself).
	Prepare()
	// Replayed counts a step that ran as a replay.
	Replayed()
	Steps() int
	Parameters() []nn.Parameter
	// Gradients is the packed gradient buffer.
	Gradients() *tensor.Tensor
	Stateful
}
