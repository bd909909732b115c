package driver

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// This file opens the NVIDIA shared libraries at run time with purego (no
// cgo): the driver (libcuda.so.1), the runtime compiler (libnvrtc.so.N) and
// cuBLAS (libcublas.so.N) here, and through Library, RequiredSymbol and
// CCall the other libraries package cuda binds (cuDNN, NCCL). Each library is opened lazily, on the first call
// that needs it, and the result (handle or error) is remembered.

// LibraryError reports that a CUDA shared library could not be opened or
// lacks a required Symbol. Its message says which library and what to
// install.
type LibraryError struct {
	Library string   // "CUDA driver", "NVRTC", "cuBLAS"
	Tried   []string // file names tried, in order
	Missing string   // a required Symbol that was not found ("" when the library itself was not found)
	Detail  string   // the dynamic loader's message for the first candidate, when it is not a plain "not found"
	msg     string
}

func (e *LibraryError) Error() string { return e.msg }

// Library is one shared library opened on first use: the driver, NVRTC and
// cuBLAS here, cuDNN and NCCL in package cuda. Set the exported fields; Open
// dlopens the first candidate that loads and remembers the result (handle
// or error), and Resolve looks up its C functions.
type Library struct {
	What    string          // human name: "CUDA driver", for error messages
	Names   []string        // candidate file names, tried in order
	Display string          // how the candidates are listed in the error message
	Install string          // what to install, for the error message
	Dirs    func() []string // directories searched after the dynamic loader's own, or nil

	once   sync.Once
	handle uintptr
	path   string
	err    error
}

// ExtraLibDirs are searched after the dynamic loader's own search
// (LD_LIBRARY_PATH, DT_RUNPATH, /etc/ld.so.cache, /lib, /usr/lib).
func ExtraLibDirs() []string {
	var dirs []string
	for _, env := range []string{"CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"} {
		if v := os.Getenv(env); v != "" {
			dirs = append(dirs, filepath.Join(v, "lib64"), filepath.Join(v, "lib"))
		}
	}
	return append(dirs, "/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib", "/usr/local/cuda/targets/sbsa-linux/lib")
}

func driverLibDirs() []string {
	// WSL2 ships libcuda.so.1 outside the loader's default search path.
	return append(ExtraLibDirs(), "/usr/lib/wsl/lib", "/usr/lib64/nvidia", "/usr/lib/x86_64-linux-gnu/nvidia/current")
}

// candidates lists the paths tried for lib, in order: for each file name,
// first the bare name (standard dlopen search), then the extra directories.
func (l *Library) candidates() []string {
	var out []string
	seen := map[string]bool{}
	add := func(p string) {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	var dirs []string
	if l.Dirs != nil {
		dirs = l.Dirs()
	}
	for _, n := range l.Names {
		add(n)
		for _, d := range dirs {
			add(filepath.Join(d, n))
		}
	}
	return out
}

// Open dlopens the first candidate that loads. The first call decides:
// later calls return the same handle or error.
func (l *Library) Open() (uintptr, error) {
	l.once.Do(func() {
		var firstDetail string
		for _, p := range l.candidates() {
			h, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL)
			if err == nil {
				l.handle, l.path = h, p
				return
			}
			// Remember a loader message other than "<this file>: ... No such
			// file": a library that exists but cannot be loaded (a missing
			// dependency such as libcublasLt, the wrong architecture) must
			// not be reported as plainly "not found".
			if msg := err.Error(); firstDetail == "" && !(strings.Contains(msg, p+":") && strings.Contains(msg, "No such file")) {
				firstDetail = msg
			}
		}
		l.err = l.notFound(firstDetail)
	})
	return l.handle, l.err
}

func (l *Library) notFound(detail string) *LibraryError {
	msg := fmt.Sprintf("%s not found: tried %s (install %s)", l.What, l.Display, l.Install)
	if l.What == "CUDA driver" {
		msg = fmt.Sprintf("no CUDA driver: %s not found (install %s)", l.Display, l.Install)
	}
	if detail != "" {
		msg += "; loader said: " + detail
	}
	return &LibraryError{Library: l.What, Tried: l.candidates(), Detail: detail, msg: msg}
}

func (l *Library) missingSymbol(name string) *LibraryError {
	return &LibraryError{
		Library: l.What, Tried: []string{l.path}, Missing: name,
		msg: fmt.Sprintf("%s %s does not export %s (too old? install a newer %s)", l.What, l.path, name, l.Install),
	}
}

// Symbol is one entry of a table of C functions for Resolve: a destination
// and a list of alternative names (newest first); optional entries may stay
// 0 when the library lacks them.
type Symbol struct {
	dst      *uintptr
	names    []string
	optional bool
}

func (l *Library) Resolve(h uintptr, syms []Symbol) error {
	for _, s := range syms {
		*s.dst = 0
		for _, n := range s.names {
			if p, err := purego.Dlsym(h, n); err == nil && p != 0 {
				*s.dst = p
				break
			}
		}
		if *s.dst == 0 && !s.optional {
			return l.missingSymbol(s.names[0])
		}
	}
	return nil
}

// RequiredSymbol is a Symbol that Resolve must find under one of names.
func RequiredSymbol(dst *uintptr, names ...string) Symbol { return Symbol{dst: dst, names: names} }

// OptionalSymbol is a Symbol that may be missing (its destination is then 0).
func OptionalSymbol(dst *uintptr, names ...string) Symbol {
	return Symbol{dst: dst, names: names, optional: true}
}

// versionedNames orders sonames "base.N" for the majors given, newest
// first, but moves majors newer than maxMajor (the driver's CUDA version)
// to the end: a libcublas.so.13 cannot run on a CUDA 12 driver, so when
// both are installed the one the driver supports is tried first.
func versionedNames(base string, majors []int, maxMajor int) []string {
	var ok, tooNew []string
	for _, m := range majors {
		n := fmt.Sprintf("%s.%d", base, m)
		if maxMajor > 0 && m > maxMajor {
			tooNew = append(tooNew, n)
		} else {
			ok = append(ok, n)
		}
	}
	return append(ok, tooNew...)
}

// CCall invokes the C function fn with integer/pointer arguments and returns
// its integer result. Pointers to Go memory may be passed converted to
// uintptr in the call expression itself: go:uintptrescapes keeps them alive
// and on the heap for the duration of the call (unsafe.Pointer rule 4).
// None of the functions called through it take float arguments by value.
//
//go:uintptrescapes
func CCall(fn uintptr, args ...uintptr) uintptr {
	r, _, _ := purego.SyscallN(fn, args...)
	return r
}

// GoString copies the NUL-terminated C string at p (static or C-owned
// memory) into a Go string.
func GoString(p uintptr) string {
	if p == 0 {
		return ""
	}
	// Go vet-friendly conversion of a C address to a pointer.
	base := *(*unsafe.Pointer)(unsafe.Pointer(&p))
	n := 0
	for *(*byte)(unsafe.Add(base, n)) != 0 {
		n++
		if n > 1<<20 {
			break
		}
	}
	return string(unsafe.Slice((*byte)(base), n))
}

// cString returns a NUL-terminated copy of s; keep the slice alive while C
// uses it.
func cString(s string) []byte {
	b := make([]byte, len(s)+1)
	copy(b, s)
	return b
}

// ErrNilDevice is returned for a call on a nil or closed Device.
var ErrNilDevice = errors.New("cuda: nil or closed Device")
