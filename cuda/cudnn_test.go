package cuda

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/ember-ml/ember/tensor"
)

// Tests of the cuDNN binding and dispatch without a GPU: a fake cuDNN
// (fakeDNN) receives every call the binding makes, checks pointers against
// the recording backend's memory, writes the results cuDNN would (handles,
// workspace sizes, algorithm searches) and records the calls, so that the
// descriptors' arguments, the algorithm choice and cache, and what each
// convolution queues can be checked exactly.

type fakeCall struct {
	name        string
	args        []uintptr
	alpha, beta float32 // a convolution's scalars, as read when called
}

type fakeDNN struct {
	t       *testing.T
	syms    *cudnnSyms
	names   map[uintptr]string // function address in syms -> field name
	mem     *recMem            // nil: pointers are not checked
	version int
	fail    map[string]uintptr         // status returned by a function, by field name
	perf    map[string][]cudnnAlgoPerf // results of a search, by field name (fwdFind, bwdDataGet, ...)
	calls   []fakeCall
	next    uintptr
	sets    map[string]map[uintptr][]uintptr // setter name -> descriptor -> its arguments
}

// fakeWorkspace is the workspace the fake says algorithm a needs.
func fakeWorkspace(a uintptr) uint64 { return 4096 * uint64(a+1) }

func newFakeDNN(t *testing.T, mem *recMem) *fakeDNN {
	f := &fakeDNN{t: t, syms: &cudnnSyms{}, names: map[uintptr]string{}, mem: mem, version: 91400,
		fail: map[string]uintptr{}, perf: map[string][]cudnnAlgoPerf{}, next: 0x7000,
		sets: map[string]map[uintptr][]uintptr{}}
	v := reflect.ValueOf(f.syms).Elem()
	for i := range v.NumField() {
		addr := uintptr(0x100 + i)
		fv := v.Field(i) // unexported: written through its address
		*(*uintptr)(unsafe.Pointer(fv.UnsafeAddr())) = addr
		f.names[addr] = v.Type().Field(i).Name
	}
	// Every search, unless a test says otherwise: fastest first, as cuDNN
	// sorts them. Only algorithm 2 qualifies without TF32: 6 fails, 1 is
	// not deterministic, 4 has a TF32 math type.
	results := []cudnnAlgoPerf{
		{Algo: 6, Status: cudnnStatusNotSupported, Determinism: 1, MathType: cudnnFMAMath},
		{Algo: 1, Time: 0.1, Memory: fakeWorkspace(1), Determinism: 0, MathType: cudnnFMAMath},
		{Algo: 4, Time: 0.2, Memory: fakeWorkspace(4), Determinism: 1, MathType: cudnnTensorOpAllowConversion},
		{Algo: 2, Time: 0.3, Memory: fakeWorkspace(2), Determinism: 1, MathType: cudnnFMAMath},
	}
	for _, n := range []string{"fwdFind", "fwdGet", "bwdDataFind", "bwdDataGet", "bwdFilterFind", "bwdFilterGet"} {
		f.perf[n] = append([]cudnnAlgoPerf(nil), results...)
	}
	// The backward directions also offer a slower deterministic algorithm
	// of the matrix-product class (gemmClassAlgo), the one they pick.
	for _, n := range []string{"bwdDataFind", "bwdDataGet"} {
		f.perf[n] = append(f.perf[n], cudnnAlgoPerf{Algo: 0, Time: 0.4, Memory: fakeWorkspace(0), Determinism: 1, MathType: cudnnFMAMath})
	}
	for _, n := range []string{"bwdFilterFind", "bwdFilterGet"} {
		f.perf[n] = append(f.perf[n], cudnnAlgoPerf{Algo: 3, Time: 0.4, Memory: fakeWorkspace(3), Determinism: 1, MathType: cudnnFMAMath})
	}
	return f
}

func fakeAt[T any](p uintptr) *T { return (*T)(*(*unsafe.Pointer)(unsafe.Pointer(&p))) }

func (f *fakeDNN) count(name string) int {
	n := 0
	for _, c := range f.calls {
		if c.name == name {
			n++
		}
	}
	return n
}

func (f *fakeDNN) last(name string) fakeCall {
	for i := len(f.calls) - 1; i >= 0; i-- {
		if f.calls[i].name == name {
			return f.calls[i]
		}
	}
	f.t.Fatalf("no call of %s", name)
	return fakeCall{}
}

func (f *fakeDNN) device(name string, p uintptr, bytes int) {
	if f.mem != nil && (p == 0 || !f.mem.inside(p, bytes)) {
		f.t.Errorf("%s: pointer %#x (%d bytes) outside allocated memory", name, p, bytes)
	}
}

func (f *fakeDNN) call(fn uintptr, args []uintptr) uintptr {
	name, ok := f.names[fn]
	if !ok {
		f.t.Fatalf("call of unknown function %#x", fn)
	}
	f.calls = append(f.calls, fakeCall{name: name, args: append([]uintptr(nil), args...)})
	if st, ok := f.fail[name]; ok {
		return st
	}
	search := func(countArg, perfArg int) {
		res := f.perf[name]
		if int(args[countArg-1]) < len(res) {
			res = res[:args[countArg-1]]
		}
		copy(unsafe.Slice(fakeAt[cudnnAlgoPerf](args[perfArg]), len(res)), res)
		*fakeAt[int32](args[countArg]) = int32(len(res))
	}
	switch name {
	case "getVersion":
		return uintptr(f.version)
	case "create":
		*fakeAt[uintptr](args[0]) = 0xdd00
	case "createTensor", "createFilter", "createConv":
		f.next++
		*fakeAt[uintptr](args[0]) = f.next
	case "setTensor4d", "setFilter4d", "setConv2d", "setConvGroups", "setConvMath":
		if f.sets[name] == nil {
			f.sets[name] = map[uintptr][]uintptr{}
		}
		f.sets[name][args[0]] = append([]uintptr(nil), args[1:]...)
	case "fwdWorkspace", "bwdDataWorkspace", "bwdFilterWorkspace":
		*fakeAt[uint64](args[6]) = fakeWorkspace(args[5])
	case "fwdGet", "bwdDataGet", "bwdFilterGet":
		search(6, 7)
	case "fwdFind", "bwdDataFind", "bwdFilterFind":
		for _, i := range []int{2, 4, 7} {
			f.device(name, args[i], 4)
		}
		if args[12] > 0 {
			f.device(name+" workspace", args[11], int(args[12]))
		}
		search(9, 10)
	case "fwd", "bwd", "bwdFilter":
		c := &f.calls[len(f.calls)-1]
		c.alpha, c.beta = *fakeAt[float32](args[1]), *fakeAt[float32](args[10])
		for _, i := range []int{3, 5, 12} {
			f.device(name, args[i], 4)
		}
		if args[9] > 0 {
			f.device(name+" workspace", args[8], int(args[9]))
		}
	}
	return 0
}

// fakeBackend is a recording backend whose convolutions go to a fake cuDNN.
func fakeBackend(t *testing.T, tf32 bool) (*Backend, *recExec, *fakeDNN) {
	b, rec := newRecordingBackend(t)
	f := newFakeDNN(t, rec.mem)
	n, err := newDNN(nil, f.syms, f, 0, tf32)
	if err != nil {
		t.Fatal(err)
	}
	b.dnn = newDNNConvs(n)
	// FindEx over every algorithm, which most tests here check;
	// TestCuDNNTimedCandidates takes the default, the heuristics' first
	// few timed.
	b.opt.ConvSearchAll = true
	return b, rec, f
}

func TestCuDNNLibraryMissing(t *testing.T) {
	err := loadCudnn()
	if err == nil {
		t.Skip("libcudnn.so.9 is installed here")
	}
	var le *LibraryError
	if !errors.As(err, &le) || le.Library != "cuDNN" {
		t.Fatalf("loadCudnn: %v (%T), want a *LibraryError for cuDNN", err, err)
	}
	for _, want := range []string{"cuDNN not found", "libcudnn.so.9", "install cuDNN 9"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// TestCuDNNAbsentRecorder: a backend without cuDNN says why, and its
// convolutions take the im2col path.
func TestCuDNNAbsentRecorder(t *testing.T) {
	b, rec := newRecordingBackend(t)
	b.opt.NoCuDNN = true
	b.openCuDNN()
	if _, got := b.CuDNN(); got != errCuDNNOff {
		t.Errorf("CuDNN() = %v, want the reason it is not used", got)
	}
	g := resnetGeom(false)
	xLen, yLen := g.N*g.C*g.H*g.W, g.N*g.K*g.OutH()*g.OutW()
	y, x, w := recBuf(t, b, yLen), recBuf(t, b, xLen), recBuf(t, b, g.WeightLen())
	b.Conv2d(y, x, w, tensor.Buffer{}, g)
	if rec.gemms != 1 || rec.launches["ember_im2col"] != 1 {
		t.Errorf("forward without cuDNN: %d GEMMs, %d im2col; want 1, 1", rec.gemms, rec.launches["ember_im2col"])
	}
	b.Conv2dBackward(recBuf(t, b, xLen), recBuf(t, b, g.WeightLen()), tensor.Buffer{}, recBuf(t, b, yLen), x, w, tensor.Buffer{}, g)
	if rec.gemms != 3 || rec.launches["ember_col2im"] != 1 {
		t.Errorf("backward without cuDNN: %d GEMMs in all, %d col2im; want 3, 1", rec.gemms, rec.launches["ember_col2im"])
	}
}

func recBuf(t *testing.T, b *Backend, n int) tensor.Buffer {
	t.Helper()
	buf, err := b.Alloc(n, tensor.Float32)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Free(buf) })
	return buf
}

func TestCuDNNOptionsFromEnv(t *testing.T) {
	t.Setenv("EMBER_CUDNN", "0")
	opt, err := OptionsFromEnv(BackendOptions{})
	if err != nil || !opt.NoCuDNN {
		t.Errorf("EMBER_CUDNN=0: NoCuDNN=%v, err %v; want true", opt.NoCuDNN, err)
	}
	t.Setenv("EMBER_CUDNN", "1")
	if opt, _ = OptionsFromEnv(BackendOptions{}); opt.NoCuDNN {
		t.Error("EMBER_CUDNN=1 turned cuDNN off")
	}
}

func TestCuDNNNewDNNFailures(t *testing.T) {
	f := newFakeDNN(t, nil)
	f.version = 8907
	if _, err := newDNN(nil, f.syms, f, 0, false); err == nil || !strings.Contains(err.Error(), "cuDNN 8.9.7 is not 9.x") {
		t.Errorf("cuDNN 8.9.7: err %v, want a version error", err)
	}

	// The shim cannot load libcudnn_cnn: the probe's workspace query fails.
	f = newFakeDNN(t, nil)
	f.fail["fwdWorkspace"] = cudnnStatusSublibraryNotFound
	_, err := newDNN(nil, f.syms, f, 0, false)
	for _, want := range []string{"cuDNN 9.14.0 is not usable for convolutions", "cudnnGetConvolutionForwardWorkspaceSize", "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("sub-library missing: err %v, want it to say %q", err, want)
		}
	}
	if f.count("destroy") != 1 {
		t.Errorf("the handle was destroyed %d times, want 1", f.count("destroy"))
	}
	created := f.count("createTensor") + f.count("createFilter") + f.count("createConv")
	destroyed := f.count("destroyTensor") + f.count("destroyFilter") + f.count("destroyConv")
	if created == 0 || created != destroyed {
		t.Errorf("%d descriptors created, %d destroyed", created, destroyed)
	}

	f = newFakeDNN(t, nil)
	f.fail["cnnVersionCheck"] = 1002
	if _, err := newDNN(nil, f.syms, f, 0, false); err == nil || !strings.Contains(err.Error(), "cudnnCnnVersionCheck: CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH") {
		t.Errorf("sub-library of another version: err %v", err)
	}

	f = newFakeDNN(t, nil)
	f.fail["setStream"] = 2000
	if _, err := newDNN(nil, f.syms, f, 0, false); err == nil || !strings.Contains(err.Error(), "cudnnSetStream: CUDNN_STATUS_BAD_PARAM") {
		t.Errorf("cudnnSetStream failing: err %v", err)
	}
}

func TestCuDNNDescriptorArguments(t *testing.T) {
	// The perf struct must match cuDNN's layout: the search writes into it.
	var p cudnnAlgoPerf
	if unsafe.Sizeof(p) != 48 || unsafe.Offsetof(p.Memory) != 16 || unsafe.Offsetof(p.Determinism) != 24 || unsafe.Offsetof(p.MathType) != 28 {
		t.Errorf("cudnnAlgoPerf: size %d, Memory at %d, Determinism at %d, MathType at %d; want 48, 16, 24, 28",
			unsafe.Sizeof(p), unsafe.Offsetof(p.Memory), unsafe.Offsetof(p.Determinism), unsafe.Offsetof(p.MathType))
	}
	g := convDescGeom{n: 4, c: 32, h: 28, w: 20, k: 48, r: 3, s: 5, strideH: 2, strideW: 1, padH: 2, padW: 4,
		dilH: 2, dilW: 3, groups: 4, oh: 12, ow: 18}
	for _, tf32 := range []bool{false, true} {
		f := newFakeDNN(t, nil)
		n, err := newDNN(nil, f.syms, f, 0, tf32)
		if err != nil {
			t.Fatal(err)
		}
		d, err := n.newConvDescs(g)
		if err != nil {
			t.Fatal(err)
		}
		check := func(what, setter string, desc uintptr, want []uintptr) {
			t.Helper()
			if got := f.sets[setter][desc]; !reflect.DeepEqual(got, want) {
				t.Errorf("tf32=%v %s: %s arguments %v, want %v", tf32, what, setter, got, want)
			}
		}
		// format NCHW = 0 and data type float = 0; the filter takes the
		// data type first.
		check("x", "setTensor4d", d.x, []uintptr{0, 0, 4, 32, 28, 20})
		check("y", "setTensor4d", d.y, []uintptr{0, 0, 4, 48, 12, 18})
		check("w", "setFilter4d", d.w, []uintptr{0, 0, 48, 8, 3, 5})
		math := uintptr(cudnnFMAMath)
		if tf32 {
			math = cudnnTensorOpAllowConversion
		}
		for dir, c := range d.conv {
			check(convDirection(dir).String(), "setConv2d", c, []uintptr{2, 4, 2, 1, 2, 3, cudnnCrossCorrelation, 0})
			check(convDirection(dir).String(), "setConvGroups", c, []uintptr{4})
			check(convDirection(dir).String(), "setConvMath", c, []uintptr{math})
		}
		// Each direction's functions take the descriptors in their order.
		for dir, want := range [][3]uintptr{{d.x, d.w, d.y}, {d.w, d.y, d.x}, {d.x, d.y, d.w}} {
			if _, err := n.workspaceSize(convDirection(dir), d, 5); err != nil {
				t.Fatal(err)
			}
			c := f.calls[len(f.calls)-1]
			if got := [3]uintptr{c.args[1], c.args[2], c.args[4]}; got != want || c.args[3] != d.conv[dir] || c.args[0] != 0xdd00 || c.args[5] != 5 {
				t.Errorf("%v workspace query: arguments %v", convDirection(dir), c.args)
			}
		}
		n.destroyDescs(d)
	}
}

// TestCuDNNBFloat16Descriptors: autocast's geometries are described as
// bfloat16 tensors (CUDNN_DATA_BFLOAT16 = 9) in NHWC (1; the filter KRSC)
// or NCHW, with float32 sums on the convolution descriptor and tensor-op
// math whether TF32 is on or not; the algorithm search then takes
// tensor-op results, which a float32 geometry without TF32 does not.
func TestCuDNNBFloat16Descriptors(t *testing.T) {
	g := convDescGeom{n: 4, c: 32, h: 28, w: 20, k: 48, r: 3, s: 3, strideH: 1, strideW: 1, padH: 1, padW: 1,
		dilH: 1, dilW: 1, groups: 1, oh: 28, ow: 20, dtype: cudnnDataBFloat16}
	for _, nhwc := range []bool{true, false} {
		g.nhwc = nhwc
		f := newFakeDNN(t, nil)
		n, err := newDNN(nil, f.syms, f, 0, false)
		if err != nil {
			t.Fatal(err)
		}
		d, err := n.newConvDescs(g)
		if err != nil {
			t.Fatal(err)
		}
		format := uintptr(cudnnTensorNCHW)
		if nhwc {
			format = cudnnTensorNHWC
		}
		check := func(what, setter string, desc uintptr, want []uintptr) {
			t.Helper()
			if got := f.sets[setter][desc]; !reflect.DeepEqual(got, want) {
				t.Errorf("nhwc=%v %s: %s arguments %v, want %v", nhwc, what, setter, got, want)
			}
		}
		check("x", "setTensor4d", d.x, []uintptr{format, 9, 4, 32, 28, 20})
		check("y", "setTensor4d", d.y, []uintptr{format, 9, 4, 48, 28, 20})
		check("w", "setFilter4d", d.w, []uintptr{9, format, 48, 32, 3, 3})
		for dir, c := range d.conv {
			check(convDirection(dir).String(), "setConv2d", c, []uintptr{1, 1, 1, 1, 1, 1, cudnnCrossCorrelation, cudnnDataFloat})
			check(convDirection(dir).String(), "setConvMath", c, []uintptr{cudnnTensorOpMath})
		}
		res := []cudnnAlgoPerf{{Algo: 1, MathType: cudnnTensorOpMath, Determinism: cudnnDeterministic}}
		if a, ok := n.pickAlgoFor(cudnnDataBFloat16, res, true, 1<<20, true); !ok || a.mathType != cudnnTensorOpMath {
			t.Errorf("bfloat16: a tensor-op result: picked %+v (%v), want it with its math type", a, ok)
		}
		if _, ok := n.pickAlgoFor(cudnnDataFloat, res, true, 1<<20, true); ok {
			t.Error("float32 without TF32: a tensor-op result was picked")
		}
		n.destroyDescs(d)
	}
}

func TestCuDNNGEMMClassOnly(t *testing.T) {
	for _, c := range []struct {
		dir  convDirection
		algo int
		want bool
	}{
		{dirForward, 1, true}, {dirForward, 2, true}, {dirForward, 4, false}, {dirForward, 6, false},
		{dirBackwardData, 1, true}, {dirBackwardData, 2, false}, {dirBackwardData, 4, false},
		{dirBackwardFilter, 3, true}, {dirBackwardFilter, 2, false}, {dirBackwardFilter, 4, false},
	} {
		if got := gemmClassAlgo(c.dir, c.algo); got != c.want {
			t.Errorf("gemmClassAlgo(%v, %d) = %v, want %v", c.dir, c.algo, got, c.want)
		}
	}
}

func TestCuDNNPickAlgo(t *testing.T) {
	f := newFakeDNN(t, nil)
	res := f.perf["fwdFind"]
	// A default-math result counts without TF32, and runs as FMA.
	dflt := append([]cudnnAlgoPerf{{Algo: 5, Time: 0.05, Memory: fakeWorkspace(5), Determinism: 1, MathType: cudnnDefaultMath}}, res...)
	n := &DNN{}
	if a, ok := n.pickAlgo(dflt, true, 1<<20, true); !ok || a.algo != 5 || a.mathType != cudnnFMAMath {
		t.Errorf("a CUDNN_DEFAULT_MATH result without TF32: picked %+v (%v), want algo 5 with FMA math", a, ok)
	}
	n.tf32 = true
	if a, _ := n.pickAlgo(res, true, 1<<20, true); a.mathType != cudnnTensorOpAllowConversion {
		t.Errorf("with TF32: math type %d, want the result's %d", a.mathType, cudnnTensorOpAllowConversion)
	}
	for _, c := range []struct {
		tf32, deterministic bool
		limit               int
		want                int // -1: none
	}{
		{false, true, 1 << 20, 2},
		{true, true, 1 << 20, 4},
		{false, false, 1 << 20, 1},
		{true, true, int(fakeWorkspace(2)), 2}, // 4 needs more than the limit
		{false, true, int(fakeWorkspace(1)), -1},
	} {
		n := &DNN{tf32: c.tf32}
		a, ok := n.pickAlgo(res, c.deterministic, c.limit, true)
		got := a.algo
		if !ok {
			got = -1
		}
		if got != c.want {
			t.Errorf("tf32=%v deterministic=%v limit %d: picked %d, want %d", c.tf32, c.deterministic, c.limit, got, c.want)
		}
		if ok && (a.workspace != int(fakeWorkspace(uintptr(a.algo))) || !a.measured) {
			t.Errorf("picked %+v: workspace or measured flag lost", a)
		}
	}
}

// resnetGeom is a ResNet-sized geometry no register-tiled kernel takes.
func resnetGeom(relu bool) tensor.ConvGeom {
	return tensor.ConvGeom{N: 2, C: 64, H: 14, W: 14, K: 64, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1, ReLU: relu}
}

func TestCuDNNConvForwardDispatch(t *testing.T) {
	b, rec, f := fakeBackend(t, false)
	g := resnetGeom(true)
	yLen := g.N * g.K * g.OutH() * g.OutW()
	y, x, w, bias := recBuf(t, b, yLen), recBuf(t, b, g.N*g.C*g.H*g.W), recBuf(t, b, g.WeightLen()), recBuf(t, b, g.K)
	for range 2 {
		b.Conv2d(y, x, w, bias, g)
	}
	if f.count("fwdFind") != 1 || b.dnn.searches != 1 {
		t.Errorf("two calls of one geometry searched %d times, want once (then cached)", f.count("fwdFind"))
	}
	if f.count("fwd") != 2 {
		t.Fatalf("%d cudnnConvolutionForward calls, want 2", f.count("fwd"))
	}
	c := f.last("fwd")
	if c.alpha != 1 || c.beta != 0 {
		t.Errorf("forward alpha, beta = %v, %v; want 1, 0", c.alpha, c.beta)
	}
	if c.args[3] != b.f32("", x) || c.args[5] != b.f32("", w) || c.args[12] != b.f32("", y) {
		t.Errorf("forward buffers %#x %#x %#x, want x, w, y", c.args[3], c.args[5], c.args[12])
	}
	if c.args[7] != 2 || c.args[9] != uintptr(fakeWorkspace(2)) {
		t.Errorf("forward ran algorithm %d with %d workspace bytes, want the search's pick 2 with %d", c.args[7], c.args[9], fakeWorkspace(2))
	}
	find := f.last("fwdFind")
	if find.args[7] != b.f32("", y) || find.args[12] == 0 {
		t.Errorf("search wrote into %#x with %d workspace bytes, want y and a workspace", find.args[7], find.args[12])
	}
	if m := f.last("setConvMath"); m.args[0] != b.dnn.plans[mustDescGeom(t, b, g)].descs.conv[dirForward] || m.args[1] != cudnnFMAMath {
		t.Errorf("before running: math type call %v", m.args)
	}
	if rec.gemms != 0 || rec.launches["ember_im2col"] != 0 {
		t.Errorf("the cuDNN path also ran %d GEMMs and %d im2col", rec.gemms, rec.launches["ember_im2col"])
	}
	if rec.launches["ember_add_bias"] != 2 || rec.launches["ember_relu"] != 2 {
		t.Errorf("bias and ReLU passes: %d, %d; want 2 each", rec.launches["ember_add_bias"], rec.launches["ember_relu"])
	}

	// Another geometry is searched for on its own.
	g2 := g
	g2.K = 96 // (a 7x7 output, stride 2, would stay on im2col: cudnnForward)
	b.Conv2d(recBuf(t, b, g2.N*g2.K*g2.OutH()*g2.OutW()), x, recBuf(t, b, g2.WeightLen()), tensor.Buffer{}, g2)
	if f.count("fwdFind") != 2 || len(b.dnn.plans) != 2 {
		t.Errorf("a second geometry: %d searches, %d plans; want 2, 2", f.count("fwdFind"), len(b.dnn.plans))
	}

	// While a graph is captured: the heuristic, not a search, and nothing
	// kept.
	g3 := g
	g3.K = 48
	y3 := recBuf(t, b, g3.N*g3.K*g3.OutH()*g3.OutW())
	b.capturing.Store(true)
	b.Conv2d(y3, x, w, tensor.Buffer{}, g3)
	b.Conv2d(y3, x, w, tensor.Buffer{}, g3)
	b.capturing.Store(false)
	if f.count("fwdFind") != 2 || f.count("fwdGet") != 2 {
		t.Errorf("captured: %d searches, %d heuristic queries; want 2 (earlier) and 2", f.count("fwdFind"), f.count("fwdGet"))
	}
	if c := f.last("fwd"); c.args[7] != 2 {
		t.Errorf("captured forward ran algorithm %d, want the heuristic's 2", c.args[7])
	}

	// LeNet's second convolution stays on the register-tiled kernels.
	lenet := tensor.ConvGeom{N: 4, C: 20, H: 12, W: 12, K: 50, R: 5, S: 5, StrideH: 1, StrideW: 1}
	before := f.count("fwd")
	b.Conv2d(recBuf(t, b, 4*50*8*8), recBuf(t, b, 4*20*12*12), recBuf(t, b, lenet.WeightLen()), tensor.Buffer{}, lenet)
	if f.count("fwd") != before {
		t.Error("LeNet's geometry went to cuDNN")
	}
}

// groupedGeom is resnetGeom in two groups: both directions go to cuDNN
// (cudnnBackward).
func groupedGeom(relu bool) tensor.ConvGeom {
	g := resnetGeom(relu)
	g.Groups = 2
	return g
}

func mustDescGeom(t *testing.T, b *Backend, g tensor.ConvGeom) convDescGeom {
	t.Helper()
	d, ok := b.descGeom(convShapeOf("test", g))
	if !ok {
		t.Fatalf("%+v: not a cuDNN geometry", g)
	}
	return d
}

func TestCuDNNConvBackwardDispatch(t *testing.T) {
	b, rec, f := fakeBackend(t, false)
	g := groupedGeom(true)
	xLen, yLen := g.N*g.C*g.H*g.W, g.N*g.K*g.OutH()*g.OutW()
	dx, dw, db := recBuf(t, b, xLen), recBuf(t, b, g.WeightLen()), recBuf(t, b, g.K)
	dy, x, w, y := recBuf(t, b, yLen), recBuf(t, b, xLen), recBuf(t, b, g.WeightLen()), recBuf(t, b, yLen)
	b.Conv2dBackward(dx, dw, db, dy, x, w, y, g)
	if rec.gemms != 0 || rec.launches["ember_col2im"] != 0 {
		t.Errorf("the cuDNN path also ran %d GEMMs, %d col2im", rec.gemms, rec.launches["ember_col2im"])
	}
	if rec.launches["ember_relu_backward"] != 1 || rec.launches["ember_bias_grad_rows"] == 0 {
		t.Errorf("mask and bias passes: %d relu_backward, %d bias_grad_rows", rec.launches["ember_relu_backward"], rec.launches["ember_bias_grad_rows"])
	}
	data, filter := f.last("bwd"), f.last("bwdFilter")
	// The ReLU's mask makes dy a workspace: both read the same masked copy.
	if data.args[5] == b.f32("", dy) || data.args[5] != filter.args[5] {
		t.Errorf("gradients read dy at %#x and %#x, want one masked copy (not dy itself)", data.args[5], filter.args[5])
	}
	if data.args[3] != b.f32("", w) || data.args[12] != b.f32("", dx) || data.alpha != 1 || data.beta != 0 {
		t.Errorf("data gradient: w %#x, dx %#x, alpha %v, beta %v; want w, dx, 1, 0 (overwrite)", data.args[3], data.args[12], data.alpha, data.beta)
	}
	if filter.args[3] != b.f32("", x) || filter.args[12] != b.f32("", dw) || filter.alpha != 1 || filter.beta != 1 {
		t.Errorf("filter gradient: x %#x, dw %#x, alpha %v, beta %v; want x, dw, 1, 1 (accumulate)", filter.args[3], filter.args[12], filter.alpha, filter.beta)
	}
	if s := f.last("bwdFilterFind"); s.args[7] == b.f32("", dw) {
		t.Error("the filter search wrote into dw, which accumulates")
	}
	if s := f.last("bwdDataFind"); s.args[7] != b.f32("", dx) {
		t.Errorf("the data search wrote into %#x, want dx (overwritten anyway)", s.args[7])
	}

	// Only dw, no ReLU: dy itself, no mask pass, no data gradient.
	g.ReLU = false
	b.Conv2dBackward(tensor.Buffer{}, dw, tensor.Buffer{}, dy, x, tensor.Buffer{}, tensor.Buffer{}, g)
	if c := f.last("bwdFilter"); c.args[5] != b.f32("", dy) || f.count("bwd") != 1 || rec.launches["ember_relu_backward"] != 1 {
		t.Errorf("dw only: read dy at %#x, %d data gradients, %d masks", c.args[5], f.count("bwd"), rec.launches["ember_relu_backward"])
	}
	if f.count("bwdFilterFind") != 1 {
		t.Errorf("%d filter searches, want 1 (the plan keeps ReLU out of its key)", f.count("bwdFilterFind"))
	}
}

func TestCuDNNFallbackWithoutDeterministicAlgorithm(t *testing.T) {
	b, rec, f := fakeBackend(t, false)
	for i := range f.perf["bwdFilterFind"] {
		f.perf["bwdFilterFind"][i].Determinism = 0
	}
	g := groupedGeom(false)
	xLen, yLen := g.N*g.C*g.H*g.W, g.N*g.K*g.OutH()*g.OutW()
	dx, dw, dy, x, w := recBuf(t, b, xLen), recBuf(t, b, g.WeightLen()), recBuf(t, b, yLen), recBuf(t, b, xLen), recBuf(t, b, g.WeightLen())
	for range 2 {
		b.Conv2dBackward(dx, dw, tensor.Buffer{}, dy, x, w, tensor.Buffer{}, g)
	}
	if f.count("bwd") != 0 || f.count("bwdFilter") != 0 {
		t.Errorf("cuDNN ran %d data and %d filter gradients; want none (the whole pass falls back)", f.count("bwd"), f.count("bwdFilter"))
	}
	if rec.gemms == 0 || rec.launches["ember_col2im"] != 2 {
		t.Errorf("fallback: %d GEMMs, %d col2im; want the im2col path twice", rec.gemms, rec.launches["ember_col2im"])
	}
	if f.count("bwdFilterFind") != 1 {
		t.Errorf("%d filter searches, want 1 (the failure is kept)", f.count("bwdFilterFind"))
	}
	if d := b.dnn.describe(mustDescGeom(t, b, g)); !strings.Contains(d, "backward filter: im2col") {
		t.Errorf("plan summary %q does not say the filter gradient falls back", d)
	}
}

// TestCuDNNTimedCandidates: by default a geometry's first call times the
// first few algorithms that cuDNN's heuristics rank and that qualify, each
// run once to warm up and once timed, and keeps the fastest; one that
// qualifies alone is taken untimed, and one over the workspace cap is not
// run.
func TestCuDNNTimedCandidates(t *testing.T) {
	b, _, f := fakeBackend(t, false)
	b.opt.ConvSearchAll = false
	f.perf["fwdGet"] = []cudnnAlgoPerf{
		{Algo: 1, Time: 0.1, Memory: fakeWorkspace(1), Determinism: 1, MathType: cudnnFMAMath},
		{Algo: 5, Time: 0.1, Memory: fakeWorkspace(5), Determinism: 1, MathType: cudnnFMAMath}, // FFT: never
		{Algo: 0, Time: 0.2, Memory: fakeWorkspace(0), Determinism: 1, MathType: cudnnFMAMath},
		{Algo: 2, Time: 0.3, Memory: fakeWorkspace(2), Determinism: 1, MathType: cudnnFMAMath},
	}
	deviceTime := map[uintptr]time.Duration{1: 3 * time.Millisecond, 0: time.Millisecond, 2: 2 * time.Millisecond}
	var timed []uintptr
	b.dnn.clock = func(warm, run func() error) (time.Duration, error) {
		if err := warm(); err != nil {
			return 0, err
		}
		if err := run(); err != nil {
			return 0, err
		}
		a := f.last("fwd").args[7]
		timed = append(timed, a)
		return deviceTime[a], nil
	}
	g := resnetGeom(false)
	y, x, w := recBuf(t, b, g.N*g.K*g.OutH()*g.OutW()), recBuf(t, b, g.N*g.C*g.H*g.W), recBuf(t, b, g.WeightLen())
	b.Conv2d(y, x, w, tensor.Buffer{}, g)
	if !slices.Equal(timed, []uintptr{1, 0, 2}) {
		t.Errorf("timed algorithms %v, want the heuristics' qualifying order [1 0 2]", timed)
	}
	if f.count("fwdFind") != 0 || f.count("fwd") != 7 || b.dnn.searches != 1 {
		t.Errorf("%d FindEx, %d forward runs, %d searches; want 0, 3x2 timed + 1, 1", f.count("fwdFind"), f.count("fwd"), b.dnn.searches)
	}
	if c := f.last("fwd"); c.args[7] != 0 || c.args[9] != uintptr(fakeWorkspace(0)) {
		t.Errorf("ran algorithm %d with %d workspace bytes, want the fastest, 0, with %d", c.args[7], c.args[9], fakeWorkspace(0))
	}
	b.Conv2d(y, x, w, tensor.Buffer{}, g)
	if len(timed) != 3 || f.count("fwdGet") != 1 {
		t.Errorf("a second call timed again or asked the heuristics again (%d timings, %d queries)", len(timed), f.count("fwdGet"))
	}

	// A cap that leaves out algorithm 2 (12 KiB): two are timed. A cap
	// that leaves one: it is taken untimed.
	for _, c := range []struct {
		limit int
		timed []uintptr
		want  uintptr
	}{{8 << 10, []uintptr{1, 0}, 0}, {4 << 10, nil, 0}} {
		b.opt.MemoryLimit = 8 * c.limit
		g.K++ // a new geometry
		timed = nil
		b.Conv2d(recBuf(t, b, g.N*g.K*g.OutH()*g.OutW()), x, recBuf(t, b, g.WeightLen()), tensor.Buffer{}, g)
		if !slices.Equal(timed, c.timed) || f.last("fwd").args[7] != c.want {
			t.Errorf("cap %d: timed %v and ran %d, want %v and %d", c.limit, timed, f.last("fwd").args[7], c.timed, c.want)
		}
	}
}

// TestCuDNNCandidatesTensorCores: for bfloat16 at channel counts that
// tensor cores take, the candidates leave out the other math type unless
// nothing else qualifies.
func TestCuDNNCandidatesTensorCores(t *testing.T) {
	b, _, f := fakeBackend(t, false)
	n := b.dnn.n
	fma := cudnnAlgoPerf{Algo: 1, Determinism: 1, MathType: cudnnDefaultMath}
	tc1 := cudnnAlgoPerf{Algo: 1, Determinism: 1, MathType: cudnnTensorOpMath}
	tc0 := cudnnAlgoPerf{Algo: 0, Determinism: 1, MathType: cudnnTensorOpMath}
	descs := func(tc bool) convDescs {
		return convDescs{x: 1, y: 2, w: 3, conv: [dirCount]uintptr{4, 5, 6}, dtype: cudnnDataBFloat16, tensorCores: tc}
	}
	for _, c := range []struct {
		perf []cudnnAlgoPerf
		tc   bool
		want []int // algo*10 + math type
	}{
		{[]cudnnAlgoPerf{fma, tc1, tc0}, true, []int{10 + cudnnTensorOpMath, cudnnTensorOpMath}},
		{[]cudnnAlgoPerf{fma, tc1, tc0}, false, []int{10 + cudnnDefaultMath, 10 + cudnnTensorOpMath, cudnnTensorOpMath}},
		{[]cudnnAlgoPerf{fma}, true, []int{10 + cudnnDefaultMath}},
	} {
		f.perf["fwdGet"] = c.perf
		got, err := n.candidates(dirForward, descs(c.tc), true, 1<<20, 3)
		var ids []int
		for _, a := range got {
			ids = append(ids, a.algo*10+a.mathType)
		}
		if err != nil || !slices.Equal(ids, c.want) {
			t.Errorf("tensor cores %v, results %v: candidates %v (%v), want %v", c.tc, c.perf, ids, err, c.want)
		}
	}
}
