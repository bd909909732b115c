// Package tensor is the core of ember: n-dimensional float32 tensors on a
// device, reverse-mode automatic differentiation, and the Backend interface
// that devices implement.
//
// Where to start:
//
//   - tensor.go: Tensor (shape, strides, views) and its constructors. Every
//     constructor takes the Backend the tensor lives on and the Scope that
//     frees it (nil for long-lived tensors such as parameters).
//   - scope.go: Scope, which frees all the tensors of a training step at once,
//     so that device memory never waits for Go's garbage collector.
//   - ops.go, ops_shape.go: the operations (MatMul, Linear, Conv2d,
//     MaxPool2d, ReLU, CrossEntropy, Reshape, ...), each forward followed by
//     the backward closure it records.
//   - autograd.go: Backward, gradient accumulation, ZeroGrad.
//   - backend.go: the Backend interface. cpu.go and cpu_conv.go implement it
//     on the host; package cuda implements it on NVIDIA GPUs; package
//     tensortest is the conformance suite both run. A backend may also
//     implement ConvPoolBackend, BiasReLUBackend, LinearBackend and
//     LinearCrossEntropyBackend, which fuse Conv2dReLUMaxPool, LinearReLU
//     and LinearCrossEntropy (a classifier's last layer with its loss) into
//     fewer passes; without them those operations run as their parts. One
//     that implements ClassLossBackend (backend_loss.go) runs
//     CrossEntropyLoss with torch's options without waiting for the host.
//   - ewk.go: Fused, a chain of pointwise operations written as an
//     expression (Var, Const, Add, Mul, Tanh, ...) with its gradient derived
//     symbolically; a FusedBackend (backend_fused.go; CUDA) runs each
//     direction as one generated kernel, others as the composed operations.
//
// Operations panic on programming errors (mismatched shapes) and on device
// failures; Guard turns a device failure (out of memory, a failed launch)
// into an error.
package tensor
