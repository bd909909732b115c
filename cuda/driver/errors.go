package driver

import (
	"fmt"
	"strings"
	"unsafe"
)

// Error is a failed call into the CUDA driver, NVRTC or cuBLAS.
//
// Call is the C function that failed (cuMemAlloc_v2, nvrtcCompileProgram,
// cublasSgemm_v2, ...), Code the numeric CUresult / nvrtcResult /
// cublasStatus_t, Name the library's own name for it
// (CUDA_ERROR_OUT_OF_MEMORY, NVRTC_ERROR_COMPILATION,
// CUBLAS_STATUS_INVALID_VALUE) and Message a description (the driver's
// cuGetErrorString text, or a compiler log, ...).
//
// A CUDA_ERROR_OUT_OF_MEMORY error satisfies
// errors.Is(err, ErrDeviceOutOfMemory).
type Error struct {
	Call    string
	Code    int
	Name    string
	Message string
}

// Error formats as "cuda: <call>: <NAME>: <message>".
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("cuda: ")
	b.WriteString(e.Call)
	b.WriteString(": ")
	if e.Name != "" {
		b.WriteString(e.Name)
	} else {
		fmt.Fprintf(&b, "error %d", e.Code)
	}
	if e.Message != "" && e.Message != e.Name {
		b.WriteString(": ")
		b.WriteString(e.Message)
	}
	return b.String()
}

// Is reports whether e matches target. A driver CUDA_ERROR_OUT_OF_MEMORY
// (code 2) matches ErrDeviceOutOfMemory, so a caching allocator can detect
// it with errors.Is and free cached blocks before retrying. Codes of other
// libraries (NVRTC and cuBLAS number their results independently) never
// match.
func (e *Error) Is(target error) bool {
	if target == ErrDeviceOutOfMemory {
		return e.Code == cudaErrOutOfMemory && strings.HasPrefix(e.Name, "CUDA_ERROR")
	}
	if t, ok := target.(*Error); ok {
		return t.Code == e.Code && t.Name == e.Name
	}
	return false
}

// newDriverError builds an *Error from a CUresult, asking the driver for
// the name and description (cuGetErrorName / cuGetErrorString) and falling
// back to a built-in table.
func newDriverError(callName string, code uint32) *Error {
	name, msg := driverErrorText(code)
	return &Error{Call: callName, Code: int(int32(code)), Name: name, Message: msg}
}

func driverErrorText(code uint32) (name, msg string) {
	if cuDrv.cuGetErrorName != 0 {
		var p uintptr
		if uint32(CCall(cuDrv.cuGetErrorName, uintptr(code), uintptr(unsafe.Pointer(&p)))) == cudaSuccess {
			name = GoString(p)
		}
		var q uintptr
		if uint32(CCall(cuDrv.cuGetErrorString, uintptr(code), uintptr(unsafe.Pointer(&q)))) == cudaSuccess {
			msg = GoString(q)
		}
	}
	if name == "" {
		name = driverErrorNames[int(code)]
	}
	if name == "" {
		name = fmt.Sprintf("CUDA_ERROR_%d", code)
	}
	return name, msg
}

// driverErrorNames is the fallback when the driver cannot name a code
// (cuda.h, CUresult).
var driverErrorNames = map[int]string{
	0:   "CUDA_SUCCESS",
	1:   "CUDA_ERROR_INVALID_VALUE",
	2:   "CUDA_ERROR_OUT_OF_MEMORY",
	3:   "CUDA_ERROR_NOT_INITIALIZED",
	4:   "CUDA_ERROR_DEINITIALIZED",
	34:  "CUDA_ERROR_STUB_LIBRARY",
	46:  "CUDA_ERROR_DEVICE_UNAVAILABLE",
	100: "CUDA_ERROR_NO_DEVICE",
	101: "CUDA_ERROR_INVALID_DEVICE",
	102: "CUDA_ERROR_DEVICE_NOT_LICENSED",
	200: "CUDA_ERROR_INVALID_IMAGE",
	201: "CUDA_ERROR_INVALID_CONTEXT",
	209: "CUDA_ERROR_NO_BINARY_FOR_GPU",
	218: "CUDA_ERROR_INVALID_PTX",
	221: "CUDA_ERROR_JIT_COMPILER_NOT_FOUND",
	222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
	300: "CUDA_ERROR_INVALID_SOURCE",
	301: "CUDA_ERROR_FILE_NOT_FOUND",
	400: "CUDA_ERROR_INVALID_HANDLE",
	401: "CUDA_ERROR_ILLEGAL_STATE",
	500: "CUDA_ERROR_NOT_FOUND",
	600: "CUDA_ERROR_NOT_READY",
	700: "CUDA_ERROR_ILLEGAL_ADDRESS",
	701: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
	702: "CUDA_ERROR_LAUNCH_TIMEOUT",
	709: "CUDA_ERROR_CONTEXT_IS_DESTROYED",
	710: "CUDA_ERROR_ASSERT",
	715: "CUDA_ERROR_ILLEGAL_INSTRUCTION",
	716: "CUDA_ERROR_MISALIGNED_ADDRESS",
	719: "CUDA_ERROR_LAUNCH_FAILED",
	800: "CUDA_ERROR_NOT_PERMITTED",
	801: "CUDA_ERROR_NOT_SUPPORTED",
	802: "CUDA_ERROR_SYSTEM_NOT_READY",
	803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
	804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
	900: "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
	901: "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
	902: "CUDA_ERROR_STREAM_CAPTURE_MERGE",
	903: "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
	904: "CUDA_ERROR_STREAM_CAPTURE_UNJOINED",
	905: "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
	906: "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
	907: "CUDA_ERROR_CAPTURED_EVENT",
	908: "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
	909: "CUDA_ERROR_TIMEOUT",
	910: "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE",
	999: "CUDA_ERROR_UNKNOWN",
}

// nvrtcResultNames (nvrtc.h, nvrtcResult).
var nvrtcResultNames = map[int]string{
	0:  "NVRTC_SUCCESS",
	1:  "NVRTC_ERROR_OUT_OF_MEMORY",
	2:  "NVRTC_ERROR_PROGRAM_CREATION_FAILURE",
	3:  "NVRTC_ERROR_INVALID_INPUT",
	4:  "NVRTC_ERROR_INVALID_PROGRAM",
	5:  "NVRTC_ERROR_INVALID_OPTION",
	6:  "NVRTC_ERROR_COMPILATION",
	7:  "NVRTC_ERROR_BUILTIN_OPERATION_FAILURE",
	8:  "NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION",
	9:  "NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION",
	10: "NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID",
	11: "NVRTC_ERROR_INTERNAL_ERROR",
	12: "NVRTC_ERROR_TIME_FILE_WRITE_FAILED",
	13: "NVRTC_ERROR_NO_PCH_CREATE_ATTEMPTED",
	14: "NVRTC_ERROR_PCH_CREATE_HEAP_EXHAUSTED",
	15: "NVRTC_ERROR_PCH_CREATE",
	16: "NVRTC_ERROR_CANCELLED",
	17: "NVRTC_ERROR_TIME_TRACE_FILE_WRITE_FAILED",
}

// newNVRTCError builds an *Error from an nvrtcResult. nvrtcGetErrorString
// returns the enum's name ("NVRTC_ERROR_COMPILATION"); the table is the
// fallback. detail (e.g. the program log) becomes the Message.
func newNVRTCError(callName string, code uint32, detail string) *Error {
	name := nvrtcResultNames[int(code)]
	if nvrtcFn.nvrtcGetErrorString != 0 {
		if s := GoString(CCall(nvrtcFn.nvrtcGetErrorString, uintptr(code))); strings.HasPrefix(s, "NVRTC_") && !strings.Contains(s, " ") {
			name = s
		}
	}
	if name == "" {
		name = fmt.Sprintf("NVRTC_ERROR_%d", code)
	}
	return &Error{Call: callName, Code: int(int32(code)), Name: name, Message: detail}
}

// cublasStatusNames (cublas_api.h, cublasStatus_t).
var cublasStatusNames = map[int]string{
	0:  "CUBLAS_STATUS_SUCCESS",
	1:  "CUBLAS_STATUS_NOT_INITIALIZED",
	3:  "CUBLAS_STATUS_ALLOC_FAILED",
	7:  "CUBLAS_STATUS_INVALID_VALUE",
	8:  "CUBLAS_STATUS_ARCH_MISMATCH",
	11: "CUBLAS_STATUS_MAPPING_ERROR",
	13: "CUBLAS_STATUS_EXECUTION_FAILED",
	14: "CUBLAS_STATUS_INTERNAL_ERROR",
	15: "CUBLAS_STATUS_NOT_SUPPORTED",
	16: "CUBLAS_STATUS_LICENSE_ERROR",
}

var cublasStatusMessages = map[int]string{
	1:  "the cuBLAS library was not initialized (no current context or cublasCreate failed)",
	3:  "resource allocation failed inside cuBLAS (device memory)",
	7:  "an unsupported value or parameter was passed to the function",
	8:  "the function requires a feature absent from the device architecture",
	11: "an access to GPU memory space failed",
	13: "the GPU program failed to execute",
	14: "an internal cuBLAS operation failed",
	15: "the functionality requested is not supported",
	16: "the functionality requested requires a license",
}

// CublasStatusName returns the cuBLAS name of a cublasStatus_t value.
func CublasStatusName(code int) string {
	if n, ok := cublasStatusNames[code]; ok {
		return n
	}
	return fmt.Sprintf("CUBLAS_STATUS_%d", code)
}

func newCublasError(callName string, code uint32) *Error {
	return &Error{Call: callName, Code: int(int32(code)), Name: CublasStatusName(int(int32(code))), Message: cublasStatusMessages[int(int32(code))]}
}

func cublasCheck(callName string, r uintptr) error {
	if uint32(r) == 0 {
		return nil
	}
	return newCublasError(callName, uint32(r))
}

func nvrtcCheck(callName string, r uintptr) error {
	if uint32(r) == 0 {
		return nil
	}
	return newNVRTCError(callName, uint32(r), "")
}
