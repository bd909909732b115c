package cuda

// Convolutions through cuDNN (cudnn.go's binding), where the library is
// present and the geometry is not one of LeNet's, which keep their
// register-tiled kernels (conv_rt.go); everything else that cuDNN cannot
// take falls back to conv.go's im2col + cuBLAS path.
//
// Algorithms are chosen once per geometry and direction, like PyTorch's
// cudnn.benchmark: the first call of a geometry times every algorithm with
// cudnnFind*AlgorithmEx on the call's own buffers (the filter gradient's
// search writes into scratch, not into dw, which accumulates) and keeps the
// fastest that qualifies. While a graph is being captured a search cannot
// run (it waits for the GPU), so an uncached geometry then takes cuDNN's
// heuristic pick (Get_v7, host only), uncached.
//
// Qualifies: deterministic (CUDNN_DETERMINISTIC) in all three directions,
// so that the same inputs give the same bits on every run as the rest of
// the backend does; that rules out the atomics-based backward algorithms
// (data ALGO_0, filter ALGO_0 and ALGO_3). Without TF32 only FMA-math
// results count (CUDNN_FMA_MATH on the descriptor: CUDNN_DEFAULT_MATH lets
// cuDNN round to TF32 on Ampere and later); with BackendOptions.TF32 any
// math type does. Workspaces come from the caching allocator, at most
// cudnnSearchWorkspace bytes.
//
// Bias and ReLU are separate passes: forward add_bias, then relu, after the
// convolution; backward relu_backward into a workspace (the masked dy)
// and the bias gradient from bias_grad_rows.

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/ember-ml/ember/tensor"
)

// cudnnSearchWorkspace caps the workspace an algorithm may use (and the
// searches are given): the FFT algorithms ask for gigabytes at ResNet
// sizes and are rarely the fastest.
const cudnnSearchWorkspace = 256 << 20

// errCuDNNOff is the reason cuDNN is not used when an option turned it off.
var errCuDNNOff = errors.New("cuda: cuDNN turned off (BackendOptions.NoCuDNN, EMBER_CUDNN=0)")

// convPlan is one geometry's descriptors and its algorithm per direction.
type convPlan struct {
	descs  convDescs
	algo   [dirCount]convAlgo
	found  [dirCount]bool  // algo was measured and is kept
	failed [dirCount]error // no algorithm qualifies: this direction takes im2col
}

// dnnConvs is the Backend's cuDNN state. mu serializes every use of the
// handle and the plans.
type dnnConvs struct {
	mu       sync.Mutex
	n        *DNN
	plans    map[convDescGeom]*convPlan
	searches int // FindEx calls made (tests)
}

func newDNNConvs(n *DNN) *dnnConvs {
	return &dnnConvs{n: n, plans: map[convDescGeom]*convPlan{}}
}

func (s *dnnConvs) close() error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, p := range s.plans {
		_ = s.n.with(func() error { s.n.destroyDescs(p.descs); return nil })
		delete(s.plans, k)
	}
	return s.n.Close()
}

// CuDNN reports the cuDNN version the backend's convolutions use, or why
// they use none (not installed, too old, turned off).
func (b *Backend) CuDNN() (version int, err error) {
	if b.dnn == nil {
		if b.dnnErr == nil {
			return 0, errors.New("cuda: cuDNN not opened")
		}
		return 0, b.dnnErr
	}
	return b.dnn.n.Version(), nil
}

// openCuDNN opens cuDNN for the backend unless turned off; without it the
// convolutions take the im2col path, and CuDNN says why.
func (b *Backend) openCuDNN() {
	if b.opt.NoCuDNN {
		b.dnnErr = errCuDNNOff
		return
	}
	n, err := b.dev.NewDNN(b.stream, b.opt.TF32)
	if err != nil {
		b.dnnErr = err
		return
	}
	b.dnn = newDNNConvs(n)
}

// descGeom is c as cuDNN's descriptors take it; ok is false where cuDNN
// is not used: no backend handle, nothing to compute, a tensor over 2^31
// elements (cuDNN's legacy descriptors count in int), or a geometry that
// LeNet's register-tiled kernels take.
func (b *Backend) descGeom(c convShape) (g convDescGeom, ok bool) {
	if b.dnn == nil || c.yLen == 0 || c.crs == 0 || c.xLen > math.MaxInt32 || c.yLen > math.MaxInt32 || c.wLen > math.MaxInt32 {
		return g, false
	}
	if b.rtDW(c, false) != nil || b.rtDX(c, false) != nil {
		return g, false
	}
	cg := c.g
	dh, dw := cg.Dilation()
	return convDescGeom{n: cg.N, c: cg.C, h: cg.H, w: cg.W, k: cg.K, r: cg.R, s: cg.S,
		strideH: cg.StrideH, strideW: cg.StrideW, padH: cg.PadH, padW: cg.PadW,
		dilH: dh, dilW: dw, groups: c.groups, oh: c.oh, ow: c.ow, dtype: cudnnDataFloat}, true
}

// plan returns g's plan, creating its descriptors on first use. When
// cuDNN rejects them every direction of the plan is marked failed, so that
// g takes im2col from then on. s.mu is held.
func (s *dnnConvs) plan(g convDescGeom) *convPlan {
	if p, ok := s.plans[g]; ok {
		return p
	}
	p := &convPlan{}
	err := s.n.with(func() (err error) {
		p.descs, err = s.n.newConvDescs(g)
		return err
	})
	if err != nil {
		for d := range p.failed {
			p.failed[d] = err
		}
	}
	s.plans[g] = p
	return p
}

// algoFor returns the algorithm of direction dir for plan p, searching on
// first use with the buffers p1, p2 (inputs) and p3 (overwritten; 0 asks
// for scratch of p3Bytes). ok is false when this direction falls back to
// im2col. s.mu is held.
func (b *Backend) algoFor(op string, p *convPlan, dir convDirection, p1, p2, p3 uintptr, p3Bytes int) (convAlgo, bool) {
	s := b.dnn
	if p.failed[dir] != nil {
		return convAlgo{}, false
	}
	if p.found[dir] {
		return p.algo[dir], true
	}
	if b.capturing.Load() {
		var a convAlgo
		err := s.n.with(func() (err error) {
			a, err = s.n.heuristicAlgo(dir, p.descs, true, cudnnSearchWorkspace)
			return err
		})
		return a, err == nil
	}
	limit := cudnnSearchWorkspace
	if m := b.opt.MemoryLimit; m > 0 {
		limit = min(limit, m/8)
	}
	var wsBytes int
	_ = s.n.with(func() error { wsBytes = s.n.maxWorkspace(dir, p.descs, limit); return nil })
	var ws Block
	if wsBytes > 0 {
		var err error
		if ws, err = b.alloc.Alloc(wsBytes, b.stream); err != nil {
			ws, wsBytes = Block{}, 0 // search among the algorithms that need none
		}
		defer b.release(ws)
	}
	if p3 == 0 {
		scratch := b.workspace(op, p3Bytes)
		defer b.release(scratch)
		p3 = scratch.Ptr()
	}
	var a convAlgo
	err := s.n.with(func() (err error) {
		a, err = s.n.findAlgo(dir, p.descs, p1, p2, p3, ws.Ptr(), wsBytes, true)
		return err
	})
	s.searches++
	if err != nil {
		p.failed[dir] = err
		return convAlgo{}, false
	}
	p.algo[dir], p.found[dir] = a, true
	return a, true
}

// runDNN queues direction dir with algorithm a and its workspace.
func (b *Backend) runDNN(op string, p *convPlan, dir convDirection, a convAlgo, p1, p2 uintptr, beta float32, p3 uintptr) {
	var ws Block
	if a.workspace > 0 {
		ws = b.workspace(op, a.workspace)
		defer b.release(ws)
	}
	n := b.dnn.n
	devCheck(op, n.with(func() error { return n.run(dir, p.descs, a, 1, p1, p2, beta, p3, ws.Ptr()) }))
}

// Where cuDNN is faster than im2col + cuBLAS, measured on the H200 at
// ResNet-9's shapes (batch 512, 3x3, deterministic algorithms;
// docs/performance.md). In full FP32 (FMA kernels): the forward pass for
// output planes of 14x14 and more (0.72-0.88x im2col's time; at 7x7 and
// 3x3 it took 1.3-1.5x), and neither backward pass (2.6x, 1.3x, 1.5x,
// 1.8x, 1.6x, 1.6x). With TF32 cuDNN's tensor-core implicit GEMMs take
// every pass of every geometry (see cudnnAllWithTF32). Grouped
// convolutions go to cuDNN in both directions: im2col runs one GEMM per
// group.
const cudnnMinForwardPlane = 14 * 14

// cudnnAllWithTF32: with TF32 every convolution cuDNN takes goes to it,
// forward and backward (measured: docs/performance.md, "Convolutions in
// three precisions").
const cudnnAllWithTF32 = true

func (b *Backend) cudnnForward(c convShape) bool {
	return b.dnnEverywhere || c.groups > 1 || c.oh*c.ow >= cudnnMinForwardPlane || (b.opt.TF32 && cudnnAllWithTF32)
}

func (b *Backend) cudnnBackward(c convShape) bool {
	return b.dnnEverywhere || c.groups > 1 || (b.opt.TF32 && cudnnAllWithTF32)
}

// conv2dCuDNN is Conv2d through cuDNN; false (nothing queued) where cuDNN
// is not used for c.
func (b *Backend) conv2dCuDNN(op string, py, px, pw, pbias uintptr, c convShape) bool {
	g, ok := b.descGeom(c)
	if !ok || !b.cudnnForward(c) {
		return false
	}
	s := b.dnn
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.plan(g)
	// cuDNN queues on the main stream behind the executor's back: first
	// join a detached side task, as every main-stream operation does.
	devCheck(op, b.x.settle())
	a, ok := b.algoFor(op, p, dirForward, px, pw, py, 0)
	if !ok {
		return false
	}
	b.runDNN(op, p, dirForward, a, px, pw, 0, py)
	if pbias != 0 {
		b.launch(op, b.k.addBias, c.yLen, py, pbias, int64(c.yLen), int64(c.g.K), int64(c.p))
	}
	if c.g.ReLU {
		b.launch(op, b.k.relu, c.yLen, py, py, int64(c.yLen))
	}
	return true
}

// conv2dBackwardCuDNN is Conv2dBackward (with dx or dw wanted) through
// cuDNN; false (nothing queued) where cuDNN is not used for c.
func (b *Backend) conv2dBackwardCuDNN(op string, pdx, pdw, pdb, pdy, px, pw, pmask uintptr, c convShape) bool {
	g, ok := b.descGeom(c)
	if !ok || !b.cudnnBackward(c) {
		return false
	}
	s := b.dnn
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.plan(g)
	devCheck(op, b.x.settle())
	// Both algorithms first, so that a direction cuDNN cannot take sends
	// the whole backward pass to im2col before anything is queued.
	var da, fa convAlgo
	if pdx != 0 {
		if da, ok = b.algoFor(op, p, dirBackwardData, pw, pdy, pdx, 0); !ok {
			return false
		}
	}
	if pdw != 0 {
		if fa, ok = b.algoFor(op, p, dirBackwardFilter, px, pdy, 0, 4*c.wLen); !ok {
			return false
		}
	}
	if pdb != 0 {
		b.biasGrad(op, pdb, pdy, 0, pmask, c.g.N, c.g.K, c.p, true)
	}
	gdy := pdy
	if pmask != 0 {
		masked := b.workspace(op, 4*c.yLen)
		defer b.release(masked)
		gdy = masked.Ptr()
		b.launch(op, b.k.reluBackward, c.yLen, gdy, pdy, pmask, int64(c.yLen), flag(false))
	}
	if pdw != 0 {
		b.runDNN(op, p, dirBackwardFilter, fa, px, gdy, 1, pdw) // dw += ...
	}
	if pdx != 0 {
		b.runDNN(op, p, dirBackwardData, da, pw, gdy, 0, pdx)
	}
	return true
}

// describe is a one-line summary of the plans, for tests and benchmarks.
func (s *dnnConvs) describe(g convDescGeom) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.plans[g]
	if !ok {
		return "no plan"
	}
	out := ""
	for d := range dirCount {
		switch {
		case p.failed[d] != nil:
			out += fmt.Sprintf("%v: im2col (%v); ", d, p.failed[d])
		case p.found[d]:
			out += fmt.Sprintf("%v: %v; ", d, p.algo[d])
		}
	}
	return out
}

// ---- bfloat16 (autocast) ----

// Autocast's convolutions (tensor.LowPrecisionConvBackend) run through
// cuDNN with bfloat16 tensors and float32 sums (CUDNN_DATA_BFLOAT16
// descriptors, a float32 convolution descriptor: cuDNN's BFLOAT16_CONFIG,
// which wants x, w and y of one type). The float32 side is met by fused
// casts (kernels/cast.cu): the output is cast back with the bias and ReLU
// (ember_conv_out_bf16), dy is masked and cast in one pass
// (ember_conv_grad_bf16), and the bfloat16 gradients are written into dx or
// added into dw (ember_add_bf16_f32). Without cuDNN, or for a geometry it
// refuses, the convolution stays float32 (ConvLowp false), or, when cuDNN
// refuses only at the first run, takes the float32 path on float32 copies.

// lowpGeom is c as a bfloat16 cuDNN geometry; false where cuDNN does not
// take it.
func (b *Backend) lowpGeom(c convShape) (convDescGeom, bool) {
	g, ok := b.descGeom(c)
	g.dtype = cudnnDataBFloat16
	return g, ok
}

// ConvLowp reports whether g runs in bfloat16 under autocast: where cuDNN
// is open, takes g and accepted its descriptors.
func (b *Backend) ConvLowp(g tensor.ConvGeom) bool {
	const op = "conv2d_lowp"
	c := convShapeOf(op, g)
	if c.yLen == 0 || c.crs == 0 {
		return false
	}
	dg, ok := b.lowpGeom(c)
	if !ok {
		return false
	}
	s := b.dnn
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.plan(dg)
	return p.failed[dirForward] == nil || p.failed[dirBackwardData] == nil || p.failed[dirBackwardFilter] == nil
}

// float32Copy is a float32 copy of the bfloat16 buffer h (the fallback's
// operand); free it when the work using it is queued.
func (b *Backend) float32Copy(h tensor.Buffer) tensor.Buffer {
	f, err := b.Alloc(h.Len, tensor.Float32)
	if err != nil {
		panic(&tensor.Error{Op: "cuda: conv2d_lowp", Err: err})
	}
	b.Cast(f, h)
	return f
}

// Conv2dLowp sets y = conv(x, w) (rounded to bfloat16) + bias, then
// max(y, 0) when g.ReLU, for bfloat16 x and w and float32 y and bias.
func (b *Backend) Conv2dLowp(y, x, w, bias tensor.Buffer, g tensor.ConvGeom) {
	const op = "conv2d_lowp"
	c := convShapeOf(op, g)
	need(op, "y", y, c.yLen)
	need(op, "x", x, c.xLen)
	need(op, "w", w, c.wLen)
	py, px, pw := b.f32(op, y), b.ptr(op, x, tensor.BFloat16), b.ptr(op, w, tensor.BFloat16)
	pbias := b.f32Opt(op, "bias", bias, g.K)
	if c.yLen == 0 {
		return
	}
	if dg, ok := b.lowpGeom(c); ok && c.crs > 0 {
		s := b.dnn
		s.mu.Lock()
		p := s.plan(dg)
		devCheck(op, b.x.settle())
		yh := b.workspace(op, 2*c.yLen)
		a, ok := b.algoFor(op, p, dirForward, px, pw, yh.Ptr(), 0)
		if ok {
			b.runDNN(op, p, dirForward, a, px, pw, 0, yh.Ptr())
		}
		s.mu.Unlock()
		if ok {
			b.launch(op, b.kernel("ember_conv_out_bf16"), c.yLen, py, yh.Ptr(), pbias,
				int64(c.yLen), int64(g.K), int64(c.p), flag(g.ReLU))
			b.release(yh)
			return
		}
		b.release(yh)
	}
	fx, fw := b.float32Copy(x), b.float32Copy(w)
	b.Conv2d(y, fx, fw, bias, g)
	b.Free(fx)
	b.Free(fw)
}

// Conv2dBackwardLowp is Conv2dBackward for bfloat16 x and w and float32
// gradients: dx overwritten, dw and db added into (each skipped when
// empty), dy masked by y under g.ReLU.
func (b *Backend) Conv2dBackwardLowp(dx, dw, db, dy, x, w, y tensor.Buffer, g tensor.ConvGeom) {
	const op = "conv2d_backward_lowp"
	wantDX, wantDW := !dx.Empty(), !dw.Empty()
	if !wantDX && !wantDW && db.Empty() {
		return
	}
	c := convShapeOf(op, g)
	need(op, "dy", dy, c.yLen)
	pdy := b.f32(op, dy)
	var pdx, pdw, px, pw uintptr
	if wantDX {
		need(op, "dx", dx, c.xLen)
		need(op, "w", w, c.wLen)
		pdx, pw = b.f32(op, dx), b.ptr(op, w, tensor.BFloat16)
	}
	if wantDW {
		need(op, "dw", dw, c.wLen)
		need(op, "x", x, c.xLen)
		pdw, px = b.f32(op, dw), b.ptr(op, x, tensor.BFloat16)
	}
	pdb := b.f32Opt(op, "db", db, g.K)
	var pmask uintptr
	if g.ReLU {
		pmask = b.f32Opt(op, "y", y, c.yLen)
	}
	dg, ok := b.lowpGeom(c)
	if c.yLen == 0 || c.crs == 0 || (!wantDX && !wantDW) || !ok || !b.conv2dBackwardLowpCuDNN(op, dg, pdx, pdw, pdb, pdy, px, pw, pmask, c) {
		// The float32 path on float32 copies (it handles the empty cases).
		var fx, fw tensor.Buffer
		if wantDW {
			fx = b.float32Copy(x)
			defer b.Free(fx)
		}
		if wantDX {
			fw = b.float32Copy(w)
			defer b.Free(fw)
		}
		b.Conv2dBackward(dx, dw, db, dy, fx, fw, y, g)
	}
}

// conv2dBackwardLowpCuDNN queues Conv2dBackwardLowp through cuDNN; false,
// with nothing queued, where cuDNN refuses a direction.
func (b *Backend) conv2dBackwardLowpCuDNN(op string, dg convDescGeom, pdx, pdw, pdb, pdy, px, pw, pmask uintptr, c convShape) bool {
	s := b.dnn
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.plan(dg)
	devCheck(op, b.x.settle())
	dyh := b.workspace(op, 2*c.yLen)
	defer b.release(dyh)
	var dxh Block
	var da, fa convAlgo
	ok := true
	if pdx != 0 {
		dxh = b.workspace(op, 2*c.xLen)
		defer b.release(dxh)
		da, ok = b.algoFor(op, p, dirBackwardData, pw, dyh.Ptr(), dxh.Ptr(), 0)
	}
	if ok && pdw != 0 {
		fa, ok = b.algoFor(op, p, dirBackwardFilter, px, dyh.Ptr(), 0, 2*c.wLen)
	}
	if !ok {
		return false
	}
	if pdb != 0 {
		b.biasGrad(op, pdb, pdy, 0, pmask, c.g.N, c.g.K, c.p, true)
	}
	b.launch(op, b.kernel("ember_conv_grad_bf16"), c.yLen, dyh.Ptr(), pdy, pmask, int64(c.yLen))
	if pdw != 0 {
		dwh := b.workspace(op, 2*c.wLen)
		b.runDNN(op, p, dirBackwardFilter, fa, px, dyh.Ptr(), 0, dwh.Ptr())
		b.launch(op, b.kernel("ember_add_bf16_f32"), c.wLen, pdw, dwh.Ptr(), int64(c.wLen), flag(true))
		b.release(dwh)
	}
	if pdx != 0 {
		b.runDNN(op, p, dirBackwardData, da, pw, dyh.Ptr(), 0, dxh.Ptr())
		b.launch(op, b.kernel("ember_add_bf16_f32"), c.xLen, pdx, dxh.Ptr(), int64(c.xLen), flag(false))
	}
	return true
}

var _ tensor.LowPrecisionConvBackend = (*Backend)(nil)
