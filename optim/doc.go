// Package optim updates parameters from their gradients, following
// torch.optim's update rules exactly: SGD (momentum, dampening, nesterov,
// weight decay), Adam and AdamW (bias correction, eps after the square root,
// L2 or decoupled weight decay, amsgrad), with parameter groups (DecayGroups
// keeps biases and normalisation weights out of the decay), gradient
// clipping by global norm (ClipGradNorm) and learning-rate schedules
// (StepLR, MultiStepLR, LinearLR warm-up, CosineAnnealingLR, OneCycleLR,
// Sequential to chain them).
//
// Every optimiser packs the parameters, their gradients and its state
// buffers into one allocation each, so that ZeroGrad and Step are one
// backend call each (one kernel launch on a GPU, per parameter group)
// whatever the number of parameters, and StepAndZeroGrad is both in one
// call: a training loop that uses it needs no fill of the gradients per
// step.
//
// Per-step values on the device. A CUDA graph replays the launches it
// captured with their arguments frozen, so anything that changes from step
// to step must be read from device memory. Adam's kernels read the step
// size lr/(1 - beta1^t), √(1 - beta2^t), AdamW's 1 - lr·wd and 1 - beta1
// from a small device buffer that Prepare computes (in double, as torch)
// and uploads; Step calls Prepare itself when it has not run for the
// coming step. SGD takes its hyper-parameters as launch arguments by
// default (LeNet's path, unchanged); SetLR or SetMomentum (what schedules
// call), SetDampening and SetWeightDecay move the learning rate, momentum,
// dampening and weight decay to a four-value device buffer, uploaded only
// when one changes. A one-cycle schedule's momentum (OneCycleLR with
// CycleMomentum: SGD's momentum, Adam's beta1) thus reaches a replayed
// step as its learning rate does. A loop that replays a captured step
// therefore does, per step:
//
//	opt.SetLR(schedule.LR(step)) // host side; nothing is queued for Adam yet
//	opt.SetMomentum(m)           // likewise, with a cycled momentum
//	opt.Prepare()                // one small upload, before the replay
//	graph.Replay()
//	opt.Replayed()               // count the step
//
// and calls Prepare before capturing the step too (an upload cannot be
// captured; a prepared Step queues kernels only, and counts itself, so the
// first replay, which runs the captured step, is not counted again). Checkpoints keep each
// optimiser's state with SaveTraining and LoadTraining (SGD's momentum in
// the format it always had).
package optim
