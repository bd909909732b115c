package cuda

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"

	"github.com/ember-ml/ember/tensor"
)

// Batch and layer normalisation (tensor.NormBackend). kernels/norm.cu
// mirrors tensor/cpu_norm.go: sums in double with fixed trees
// (deterministic), the per-element passes grid-wide elementwise kernels.
// A batch-norm channel's reduction is split over several blocks (partial
// sums in a workspace, added in order by a second kernel), so that 64
// channels of 400k elements still fill the GPU's 132 SMs; layer norm takes
// one warp per row when rows are short, and sums the parameters' gradients
// over tiles of rows in two stages.

const (
	// normBlocks is the grid a split reduction aims at: about eight
	// resident blocks of 256 threads on each of an H200's 132 SMs, twice.
	normBlocks = 2048
	// bnPart is the most elements a block of a batch-norm reduction sums
	// (16 per thread): the forward pass reads its part twice, the second
	// time from the cache, which must hold the parts of the resident blocks
	// (eight of 16 KiB per SM).
	bnPart = 4096
	// bnMinPart is the fewest elements a block sums where more blocks are
	// wanted to fill the GPU (eight per thread): smaller parts cost more in
	// partial sums than they gain in parallelism.
	bnMinPart = 2048
	// lnWarpCols is the widest row layer norm gives one warp (beyond it a
	// block per row, whose threads then have enough columns each).
	lnWarpCols = 2048
	// lnMinChunk is the fewest rows a block of the parameters' gradients
	// sums.
	lnMinChunk = 16
)

// bnParts is the number of blocks each of c channels of m elements is
// split over: parts of at most bnPart elements, more (down to bnMinPart)
// where c such parts would not fill the GPU.
func bnParts(c, m int) int {
	parts := (m + bnPart - 1) / bnPart
	if c*parts < normBlocks {
		parts = max(parts, min((normBlocks+c-1)/c, (m+bnMinPart-1)/bnMinPart))
	}
	return max(parts, 1)
}

// bnGrid is the grid of a kernel over the c·parts parts (the kernels loop
// over more blocks than the grid has).
func bnGrid(c, parts int) int { return min(c*parts, 1<<16) }

// lnRowsPerChunk is the rows each block of the parameters' gradients of
// [rows, cols] sums.
func lnRowsPerChunk(rows, cols int) int {
	tiles := (cols + 31) / 32
	chunks := max(1, min((normBlocks+tiles-1)/tiles, (rows+lnMinChunk-1)/lnMinChunk))
	return (rows + chunks - 1) / chunks
}

// channelArgs are the arguments after total, c and inner with which an
// elementwise batch-norm kernel finds an index's channel: the wide flag
// (64-bit divisions, for 2^31 elements or more) and the dividers by inner
// and by c, as the kernels' int parameters.
func channelArgs(total, c, inner int) []any {
	if total > math.MaxInt32 {
		return []any{int32(1), int32(0), int32(0), int32(0), int32(0)}
	}
	return append([]any{int32(0)}, dividerArgs(max(inner, 1), max(c, 1))...)
}

// BatchNorm normalises x [n, c, inner] per channel (tensor.NormBackend):
// in training, where a channel fits in a block's shared memory and the
// channels fill the GPU, one launch: with a block a channel (bnOnePass),
// or a thread block cluster a channel where one block would take most of
// an SM's shared memory (bnCluster); otherwise each part's sum and squared
// deviations from its mean, then the statistics per channel, then y
// elementwise.
func (b *Backend) BatchNorm(y, saveMean, saveInvStd, runMean, runVar, x, weight, bias tensor.Buffer, n, c, inner int, training bool, momentum, eps float32) {
	b.batchNorm(y, saveMean, saveInvStd, runMean, runVar, x, weight, bias, n, c, inner, training, momentum, eps, tensor.OpIdentity)
}

// BatchNormAct is BatchNorm with the activation in the kernel that writes
// y (tensor.BatchNormActBackend).
func (b *Backend) BatchNormAct(y, saveMean, saveInvStd, runMean, runVar, x, weight, bias tensor.Buffer, n, c, inner int, training bool, momentum, eps float32, act tensor.UnaryOp) {
	if !tensor.BatchNormActivation(act) {
		panic(fmt.Sprintf("cuda: batch_norm_act: activation op %d; want identity, ReLU or GELU", act))
	}
	b.batchNorm(y, saveMean, saveInvStd, runMean, runVar, x, weight, bias, n, c, inner, training, momentum, eps, act)
}

func (b *Backend) batchNorm(y, saveMean, saveInvStd, runMean, runVar, x, weight, bias tensor.Buffer, n, c, inner int, training bool, momentum, eps float32, act tensor.UnaryOp) {
	const op = "batch_norm"
	total := n * c * inner
	need(op, "x", x, total)
	need(op, "y", y, total)
	need(op, "saveMean", saveMean, c)
	need(op, "saveInvStd", saveInvStd, c)
	if !training && (runMean.Empty() || runVar.Empty()) {
		panic("cuda: batch_norm: evaluation mode needs the running statistics")
	}
	if c == 0 {
		return
	}
	pm, pi := b.f32(op, saveMean), b.f32(op, saveInvStd)
	prm, prv := b.f32Opt(op, "runMean", runMean, c), b.f32Opt(op, "runVar", runVar, c)
	px := b.f32(op, x)
	py, pw, pb := b.f32(op, y), b.f32Opt(op, "weight", weight, c), b.f32Opt(op, "bias", bias, c)
	if training {
		if sl, name, k, threads, shared, ok := b.bnCluster(n, c, inner); ok {
			devCheck(op, sl.launchShared(b.kernel(name), Dim3{X: c * k, Y: 1, Z: 1}, Dim3{X: threads, Y: 1, Z: 1}, shared,
				[]any{py, pm, pi, prm, prv, px, pw, pb, int32(n), int32(c), int32(inner), momentum, eps, int32(act)}))
			return
		}
		if sl, threads, shared, ok := b.bnOnePass(n, c, inner); ok {
			devCheck(op, sl.launchShared(b.kernel(b.bnOne.kernel()), Dim3{X: min(c, maxGrid), Y: 1, Z: 1},
				Dim3{X: threads, Y: 1, Z: 1}, shared, []any{py, pm, pi, prm, prv, px, pw, pb,
					int32(n), int32(c), int32(inner), momentum, eps, int32(act)}))
			return
		}
	}
	parts := bnParts(c, n*inner)
	var partial uintptr
	if training {
		ws := b.workspace(op, 2*c*parts*8)
		defer b.release(ws)
		partial = ws.Ptr()
		b.launchGrid(op, b.kernel("ember_batch_norm_stats_partial"), bnGrid(c, parts), blockSize, partial, px,
			int64(n), int64(c), int64(inner), int64(parts))
	}
	b.launchGrid(op, b.kernel("ember_batch_norm_finish"), warpGroups(c), blockSize, pm, pi, prm, prv, partial,
		int64(n), int64(c), int64(inner), int64(parts), flag(training), momentum, eps)
	if total <= math.MaxInt32 && (px|py)%16 == 0 {
		di, dc := newDivider(max(inner, 1)), newDivider(c)
		b.launch(op, b.kernel("ember_batch_norm_apply4"), max(total/4, 1), py, px, pm, pi, pw, pb, int32(total), int32(c),
			int32(di.mul), int32(di.shift), int32(dc.mul), int32(dc.shift), int32(act))
		return
	}
	args := []any{py, px, pm, pi, pw, pb, int64(total), int64(c), int64(inner)}
	args = append(args, channelArgs(total, c, inner)...)
	b.launch(op, b.kernel("ember_batch_norm_apply"), total, append(args, int32(act))...)
}

// BatchNormBackward computes dx, dweight and dbias of BatchNorm
// (tensor.NormBackend): partial sums of Σdy and Σdy·x̂ per block, their
// totals per channel (which also write the parameters' gradients), then dx
// elementwise.
func (b *Backend) BatchNormBackward(dx, dweight, dbias, dy, x, weight, saveMean, saveInvStd tensor.Buffer, n, c, inner int, training, accX, accW, accB bool) {
	b.batchNormBackward(dx, dweight, dbias, dy, x, weight, tensor.Buffer{}, saveMean, saveInvStd, n, c, inner, training, tensor.OpIdentity, accX, accW, accB)
}

// BatchNormActBackward is BatchNormBackward of dy·act'(z), z recomputed
// from x in both passes over dy (tensor.BatchNormActBackend).
func (b *Backend) BatchNormActBackward(dx, dweight, dbias, dy, x, weight, bias, saveMean, saveInvStd tensor.Buffer, n, c, inner int, training bool, act tensor.UnaryOp, accX, accW, accB bool) {
	if !tensor.BatchNormActivation(act) {
		panic(fmt.Sprintf("cuda: batch_norm_act_backward: activation op %d; want identity, ReLU or GELU", act))
	}
	b.batchNormBackward(dx, dweight, dbias, dy, x, weight, bias, saveMean, saveInvStd, n, c, inner, training, act, accX, accW, accB)
}

func (b *Backend) batchNormBackward(dx, dweight, dbias, dy, x, weight, bias, saveMean, saveInvStd tensor.Buffer, n, c, inner int, training bool, act tensor.UnaryOp, accX, accW, accB bool) {
	const op = "batch_norm_backward"
	total := n * c * inner
	need(op, "dy", dy, total)
	need(op, "x", x, total)
	need(op, "saveMean", saveMean, c)
	need(op, "saveInvStd", saveInvStd, c)
	if c == 0 {
		return
	}
	pdy, px, pm, pi := b.f32(op, dy), b.f32(op, x), b.f32(op, saveMean), b.f32(op, saveInvStd)
	pdw, pdb := b.f32Opt(op, "dweight", dweight, c), b.f32Opt(op, "dbias", dbias, c)
	pw, pb := b.f32Opt(op, "weight", weight, c), b.f32Opt(op, "bias", bias, c)
	needCoef := training && !dx.Empty()
	var coef uintptr
	if needCoef || pdw != 0 || pdb != 0 {
		parts := bnParts(c, n*inner)
		ws := b.workspace(op, (2*c*parts+2*c)*8)
		defer b.release(ws)
		partial := ws.Ptr()
		if needCoef {
			coef = partial + uintptr(2*c*parts*8)
		}
		// A GELU's derivative (erff, expf) costs more than a pass over
		// memory: the sums' kernel stores g for the dx pass, in dx itself
		// when it is overwritten.
		var pg uintptr
		if (act == tensor.OpGELU || act == tensor.OpGELUTanh) && !dx.Empty() {
			if pg = b.f32Opt(op, "dx", dx, total); accX {
				gs := b.workspace(op, 4*total)
				defer b.release(gs)
				pg = gs.Ptr()
			}
		}
		b.launchGrid(op, b.kernel("ember_batch_norm_backward_partial"), bnGrid(c, parts), blockSize, partial,
			pdy, px, pm, pi, pw, pb, pg, int64(n), int64(c), int64(inner), int64(parts), int32(act))
		if pg != 0 {
			pdy, act = pg, tensor.OpIdentity
		}
		b.launchGrid(op, b.kernel("ember_batch_norm_backward_finish"), warpGroups(c), blockSize, coef, pdw, pdb, partial,
			int64(n), int64(c), int64(inner), int64(parts), flag(accW), flag(accB))
	}
	if !dx.Empty() {
		pdx := b.f32Opt(op, "dx", dx, total)
		if total <= math.MaxInt32 && (pdx|pdy|px)%16 == 0 {
			di, dc := newDivider(max(inner, 1)), newDivider(c)
			b.launch(op, b.kernel("ember_batch_norm_backward_dx4"), max(total/4, 1), pdx, pdy, px, pw, pm, pi, coef, pb,
				int32(total), int32(c), int32(di.mul), int32(di.shift), int32(dc.mul), int32(dc.shift), flag(training), flag(accX), int32(act))
			return
		}
		args := []any{pdx, pdy, px, pw, pm, pi, coef, pb, int64(total), int64(c), int64(inner)}
		args = append(args, channelArgs(total, c, inner)...)
		b.launch(op, b.kernel("ember_batch_norm_backward_dx"), total, append(args, flag(training), flag(accX), int32(act))...)
	}
}

// sharedLauncher is an executor that launches kernels with dynamic shared
// memory (the GPU's); the tests' recorders lack it, and batch norm takes
// its other path there.
type sharedLauncher interface {
	launchShared(f *Function, grid, block Dim3, shared int, args []any) error
}

func (g *gpuExec) launchShared(f *Function, grid, block Dim3, shared int, args []any) error {
	if err := g.settle(); err != nil {
		return err
	}
	return f.Launch(grid, block, shared, g.stream, args...)
}

// bnOnePassState is the one-pass batch norm's shared memory: the most
// dynamic shared memory a block of ember_batch_norm_onepass may take, set
// once on the kernel (0: the path is off).
type bnOnePassState struct {
	once        sync.Once
	ready       atomic.Bool // once has run
	bytes       int
	anyChannels bool // tests: take the path for any number of channels
	// threads and unroll, when set, replace the choice of block size and
	// of loads in flight per thread (8 or 16): tests and benchmarks.
	threads, unroll int
	// cluster and clusterThreads, when set, replace bnCluster's blocks a
	// channel (2, 4 or 8; for any channel that fits) and block size:
	// tests and benchmarks.
	cluster, clusterThreads int
}

// bnClusterKernels are the cluster batch norm's kernels by blocks a
// channel.
var bnClusterKernels = [...]string{2: "ember_batch_norm_cluster2", 4: "ember_batch_norm_cluster4", 8: "ember_batch_norm_cluster8"}

// bnClusterBytes is the most of a channel a block of the cluster batch
// norm holds: eight such blocks of 256 threads fit on an SM.
const bnClusterBytes = 28 << 10

// bnClusterChannelBytes is the smallest channel that fewer channels than
// two thirds of the SMs split over a cluster: below it one block a channel
// was as fast (H200: [128,64,8,8], 32 KiB a channel, 6.3 µs in one pass
// against 6.7 in clusters of 2 or 4; [256,32,8,8], 64 KiB, 8.2 against 7.0
// in clusters of 4).
const bnClusterChannelBytes = 64 << 10

// bnCluster says whether a training batch norm of [n, c, inner] runs as
// ember_batch_norm_cluster{K} (sm_90, tensors of fewer than 2^31
// elements), and with what kernel, K, threads and bytes of shared memory.
// Where the one-pass kernel takes a shape (bnOnePass), clusters take it
//
//   - with as many channels as SMs, where the one-pass kernel would hold a
//     channel in one block an SM (more than half its shared memory);
//   - with fewer channels than two thirds of the SMs and channels of
//     bnClusterChannelBytes or more, K enough for c·K to reach two
//     thirds of the SMs;
//
// K then doubled until a block holds at most bnClusterBytes, and at most
// 8 (a thread block cluster's portable size). Measured on the H200:
// [1024,256,7,7] 68.3 µs in one pass, 58.5 in clusters of 8; where the
// one-pass kernel fits two blocks an SM ([512,256,7,7]: 29.6 µs) clusters
// of 4 or 8 took 32.8-42.3, so it keeps those; [512,64,8,8] 11.7 in one
// pass, 10.8 in clusters of 8; [512,16,8,8] 11.5 and 7.3; [1024,96,7,7]
// (96 channels, a block of 1024 threads each) 21.5 in one pass and 23.4 in
// clusters of 8, so it keeps one pass.
func (b *Backend) bnCluster(n, c, inner int) (sl sharedLauncher, name string, k, threads, shared int, ok bool) {
	m := n * inner
	sl, ok = b.x.(sharedLauncher)
	if !ok || b.opt.NoBatchNormOnePass || b.noClusters || m == 0 || n*c*inner > math.MaxInt32 {
		return nil, "", 0, 0, 0, false
	}
	st := &b.bnOne
	k = st.cluster
	if k == 0 {
		_, one, _, ok := b.bnOnePass(n, c, inner)
		sms := b.dev.MultiprocessorCount()
		switch {
		case !ok:
			return nil, "", 0, 0, 0, false
		case c >= sms && one == 1024:
			k = 2
		case 3*c < 2*sms && 4*m >= bnClusterChannelBytes:
			for k = 2; 3*c*k < 2*sms; k *= 2 {
			}
		default:
			return nil, "", 0, 0, 0, false
		}
		for ; k <= 8 && 4*((m+k-1)/k) > bnClusterBytes; k *= 2 {
		}
		if k > 8 {
			return nil, "", 0, 0, 0, false
		}
	}
	if k > 0 && k < len(bnClusterKernels) {
		name = bnClusterKernels[k]
	}
	shared = 4 * ((m + k - 1) / k)
	if name == "" || shared > 48<<10 || !b.hasKernel(name) { // 48 KiB: the dynamic shared memory a launch takes unasked
		return nil, "", 0, 0, 0, false
	}
	threads = 256
	if st.clusterThreads > 0 {
		threads = st.clusterThreads
	}
	return sl, name, k, threads, shared, true
}

// kernel is the one-pass kernel's name.
func (st *bnOnePassState) kernel() string {
	if st.unroll == 16 {
		return "ember_batch_norm_onepass16"
	}
	return "ember_batch_norm_onepass"
}

// bnSharedCandidates are the per-block shared memory sizes tried, largest
// first: H100/H200 (227 KiB), A100 (163 KiB), the 99 KiB of sm_86/sm_89,
// less 1 KiB for the kernel's static shared memory (the block sums).
var bnSharedCandidates = []int{227<<10 - 1<<10, 163<<10 - 1<<10, 99<<10 - 1<<10}

// bnOnePassMinChannels is the fewest channels the one-pass kernel takes
// (a block each): on the H200 16 channels of 128 KiB ([512,16,8,8]) took
// 11.5 µs in one pass against 14.0 split, and from 32 to 128 channels one
// pass was 1.3-2.8 times as fast as the split path's three launches.
const bnOnePassMinChannels = 16

// bnOnePass says whether a training batch norm of [n, c, inner] runs as
// ember_batch_norm_onepass (or, bnCluster's choice, in clusters), and with
// how many threads and bytes of shared memory: where a channel's n·inner
// floats fit in the shared memory a block may take and there are at least
// bnOnePassMinChannels channels. Blocks of 512 threads, or 1024 when a
// channel takes more than half the shared memory (then one block fits on
// an SM, and it alone must keep enough loads in flight).
func (b *Backend) bnOnePass(n, c, inner int) (sl sharedLauncher, threads, shared int, ok bool) {
	if b.opt.NoBatchNormOnePass {
		return nil, 0, 0, false
	}
	sl, ok = b.x.(sharedLauncher)
	if !ok || n*c*inner > math.MaxInt32 {
		return nil, 0, 0, false
	}
	st := &b.bnOne
	if !st.ready.Load() && b.capturing.Load() {
		// Setting a kernel's attribute while a graph is captured is left
		// alone: this step takes the split path.
		return nil, 0, 0, false
	}
	st.once.Do(func() {
		defer st.ready.Store(true)
		f, f16 := b.loaded("ember_batch_norm_onepass"), b.loaded("ember_batch_norm_onepass16")
		if f == nil || f16 == nil {
			return
		}
		for _, bytes := range bnSharedCandidates {
			if f.SetMaxDynamicSharedMemory(bytes) == nil && f16.SetMaxDynamicSharedMemory(bytes) == nil {
				st.bytes = bytes
				return
			}
		}
	})
	shared = 4 * n * inner
	if shared > st.bytes || (c < bnOnePassMinChannels && !st.anyChannels) {
		return nil, 0, 0, false
	}
	threads = 512
	if 2*shared > st.bytes {
		threads = 1024
	}
	if st.threads > 0 {
		threads = st.threads
	}
	return sl, threads, shared, true
}

// warpGroups is the grid of a kernel that gives each of groups (rows,
// channels) one warp.
func warpGroups(groups int) int {
	perBlock := blockSize / 32
	return min(max((groups+perBlock-1)/perBlock, 1), maxGrid)
}

// LayerNorm normalises each row of x [rows, cols] (tensor.NormBackend):
// a warp per row up to lnWarpCols columns, else a block per row.
func (b *Backend) LayerNorm(y, saveMean, saveInvStd, x, weight, bias tensor.Buffer, rows, cols int, eps float32) {
	b.layerNorm("layer_norm", "ember_layer_norm_warp", "ember_layer_norm", tensor.Float32, y, saveMean, saveInvStd, x, weight, bias, rows, cols, eps)
}

// LayerNormCast is LayerNorm with y bfloat16, each element rounded as it
// is written (tensor.LayerNormCastBackend): the _bf16 forms of the same
// kernels.
func (b *Backend) LayerNormCast(y, saveMean, saveInvStd, x, weight, bias tensor.Buffer, rows, cols int, eps float32) {
	b.layerNorm("layer_norm_cast", "ember_layer_norm_warp_bf16", "ember_layer_norm_bf16", tensor.BFloat16, y, saveMean, saveInvStd, x, weight, bias, rows, cols, eps)
}

var _ tensor.LayerNormCastBackend = (*Backend)(nil)

// layerNorm launches the layer norm kernel warpKernel (a warp a row) or
// rowKernel (a block a row, for long rows), for y of type yType.
func (b *Backend) layerNorm(op, warpKernel, rowKernel string, yType tensor.DType, y, saveMean, saveInvStd, x, weight, bias tensor.Buffer, rows, cols int, eps float32) {
	need(op, "x", x, rows*cols)
	need(op, "y", y, rows*cols)
	need(op, "saveMean", saveMean, rows)
	need(op, "saveInvStd", saveInvStd, rows)
	if rows == 0 {
		return
	}
	args := []any{b.ptr(op, y, yType), b.f32(op, saveMean), b.f32(op, saveInvStd), b.f32(op, x),
		b.f32Opt(op, "weight", weight, cols), b.f32Opt(op, "bias", bias, cols), int64(rows), int64(cols), eps}
	if cols <= lnWarpCols {
		b.launchGrid(op, b.kernel(warpKernel), warpGroups(rows), blockSize, args...)
		return
	}
	b.launchGrid(op, b.kernel(rowKernel), min(rows, maxGrid), blockSize, args...)
}

// LayerNormBackward computes dx (a warp or a block per row, as the
// forward) and dweight, dbias (partial sums over chunks of rows, then
// their totals) of LayerNorm (tensor.NormBackend).
func (b *Backend) LayerNormBackward(dx, dweight, dbias, dy, x, weight, saveMean, saveInvStd tensor.Buffer, rows, cols int, accX, accW, accB bool) {
	const op = "layer_norm_backward"
	need(op, "dy", dy, rows*cols)
	need(op, "x", x, rows*cols)
	need(op, "saveMean", saveMean, rows)
	need(op, "saveInvStd", saveInvStd, rows)
	pdy, px, pm, pi := b.f32(op, dy), b.f32(op, x), b.f32(op, saveMean), b.f32(op, saveInvStd)
	if !dx.Empty() && rows > 0 {
		args := []any{b.f32Opt(op, "dx", dx, rows*cols), pdy, px, b.f32Opt(op, "weight", weight, cols), pm, pi,
			int64(rows), int64(cols), flag(accX)}
		if cols <= lnWarpCols {
			b.launchGrid(op, b.kernel("ember_layer_norm_backward_dx_warp"), warpGroups(rows), blockSize, args...)
		} else {
			b.launchGrid(op, b.kernel("ember_layer_norm_backward_dx"), min(rows, maxGrid), blockSize, args...)
		}
	}
	if (dweight.Empty() && dbias.Empty()) || cols == 0 {
		return
	}
	pdw, pdb := b.f32Opt(op, "dweight", dweight, cols), b.f32Opt(op, "dbias", dbias, cols)
	tiles, chunks, perChunk := (cols+31)/32, 0, 0
	if rows > 0 {
		perChunk = lnRowsPerChunk(rows, cols)
		chunks = (rows + perChunk - 1) / perChunk
	}
	ws := b.workspace(op, 2*max(chunks, 1)*cols*8)
	defer b.release(ws)
	if chunks > 0 {
		b.launchGrid(op, b.kernel("ember_layer_norm_params_partial"), min(tiles*chunks, maxGrid), blockSize, ws.Ptr(),
			pdy, px, pm, pi, int64(rows), int64(cols), int64(perChunk))
	}
	// With no rows (no chunks) the finish kernel stores zero sums.
	b.launchGrid(op, b.kernel("ember_layer_norm_params_finish"), min(tiles, maxGrid), blockSize, pdw, pdb,
		ws.Ptr(), int64(cols), int64(chunks), flag(accW), flag(accB))
}
