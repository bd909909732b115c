// Package optim updates parameters from their gradients: SGD with momentum,
// dampening, nesterov and weight decay, following torch.optim.SGD's rule
// exactly, and a step learning-rate schedule.
//
// NewSGD packs the parameters, their gradients and the momentum buffers into
// one allocation each, so that ZeroGrad and Step are one backend call each
// (one kernel launch on a GPU) whatever the number of parameters, and
// StepAndZeroGrad is both in one call: a training loop that uses it needs no
// fill of the gradients per step.
package optim
