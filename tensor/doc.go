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
//   - The operations, each forward followed by the backward closure it
//     records, one file per family: ops_elementwise.go (broadcasting
//     arithmetic, comparisons, Where, activations), ops_reduce_axes.go
//     (sums, means, extrema, variance, log-sum-exp over any axes),
//     ops_shape.go (views: Reshape, Permute, Transpose, Slice, Expand;
//     copies: Concat, Stack, Pad), ops_softmax.go (Softmax, LogSoftmax,
//     CrossEntropyLoss), ops_index.go (IndexSelect, Embedding, OneHot),
//     ops_matmul.go (BatchMatMul, Linear over [..., in], attention),
//     ops_conv.go and ops_pool.go (convolutions with strides, padding,
//     dilation and groups; max, average and adaptive pooling), ops_norm.go
//     (BatchNorm, LayerNorm), ops_random.go (Philox generators, Dropout),
//     and ops.go (LeNet's fused operations and the classic MatMul/Linear).
//   - Mixed precision: ops_cast.go (the BFloat16 dtype's rounding, Cast)
//     and autocast.go (Scope.SetAutocast: bfloat16 matrix products with
//     float32 results and float32 parameters, as torch.autocast; operands
//     written once in bfloat16 by their producers: LayerNormHalf,
//     ActivationLinear, LinearHalf, and Linear taking them as they are);
//     channels_last.go and ops_channels_last.go (autocast's convolution
//     activations held as bfloat16 [N, H, W, C] between the layers of a
//     convolution net, Scope.SetChannelsLast).
//   - autograd.go: Backward, gradient accumulation, ZeroGrad. A gradient
//     that is the same value everywhere (a whole-tensor sum's or mean's)
//     travels as a view of its one element until a backward function
//     reads it as memory, and a leaf borrowed into a scope
//     (scope_borrow.go) takes its gradient where it is made; release.go:
//     Scope.SetReleaseInBackward, under which Backward gives each
//     activation back once the pass is through with it (Retain keeps one),
//     and ReleaseInput, which gives back a layer's input once the next
//     layer has run where no backward pass reads it (a no-grad chain of
//     layers; an activation that only autocast products, additions,
//     dropouts or a ReLU took);
//     recompute.go: Recompute, which keeps a function's inputs and result
//     for the backward pass and runs it again there (activation
//     recomputation). CountingCPU (cpu_counting.go) counts the bytes a
//     step holds on the host.
//   - backend.go: the Backend interface, which is all a new backend must
//     implement: memory (Alloc, Free, Upload, Download), Fill, Copy and
//     CopyStrided, strided elementwise operations by op code
//     (backend_elementwise.go), reductions and softmax over an axis
//     (backend_reduce.go), gathers, scatters and batched products
//     (backend_index.go), MatMul, Conv2d and Conv2dBackward, counter-based
//     random numbers (backend_random.go), and Synchronize.
//   - Everything else is an optional interface, nearly all with a
//     fallback (average and adaptive pooling, the augmented gather and
//     autocast refuse a backend without theirs, naming it).
//     CompleteBackend's parts are dense-buffer forms of core operations:
//     ArithmeticBackend (Add, Axpy, ScaleBy, Sum, ReLU, Argmax, ...),
//     BiasBackend, ChannelReduceBackend (sums over all axes but one run),
//     MaxPoolBackend, CrossEntropyBackend, SGDBackend and
//     GatherBackend; Complete(b) fills in the ones b lacks from its core
//     (backend_complete.go holds every one of those fallbacks). The
//     layer-level and fused interfaces are looked for by the operation
//     that uses them, whose doc comment says what it runs without:
//     NormBackend, PoolBackend, ClassLossBackend (the class losses without
//     waiting for the host), OptimBackend (fused optimiser updates),
//     RandomStateBackend and DropoutBackend (random numbers whose counter
//     lives on the device), DropoutRedrawBackend (dropout that keeps no
//     mask: its backward pass draws it again) and DropoutAddBackend (the
//     residual added in the same pass, DropoutAdd), AugmentBackend (a batch of uint8 images
//     gathered with per-sample crop, flip, normalisation and cutout from
//     Philox words, the same bits on every backend), LowPrecisionBackend,
//     LowPrecisionConvBackend and LowPrecisionBiasBackend (casts, bfloat16
//     products, convolutions, and products with the bias in their
//     epilogue, backend_lowp.go), UnaryCastBackend, LayerNormCastBackend
//     and LinearCastBackend (a unary function, a layer norm and a product
//     that round their result as they write it), ChannelsLastBackend and
//     ChannelsLastFilterBackend (autocast's bfloat16 channels-last
//     activations, and a filter cast once a step for both of a
//     convolution's passes, channels_last.go), ChannelsLastPoolNormBackend
//     (a max pooling and the batch norm after it, MaxPoolBatchNormAct,
//     one operation each way), CausalSoftmaxBackend,
//     AttentionBackend (fused scaled dot-product attention; without it,
//     the composed products and softmax), FusedBackend, and the fused
//     ConvPoolBackend, BiasReLUBackend, LinearBackend and
//     LinearCrossEntropyBackend. cpu*.go implement the core and the
//     optional interfaces on the host, but for AttentionBackend and the
//     four fused ones (the CPU runs their composed forms); package cuda
//     implements them all on NVIDIA GPUs;
//     package tensortest is the conformance suite both run, and its
//     CoreOnly hides every optional interface, so that the same suite
//     checks the fallbacks.
//   - Adding an operator: its op file (ops_*.go: the forward and the
//     backward it records), a code in the core's family where it is
//     pointwise or a reduction (or else an optional interface with a
//     fallback), its kernels (cpu_*.go, package cuda), and its case in
//     tensortest.
//   - ewk.go: Fused, a chain of pointwise operations written as an
//     expression (Var, Const, Add, Mul, Tanh, ...) with its gradient derived
//     symbolically; a FusedBackend (backend_fused.go; CUDA) runs each
//     direction as one generated kernel, others as the composed operations.
//
// Operations panic on programming errors (mismatched shapes) and on device
// failures; Guard turns a device failure (out of memory, a failed launch)
// into an error.
package tensor
