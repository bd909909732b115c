package optim

import (
	"slices"

	"github.com/ember-ml/ember/tensor"
)

// DefaultInBackwardMin is SGD.InBackwardMin's default: the fewest packed
// elements one update queued from the backward pass covers. A smaller
// update costs its launch (a few microseconds in a captured step) more
// than it saves beside the backward pass; smaller parameters wait for
// their neighbours in the packed buffer, or for StepAndZeroGrad.
const DefaultInBackwardMin = 1 << 18

// UpdateInBackward makes the update of parameters start as soon as the
// backward pass has finished their gradients (tensor.SetGradReadyHook), as
// PyTorch's optimizer-in-backward recipe does. On a backend that can queue
// an update beside the work after it (tensor.BesideOptimBackend: the CUDA
// backend's second stream, in a captured step) the last layers' update
// then runs while the backward pass of the first layers goes on, instead
// of after it; on other backends nothing changes. Parameters whose
// gradients become ready one after the other and lie side by side in the
// packed buffer (a layer's weight and bias, the layers above it) are
// updated together once they hold InBackwardMin elements;
// StepAndZeroGrad updates the rest and ends the step. The results are bit
// for bit those of StepAndZeroGrad after Backward: the same kernel on
// each part of the packed buffers.
//
// It is for loops in which every Backward is followed by StepAndZeroGrad
// with nothing in between that reads or changes the gradients (no
// accumulation over several passes, no clipping, no all-reduce), and in
// which no operation of the backward pass reads a parameter after its
// gradient is complete (one read outside the gradient's graph, say, under
// Detach). nn/trainer turns it on for its steps where the first holds
// (Config.UpdateInBackward). It replaces any hook set on the parameters;
// off removes them.
func (s *SGD) UpdateInBackward(on bool) {
	if !on {
		if s.early != nil {
			for _, p := range s.params {
				p.Tensor.SetGradReadyHook(nil)
			}
			s.early, s.ready, s.offs = nil, nil, nil
		}
		return
	}
	if _, ok := s.flatP.Backend().(tensor.BesideOptimBackend); !ok || s.early != nil {
		return // nothing to overlap, or on already
	}
	s.early, s.ready = make([]bool, len(s.params)), make([]bool, len(s.params))
	s.offs = make([]int, len(s.params)+1)
	for i, p := range s.params {
		s.offs[i+1] = s.offs[i] + p.Tensor.Len()
		p.Tensor.SetGradReadyHook(func(*tensor.Tensor) { s.gradReady(i) })
	}
	s.BeginGradients()
}

// BeginGradients forgets the updates queued by a backward pass whose step
// did not end (a captured step that failed and is run again eagerly).
func (s *SGD) BeginGradients() {
	clear(s.early)
	clear(s.ready)
}

// gradReady takes parameter i's gradient, complete: the run of adjacent
// parameters (in the packed buffer) around it whose gradients are ready
// and whose update is not queued is queued beside what follows once it is
// large enough.
func (s *SGD) gradReady(i int) {
	s.ready[i] = true
	lo, hi := i, i+1
	for lo > 0 && s.ready[lo-1] {
		lo--
	}
	for hi < len(s.ready) && s.ready[hi] {
		hi++
	}
	minElems := s.InBackwardMin
	if minElems <= 0 {
		minElems = DefaultInBackwardMin
	}
	if s.offs[hi]-s.offs[lo] < minElems {
		return
	}
	for j := lo; j < hi; j++ {
		s.ready[j], s.early[j] = false, true
	}
	p, g, v := s.window(s.offs[lo], s.offs[hi]-s.offs[lo])
	var scalars tensor.Buffer
	if s.dev != nil {
		s.Prepare()
		scalars = s.dev.buf.Buffer()
	}
	s.flatP.Backend().(tensor.BesideOptimBackend).SGDBeside(p, g, v, scalars, s.hyper(true))
}

// finishInBackward queues the updates the backward pass did not, one call
// per run of adjacent parameters, and starts the next step's account.
func (s *SGD) finishInBackward(zeroGrad bool) {
	if !zeroGrad && slices.Contains(s.early, true) {
		panic("optim: SGD.Step after a backward pass that updated parameters (UpdateInBackward): call StepAndZeroGrad")
	}
	h := s.hyper(zeroGrad)
	start := -1
	for i := range s.params {
		switch {
		case !s.early[i] && start < 0:
			start = s.offs[i]
		case s.early[i] && start >= 0:
			s.update(start, s.offs[i]-start, h)
			start = -1
		}
	}
	if start >= 0 {
		s.update(start, s.offs[len(s.params)]-start, h)
	}
	s.BeginGradients()
}
