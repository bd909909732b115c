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
// workspaceCap bytes.
//
// Bias and ReLU are separate passes: forward add_bias, then relu, after the
// convolution; backward relu_backward into a workspace (the masked dy)
// and the bias gradient from bias_grad_rows.

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/ember-ml/ember/tensor"
)

// cudnnSearchWorkspace caps the workspace an algorithm may use (and the
// searches are given): the FFT algorithms ask for gigabytes at ResNet
// sizes and are rarely the fastest. A geometry may have more, twice its
// input and output (workspaceCap): cuDNN's tensor-core kernels for NCHW
// transpose both into their workspace (measured: 150 MB at ResNet-9's
// 28x28 64->128 at batch 512 in bfloat16), and within 256 MiB no TF32
// backward algorithm of that geometry fitted.
const cudnnSearchWorkspace = 256 << 20

// workspaceCap is the most workspace an algorithm of g may use.
func workspaceCap(g convDescGeom) int {
	size := 4
	if g.dtype == cudnnDataBFloat16 {
		size = 2
	}
	return max(cudnnSearchWorkspace, 2*size*(g.n*g.c*g.h*g.w+g.n*g.k*g.oh*g.ow))
}

// errCuDNNOff is the reason cuDNN is not used when an option turned it off.
var errCuDNNOff = errors.New("cuda: cuDNN turned off (BackendOptions.NoCuDNN, EMBER_CUDNN=0)")

// convPlan is one geometry's descriptors and its algorithm per direction.
type convPlan struct {
	geom   convDescGeom
	descs  convDescs
	wsCap  int // workspaceCap
	algo   [dirCount]convAlgo
	found  [dirCount]bool  // algo was measured and is kept
	failed [dirCount]error // no algorithm qualifies: this direction takes im2col
	// padForward says whether the forward pass runs on channels padded
	// to a multiple of 32 (conv_pad.go), through the plan pad; dxForward
	// whether the data gradient runs as a forward pass (conv_dgrad.go),
	// through the plan dxPlan. Each is an alt state.
	padForward, dxForward int
	pad, dxPlan           *convPlan
}

// dnnConvs is the Backend's cuDNN state. mu serializes every use of the
// handle and the plans.
type dnnConvs struct {
	mu       sync.Mutex
	n        *DNN
	plans    map[convDescGeom]*convPlan
	searches int           // searches made (one per plan and direction)
	searchIn time.Duration // and the time they took
	// clock runs warm, then timed, and returns timed's device time.
	clock    func(warm, timed func() error) (time.Duration, error)
	lowpNCHW bool // bfloat16 convolutions in NCHW, not NHWC (benchmarks)
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

// ConvSearches reports how many convolution algorithm searches the
// backend has run (one per geometry and direction, at its first eager
// call) and the time they took, which a first step pays on top of its
// work.
func (b *Backend) ConvSearches() (n int, took time.Duration) {
	if b.dnn == nil {
		return 0, 0
	}
	b.dnn.mu.Lock()
	defer b.dnn.mu.Unlock()
	return b.dnn.searches, b.dnn.searchIn
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
	b.dnn.clock = deviceClock(b.dev, b.stream)
}

// deviceClock times work queued on stream between two timing events.
func deviceClock(dev *Device, stream Stream) func(warm, timed func() error) (time.Duration, error) {
	return func(warm, timed func() error) (time.Duration, error) {
		if err := warm(); err != nil {
			return 0, err
		}
		var ev [2]Event
		for i := range ev {
			e, err := dev.NewEvent(true)
			if err != nil {
				return 0, err
			}
			defer dev.EventDestroy(e)
			ev[i] = e
		}
		if err := dev.RecordEvent(ev[0], stream); err != nil {
			return 0, err
		}
		if err := timed(); err != nil {
			return 0, err
		}
		if err := dev.RecordEvent(ev[1], stream); err != nil {
			return 0, err
		}
		return dev.EventElapsed(ev[0], ev[1])
	}
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
	p := &convPlan{geom: g, wsCap: workspaceCap(g)}
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
		b.convGuesses.Add(1) // CapturePlanned asks for an eager step first
		var a convAlgo
		err := s.n.with(func() (err error) {
			a, err = s.n.heuristicAlgo(dir, p.descs, true, p.wsCap)
			return err
		})
		return a, err == nil
	}
	limit := p.wsCap
	if m := b.opt.MemoryLimit; m > 0 {
		limit = min(limit, m/8)
	}
	if p3 == 0 {
		scratch := b.workspace(op, p3Bytes)
		defer b.release(scratch)
		p3 = scratch.Ptr()
	}
	t0 := time.Now()
	var a convAlgo
	var err error
	how := "FindEx over all"
	if b.opt.ConvSearchAll {
		a, err = b.findAll(p, dir, p1, p2, p3, limit)
	} else {
		a, how, err = b.timeCandidates(p, dir, p1, p2, p3, limit)
	}
	took := time.Since(t0)
	s.searches++
	s.searchIn += took
	if w := b.opt.KernelLog; w != nil {
		fmt.Fprintf(w, "cuda: cuDNN %s algorithm of %s chosen in %.1f ms (%s): %v, err %v\n", dir, p.geom, took.Seconds()*1e3, how, a, err)
	}
	if err != nil {
		p.failed[dir] = err
		return convAlgo{}, false
	}
	p.algo[dir], p.found[dir] = a, true
	return a, true
}

// findAll is cuDNN's FindEx over every algorithm of dir, with the largest
// workspace any of them takes within limit.
func (b *Backend) findAll(p *convPlan, dir convDirection, p1, p2, p3 uintptr, limit int) (a convAlgo, err error) {
	s := b.dnn
	var wsBytes int
	_ = s.n.with(func() error { wsBytes = s.n.maxWorkspace(dir, p.descs, limit); return nil })
	var ws Block
	if wsBytes > 0 {
		if ws, err = b.alloc.Alloc(wsBytes, b.stream); err != nil {
			ws, wsBytes = Block{}, 0 // search among the algorithms that need none
		}
		defer b.release(ws)
	}
	err = s.n.with(func() (err error) {
		a, err = s.n.findAlgo(dir, p.descs, p1, p2, p3, ws.Ptr(), wsBytes, true)
		return err
	})
	return a, err
}

// convSearchCandidates is how many of the heuristics' qualifying
// algorithms a first call times. FindEx over all of them took 80 ms a
// direction for airbench's bfloat16 geometries on the H200, most of it in
// algorithms that never qualify (FFT, Winograd, the nondeterministic
// backward ones) or never win.
const convSearchCandidates = 3

// timeCandidates times the first convSearchCandidates algorithms that
// cuDNN's heuristics rank for dir and that qualify (deterministic, of an
// allowed math type, within limit), on the call's buffers, and returns the
// fastest; where one qualifies it is taken untimed.
func (b *Backend) timeCandidates(p *convPlan, dir convDirection, p1, p2, p3 uintptr, limit int) (a convAlgo, how string, err error) {
	s := b.dnn
	t0 := time.Now()
	var cands []convAlgo
	err = s.n.with(func() (err error) {
		cands, err = s.n.candidates(dir, p.descs, true, limit, convSearchCandidates)
		return err
	})
	how = fmt.Sprintf("heuristics %.1f ms", time.Since(t0).Seconds()*1e3)
	if err != nil {
		return convAlgo{}, how, err
	}
	if len(cands) == 1 {
		return cands[0], how + ", one qualifies", nil
	}
	most := 0
	for _, c := range cands {
		most = max(most, c.workspace)
	}
	var ws Block
	if most > 0 {
		if ws, err = b.alloc.Alloc(most, b.stream); err != nil {
			return cands[0], how + ", no room to time them", nil
		}
		defer b.release(ws)
	}
	best, bestT := -1, time.Duration(0)
	var firstErr error
	for i, c := range cands {
		run := func() error {
			return s.n.with(func() error { return s.n.run(dir, p.descs, c, 1, p1, p2, 0, p3, ws.Ptr()) })
		}
		// The first run loads the algorithm's kernels; the second is timed.
		t, err := s.clock(run, run)
		how += fmt.Sprintf(", algo %d %v", c.algo, t)
		if err != nil {
			firstErr = cmp.Or(firstErr, err)
			continue
		}
		if best < 0 || t < bestT {
			best, bestT = i, t
		}
	}
	if best < 0 {
		return convAlgo{}, how, firstErr
	}
	a = cands[best]
	a.ms, a.measured = float32(bestT.Seconds()*1e3), true
	return a, how, nil
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
// docs/performance.md, "Convolutions in three precisions"). In full FP32
// (FMA kernels): the forward pass for output planes of 14x14 and more
// (0.59-0.89x im2col's time; at 7x7 and 3x3 it took 1.3-1.5x), and
// neither backward pass (1.3-2.5x). With TF32 on tensor cores: every
// forward pass (0.36-0.67x), and the backward passes of planes from 7x7
// with at least 64 rows C·R·S (0.45-0.85x); the first layer's (one input
// channel: 9 rows) took 2.8x and the 3x3 planes' 1.02x. Grouped
// convolutions go to cuDNN in both directions: im2col runs one GEMM per
// group.
const (
	cudnnMinForwardPlane  = 14 * 14
	cudnnTF32MinBackPlane = 7 * 7
	cudnnTF32MinBackRows  = 64
)

func (b *Backend) cudnnForward(c convShape) bool {
	return b.dnnEverywhere || c.groups > 1 || c.oh*c.ow >= cudnnMinForwardPlane || b.opt.TF32
}

func (b *Backend) cudnnBackward(c convShape) bool {
	return b.dnnEverywhere || c.groups > 1 ||
		(b.opt.TF32 && c.oh*c.ow >= cudnnTF32MinBackPlane && c.crs >= cudnnTF32MinBackRows)
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
		b.launch(op, b.kernel("ember_add_bias"), c.yLen, py, pbias, int64(c.yLen), int64(c.g.K), int64(c.p))
	}
	if c.g.ReLU {
		b.launch(op, b.kernel("ember_relu"), c.yLen, py, py, int64(c.yLen))
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
		b.launch(op, b.kernel("ember_relu_backward"), c.yLen, gdy, pdy, pmask, int64(c.yLen), flag(false))
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
// which wants x, w and y of one type). The operands are cast as the
// convolution needs them, fused with a change of layout: x, dy and the
// filter go to bfloat16 NHWC (KRSC) in one pass each (ember_to_nhwc_bf16,
// dy masked by the fused ReLU in the same pass), and the results come back
// to float32 NCHW with the bias and ReLU, or added into dw
// (ember_from_nhwc_bf16). NHWC because cuDNN's tensor-core kernels read it
// directly; for NCHW they transpose into their workspace: a forward and
// backward pass in NCHW took 1.15-1.32x the NHWC time (casts included) at
// ResNet-9's four middle geometries, 0.97x and 0.95x at its first (one
// channel) and its 3x3 planes, 1.16x over the whole network
// (docs/performance.md, "Convolutions in three precisions"). Grouped
// convolutions keep NCHW. Without cuDNN, or for a
// geometry it refuses, the convolution stays float32.

// lowpGeom is c as a bfloat16 cuDNN geometry; false where cuDNN does not
// take it.
func (b *Backend) lowpGeom(c convShape) (convDescGeom, bool) {
	g, ok := b.descGeom(c)
	if !ok {
		return g, false
	}
	g.dtype = cudnnDataBFloat16
	// The tiled casts run channel tiles on grid.y.
	g.nhwc = !b.dnn.lowpNCHW && c.groups == 1 && nhwcChannelTiles(c.g.C) <= maxGridY && nhwcChannelTiles(c.g.K) <= maxGridY
	return g, true
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
	return p.failed[dirForward] == nil
}

// The tiles of the layout casts (kernels/cast.cu): nhwcTileChannels(ch)
// channels by min(nhwcThreads, nhwcTile/that) rows of n·inner. Operands
// with fewer than nhwcSmallInner positions (a filter's taps) take the
// untiled casts instead, a thread per element.
const (
	nhwcTile       = 4096
	nhwcThreads    = 256
	nhwcSmallInner = 32
)

// nhwcRowsMax is cast.cu's EMBER_NHWC_ROWS_MAX: casts to NHWC of at most
// that many channels (an image's) take a thread a row, not the tiles.
const nhwcRowsMax = 4

// nhwcTileChannels is the channels of a cast's tile: the smallest power of
// two from 8 to 64 that holds ch, so that few lanes idle on narrow layers
// (24 channels: a tile of 32) and wide ones move 64 at a time.
func nhwcTileChannels(ch int) int {
	tc := 8
	for tc < ch && tc < 64 {
		tc *= 2
	}
	return tc
}

// nhwcChannelTiles is the grid.y of a cast over ch channels.
func nhwcChannelTiles(ch int) int {
	tc := nhwcTileChannels(ch)
	return (ch + tc - 1) / tc
}

// nhwcGrid is the grid of a cast of n·inner rows of ch channels and its
// tile's channels.
func nhwcGrid(n, ch, inner int) (Dim3, int) {
	tc := nhwcTileChannels(ch)
	tr := min(nhwcThreads, nhwcTile/tc)
	return Dim3{X: (n*inner + tr - 1) / tr, Y: nhwcChannelTiles(ch), Z: 1}, tc
}

// nhwcSlabMax is cast.cu's EMBER_NHWC_SLAB: the most elements of a slab
// [ch][inner] that the slab kernels turn through shared memory.
const nhwcSlabMax = 12288

// nhwcSlab says whether n slabs [ch][inner] (inner < nhwcSmallInner) take
// the slab kernels.
func nhwcSlab(n, ch, inner int) bool { return ch*inner <= nhwcSlabMax && n <= math.MaxInt32 }

// toLowp queues h = bfloat16(src) for src float32 [n, ch, inner], zero
// where mask (0: none) is not positive, laid out as [n, inner, ch] when
// nhwc. With one channel or one position the two layouts are the same
// and the cast is elementwise.
func (b *Backend) toLowp(op string, h, src, mask uintptr, n, ch, inner int, nhwc bool) {
	if n*ch*inner == 0 {
		return
	}
	if !nhwc || ch == 1 || inner == 1 {
		b.launch(op, b.kernel("ember_conv_grad_bf16"), n*ch*inner, h, src, mask, int64(n*ch*inner))
		return
	}
	if inner < nhwcSmallInner && mask == 0 {
		if nhwcSlab(n, ch, inner) {
			b.launchGrid(op, b.kernel("ember_to_nhwc_slab_bf16"), min(n, maxGrid), nhwcThreads,
				append([]any{h, src, i32arg(op, ch), i32arg(op, inner), i32arg(op, n)}, dividerArgs(ch, inner)...)...)
			return
		}
		b.launch(op, b.kernel("ember_to_nhwc_small_bf16"), n*ch*inner, h, src, i32arg(op, ch), i32arg(op, inner), int64(n*ch*inner))
		return
	}
	if ch <= nhwcRowsMax {
		b.launch(op, b.kernel("ember_to_nhwc_rows_bf16"), n*inner, h, src, mask, i32arg(op, ch), i32arg(op, inner), int64(n*inner))
		return
	}
	grid, tc := nhwcGrid(n, ch, inner)
	devCheck(op, b.x.launch(b.kernel("ember_to_nhwc_bf16"), grid, Dim3{X: nhwcThreads, Y: 1, Z: 1},
		[]any{h, src, mask, i32arg(op, ch), i32arg(op, inner), int64(n * inner), i32arg(op, tc)}))
}

// fromLowp queues dst [n, ch, inner] = float32(h) + bias (0: none), then
// ReLU when relu, or dst += float32(h) when accumulate; h is [n, inner,
// ch] when nhwc.
func (b *Backend) fromLowp(op string, dst, h, bias uintptr, n, ch, inner int, relu, accumulate bool, nhwc bool) {
	if n*ch*inner == 0 {
		return
	}
	if !nhwc || ch == 1 || inner == 1 {
		if accumulate {
			b.launch(op, b.kernel("ember_add_bf16_f32"), n*ch*inner, dst, h, int64(n*ch*inner), flag(true))
			return
		}
		b.launch(op, b.kernel("ember_conv_out_bf16"), n*ch*inner, dst, h, bias, int64(n*ch*inner), int64(ch), int64(inner), flag(relu))
		return
	}
	if inner < nhwcSmallInner && bias == 0 && !relu {
		if nhwcSlab(n, ch, inner) {
			b.launchGrid(op, b.kernel("ember_from_nhwc_slab_bf16"), min(n, maxGrid), nhwcThreads,
				append([]any{dst, h, i32arg(op, ch), i32arg(op, inner), i32arg(op, n), flag(accumulate)}, dividerArgs(ch, inner)...)...)
			return
		}
		b.launch(op, b.kernel("ember_from_nhwc_small_bf16"), n*ch*inner, dst, h, i32arg(op, ch), i32arg(op, inner), int64(n*ch*inner), flag(accumulate))
		return
	}
	grid, tc := nhwcGrid(n, ch, inner)
	devCheck(op, b.x.launch(b.kernel("ember_from_nhwc_bf16"), grid, Dim3{X: nhwcThreads, Y: 1, Z: 1},
		[]any{dst, h, bias, i32arg(op, ch), i32arg(op, inner), int64(n * inner), i32arg(op, tc), flag(relu), flag(accumulate)}))
}

// Conv2dLowp sets y = conv(x, w) + bias, then max(y, 0) when g.ReLU, with
// x and w rounded to bfloat16, float32 sums and the convolution rounded to
// bfloat16 before the bias. Where cuDNN refuses g it is Conv2d.
func (b *Backend) Conv2dLowp(y, x, w, bias tensor.Buffer, g tensor.ConvGeom) {
	const op = "conv2d_lowp"
	c := convShapeOf(op, g)
	need(op, "y", y, c.yLen)
	need(op, "x", x, c.xLen)
	need(op, "w", w, c.wLen)
	py, px, pw := b.f32(op, y), b.f32(op, x), b.f32(op, w)
	pbias := b.f32Opt(op, "bias", bias, g.K)
	if c.yLen == 0 {
		return
	}
	if dg, ok := b.lowpGeom(c); ok && c.crs > 0 && b.conv2dLowpCuDNN(op, dg, py, px, pw, pbias, c) {
		return
	}
	b.Conv2d(y, x, w, bias, g)
}

func (b *Backend) conv2dLowpCuDNN(op string, dg convDescGeom, py, px, pw, pbias uintptr, c convShape) bool {
	s := b.dnn
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.plan(dg)
	if p.failed[dirForward] != nil {
		return false
	}
	devCheck(op, b.x.settle())
	g := c.g
	xh, wh, yh := b.workspace(op, 2*c.xLen), b.workspace(op, 2*c.wLen), b.workspace(op, 2*c.yLen)
	defer b.release(xh)
	defer b.release(wh)
	defer b.release(yh)
	b.toLowp(op, xh.Ptr(), px, 0, g.N, g.C, g.H*g.W, dg.nhwc)
	b.toLowp(op, wh.Ptr(), pw, 0, g.K, g.C/c.groups, g.R*g.S, dg.nhwc)
	a, ok := b.algoFor(op, p, dirForward, xh.Ptr(), wh.Ptr(), yh.Ptr(), 0)
	if !ok {
		return false
	}
	b.runDNN(op, p, dirForward, a, xh.Ptr(), wh.Ptr(), 0, yh.Ptr())
	b.fromLowp(op, py, yh.Ptr(), pbias, g.N, g.K, c.p, g.ReLU, false, dg.nhwc)
	return true
}

// Conv2dBackwardLowp is Conv2dBackward with x, w and dy (masked by y under
// g.ReLU) rounded to bfloat16, float32 sums, and the input and weight
// gradients rounded to bfloat16 before dx is overwritten and dw added
// into (each skipped when empty); db is summed from the float32 dy. Where
// cuDNN refuses g it is Conv2dBackward.
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
		pdx, pw = b.f32(op, dx), b.f32(op, w)
	}
	if wantDW {
		need(op, "dw", dw, c.wLen)
		need(op, "x", x, c.xLen)
		pdw, px = b.f32(op, dw), b.f32(op, x)
	}
	pdb := b.f32Opt(op, "db", db, g.K)
	var pmask uintptr
	if g.ReLU {
		pmask = b.f32Opt(op, "y", y, c.yLen)
	}
	if wantDW && c.yLen > 0 && smallFilterGrad(c) {
		// Few taps: our kernel, not cuDNN's (conv_dw_small.go).
		b.filterGradSmall(op, pdw, px, pdy, pmask, c)
		wantDW, pdw, dw = false, 0, tensor.Buffer{}
		if !wantDX {
			if pdb != 0 {
				b.biasGrad(op, pdb, pdy, 0, pmask, g.N, g.K, c.p, true)
			}
			return
		}
	}
	if dg, ok := b.lowpGeom(c); ok && c.yLen > 0 && c.crs > 0 && (wantDX || wantDW) &&
		b.conv2dBackwardLowpCuDNN(op, dg, pdx, pdw, pdb, pdy, px, pw, pmask, c) {
		return
	}
	b.Conv2dBackward(dx, dw, db, dy, x, w, y, g)
}

// conv2dBackwardLowpCuDNN queues Conv2dBackwardLowp through cuDNN; false,
// with nothing but casts into workspaces queued, where cuDNN refuses a
// direction.
func (b *Backend) conv2dBackwardLowpCuDNN(op string, dg convDescGeom, pdx, pdw, pdb, pdy, px, pw, pmask uintptr, c convShape) bool {
	s := b.dnn
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.plan(dg)
	if (pdx != 0 && p.failed[dirBackwardData] != nil) || (pdw != 0 && p.failed[dirBackwardFilter] != nil) {
		return false
	}
	devCheck(op, b.x.settle())
	g := c.g
	dyh := b.workspace(op, 2*c.yLen)
	defer b.release(dyh)
	b.toLowp(op, dyh.Ptr(), pdy, pmask, g.N, g.K, c.p, dg.nhwc)
	var wh, dxh, xh Block
	var da, fa convAlgo
	ok := true
	if pdx != 0 {
		wh, dxh = b.workspace(op, 2*c.wLen), b.workspace(op, 2*c.xLen)
		defer b.release(wh)
		defer b.release(dxh)
		b.toLowp(op, wh.Ptr(), pw, 0, g.K, g.C/c.groups, g.R*g.S, dg.nhwc)
		da, ok = b.algoFor(op, p, dirBackwardData, wh.Ptr(), dyh.Ptr(), dxh.Ptr(), 0)
	}
	if ok && pdw != 0 {
		xh = b.workspace(op, 2*c.xLen)
		defer b.release(xh)
		b.toLowp(op, xh.Ptr(), px, 0, g.N, g.C, g.H*g.W, dg.nhwc)
		fa, ok = b.algoFor(op, p, dirBackwardFilter, xh.Ptr(), dyh.Ptr(), 0, 2*c.wLen)
	}
	if !ok {
		return false
	}
	if pdb != 0 {
		b.biasGrad(op, pdb, pdy, 0, pmask, g.N, g.K, c.p, true)
	}
	if pdw != 0 {
		dwh := b.workspace(op, 2*c.wLen)
		b.runDNN(op, p, dirBackwardFilter, fa, xh.Ptr(), dyh.Ptr(), 0, dwh.Ptr())
		b.fromLowp(op, pdw, dwh.Ptr(), 0, g.K, g.C/c.groups, g.R*g.S, false, true, dg.nhwc)
		b.release(dwh)
	}
	if pdx != 0 {
		b.runDNN(op, p, dirBackwardData, da, wh.Ptr(), dyh.Ptr(), 0, dxh.Ptr())
		b.fromLowp(op, pdx, dxh.Ptr(), 0, g.N, g.C, g.H*g.W, false, false, dg.nhwc)
	}
	return true
}

var _ tensor.LowPrecisionConvBackend = (*Backend)(nil)
