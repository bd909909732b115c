package optim

import "github.com/ember-ml/ember/nn"

// Gradients zeroed by being cleared (tensor.Tensor.ClearGrad): the next
// backward pass writes each parameter's first part over its buffer instead
// of adding it to zeros, so the update writes no zeros and the products
// that make the gradients read none.
//
// StepAndZeroGrad's update clears the gradients rather than zeroing them
// only when the backward pass before it found every gradient it reached
// cleared (tensor.Tensor.GradWrittenAfresh) and every other one is still
// cleared: the step's result then does not depend on what the buffers
// held, which a captured step replayed over and over needs, since its
// backward pass's choice between writing and adding is fixed when it is
// captured. ClearGrad starts that: it clears the gradients where the last
// backward pass showed that each can be written whole
// (tensor.Tensor.GradWrittenWhole), and writes zeros otherwise. A model
// with a gradient some operation can only add into (a convolution's
// filter gradient, an embedding's scatter) keeps the zeros the update
// writes, for all the parameters in one pass, so that no backward pass
// queues a fill of its own.

// settleGrads writes the zeros of the gradients still cleared, those of
// parameters the last backward pass did not reach, before the packed
// buffer is read as a whole.
func settleGrads(params []nn.Parameter) {
	for _, p := range params {
		p.Tensor.Grad()
	}
}

// clearedAfresh reports whether an update may clear the gradients instead
// of writing zeros (above); call it before settleGrads.
func clearedAfresh(params []nn.Parameter) bool {
	for _, p := range params {
		if !p.Tensor.GradCleared() && !p.Tensor.GradWrittenAfresh() {
			return false
		}
	}
	return true
}

// writtenWhole reports whether the last backward pass could write every
// gradient whole.
func writtenWhole(params []nn.Parameter) bool {
	for _, p := range params {
		if !p.Tensor.GradWrittenWhole() {
			return false
		}
	}
	return true
}

// clearOrZero is an optimiser's ClearGrad: the gradients cleared where
// the last backward pass wrote each of them whole, else zeroed by zero.
func clearOrZero(params []nn.Parameter, zero func()) {
	if !writtenWhole(params) {
		zero()
		return
	}
	clearGrads(params)
}

// clearGrads marks every gradient cleared.
func clearGrads(params []nn.Parameter) {
	for _, p := range params {
		p.Tensor.ClearGrad()
	}
}

// unclearGrads drops the marks of gradients whose zeros were just written.
func unclearGrads(params []nn.Parameter) {
	for _, p := range params {
		p.Tensor.RestoreGradCleared(false)
	}
}
