// Package cuda is ember's interface to NVIDIA GPUs: the CUDA driver API,
// the NVRTC runtime compiler, cuBLAS and (optionally) cuDNN and NCCL,
// called without cgo, and the tensor backend built on them.
//
// The code is split by concern. Package cuda/driver binds the driver,
// NVRTC and cuBLAS (devices, memory, streams, modules, virtual memory, the
// on-disk kernel cache, library loading, errors); package cuda/alloc is the
// caching allocator; this package holds the Backend and its operators, the
// cuDNN and NCCL bindings, and names the other two packages' types and
// functions as its own (cuda.Device embeds *driver.Device; cuda.Allocator
// is alloc.Allocator; driverapi.go and allocapi.go), so that programs
// import only this one.
//
// The package builds with CGO_ENABLED=0 on any machine. The NVIDIA
// libraries are opened at run time with purego (github.com/ebitengine/purego)
// on first use: libcuda.so.1 (from the driver), libnvrtc.so.13/.12/.11 and
// libcublas.so.13/.12/.11 (from the CUDA toolkit or its redistributable
// packages), searched by the dynamic loader and then under $CUDA_HOME/lib64
// and /usr/local/cuda/lib64. Without them everything still compiles;
// Available reports why no GPU can be used, and GPU tests skip.
//
// # Where to start
//
//	if err := cuda.Available(); err != nil { ... }  // no driver, no device, ...
//	d, err := cuda.Open(0)                           // device 0, primary context
//	defer d.Close()
//	fmt.Println(d.Name(), d.ComputeCapability())
//
// Device has memory (MemAlloc, MemFree, MemGetInfo), copies (CopyHtoD,
// CopyDtoH, CopyDtoD, Memset32), streams (NewStream, Synchronize), events
// (EventRecord, EventQuery, NewEvent, EventElapsed) and CUDA graphs
// (BeginCapture, EndCapture, Graph.Instantiate, GraphExec.Launch). Every
// failed library call is an *Error naming the call and the library's own
// error name (CUDA_ERROR_..., NVRTC_ERROR_..., CUBLAS_STATUS_...).
//
// # Threads and contexts
//
// A CUDA context is current per OS thread, and goroutines move between
// threads. Every Device method therefore pins the calling goroutine to its
// thread, makes the device's primary context current, makes the call and
// unpins; code in this package never calls a library except through a
// Device method, Device.Do or Device.Enter/Leave (the cuDNN and NCCL
// bindings). Package cuda/driver's documentation says why and what it
// costs.
//
// # Memory allocator
//
// The framework's tensors allocate through the caching allocator of
// package cuda/alloc (NewAllocator), which keeps freed blocks per stream
// for reuse and uses events to know when a block freed on one stream is
// safe to hand out again. Device implements the DeviceMemory interface it
// needs, and, where the device supports virtual memory management,
// VirtualMemory (ReserveAddress, MapPages, UnmapPages): the backend's
// allocator then grows one address range per stream page by page
// ("expandable segments"; BackendOptions.NoExpandableSegments turns them
// off). A CUDA_ERROR_OUT_OF_MEMORY *Error satisfies errors.Is(err,
// ErrDeviceOutOfMemory). For quick experiments, AllocFloat32 gives a simple
// device array that bypasses the allocator.
//
// # The tensor backend
//
// Backend (backend.go) implements tensor.Backend with the kernels of
// kernels/*.cu, compiled by NVRTC as a few translation units (kernels.go),
// each on first use of one of its kernels (the core unit in NewBackend,
// the general one in the background: kernels_load.go), so that a cold
// start compiles only what the model launches; and cuBLAS for large
// products. No table lists the kernels: the operators
// look each up by its extern "C" name among those the compiled modules
// hold, and a test checks every name against the sources' declarations.
// BackendOptions holds every switch (kernel choices, the memory limit, the
// kernel cache); the package reads no environment variable, and
// OptionsFromEnv maps the EMBER_* variables onto the options for commands
// and tests.
//
// The operators are grouped by family, a file each (their kernels mostly
// in the kernels/*.cu file of the same name): backend.go (memory, copies and the
// operators of the first networks: elementwise arithmetic, ReLU, products,
// biases, cross entropy, SGD), ops_elementwise.go, ops_reduce.go,
// ops_softmax.go, ops_index.go, ops_loss.go, ops_random.go, norm.go,
// pool.go, optim.go, cast.go (bfloat16), channels_last.go (autocast's
// activations held as bfloat16 [N, H, W, C]), augment.go, conv.go (im2col),
// conv_cudnn.go, conv_pool.go and conv_rt.go (fused and register-tiled
// convolutions), linear.go and narrow.go (fused linear layers), ewk.go and
// ewk_backend.go (generated elementwise kernels); side.go and graph.go
// hold the second stream and graph capture (CapturePlanned, which places a
// graph's memory by a plan from a rehearsal of the capture, and Lend,
// which lends a graph's idle memory to the work between its replays),
// pinned.go the
// uploads. It also implements the tensor package's
// optional fused operations: convolution + bias + ReLU + max pooling
// (conv_pool.go, with the register-tiled kernels of conv_rt.go), a linear
// layer with its bias and ReLU, and its gradients, in one launch each way
// for batches of up to 256 rows (linear.go; on sm_90 the blocks that split
// a sum form thread block clusters), and a classifier's last layer with its
// cross entropy in one launch each way (narrow.go). While a graph is
// captured, independent work goes to a second stream as parallel branches
// of the graph (side.go): a convolution's weight gradient beside its input
// gradient, and detached tasks such as a last layer's weight gradient,
// which the main stream joins only before an operation that touches their
// memory. Every kernel is checked
// against the CPU backend by the conformance suite (package tensortest) on
// the GPU, and every launch against the kernel's C signature by a recorder
// in the tests that run without one.
//
// # Feeding data
//
// A data set that fits stays on the device as bytes and each batch is
// gathered and augmented there (augment.go, tensor.AugmentGather). One that
// lives on the host goes through page-locked memory (pinned.go:
// Device.NewPinnedBuffer) and an Uploader, which copies into a ring of
// device slots on its own stream while the backend's stream computes.
//
// # Custom kernels
//
// Device.Compile is the counterpart of PyCUDA's SourceModule and CuPy's
// RawKernel: it compiles CUDA C++ with NVRTC for the device's architecture,
// loads the module, and Function/Launch run its kernels with Go arguments
// (uintptr device pointers, int32, uint32, int64, uint64, float32,
// float64):
//
//	const src = `
//	extern "C" __global__ void saxpy(float a, const float *x, float *y, int n) {
//	    int i = blockIdx.x * blockDim.x + threadIdx.x;
//	    if (i < n) y[i] = a * x[i] + y[i];
//	}`
//	m, err := d.Compile(src)
//	saxpy, err := m.Function("saxpy")
//	x, _ := d.AllocFloat32(n)
//	y, _ := d.AllocFloat32(n)
//	x.CopyFromHost(hx)
//	y.CopyFromHost(hy)
//	err = saxpy.Launch(cuda.Grid1D(n, 256), cuda.Dim3{X: 256}, 0, 0,
//	    float32(2), x.Ptr(), y.Ptr(), int32(n))
//	y.CopyToHost(hy)
//
// # Generated elementwise kernels
//
// NewElementwiseKernel is the counterpart of PyCUDA's ElementwiseKernel:
// from the names of float32 inputs, outputs and scalar parameters and a C
// body for one element it generates a kernel (a dense and a strided form,
// the strided one reading inputs of any layout and broadcasting them),
// compiles it with the backend's options and launches it on the backend's
// stream, on tensors:
//
//	axpy, err := cuda.NewElementwiseKernel(b, cuda.ElementwiseSpec{
//	    Name: "axpy", Inputs: "x, y", Outputs: "out", Params: "float a",
//	    Body: "out = a * x + y;"})
//	err = axpy.Launch([]*tensor.Tensor{out}, []*tensor.Tensor{x, y}, float32(2))
//
// The backend also implements tensor.FusedBackend with it (ewk_backend.go):
// a tensor.Fused expression runs as one generated kernel forward and one
// backward. examples/elementwise times both against separate operations.
//
// # Kernel cache
//
// Compiled kernels are cached on disk under os.UserCacheDir()/ember/kernels,
// keyed by SHA-256 of the source, options, NVRTC version and GPU
// architecture, so a program compiles each kernel once per machine rather
// than once per run. BackendOptions.KernelCache moves the cache ("off"
// disables it; OptionsFromEnv sets it from EMBER_KERNEL_CACHE);
// ReadKernelStats counts compilations and hits. See package cuda/driver.
//
// # Kernel bundle
//
// The backend's own kernel units also come precompiled: kernels/bundle.zip,
// embedded in the binary, holds each unit as an sm_90 cubin (H100, H200)
// and as compute_90 PTX (for newer GPUs where NVRTC is missing), keyed
// by a SHA-256 of the unit's source and options (kernels_bundle.go). A
// unit found there loads in milliseconds and runs no compiler; a unit
// edited since the bundle was made, an older GPU, or a damaged bundle
// falls back to NVRTC and the kernel cache. BackendOptions.KernelBundle
// (EMBER_KERNEL_BUNDLE) names another bundle file or "off"; with
// EMBER_KERNEL_LOG=1 the backend prints how many units are fresh and where
// each came from. Regenerate it with cmd/kernelbundle on a machine with
// NVRTC (docs/bench/kernel_bundle.sh does it from one without):
//
//	go run ./cmd/kernelbundle -o cuda/kernels/bundle.zip
//	go run ./cmd/kernelbundle -check cuda/kernels/bundle.zip   # which units are stale
//
// # cuBLAS
//
// Device.NewBLAS returns a cuBLAS handle bound to a stream. Its Sgemm and
// SgemmStridedBatched take ROW-MAJOR matrices (C = alpha*op(A)*op(B) +
// beta*C, C is m x n with leading dimension ldc >= n) and map them onto
// column-major cuBLAS by swapping the operands; SetTF32 enables TF32 tensor
// core math (off by default: full FP32). GemmBF16 and
// GemmStridedBatchedBF16 (cublasGemmEx, cublasGemmStridedBatchedEx) take
// bfloat16 A and B and a float32 C with float32 accumulation: the
// backend's mixed-precision products (cast.go, tensor/autocast.go). The
// binding is package cuda/driver's (cublas.go).
//
// Device.NewLt returns a cuBLASLt handle (cublaslt.go): row-major products
// with an epilogue (bias, ReLU, GELU, their gradients, the bias gradient)
// in the same kernel. A small shape's algorithm (up to 2^20 outputs) is
// chosen on its first call outside a capture by timing the first eight that cuBLASLt's heuristics
// rank, each in a captured graph of ten products, as convolutions' are
// (linear_lt_tune.go; BackendOptions.NoTuneProducts, EMBER_LT_TUNE=0,
// keeps the heuristics' first). Wide layers of at most 256 rows (in·out from 2^19: an MLP's
// 1024-wide layers) go through it by default, where it measured faster
// than the tiled kernels (NoLinearLtWide keeps them there); with
// BackendOptions.LinearLt (EMBER_LINEAR_LT=1) the layers of more than 256
// rows go through it too (linear_lt.go). Under autocast every linear layer
// with a bias is one cuBLASLt product of bfloat16 operands with the float32
// bias in its epilogue (LinearLowp, tensor.LowPrecisionBiasBackend) while
// cuBLASLt is open.
//
// # cuDNN
//
// Where libcudnn.so.9 is installed the Backend's convolutions (all but
// LeNet's, which have register-tiled kernels) run through cuDNN's legacy
// convolution API (cudnn.go, conv_cudnn.go) where it was measured faster
// than im2col + cuBLAS: algorithms searched once per geometry, precision
// and direction and kept, deterministic ones only, full FP32 unless TF32
// is on. Autocast's bfloat16 convolutions (tensor.LowPrecisionConvBackend)
// run there too, in NHWC, the casts fused with the change of layout; a
// convolution whose activations are held channels-last
// (tensor.ChannelsLastBackend, channels_last.go) reads and writes them
// with no cast at all, and reads its filter from a bfloat16 copy made once
// a step for both passes (tensor.ChannelsLastFilterBackend). Such a
// convolution also times two other ways on its first call and keeps the
// faster: the forward pass on input channels padded to a multiple of 32
// (conv_pad.go), and at stride 1 the data gradient as the forward pass of
// the flipped filter (conv_dgrad.go).
// Without it, or with BackendOptions.NoCuDNN (EMBER_CUDNN=0 through
// OptionsFromEnv), they run as im2col + cuBLAS (float32 under autocast);
// Backend.CuDNN says which and why.
//
// # Testing
//
// Tests that need a GPU skip without one, unless EMBER_REQUIRE_GPU=1, which
// turns the skip into a failure so that a GPU run in which everything
// skipped cannot look green. Without a GPU, the kernels' launches are still
// checked against their C signatures (a recording executor), and where
// clang is installed TestKernelsParseWithClang checks the kernels' syntax
// and types with clang's CUDA front end.
package cuda
