package driver

import (
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unsafe"
)

// Bindings to NVRTC, the CUDA runtime compiler (libnvrtc.so.N). nvrtcResult
// is a C enum: results are truncated with uint32(). NVRTC needs no CUDA
// context; compiling does not touch the GPU.

var nvrtcLib = &Library{
	What:    "NVRTC",
	Display: "libnvrtc.so.13, .12, .11",
	Install: "the CUDA runtime compiler, e.g. cuda-nvrtc",
	Dirs:    ExtraLibDirs,
}

var nvrtcFn struct {
	nvrtcVersion              uintptr // nvrtcResult nvrtcVersion(int *major, int *minor)
	nvrtcGetErrorString       uintptr // const char *nvrtcGetErrorString(nvrtcResult result)
	nvrtcCreateProgram        uintptr // nvrtcResult nvrtcCreateProgram(nvrtcProgram *prog, const char *src, const char *name, int numHeaders, const char * const *headers, const char * const *includeNames)
	nvrtcDestroyProgram       uintptr // nvrtcResult nvrtcDestroyProgram(nvrtcProgram *prog)
	nvrtcCompileProgram       uintptr // nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int numOptions, const char * const *options)
	nvrtcGetProgramLogSize    uintptr // nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram prog, size_t *logSizeRet)
	nvrtcGetProgramLog        uintptr // nvrtcResult nvrtcGetProgramLog(nvrtcProgram prog, char *log)
	nvrtcGetPTXSize           uintptr // nvrtcResult nvrtcGetPTXSize(nvrtcProgram prog, size_t *ptxSizeRet)
	nvrtcGetPTX               uintptr // nvrtcResult nvrtcGetPTX(nvrtcProgram prog, char *ptx)
	nvrtcGetCUBINSize         uintptr // nvrtcResult nvrtcGetCUBINSize(nvrtcProgram prog, size_t *cubinSizeRet)  (NVRTC >= 11.1)
	nvrtcGetCUBIN             uintptr // nvrtcResult nvrtcGetCUBIN(nvrtcProgram prog, char *cubin)               (NVRTC >= 11.1)
	nvrtcGetNumSupportedArchs uintptr // nvrtcResult nvrtcGetNumSupportedArchs(int *numArchs)                    (NVRTC >= 11.2)
	nvrtcGetSupportedArchs    uintptr // nvrtcResult nvrtcGetSupportedArchs(int *supportedArchs)                 (NVRTC >= 11.2)
}

var (
	nvrtcOnce    sync.Once
	nvrtcErr     error
	nvrtcMajor   int
	nvrtcMinor   int
	nvrtcArchs   []int // SM versions NVRTC can target, e.g. 75, 80, 90; nil when unknown
	nvrtcVersStr string
)

// nvrtcNames lists the NVRTC sonames to try, newest first, preferring those
// the installed driver can run (PTX and cubins from a newer toolkit than the
// driver are rejected by it). NVRTC 11.2-11.8 all use the soname
// libnvrtc.so.11.2.
func nvrtcNames(driverMajor int) []string {
	names := versionedNames("libnvrtc.so", []int{13, 12}, driverMajor)
	names = append(names, "libnvrtc.so.11.2", "libnvrtc.so.11.1", "libnvrtc.so.11.0")
	return append(names, "libnvrtc.so")
}

func loadNVRTC() error {
	nvrtcOnce.Do(func() {
		nvrtcLib.Names = nvrtcNames(driverMajor())
		h, err := nvrtcLib.Open()
		if err != nil {
			nvrtcErr = err
			return
		}
		n := &nvrtcFn
		if err := nvrtcLib.Resolve(h, []Symbol{
			RequiredSymbol(&n.nvrtcVersion, "nvrtcVersion"),
			RequiredSymbol(&n.nvrtcGetErrorString, "nvrtcGetErrorString"),
			RequiredSymbol(&n.nvrtcCreateProgram, "nvrtcCreateProgram"),
			RequiredSymbol(&n.nvrtcDestroyProgram, "nvrtcDestroyProgram"),
			RequiredSymbol(&n.nvrtcCompileProgram, "nvrtcCompileProgram"),
			RequiredSymbol(&n.nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize"),
			RequiredSymbol(&n.nvrtcGetProgramLog, "nvrtcGetProgramLog"),
			RequiredSymbol(&n.nvrtcGetPTXSize, "nvrtcGetPTXSize"),
			RequiredSymbol(&n.nvrtcGetPTX, "nvrtcGetPTX"),
			OptionalSymbol(&n.nvrtcGetCUBINSize, "nvrtcGetCUBINSize"),
			OptionalSymbol(&n.nvrtcGetCUBIN, "nvrtcGetCUBIN"),
			OptionalSymbol(&n.nvrtcGetNumSupportedArchs, "nvrtcGetNumSupportedArchs"),
			OptionalSymbol(&n.nvrtcGetSupportedArchs, "nvrtcGetSupportedArchs"),
		}); err != nil {
			nvrtcErr = err
			return
		}
		var major, minor int32
		if err := nvrtcCheck("nvrtcVersion", CCall(nvrtcFn.nvrtcVersion, uintptr(unsafe.Pointer(&major)), uintptr(unsafe.Pointer(&minor)))); err != nil {
			nvrtcErr = err
			return
		}
		nvrtcMajor, nvrtcMinor = int(major), int(minor)
		nvrtcVersStr = fmt.Sprintf("%d.%d", major, minor)
		if nvrtcFn.nvrtcGetNumSupportedArchs != 0 && nvrtcFn.nvrtcGetSupportedArchs != 0 {
			var count int32
			if uint32(CCall(nvrtcFn.nvrtcGetNumSupportedArchs, uintptr(unsafe.Pointer(&count)))) == 0 && count > 0 && count < 1024 {
				archs := make([]int32, count)
				if uint32(CCall(nvrtcFn.nvrtcGetSupportedArchs, uintptr(unsafe.Pointer(&archs[0])))) == 0 {
					for _, a := range archs {
						nvrtcArchs = append(nvrtcArchs, int(a))
					}
					slices.Sort(nvrtcArchs)
				}
			}
		}
	})
	return nvrtcErr
}

// NVRTCVersion returns the version of the loaded NVRTC library, loading it
// if needed.
func NVRTCVersion() (major, minor int, err error) {
	if err := loadNVRTC(); err != nil {
		return 0, 0, err
	}
	return nvrtcMajor, nvrtcMinor, nil
}

// archOption finds a user-supplied architecture option and returns its
// value ("sm_90", "compute_90"), or "".
func archOption(opts []string) string {
	for i, o := range opts {
		for _, p := range []string{"--gpu-architecture=", "-arch=", "--gpu-architecture", "-arch"} {
			switch {
			case strings.HasSuffix(p, "=") && strings.HasPrefix(o, p):
				return strings.TrimPrefix(o, p)
			case !strings.HasSuffix(p, "=") && o == p && i+1 < len(opts):
				return opts[i+1]
			}
		}
	}
	return ""
}

// chooseArch picks the NVRTC target for a device of compute capability
// major.minor given the SM versions NVRTC supports (nil: unknown, assume
// supported). It returns the architecture option value and whether a cubin
// can be produced:
//   - sm_XY itself when supported: a cubin for exactly this GPU;
//   - else compute_AB for the newest supported AB below XY: PTX, which the
//     driver JIT-compiles for the GPU (a newer GPU than NVRTC knows);
//   - an error when the GPU is older than anything NVRTC supports.
func chooseArch(major, minor int, supported []int, haveCUBIN bool) (arch string, cubin bool, err error) {
	sm := major*10 + minor
	if len(supported) == 0 || slices.Contains(supported, sm) {
		if haveCUBIN {
			return "sm_" + strconv.Itoa(sm), true, nil
		}
		return "compute_" + strconv.Itoa(sm), false, nil
	}
	best := 0
	for _, a := range supported {
		if a < sm && a > best {
			best = a
		}
	}
	if best == 0 {
		return "", false, fmt.Errorf("cuda: NVRTC %s cannot compile for sm_%d (supported: %v); install an older CUDA toolkit's NVRTC", nvrtcVersStr, sm, supported)
	}
	return "compute_" + strconv.Itoa(best), false, nil
}

// compileResult is the output of one NVRTC compilation.
type compileResult struct {
	image []byte // cubin, or NUL-terminated PTX
	kind  ImageKind
	log   string // the program log (warnings), possibly empty
}

// nvrtcCompile compiles CUDA C++ src with the given options. When cubin is
// true it returns the cubin (the options must then name a real sm_XY
// architecture), else PTX. A compile error carries the program log.
func nvrtcCompile(src, name string, opts []string, cubin bool) (compileResult, error) {
	if err := loadNVRTC(); err != nil {
		return compileResult{}, err
	}
	kstats.compiles.Add(1)
	// NVRTC is thread-safe for distinct programs; nothing here needs a
	// context, so no device lock is taken.
	csrc, cname := cString(src), cString(name)
	var prog uintptr
	if err := nvrtcCheck("nvrtcCreateProgram", CCall(nvrtcFn.nvrtcCreateProgram, uintptr(unsafe.Pointer(&prog)),
		uintptr(unsafe.Pointer(&csrc[0])), uintptr(unsafe.Pointer(&cname[0])), 0, 0, 0)); err != nil {
		return compileResult{}, err
	}
	defer func() { CCall(nvrtcFn.nvrtcDestroyProgram, uintptr(unsafe.Pointer(&prog))) }()

	// options: an array of C string pointers into Go memory. The strings
	// are heap slices (they do not move) kept alive below; the array is
	// passed in the call expression.
	copts := make([][]byte, len(opts))
	ptrs := make([]uintptr, len(opts)+1)
	for i, o := range opts {
		copts[i] = cString(o)
		ptrs[i] = uintptr(unsafe.Pointer(&copts[i][0]))
	}
	r := CCall(nvrtcFn.nvrtcCompileProgram, prog, uintptr(len(opts)), uintptr(unsafe.Pointer(&ptrs[0])))
	runtime.KeepAlive(copts)
	log := programLog(prog)
	if uint32(r) != 0 {
		detail := strings.TrimSpace(log)
		if detail == "" {
			detail = "(empty program log)"
		}
		return compileResult{}, newNVRTCError("nvrtcCompileProgram", uint32(r), "options "+strings.Join(opts, " ")+"\n"+detail)
	}
	getSize, get, kind, what := nvrtcFn.nvrtcGetPTXSize, nvrtcFn.nvrtcGetPTX, ImagePTX, "nvrtcGetPTX"
	if cubin {
		if nvrtcFn.nvrtcGetCUBIN == 0 {
			return compileResult{}, fmt.Errorf("cuda: NVRTC %s has no nvrtcGetCUBIN", nvrtcVersStr)
		}
		getSize, get, kind, what = nvrtcFn.nvrtcGetCUBINSize, nvrtcFn.nvrtcGetCUBIN, ImageCUBIN, "nvrtcGetCUBIN"
	}
	var size uintptr
	if err := nvrtcCheck(what+"Size", CCall(getSize, prog, uintptr(unsafe.Pointer(&size)))); err != nil {
		return compileResult{}, err
	}
	if size == 0 {
		return compileResult{}, fmt.Errorf("cuda: %s returned an empty image (options %s)", what, strings.Join(opts, " "))
	}
	img := make([]byte, size)
	if err := nvrtcCheck(what, CCall(get, prog, uintptr(unsafe.Pointer(&img[0])))); err != nil {
		return compileResult{}, err
	}
	if kind == ImagePTX && img[len(img)-1] != 0 {
		img = append(img, 0)
	}
	return compileResult{image: img, kind: kind, log: log}, nil
}

func programLog(prog uintptr) string {
	var n uintptr
	if uint32(CCall(nvrtcFn.nvrtcGetProgramLogSize, prog, uintptr(unsafe.Pointer(&n)))) != 0 || n <= 1 {
		return ""
	}
	buf := make([]byte, n)
	if uint32(CCall(nvrtcFn.nvrtcGetProgramLog, prog, uintptr(unsafe.Pointer(&buf[0])))) != 0 {
		return ""
	}
	if i := strings.IndexByte(string(buf), 0); i >= 0 {
		buf = buf[:i]
	}
	return string(buf)
}
