// Package driver binds the CUDA driver API, the NVRTC runtime compiler and
// cuBLAS without cgo: the libraries are opened at run time with purego
// (github.com/ebitengine/purego) on first use, libcuda.so.1 (from the
// driver), libnvrtc.so.13/.12/.11 and libcublas.so.13/.12/.11 (from the
// CUDA toolkit or its redistributable packages), searched by the dynamic
// loader and then under $CUDA_HOME/lib64 and /usr/local/cuda/lib64. The
// package builds with CGO_ENABLED=0 on any machine; Available reports why no
// GPU can be used.
//
// Package cuda, the tensor backend, builds on this one and names its types
// and functions too (cuda.Device embeds *Device), so most programs import
// only cuda.
//
// # Where to start
//
//	if err := driver.Available(); err != nil { ... } // no driver, no device, ...
//	d, err := driver.Open(0)                         // device 0, primary context
//	defer d.Close()
//	fmt.Println(d.Name(), d.ComputeCapability(), d.MultiprocessorCount())
//
// Device (device.go) has memory (MemAlloc, MemFree, MemGetInfo, and page-
// locked host memory: MemHostAlloc, hostmem.go), copies (CopyHtoD,
// CopyDtoH, CopyDtoD, Memset32), streams, events and CUDA graphs
// (BeginCapture, EndCapture, Graph.Instantiate, GraphExec.Launch), and,
// where the device supports virtual memory management, address ranges
// mapped page by page (ReserveAddress, MapPages, UnmapPages; vmm.go). Every
// failed library call is an *Error naming the call and the library's own
// error name (CUDA_ERROR_..., NVRTC_ERROR_..., CUBLAS_STATUS_...; errors.go);
// a CUDA_ERROR_OUT_OF_MEMORY one satisfies errors.Is(err,
// ErrDeviceOutOfMemory).
//
// # Threads and contexts
//
// A CUDA context is current per OS thread, and goroutines move between
// threads. Every Device method therefore pins the calling goroutine to its
// thread (runtime.LockOSThread), makes the device's primary context current
// (cuCtxSetCurrent), makes the call and unpins. This costs well under a
// microsecond per call, lets several goroutines use a device concurrently,
// and is why code must never call the driver except through a Device
// method, Device.Do or, for the bindings of other libraries, Device.Enter
// and Leave. See device.go for the measurements and the alternative (one
// locked goroutine per device) that was rejected.
//
// # Modules and kernels
//
// Device.Compile compiles CUDA C++ with NVRTC for the device's architecture
// (nvrtc.go) and loads the module; Module.Function and Function.Launch run
// its kernels with Go arguments (module.go), and Module.FunctionNames lists
// the kernels a module holds (CUDA 12.4 and later).
//
// # Kernel cache
//
// Compiled kernels are cached on disk, keyed by SHA-256 of the source,
// options, NVRTC version and GPU architecture, so that a program compiles
// each kernel once per machine rather than once per run (kernelcache.go).
// Devices start with DefaultKernelCache (os.UserCacheDir()/ember/kernels);
// Device.SetKernelCache and KernelCacheFor choose another or none. The
// package reads no environment variable of ember's own.
//
// # Kernel bundles
//
// A KernelBundle (kernelbundle.go) is a zip archive of images compiled
// ahead of time, keyed by BundleKey (a SHA-256 of the exact source and
// options) and the target (sm_XY cubin, compute_XY PTX);
// BuildKernelBundle writes one (NVRTC, no GPU needed), and
// Device.LoadBundled loads the image that fits the device without running
// a compiler. An edited source finds no entry (ErrNotInBundle); a damaged
// archive or image, or one the driver rejects, is an error: callers then
// Compile as usual. Package cuda embeds the bundle of its own kernels.
//
// # cuBLAS
//
// Device.NewBLAS returns a cuBLAS handle bound to a stream (cublas.go). Its
// Sgemm and SgemmStridedBatched take row-major matrices and map them onto
// column-major cuBLAS by swapping the operands; SetTF32 enables TF32 tensor
// core math (off by default: full FP32); GemmBF16 and
// GemmStridedBatchedBF16 take bfloat16 operands with float32 results.
// Device.NewLt returns a cuBLASLt handle (cublaslt.go) whose Matmul runs
// a row-major product with an epilogue (LtEpilogue: bias, ReLU, GELU,
// their gradients, the bias gradient), the algorithm chosen once per
// shape (LtGemm) by cuBLASLt's heuristics.
//
// # Other libraries
//
// Library, RequiredSymbol, OptionalSymbol and CCall (lib.go) open further
// NVIDIA libraries the same way; package cuda binds cuDNN and NCCL with
// them.
package driver
