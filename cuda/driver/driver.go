package driver

import (
	"sync"
	"unsafe"
)

// Bindings to the CUDA driver API (libcuda.so.1). Every entry is the address
// of the C function; they are called through CCall() with integer/pointer
// arguments only. C signatures (cuda.h) are noted next to each Symbol.
// CUresult is a C enum (32 bits): results are truncated with uint32().

var driverLib = &Library{
	What:    "CUDA driver",
	Names:   []string{"libcuda.so.1", "libcuda.so"},
	Display: "libcuda.so.1",
	Install: "the NVIDIA driver",
	Dirs:    driverLibDirs,
}

var cuDrv struct {
	cuInit               uintptr // CUresult cuInit(unsigned int Flags)
	cuDriverGetVersion   uintptr // CUresult cuDriverGetVersion(int *driverVersion)
	cuGetErrorName       uintptr // CUresult cuGetErrorName(CUresult error, const char **pStr)
	cuGetErrorString     uintptr // CUresult cuGetErrorString(CUresult error, const char **pStr)
	cuDeviceGetCount     uintptr // CUresult cuDeviceGetCount(int *count)
	cuDeviceGet          uintptr // CUresult cuDeviceGet(CUdevice *device, int ordinal)
	cuDeviceGetName      uintptr // CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
	cuDeviceGetAttribute uintptr // CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
	cuDeviceTotalMem     uintptr // CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)

	cuDevicePrimaryCtxRetain  uintptr // CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
	cuDevicePrimaryCtxRelease uintptr // CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
	cuCtxSetCurrent           uintptr // CUresult cuCtxSetCurrent(CUcontext ctx)
	cuCtxGetCurrent           uintptr // CUresult cuCtxGetCurrent(CUcontext *pctx)
	cuCtxSynchronize          uintptr // CUresult cuCtxSynchronize(void)

	cuMemAlloc   uintptr // CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
	cuMemFree    uintptr // CUresult cuMemFree_v2(CUdeviceptr dptr)
	cuMemGetInfo uintptr // CUresult cuMemGetInfo_v2(size_t *free, size_t *total)

	// Page-locked host memory (pinned.go), which copies to the device read
	// by DMA while the host goes on.
	cuMemHostAlloc uintptr // CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
	cuMemFreeHost  uintptr // CUresult cuMemFreeHost(void *p)

	// Virtual memory management (optional: expandable segments only).
	cuMemAddressReserve           uintptr // CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags)
	cuMemAddressFree              uintptr // CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
	cuMemCreate                   uintptr // CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop, unsigned long long flags)
	cuMemRelease                  uintptr // CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
	cuMemMap                      uintptr // CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags)
	cuMemUnmap                    uintptr // CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
	cuMemSetAccess                uintptr // CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
	cuMemGetAllocationGranularity uintptr // CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags option)

	cuMemcpyHtoD      uintptr // CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
	cuMemcpyHtoDAsync uintptr // CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s)
	cuMemcpyDtoH      uintptr // CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
	cuMemcpyDtoHAsync uintptr // CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s)
	cuMemcpyDtoDAsync uintptr // CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
	cuMemsetD32Async  uintptr // CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int ui, size_t N, CUstream s)

	cuStreamCreate      uintptr // CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
	cuStreamSynchronize uintptr // CUresult cuStreamSynchronize(CUstream hStream)
	cuStreamDestroy     uintptr // CUresult cuStreamDestroy_v2(CUstream hStream)

	cuEventCreate      uintptr // CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
	cuEventRecord      uintptr // CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
	cuEventQuery       uintptr // CUresult cuEventQuery(CUevent hEvent)
	cuEventSynchronize uintptr // CUresult cuEventSynchronize(CUevent hEvent)
	cuEventElapsedTime uintptr // CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
	cuEventDestroy     uintptr // CUresult cuEventDestroy_v2(CUevent hEvent)
	cuStreamWaitEvent  uintptr // CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)

	cuStreamBeginCapture        uintptr // CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
	cuStreamEndCapture          uintptr // CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
	cuGraphInstantiateWithFlags uintptr // CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags)
	cuGraphLaunch               uintptr // CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
	cuGraphDestroy              uintptr // CUresult cuGraphDestroy(CUgraph hGraph)
	cuGraphExecDestroy          uintptr // CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)

	cuModuleLoadData    uintptr // CUresult cuModuleLoadData(CUmodule *module, const void *image)
	cuModuleGetFunction uintptr // CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
	cuModuleUnload      uintptr // CUresult cuModuleUnload(CUmodule hmod)
	// CUDA 12.4 and later: the kernels a module holds, so that nothing is
	// looked up that is not there.
	cuModuleGetFunctionCount   uintptr // CUresult cuModuleGetFunctionCount(unsigned *count, CUmodule mod)
	cuModuleEnumerateFunctions uintptr // CUresult cuModuleEnumerateFunctions(CUfunction *functions, unsigned n, CUmodule mod)
	cuFuncGetName              uintptr // CUresult cuFuncGetName(const char **name, CUfunction hfunc)
	cuFuncSetAttribute         uintptr // CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value)
	cuFuncGetAttribute         uintptr // CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc)
	// CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, CUfunction func, int blockSize, size_t dynamicSMemSize)
	cuOccupancyMaxActiveBlocksPerMultiprocessor uintptr
	// CUresult cuLaunchKernel(CUfunction f, unsigned gridDimX, gridDimY, gridDimZ,
	//     unsigned blockDimX, blockDimY, blockDimZ, unsigned sharedMemBytes,
	//     CUstream hStream, void **kernelParams, void **extra)
	cuLaunchKernel uintptr
}

// Driver enum values (cuda.h).
const (
	cuDevAttrMultiprocessorCount   = 16  // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
	cuDevAttrL2CacheSize           = 38  // CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE
	cuDevAttrComputeCapabilityMajr = 75  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
	cuDevAttrComputeCapabilityMinr = 76  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
	cuDevAttrVirtualMemoryMgmt     = 102 // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED

	cuStreamNonBlocking = 0x1 // CU_STREAM_NON_BLOCKING
	cuEventDefault      = 0x0 // CU_EVENT_DEFAULT
	cuEventDisableTimng = 0x2 // CU_EVENT_DISABLE_TIMING

	cuStreamCaptureModeGlobal      = 0 // CU_STREAM_CAPTURE_MODE_GLOBAL
	cuStreamCaptureModeThreadLocal = 1 // CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
	cuStreamCaptureModeRelaxed     = 2 // CU_STREAM_CAPTURE_MODE_RELAXED

	cuFuncAttrMaxDynamicSharedSizeBytes = 8 // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
	cuFuncAttrNumRegs                   = 4 // CU_FUNC_ATTRIBUTE_NUM_REGS
	cuFuncAttrMaxThreadsPerBlock        = 0 // CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK

	cudaSuccess           = 0
	cudaErrOutOfMemory    = 2   // CUDA_ERROR_OUT_OF_MEMORY
	cudaErrNoDevice       = 100 // CUDA_ERROR_NO_DEVICE
	cudaErrInvalidImage   = 200 // CUDA_ERROR_INVALID_IMAGE
	cudaErrNotReady       = 600 // CUDA_ERROR_NOT_READY
	cudaErrInvalidPTX     = 218 // CUDA_ERROR_INVALID_PTX
	cudaErrNoBinaryForGPU = 209 // CUDA_ERROR_NO_BINARY_FOR_GPU
)

var (
	driverOnce    sync.Once
	driverErr     error
	driverVersion int // e.g. 12040 for CUDA 12.4
)

// loadDriver opens libcuda, resolves the symbols and calls cuInit(0). The
// outcome is remembered: a process that has no driver keeps reporting the
// same error.
func loadDriver() error {
	driverOnce.Do(func() {
		h, err := driverLib.Open()
		if err != nil {
			driverErr = err
			return
		}
		d := &cuDrv
		err = driverLib.Resolve(h, []Symbol{
			RequiredSymbol(&d.cuInit, "cuInit"),
			RequiredSymbol(&d.cuDriverGetVersion, "cuDriverGetVersion"),
			RequiredSymbol(&d.cuGetErrorName, "cuGetErrorName"),
			RequiredSymbol(&d.cuGetErrorString, "cuGetErrorString"),
			RequiredSymbol(&d.cuDeviceGetCount, "cuDeviceGetCount"),
			RequiredSymbol(&d.cuDeviceGet, "cuDeviceGet"),
			RequiredSymbol(&d.cuDeviceGetName, "cuDeviceGetName"),
			RequiredSymbol(&d.cuDeviceGetAttribute, "cuDeviceGetAttribute"),
			RequiredSymbol(&d.cuDeviceTotalMem, "cuDeviceTotalMem_v2"),
			RequiredSymbol(&d.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
			RequiredSymbol(&d.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"),
			RequiredSymbol(&d.cuCtxSetCurrent, "cuCtxSetCurrent"),
			RequiredSymbol(&d.cuCtxGetCurrent, "cuCtxGetCurrent"),
			RequiredSymbol(&d.cuCtxSynchronize, "cuCtxSynchronize"),
			RequiredSymbol(&d.cuMemAlloc, "cuMemAlloc_v2"),
			RequiredSymbol(&d.cuMemFree, "cuMemFree_v2"),
			RequiredSymbol(&d.cuMemGetInfo, "cuMemGetInfo_v2"),
			OptionalSymbol(&d.cuMemHostAlloc, "cuMemHostAlloc"),
			OptionalSymbol(&d.cuMemFreeHost, "cuMemFreeHost"),
			OptionalSymbol(&d.cuMemAddressReserve, "cuMemAddressReserve"),
			OptionalSymbol(&d.cuMemAddressFree, "cuMemAddressFree"),
			OptionalSymbol(&d.cuMemCreate, "cuMemCreate"),
			OptionalSymbol(&d.cuMemRelease, "cuMemRelease"),
			OptionalSymbol(&d.cuMemMap, "cuMemMap"),
			OptionalSymbol(&d.cuMemUnmap, "cuMemUnmap"),
			OptionalSymbol(&d.cuMemSetAccess, "cuMemSetAccess"),
			OptionalSymbol(&d.cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity"),
			OptionalSymbol(&d.cuModuleGetFunctionCount, "cuModuleGetFunctionCount"),
			OptionalSymbol(&d.cuModuleEnumerateFunctions, "cuModuleEnumerateFunctions"),
			OptionalSymbol(&d.cuFuncGetName, "cuFuncGetName"),
			RequiredSymbol(&d.cuMemcpyHtoD, "cuMemcpyHtoD_v2"),
			RequiredSymbol(&d.cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
			RequiredSymbol(&d.cuMemcpyDtoH, "cuMemcpyDtoH_v2"),
			RequiredSymbol(&d.cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"),
			RequiredSymbol(&d.cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"),
			RequiredSymbol(&d.cuMemsetD32Async, "cuMemsetD32Async"),
			RequiredSymbol(&d.cuStreamCreate, "cuStreamCreate"),
			RequiredSymbol(&d.cuStreamSynchronize, "cuStreamSynchronize"),
			RequiredSymbol(&d.cuStreamDestroy, "cuStreamDestroy_v2"),
			RequiredSymbol(&d.cuEventCreate, "cuEventCreate"),
			RequiredSymbol(&d.cuEventRecord, "cuEventRecord"),
			RequiredSymbol(&d.cuEventQuery, "cuEventQuery"),
			RequiredSymbol(&d.cuEventSynchronize, "cuEventSynchronize"),
			RequiredSymbol(&d.cuEventElapsedTime, "cuEventElapsedTime", "cuEventElapsedTime_v2"),
			RequiredSymbol(&d.cuEventDestroy, "cuEventDestroy_v2"),
			RequiredSymbol(&d.cuStreamWaitEvent, "cuStreamWaitEvent"),
			RequiredSymbol(&d.cuStreamBeginCapture, "cuStreamBeginCapture_v2"),
			RequiredSymbol(&d.cuStreamEndCapture, "cuStreamEndCapture"),
			RequiredSymbol(&d.cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags"),
			RequiredSymbol(&d.cuGraphLaunch, "cuGraphLaunch"),
			RequiredSymbol(&d.cuGraphDestroy, "cuGraphDestroy"),
			RequiredSymbol(&d.cuGraphExecDestroy, "cuGraphExecDestroy"),
			RequiredSymbol(&d.cuModuleLoadData, "cuModuleLoadData"),
			RequiredSymbol(&d.cuModuleGetFunction, "cuModuleGetFunction"),
			RequiredSymbol(&d.cuModuleUnload, "cuModuleUnload"),
			RequiredSymbol(&d.cuFuncSetAttribute, "cuFuncSetAttribute"),
			RequiredSymbol(&d.cuFuncGetAttribute, "cuFuncGetAttribute"),
			RequiredSymbol(&d.cuOccupancyMaxActiveBlocksPerMultiprocessor, "cuOccupancyMaxActiveBlocksPerMultiprocessor"),
			RequiredSymbol(&d.cuLaunchKernel, "cuLaunchKernel"),
		})
		if err != nil {
			driverErr = err
			return
		}
		if r := uint32(CCall(cuDrv.cuInit, 0)); r != cudaSuccess {
			driverErr = newDriverError("cuInit", r)
			return
		}
		var v int32
		if r := uint32(CCall(cuDrv.cuDriverGetVersion, uintptr(unsafe.Pointer(&v)))); r == cudaSuccess {
			driverVersion = int(v)
		}
	})
	return driverErr
}

// DriverVersion returns the CUDA version the installed driver supports,
// encoded as 1000*major + 10*minor (12040 is CUDA 12.4).
func DriverVersion() (int, error) {
	if err := loadDriver(); err != nil {
		return 0, err
	}
	return driverVersion, nil
}

// driverMajor is the CUDA major version of the driver, 0 when unknown.
func driverMajor() int {
	if loadDriver() != nil {
		return 0
	}
	return driverVersion / 1000
}

// cu converts a CUresult into an error (nil for CUDA_SUCCESS).
func cuCheck(callName string, r uintptr) error {
	if uint32(r) == cudaSuccess {
		return nil
	}
	return newDriverError(callName, uint32(r))
}
