package cuda

import (
	"sync"

	"github.com/ember-ml/ember/cuda/driver"
)

// The driver bindings live in package cuda/driver. This file keeps their
// names in package cuda, so that users (and this package's operator code)
// need only one import: the types are aliases, the functions forward, and
// the unexported helpers at the end let cuDNN's and NCCL's bindings here
// use the driver's library loader under the names they always had.

// Device is one GPU: a driver.Device, with the methods of the libraries
// this package binds on top of the driver (NewDNN for cuDNN, NewNCCLComm
// for NCCL, NewPinnedBuffer for page-locked host memory). Open one with
// Open; Backend.Device returns the backend's.
type Device struct{ *driver.Device }

// Open opens device ordinal (driver.Open) through its primary context.
func Open(ordinal int) (*Device, error) {
	d, err := driver.Open(ordinal)
	if err != nil {
		return nil, err
	}
	return &Device{d}, nil
}

// The driver's types, under the names users of package cuda know.
type (
	BLAS          = driver.BLAS          // a cuBLAS handle bound to a stream
	Lt            = driver.Lt            // a cuBLASLt handle with its per-shape plans
	LtGemm        = driver.LtGemm        // one cuBLASLt product shape and epilogue
	Dim3          = driver.Dim3          // a grid or block shape
	Error         = driver.Error         // a failed driver, NVRTC or cuBLAS call
	Event         = driver.Event         // a recorded CUDA event
	Float32Buffer = driver.Float32Buffer // a plain device array of float32
	Function      = driver.Function      // a kernel of a Module
	Graph         = driver.Graph         // a captured CUDA graph
	GraphExec     = driver.GraphExec     // an instantiated CUDA graph
	ImageKind     = driver.ImageKind     // what a cached kernel image is
	KernelCache   = driver.KernelCache   // the on-disk cache of compiled kernels
	KernelBundle  = driver.KernelBundle  // kernels compiled ahead of time (kernels_bundle.go)
	KernelStats   = driver.KernelStats   // compilations and cache hits
	LibraryError  = driver.LibraryError  // a library that could not be opened
	Module        = driver.Module        // a loaded CUDA module
	Stream        = driver.Stream        // a CUDA stream (0: the legacy default stream)
)

// Kinds of kernel image (driver.ImageCUBIN, driver.ImagePTX).
const (
	ImageCUBIN = driver.ImageCUBIN
	ImagePTX   = driver.ImagePTX
)

// The driver's errors (the same values, so errors.Is works with either name).
var (
	ErrClosed            = driver.ErrClosed            // a method of a closed Device
	ErrDeviceOutOfMemory = driver.ErrDeviceOutOfMemory // wrapped by every out-of-memory error
	ErrNoDevice          = driver.ErrNoDevice          // the driver works but sees no GPU
)

// Available reports why no GPU can be used, or nil (driver.Available).
func Available() error { return driver.Available() }

// DeviceCount is the number of CUDA devices visible (driver.DeviceCount).
func DeviceCount() (int, error) { return driver.DeviceCount() }

// DriverVersion is the CUDA version of the driver, e.g. 13000
// (driver.DriverVersion).
func DriverVersion() (int, error) { return driver.DriverVersion() }

// NVRTCVersion is the runtime compiler's version (driver.NVRTCVersion).
func NVRTCVersion() (major, minor int, err error) { return driver.NVRTCVersion() }

// CublasStatusName names a cublasStatus_t (driver.CublasStatusName).
func CublasStatusName(code int) string { return driver.CublasStatusName(code) }

// Grid1D is the one-dimensional grid of blocks of block threads that covers
// n elements (driver.Grid1D).
func Grid1D(n, block int) Dim3 { return driver.Grid1D(n, block) }

// DefaultKernelCache is the process's on-disk kernel cache, or nil when it
// is off (driver.DefaultKernelCache).
func DefaultKernelCache() *KernelCache { return driver.DefaultKernelCache() }

// KernelCacheFor is the kernel cache a setting names: "" the default, "off"
// none, else a directory (driver.KernelCacheFor).
func KernelCacheFor(setting string) *KernelCache { return driver.KernelCacheFor(setting) }

// NewKernelCache is a kernel cache in dir (driver.NewKernelCache).
func NewKernelCache(dir string) *KernelCache { return driver.NewKernelCache(dir) }

// ReadKernelStats counts the process's kernel compilations and cache hits
// (driver.ReadKernelStats).
func ReadKernelStats() KernelStats { return driver.ReadKernelStats() }

// enter and leave make d's context current on the calling thread around a
// call into another library (cuDNN).
func (d *Device) enter() error {
	if d == nil {
		return driver.ErrNilDevice
	}
	return d.Device.Enter()
}

func (d *Device) leave() { d.Device.Leave() }

const maxKernelParams = driver.MaxKernelParams

var (
	errNilDevice     = driver.ErrNilDevice
	errNoEnumeration = driver.ErrNoEnumeration
)

// sharedLib is a driver.Library described by the unexported fields that
// cuDNN's and NCCL's tables set.
type sharedLib struct {
	what    string   // human name: "cuDNN"
	names   []string // candidate file names, tried in order
	display string   // how the candidates are listed in the error message
	install string   // what to install, for the error message
	dirs    func() []string

	once sync.Once
	lib  *driver.Library
}

func (l *sharedLib) library() *driver.Library {
	l.once.Do(func() {
		l.lib = &driver.Library{What: l.what, Names: l.names, Display: l.display, Install: l.install, Dirs: l.dirs}
	})
	return l.lib
}

func (l *sharedLib) open() (uintptr, error)                    { return l.library().Open() }
func (l *sharedLib) resolve(h uintptr, syms []libSymbol) error { return l.library().Resolve(h, syms) }

type libSymbol = driver.Symbol

func reqSym(dst *uintptr, names ...string) libSymbol { return driver.RequiredSymbol(dst, names...) }
func optSym(dst *uintptr, names ...string) libSymbol { return driver.OptionalSymbol(dst, names...) }

func extraLibDirs() []string { return driver.ExtraLibDirs() }

// cCall is driver.CCall; go:uintptrescapes keeps Go memory passed as
// uintptr alive here too.
//
//go:uintptrescapes
func cCall(fn uintptr, args ...uintptr) uintptr { return driver.CCall(fn, args...) }

func goString(p uintptr) string { return driver.GoString(p) }
