package cuda

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"unsafe"
)

// cuDNN bindings (libcudnn.so.9): the legacy convolution API, which cuDNN 9
// keeps in libcudnn_cnn.so.9 and exports through the libcudnn.so.9 shim.
// Only what the convolution path needs (conv_cudnn.go) is bound: the handle,
// 4-D float32 (NCHW) and bfloat16 (NCHW or NHWC) tensor and filter
// descriptors, 2-D convolution
// descriptors with groups, dilation and a math type, the three convolution
// functions with their workspace sizes, and the Get_v7 (heuristic) and
// FindEx (measured) algorithm searches.
//
// The shim loads its sub-libraries on first use, so a missing
// libcudnn_cnn.so.9 shows only when a convolution function is called:
// NewDNN makes one such call (a workspace query on a tiny convolution) so
// that cuDNN is known usable, or not and why, before any tensor work.

var cudnnLib = &sharedLib{
	what:    "cuDNN",
	names:   []string{"libcudnn.so.9"},
	display: "libcudnn.so.9",
	install: "cuDNN 9, e.g. the libcudnn9-cuda-12 package",
	dirs:    extraLibDirs,
}

// cudnnSyms are the C functions of cuDNN. The loaded library's table is
// cudnnReal; tests build tables of their own (see dnnCaller).
type cudnnSyms struct {
	create, destroy, setStream uintptr // cudnnCreate(cudnnHandle_t*), cudnnDestroy(h), cudnnSetStream(h, cudaStream_t)
	getVersion                 uintptr // size_t cudnnGetVersion(void)
	getErrorString             uintptr // const char *cudnnGetErrorString(cudnnStatus_t)
	cnnVersionCheck            uintptr // cudnnStatus_t cudnnCnnVersionCheck(void); optional

	createTensor, setTensor4d, destroyTensor uintptr // cudnnSetTensor4dDescriptor(desc, format, dataType, n, c, h, w)
	createFilter, setFilter4d, destroyFilter uintptr // cudnnSetFilter4dDescriptor(desc, dataType, format, k, c, h, w)
	createConv, setConv2d, destroyConv       uintptr // cudnnSetConvolution2dDescriptor(desc, padH, padW, u, v, dilH, dilW, mode, computeType)
	setConvGroups, setConvMath               uintptr // cudnnSetConvolutionGroupCount(desc, n), cudnnSetConvolutionMathType(desc, mathType)

	// Per direction: GetWorkspaceSize(h, d1, d2, conv, d3, algo, size_t*),
	// Get_v7(h, d1, d2, conv, d3, requested, int *returned, perf*),
	// FindEx(h, d1, p1, d2, p2, conv, d3, p3, requested, int *returned, perf*, ws, wsBytes)
	// and the call itself (h, const float *alpha, d1, p1, d2, p2, conv,
	// algo, ws, wsBytes, const float *beta, d3, p3), where (d1, d2, d3) is
	// (x, w, y) forward, (w, dy, dx) for the data gradient and (x, dy, dw)
	// for the filter gradient.
	fwdWorkspace, fwdGet, fwdFind, fwd             uintptr
	bwdDataWorkspace, bwdDataGet, bwdDataFind, bwd uintptr
	bwdFilterWorkspace, bwdFilterGet, bwdFilterFind,
	bwdFilter uintptr
}

var (
	cudnnReal cudnnSyms
	cudnnOnce sync.Once
	cudnnErr  error
)

func loadCudnn() error {
	cudnnOnce.Do(func() {
		h, err := cudnnLib.open()
		if err != nil {
			cudnnErr = err
			return
		}
		c := &cudnnReal
		cudnnErr = cudnnLib.resolve(h, []libSymbol{
			reqSym(&c.create, "cudnnCreate"),
			reqSym(&c.destroy, "cudnnDestroy"),
			reqSym(&c.setStream, "cudnnSetStream"),
			reqSym(&c.getVersion, "cudnnGetVersion"),
			reqSym(&c.getErrorString, "cudnnGetErrorString"),
			optSym(&c.cnnVersionCheck, "cudnnCnnVersionCheck"),
			reqSym(&c.createTensor, "cudnnCreateTensorDescriptor"),
			reqSym(&c.setTensor4d, "cudnnSetTensor4dDescriptor"),
			reqSym(&c.destroyTensor, "cudnnDestroyTensorDescriptor"),
			reqSym(&c.createFilter, "cudnnCreateFilterDescriptor"),
			reqSym(&c.setFilter4d, "cudnnSetFilter4dDescriptor"),
			reqSym(&c.destroyFilter, "cudnnDestroyFilterDescriptor"),
			reqSym(&c.createConv, "cudnnCreateConvolutionDescriptor"),
			reqSym(&c.setConv2d, "cudnnSetConvolution2dDescriptor"),
			reqSym(&c.destroyConv, "cudnnDestroyConvolutionDescriptor"),
			reqSym(&c.setConvGroups, "cudnnSetConvolutionGroupCount"),
			reqSym(&c.setConvMath, "cudnnSetConvolutionMathType"),
			reqSym(&c.fwdWorkspace, "cudnnGetConvolutionForwardWorkspaceSize"),
			reqSym(&c.fwdGet, "cudnnGetConvolutionForwardAlgorithm_v7"),
			reqSym(&c.fwdFind, "cudnnFindConvolutionForwardAlgorithmEx"),
			reqSym(&c.fwd, "cudnnConvolutionForward"),
			reqSym(&c.bwdDataWorkspace, "cudnnGetConvolutionBackwardDataWorkspaceSize"),
			reqSym(&c.bwdDataGet, "cudnnGetConvolutionBackwardDataAlgorithm_v7"),
			reqSym(&c.bwdDataFind, "cudnnFindConvolutionBackwardDataAlgorithmEx"),
			reqSym(&c.bwd, "cudnnConvolutionBackwardData"),
			reqSym(&c.bwdFilterWorkspace, "cudnnGetConvolutionBackwardFilterWorkspaceSize"),
			reqSym(&c.bwdFilterGet, "cudnnGetConvolutionBackwardFilterAlgorithm_v7"),
			reqSym(&c.bwdFilterFind, "cudnnFindConvolutionBackwardFilterAlgorithmEx"),
			reqSym(&c.bwdFilter, "cudnnConvolutionBackwardFilter"),
		})
	})
	return cudnnErr
}

// cuDNN enum values (cudnn_graph.h, cudnn_ops.h, cudnn_cnn.h of cuDNN 9).
const (
	cudnnTensorNCHW       = 0 // CUDNN_TENSOR_NCHW
	cudnnTensorNHWC       = 1 // CUDNN_TENSOR_NHWC (a filter's is KRSC)
	cudnnDataFloat        = 0 // CUDNN_DATA_FLOAT
	cudnnDataBFloat16     = 9 // CUDNN_DATA_BFLOAT16
	cudnnCrossCorrelation = 1 // CUDNN_CROSS_CORRELATION: no kernel flip, as tensor.Conv2d

	cudnnDefaultMath              = 0 // CUDNN_DEFAULT_MATH: lets cuDNN use TF32 on Ampere and later
	cudnnTensorOpMath             = 1 // CUDNN_TENSOR_OP_MATH
	cudnnTensorOpAllowConversion  = 2 // CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION
	cudnnFMAMath                  = 3 // CUDNN_FMA_MATH: FMA kernels only, full FP32
	cudnnDeterministic            = 1 // CUDNN_DETERMINISTIC (cudnnDeterminism_t)
	cudnnStatusNotSupported       = 3000
	cudnnFwdAlgoCount             = 8 // CUDNN_CONVOLUTION_FWD_ALGO_COUNT
	cudnnBwdDataAlgoCount         = 6 // CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT
	cudnnBwdFilterAlgoCount       = 7 // CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT
	cudnnMaxAlgoCount             = cudnnFwdAlgoCount
	cudnnStatusSublibraryNotFound = 1008 // CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED
)

// cudnnStatusNames are the names of the cudnnStatus_t values cuDNN 9
// returns most (its codes are grouped by thousands: 1xxx initialisation,
// 2xxx bad parameters, 3xxx not supported, 4xxx internal, 5xxx execution).
var cudnnStatusNames = map[int]string{
	0:    "CUDNN_STATUS_SUCCESS",
	1001: "CUDNN_STATUS_NOT_INITIALIZED",
	1002: "CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH",
	1005: "CUDNN_STATUS_LICENSE_ERROR",
	1008: "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED",
	2000: "CUDNN_STATUS_BAD_PARAM",
	2002: "CUDNN_STATUS_BAD_PARAM_NULL_POINTER",
	3000: "CUDNN_STATUS_NOT_SUPPORTED",
	4000: "CUDNN_STATUS_INTERNAL_ERROR",
	4001: "CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED",
	4003: "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED",
	4004: "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",
	5000: "CUDNN_STATUS_EXECUTION_FAILED",
}

// cudnnStatusName names a cudnnStatus_t: cuDNN's own cudnnGetErrorString
// when syms has it, else the table.
func cudnnStatusName(syms *cudnnSyms, code int) string {
	if syms != nil && syms.getErrorString != 0 && syms == &cudnnReal {
		if s := goString(cCall(syms.getErrorString, uintptr(code))); s != "" {
			return s
		}
	}
	if n, ok := cudnnStatusNames[code]; ok {
		return n
	}
	return fmt.Sprintf("CUDNN_STATUS_%d", code)
}

// dnnCaller stands in for cuDNN in tests without a GPU: it receives every
// call the binding makes, with the function's address in the table the
// DNN was made with, and returns its status.
type dnnCaller interface {
	call(fn uintptr, args []uintptr) uintptr
}

// dnnInvoke calls the C function fn, or hands the call to fake when it is
// not nil. As with cCall, pointers to Go memory converted to uintptr in the
// call expression stay alive and in place for the call.
//
//go:uintptrescapes
func dnnInvoke(fake dnnCaller, fn uintptr, args ...uintptr) uintptr {
	if fake != nil {
		return fake.call(fn, args)
	}
	return cCall(fn, args...)
}

// DNN is a cuDNN handle on one device, bound to one stream. Its methods
// are not safe for concurrent use; the Backend serializes them.
type DNN struct {
	d       *Device // nil with a fake
	syms    *cudnnSyms
	fake    dnnCaller
	h       uintptr
	version int
	tf32    bool
	scal    *[2]float32 // alpha, beta: stable heap storage for the by-pointer scalars
}

// NewDNN opens cuDNN (libcudnn.so.9) and creates a handle on d bound to
// stream s. tf32 lets convolutions round their inputs to TF32 on tensor
// cores (CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION); without it they run in
// full FP32 (CUDNN_FMA_MATH: CUDNN_DEFAULT_MATH would allow TF32 on Ampere
// and later). It fails with a *LibraryError when cuDNN is missing or too
// old, and with an *Error when the handle or a probe convolution fails
// (the cuDNN sub-library for convolutions missing, say).
func (d *Device) NewDNN(s Stream, tf32 bool) (*DNN, error) {
	if err := loadCudnn(); err != nil {
		return nil, err
	}
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer d.leave()
	return newDNN(d, &cudnnReal, nil, s, tf32)
}

func newDNN(d *Device, syms *cudnnSyms, fake dnnCaller, s Stream, tf32 bool) (*DNN, error) {
	n := &DNN{d: d, syms: syms, fake: fake, tf32: tf32, scal: new([2]float32)}
	n.version = int(dnnInvoke(fake, syms.getVersion))
	if n.version/10000 != 9 {
		return nil, fmt.Errorf("cuda: cuDNN %s is not 9.x (this binding is for cuDNN 9's legacy convolution API; install cuDNN 9)", versionString(n.version))
	}
	if syms.cnnVersionCheck != 0 {
		if err := n.check("cudnnCnnVersionCheck", dnnInvoke(fake, syms.cnnVersionCheck)); err != nil {
			return nil, fmt.Errorf("cuda: cuDNN %s is not usable for convolutions: %w", versionString(n.version), err)
		}
	}
	var h uintptr
	if err := n.check("cudnnCreate", dnnInvoke(fake, syms.create, uintptr(unsafe.Pointer(&h)))); err != nil {
		return nil, err
	}
	n.h = h
	if err := n.check("cudnnSetStream", dnnInvoke(fake, syms.setStream, h, uintptr(s))); err != nil {
		n.destroy()
		return nil, err
	}
	// Probe: a 1x1x3x3 input, one 3x3 filter. Its workspace query is the
	// first call into libcudnn_cnn, which the shim loads then.
	p, err := n.newConvDescs(convDescGeom{n: 1, c: 1, h: 3, w: 3, k: 1, r: 3, s: 3, strideH: 1, strideW: 1, dilH: 1, dilW: 1, groups: 1, oh: 1, ow: 1, dtype: cudnnDataFloat})
	if err == nil {
		_, err = n.workspaceSize(dirForward, p, 0)
		n.destroyDescs(p)
	}
	if err != nil {
		n.destroy()
		return nil, fmt.Errorf("cuda: cuDNN %s is not usable for convolutions: %w", versionString(n.version), err)
	}
	return n, nil
}

// versionString formats cudnnGetVersion's number: major·10000 + minor·100
// + patch since cuDNN 9, major·1000 + minor·100 + patch before.
func versionString(v int) string {
	if v < 10000 {
		return fmt.Sprintf("%d.%d.%d", v/1000, v/100%10, v%100)
	}
	return fmt.Sprintf("%d.%d.%d", v/10000, v/100%100, v%100)
}

// Version is cuDNN's version, e.g. 91400 for 9.14.0.
func (n *DNN) Version() int { return n.version }

// TF32 reports whether convolutions may round inputs to TF32.
func (n *DNN) TF32() bool { return n.tf32 }

// SetStream binds the handle to stream s (cudnnSetStream).
func (n *DNN) SetStream(s Stream) error {
	return n.do("cudnnSetStream", func() uintptr { return dnnInvoke(n.fake, n.syms.setStream, n.h, uintptr(s)) })
}

// Close destroys the handle (cudnnDestroy). Idempotent.
func (n *DNN) Close() error {
	if n == nil || n.h == 0 {
		return nil
	}
	err := n.do("cudnnDestroy", func() uintptr { return dnnInvoke(n.fake, n.syms.destroy, n.h) })
	n.h = 0
	return err
}

func (n *DNN) destroy() {
	dnnInvoke(n.fake, n.syms.destroy, n.h)
	n.h = 0
}

// with runs fn with the device's context current (a fake has no device).
func (n *DNN) with(fn func() error) error {
	if n.d != nil {
		if err := n.d.enter(); err != nil {
			return err
		}
		defer n.d.leave()
	}
	return fn()
}

// do runs one call with the device's context current.
func (n *DNN) do(name string, fn func() uintptr) error {
	if n.h == 0 {
		return errors.New("cuda: cuDNN handle is closed")
	}
	return n.with(func() error { return n.check(name, fn()) })
}

func (n *DNN) check(name string, r uintptr) error {
	code := int(int32(uint32(r)))
	if code == 0 {
		return nil
	}
	return &Error{Call: name, Code: code, Name: cudnnStatusName(n.syms, code)}
}

// ---- descriptors ----

// convDescGeom is a convolution as cuDNN's descriptors take it: int
// dimensions, groups and dilation at least 1.
type convDescGeom struct {
	n, c, h, w       int
	k, r, s          int
	strideH, strideW int
	padH, padW       int
	dilH, dilW       int
	groups           int
	oh, ow           int
	// dtype is the element type of x, w and y (and their gradients):
	// cudnnDataFloat, or cudnnDataBFloat16 for autocast's convolutions;
	// the sums are float32 either way.
	dtype int
	// nhwc lays x, y and their gradients out as NHWC and the filter as
	// KRSC (bfloat16 only: cuDNN's tensor-core kernels read them directly).
	nhwc bool
}

// String is g in a line: x's sizes, the filter, stride, padding, dilation,
// groups, and the element type and layout.
func (g convDescGeom) String() string {
	dt := "float32"
	if g.dtype == cudnnDataBFloat16 {
		dt = "bfloat16"
	}
	if g.nhwc {
		dt += " NHWC"
	}
	return fmt.Sprintf("x [%d,%d,%d,%d] w [%d,%d,%d,%d] stride %dx%d pad %dx%d dilation %dx%d groups %d %s",
		g.n, g.c, g.h, g.w, g.k, g.c/max(g.groups, 1), g.r, g.s, g.strideH, g.strideW, g.padH, g.padW, g.dilH, g.dilW, g.groups, dt)
}

// format is g's cudnnTensorFormat_t.
func (g convDescGeom) format() uintptr {
	if g.nhwc {
		return cudnnTensorNHWC
	}
	return cudnnTensorNCHW
}

// convDescs are the descriptors of one convolution geometry: one
// convolution descriptor per direction, since each carries the math type
// of the algorithm chosen for it.
type convDescs struct {
	x, y, w uintptr
	conv    [dirCount]uintptr
	dtype   int // the geometry's element type
	// tensorCores: bfloat16 with channel counts that cuDNN's tensor-core
	// kernels take (multiples of 8 per group, in and out). There the
	// other math type's kernels run 100-1000 times slower (measured on
	// the H200: 98 ms against 85 us for ResNet-9's backward data at
	// [512,256,7,7]), so a search leaves them out.
	tensorCores bool
}

// convDirection is one of the three convolution functions.
type convDirection int

const (
	dirForward convDirection = iota
	dirBackwardData
	dirBackwardFilter
	dirCount
)

func (d convDirection) String() string {
	return [...]string{"forward", "backward data", "backward filter"}[d]
}

// tensor4dArgs are cudnnSetTensor4dDescriptor's arguments after the
// descriptor: the format, the element type, then the sizes (in NCHW order
// whatever the format).
func tensor4dArgs(format uintptr, dtype, n, c, h, w int) []uintptr {
	return []uintptr{format, uintptr(dtype), uintptr(n), uintptr(c), uintptr(h), uintptr(w)}
}

// filter4dArgs are cudnnSetFilter4dDescriptor's: the data type comes
// before the format here. A grouped filter is [K, C/G, R, S].
func filter4dArgs(g convDescGeom) []uintptr {
	return []uintptr{uintptr(g.dtype), g.format(), uintptr(g.k), uintptr(g.c / g.groups), uintptr(g.r), uintptr(g.s)}
}

// conv2dArgs are cudnnSetConvolution2dDescriptor's: padding, strides,
// dilation, cross-correlation (no flip, as tensor.Conv2d), float32
// accumulation.
func conv2dArgs(g convDescGeom) []uintptr {
	return []uintptr{uintptr(g.padH), uintptr(g.padW), uintptr(g.strideH), uintptr(g.strideW),
		uintptr(g.dilH), uintptr(g.dilW), cudnnCrossCorrelation, cudnnDataFloat}
}

// tensorOps reports whether convolutions of element type dtype may run on
// tensor cores: bfloat16 ones always (that is what they are for), float32
// ones when TF32 is allowed.
func (n *DNN) tensorOps(dtype int) bool { return n.tf32 || dtype == cudnnDataBFloat16 }

// mathType is the math type convolutions of element type dtype are
// described with: FMA only (full FP32) unless tensor cores are allowed.
func (n *DNN) mathType(dtype int) int {
	switch {
	case dtype == cudnnDataBFloat16:
		return cudnnTensorOpMath
	case n.tf32:
		return cudnnTensorOpAllowConversion
	}
	return cudnnFMAMath
}

// newConvDescs creates and sets the descriptors of g.
func (n *DNN) newConvDescs(g convDescGeom) (p convDescs, err error) {
	s, f := n.syms, n.fake
	defer func() {
		if err != nil {
			n.destroyDescs(p)
			p = convDescs{}
		}
	}()
	p.dtype = g.dtype
	groups := max(g.groups, 1)
	p.tensorCores = g.dtype == cudnnDataBFloat16 && (g.c/groups)%8 == 0 && (g.k/groups)%8 == 0
	create := func(name string, fn uintptr, dst *uintptr) error {
		return n.check(name, dnnInvoke(f, fn, uintptr(unsafe.Pointer(dst))))
	}
	if err = create("cudnnCreateTensorDescriptor", s.createTensor, &p.x); err != nil {
		return
	}
	if err = create("cudnnCreateTensorDescriptor", s.createTensor, &p.y); err != nil {
		return
	}
	if err = create("cudnnCreateFilterDescriptor", s.createFilter, &p.w); err != nil {
		return
	}
	for i := range p.conv {
		if err = create("cudnnCreateConvolutionDescriptor", s.createConv, &p.conv[i]); err != nil {
			return
		}
	}
	if err = n.check("cudnnSetTensor4dDescriptor", dnnInvoke(f, s.setTensor4d, append([]uintptr{p.x}, tensor4dArgs(g.format(), g.dtype, g.n, g.c, g.h, g.w)...)...)); err != nil {
		return
	}
	if err = n.check("cudnnSetTensor4dDescriptor", dnnInvoke(f, s.setTensor4d, append([]uintptr{p.y}, tensor4dArgs(g.format(), g.dtype, g.n, g.k, g.oh, g.ow)...)...)); err != nil {
		return
	}
	if err = n.check("cudnnSetFilter4dDescriptor", dnnInvoke(f, s.setFilter4d, append([]uintptr{p.w}, filter4dArgs(g)...)...)); err != nil {
		return
	}
	for _, c := range p.conv {
		if err = n.check("cudnnSetConvolution2dDescriptor", dnnInvoke(f, s.setConv2d, append([]uintptr{c}, conv2dArgs(g)...)...)); err != nil {
			return
		}
		if err = n.check("cudnnSetConvolutionGroupCount", dnnInvoke(f, s.setConvGroups, c, uintptr(g.groups))); err != nil {
			return
		}
		if err = n.setMath(c, n.mathType(g.dtype)); err != nil {
			return
		}
	}
	return p, nil
}

func (n *DNN) setMath(conv uintptr, math int) error {
	return n.check("cudnnSetConvolutionMathType", dnnInvoke(n.fake, n.syms.setConvMath, conv, uintptr(math)))
}

// destroyDescs destroys the descriptors of p that were created.
func (n *DNN) destroyDescs(p convDescs) {
	s, f := n.syms, n.fake
	for _, d := range []uintptr{p.x, p.y} {
		if d != 0 {
			dnnInvoke(f, s.destroyTensor, d)
		}
	}
	if p.w != 0 {
		dnnInvoke(f, s.destroyFilter, p.w)
	}
	for _, c := range p.conv {
		if c != 0 {
			dnnInvoke(f, s.destroyConv, c)
		}
	}
}

// descOrder is the (d1, d2, d3) descriptors of direction dir, in the order
// its functions take them.
func (p convDescs) descOrder(dir convDirection) (d1, d2, d3 uintptr) {
	switch dir {
	case dirForward:
		return p.x, p.w, p.y
	case dirBackwardData:
		return p.w, p.y, p.x
	default:
		return p.x, p.y, p.w
	}
}

// ---- algorithms ----

// cudnnAlgoPerf is the layout of cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t
// (all three are the same): algo, status, time in ms, workspace bytes,
// determinism, math type, 3 reserved ints; 48 bytes on 64-bit Linux.
type cudnnAlgoPerf struct {
	Algo        int32
	Status      int32
	Time        float32
	_           int32 // padding before the size_t
	Memory      uint64
	Determinism int32
	MathType    int32
	_           [3]int32
	_           int32 // tail padding to 8-byte alignment
}

// convAlgo is an algorithm chosen for one direction of one geometry.
type convAlgo struct {
	algo      int
	workspace int     // bytes
	mathType  int     // the math type set on the direction's descriptor
	ms        float32 // the search's time; 0 for an untimed pick
	measured  bool
}

func (a convAlgo) String() string {
	how := "heuristic"
	if a.measured {
		how = fmt.Sprintf("%.3f ms", a.ms)
	}
	return fmt.Sprintf("algo %d, workspace %d B, math %d, %s", a.algo, a.workspace, a.mathType, how)
}

func algoCount(dir convDirection) int {
	return [...]int{cudnnFwdAlgoCount, cudnnBwdDataAlgoCount, cudnnBwdFilterAlgoCount}[dir]
}

func (n *DNN) dirSyms(dir convDirection) (workspace, get, find, run uintptr, names [4]string) {
	s := n.syms
	switch dir {
	case dirForward:
		return s.fwdWorkspace, s.fwdGet, s.fwdFind, s.fwd, [4]string{"cudnnGetConvolutionForwardWorkspaceSize",
			"cudnnGetConvolutionForwardAlgorithm_v7", "cudnnFindConvolutionForwardAlgorithmEx", "cudnnConvolutionForward"}
	case dirBackwardData:
		return s.bwdDataWorkspace, s.bwdDataGet, s.bwdDataFind, s.bwd, [4]string{"cudnnGetConvolutionBackwardDataWorkspaceSize",
			"cudnnGetConvolutionBackwardDataAlgorithm_v7", "cudnnFindConvolutionBackwardDataAlgorithmEx", "cudnnConvolutionBackwardData"}
	default:
		return s.bwdFilterWorkspace, s.bwdFilterGet, s.bwdFilterFind, s.bwdFilter, [4]string{"cudnnGetConvolutionBackwardFilterWorkspaceSize",
			"cudnnGetConvolutionBackwardFilterAlgorithm_v7", "cudnnFindConvolutionBackwardFilterAlgorithmEx", "cudnnConvolutionBackwardFilter"}
	}
}

// workspaceSize is the workspace algorithm algo of dir needs on p.
func (n *DNN) workspaceSize(dir convDirection, p convDescs, algo int) (int, error) {
	fn, _, _, _, names := n.dirSyms(dir)
	d1, d2, d3 := p.descOrder(dir)
	var size uint64
	err := n.check(names[0], dnnInvoke(n.fake, fn, n.h, d1, d2, p.conv[dir], d3, uintptr(algo), uintptr(unsafe.Pointer(&size))))
	return int(size), err
}

// maxWorkspace is the most workspace any algorithm of dir asks for on p,
// capped at limit; algorithms that do not support p are left out.
func (n *DNN) maxWorkspace(dir convDirection, p convDescs, limit int) int {
	most := 0
	for a := range algoCount(dir) {
		if s, err := n.workspaceSize(dir, p, a); err == nil && s <= limit {
			most = max(most, s)
		}
	}
	return most
}

// gemmClassAlgo reports whether algo computes the convolution directly or
// as an (implicit) matrix product, in fp32 sums as the im2col path does:
// forward IMPLICIT_GEMM, IMPLICIT_PRECOMP_GEMM and GEMM (0-2), backward
// data ALGO_0 and ALGO_1, backward filter ALGO_0, ALGO_1 and ALGO_3. The
// FFT and Winograd algorithms transform the operands, and their rounding
// errors exceed the 1e-5 normwise bound fp32 convolutions are held to
// (measured on the H200: 3-10% errors in the input gradient of a 5x5
// convolution of one channel).
func gemmClassAlgo(dir convDirection, algo int) bool {
	if dir == dirBackwardFilter {
		return algo <= 1 || algo == 3
	}
	if dir == dirForward {
		return algo <= 2
	}
	return algo <= 1 // backward data
}

// gemmClass keeps the results of a search whose algorithms are of the
// matrix-product class (gemmClassAlgo).
func gemmClass(dir convDirection, perf []cudnnAlgoPerf) []cudnnAlgoPerf {
	var out []cudnnAlgoPerf
	for _, r := range perf {
		if gemmClassAlgo(dir, int(r.Algo)) {
			out = append(out, r)
		}
	}
	return out
}

// pickAlgo returns the first usable result of a search (cuDNN sorts them
// fastest first): it ran, it is deterministic when that is asked for, and
// its math type is allowed. Without TF32 a tensor-op result is not, and
// the algorithm runs with CUDNN_FMA_MATH on its descriptor whatever its
// result says (a search on an FMA descriptor may label FMA kernels
// CUDNN_DEFAULT_MATH, which on its own would permit TF32).
func (n *DNN) pickAlgo(perf []cudnnAlgoPerf, deterministic bool, wsLimit int, measured bool) (convAlgo, bool) {
	return n.pickAlgoFor(cudnnDataFloat, perf, deterministic, wsLimit, measured)
}

// pickAlgoFor is pickAlgo for convolutions of element type dtype: those
// of bfloat16 take tensor-op results too.
func (n *DNN) pickAlgoFor(dtype int, perf []cudnnAlgoPerf, deterministic bool, wsLimit int, measured bool) (convAlgo, bool) {
	for _, r := range perf {
		if a, ok := n.qualify(dtype, r, deterministic, wsLimit, measured); ok {
			return a, true
		}
	}
	return convAlgo{}, false
}

// qualify returns r as the algorithm to run when it qualifies (see
// pickAlgo).
func (n *DNN) qualify(dtype int, r cudnnAlgoPerf, deterministic bool, wsLimit int, measured bool) (convAlgo, bool) {
	if r.Status != 0 || (deterministic && r.Determinism != cudnnDeterministic) || int(r.Memory) > wsLimit {
		return convAlgo{}, false
	}
	math := int(r.MathType)
	if !n.tensorOps(dtype) {
		if math == cudnnTensorOpMath || math == cudnnTensorOpAllowConversion {
			return convAlgo{}, false
		}
		math = cudnnFMAMath
	}
	return convAlgo{algo: int(r.Algo), workspace: int(r.Memory), mathType: math, ms: r.Time, measured: measured}, true
}

// errNoAlgo: no algorithm of a search fits the constraints.
var errNoAlgo = errors.New("no deterministic algorithm of the allowed math type fits")

// heuristicAlgo asks cuDNN's heuristics (Get_v7, no device work: usable
// while a graph is captured) for an algorithm of dir on p.
func (n *DNN) heuristicAlgo(dir convDirection, p convDescs, deterministic bool, wsLimit int) (convAlgo, error) {
	c, err := n.candidates(dir, p, deterministic, wsLimit, 1)
	if err != nil {
		return convAlgo{}, err
	}
	return c[0], nil
}

// candidates returns up to most of the algorithms of dir on p that
// qualify (pickAlgo) in the order of cuDNN's heuristics (Get_v7, no
// device work), each with the workspace it needs at the math type it runs
// with (a heuristic result's size is an estimate). The error wraps
// errNoAlgo when none qualifies.
func (n *DNN) candidates(dir convDirection, p convDescs, deterministic bool, wsLimit, most int) ([]convAlgo, error) {
	_, get, _, _, names := n.dirSyms(dir)
	// Ask with the descriptor's own math type, whatever an earlier run
	// left on it.
	if err := n.setMath(p.conv[dir], n.mathType(p.dtype)); err != nil {
		return nil, err
	}
	d1, d2, d3 := p.descOrder(dir)
	var perf [cudnnMaxAlgoCount]cudnnAlgoPerf
	var got int32
	if err := n.check(names[1], dnnInvoke(n.fake, get, n.h, d1, d2, p.conv[dir], d3, uintptr(algoCount(dir)),
		uintptr(unsafe.Pointer(&got)), uintptr(unsafe.Pointer(&perf[0])))); err != nil {
		return nil, err
	}
	out, slow, over := n.qualifying(dir, p, gemmClass(dir, perf[:min(max(int(got), 0), len(perf))]), deterministic, wsLimit, most, p.tensorCores)
	if len(out) == 0 && len(slow) > 0 {
		out, _, over = n.qualifying(dir, p, slow, deterministic, wsLimit, most, false)
	}
	if len(out) == 0 {
		if over != nil {
			return nil, over
		}
		return nil, fmt.Errorf("cuda: %s: %w", names[1], errNoAlgo)
	}
	return out, nil
}

// qualifying is candidates' selection from results, in their order. With
// tensorCores it sets aside in slow the results of another math type
// (see convDescs). over reports the last workspace over the cap.
func (n *DNN) qualifying(dir convDirection, p convDescs, results []cudnnAlgoPerf, deterministic bool, wsLimit, most int, tensorCores bool) (out []convAlgo, slow []cudnnAlgoPerf, over error) {
	_, _, _, _, names := n.dirSyms(dir)
	for _, r := range results {
		a, ok := n.qualify(p.dtype, r, deterministic, wsLimit, false)
		if !ok || slices.ContainsFunc(out, func(o convAlgo) bool { return o.algo == a.algo && o.mathType == a.mathType }) {
			continue
		}
		if tensorCores && a.mathType != cudnnTensorOpMath && a.mathType != cudnnTensorOpAllowConversion {
			slow = append(slow, r)
			continue
		}
		if err := n.setMath(p.conv[dir], a.mathType); err != nil {
			return nil, nil, err
		}
		ws, err := n.workspaceSize(dir, p, a.algo)
		if err != nil {
			continue // not supported at this geometry after all
		}
		if ws > wsLimit {
			// The estimate was low: leave it out rather than allocate
			// past the cap (inside a capture, too).
			over = fmt.Errorf("cuda: %s: algorithm %d needs a %d-byte workspace, over the %d-byte cap: %w", names[1], a.algo, ws, wsLimit, errNoAlgo)
			continue
		}
		a.workspace = ws
		if out = append(out, a); len(out) == most {
			break
		}
	}
	return out, slow, over
}

// findAlgo times every algorithm of dir on p (FindEx, which runs them on
// the stream and waits: not while a graph is captured) with the buffers
// p1, p2, p3 (in the direction's order; p3 is overwritten) and the
// workspace [ws, ws+wsBytes).
func (n *DNN) findAlgo(dir convDirection, p convDescs, p1, p2, p3, ws uintptr, wsBytes int, deterministic bool) (convAlgo, error) {
	_, _, find, _, names := n.dirSyms(dir)
	// Search with the descriptor's own math type, whatever an earlier
	// run left on it.
	if err := n.setMath(p.conv[dir], n.mathType(p.dtype)); err != nil {
		return convAlgo{}, err
	}
	d1, d2, d3 := p.descOrder(dir)
	var perf [cudnnMaxAlgoCount]cudnnAlgoPerf
	var got int32
	if err := n.check(names[2], dnnInvoke(n.fake, find, n.h, d1, p1, d2, p2, p.conv[dir], d3, p3, uintptr(algoCount(dir)),
		uintptr(unsafe.Pointer(&got)), uintptr(unsafe.Pointer(&perf[0])), ws, uintptr(wsBytes))); err != nil {
		return convAlgo{}, err
	}
	a, ok := n.pickAlgoFor(p.dtype, gemmClass(dir, perf[:min(max(int(got), 0), len(perf))]), deterministic, wsBytes, true)
	if !ok {
		return convAlgo{}, fmt.Errorf("cuda: %s: %w", names[2], errNoAlgo)
	}
	return a, nil
}

// run queues direction dir with algorithm a: p3 = alpha·op(p1, p2) +
// beta·p3 (forward y from x, w; data gradient dx from w, dy; filter
// gradient dw from x, dy), with the workspace [ws, ws+a.workspace).
func (n *DNN) run(dir convDirection, p convDescs, a convAlgo, alpha float32, p1, p2 uintptr, beta float32, p3, ws uintptr) error {
	if err := n.setMath(p.conv[dir], a.mathType); err != nil {
		return err
	}
	_, _, _, fn, names := n.dirSyms(dir)
	d1, d2, d3 := p.descOrder(dir)
	n.scal[0], n.scal[1] = alpha, beta
	return n.check(names[3], dnnInvoke(n.fake, fn, n.h, uintptr(unsafe.Pointer(&n.scal[0])), d1, p1, d2, p2, p.conv[dir],
		uintptr(a.algo), ws, uintptr(a.workspace), uintptr(unsafe.Pointer(&n.scal[1])), d3, p3))
}
