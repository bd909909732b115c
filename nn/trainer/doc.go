// Package trainer trains any model: give Run a model, an optimiser, a data
// source and the options of the run, and it does what a training command
// needs, the same way for every model:
//
//   - the step (loss, backward, optimiser update) captured once as a CUDA
//     graph and replayed where the backend and the step allow, eagerly
//     otherwise, with the reason said once (CaptureStep, usable by a loop
//     of one's own too), and the evaluation between epochs run in the
//     captured step's idle memory (Step.Lend);
//   - a learning-rate schedule set on the device before each step, so that
//     a replayed graph uses it (Config.Schedule);
//   - progress (a live bar on a terminal, plain lines otherwise), a loss
//     check every log interval that stops a diverging run, one line and
//     one metrics row (OpenMetrics) per epoch, the device memory
//     (GPUMemory);
//   - a checkpoint after each epoch (nn.SaveCheckpoint: the model, and the
//     training state beside it, each atomic), an exact resume
//     (Config.Resume; bit for bit on the CPU), and on a cancelled context
//     (SIGINT, SIGTERM) the step finished, a checkpoint saved and an
//     *InterruptedError returned for the program to exit with its status.
//
// A data source (Source) forms each batch on the device from tensors that
// stay the same between steps, which is what lets a captured step be
// replayed; Images is the source of an image set held on the device as
// bytes (MNIST, Fashion-MNIST). cmd/train is the command built on it.
package trainer
