package cuda

import (
	"errors"
	"fmt"

	"github.com/ember-ml/ember/cuda/driver"
	"github.com/ember-ml/ember/tensor"
)

// Linear layers (tensor.LinearBackend). Three paths, by size:
//
//   - products of at most 2^20 multiply-adds without a ReLU (LeNet's fc2
//     when not fused with its loss): ember_gemm_small for the forward, one
//     launch (reduce.cu); the gradients of layers of at most narrowOut
//     outputs are one launch of ember_linear_grads_narrow (narrow.go),
//     those of other small layers of ember_linear_grads_small;
//   - batches of up to linearTiledRows rows (LeNet's fc1 at batch 64):
//     ember_linear_tiled and ember_linear_grads_tiled (linear.cu), 64x64
//     tiles with the bias, the ReLU, the ReLU's mask on the incoming
//     gradient, the bias gradient and the split-K reduction inside the
//     launch. At batch 64 fc1 took 8 launches through cuBLAS (split-K
//     kernels and their reductions, a bias + ReLU pass, a mask +
//     bias-gradient pass); here it takes 2. On sm_90 and later the blocks
//     that split a tile's sum are a thread block cluster and add their
//     partial tiles through distributed shared memory (the _cluster
//     kernels); elsewhere through a workspace and a counter per tile;
//   - larger batches: cuBLAS, whose larger tiles fill the GPU without
//     splitting sums, and the bias, ReLU and mask kernels around it; with
//     BackendOptions.LinearLt, cuBLASLt with the bias and the ReLU in its
//     epilogue, and the bias gradient of a layer without ReLU in that of
//     dw's product (linear_lt.go).
//
// EMBER_LINEAR_TILED=0 turns the tiled path off, for comparisons.

// Tiling of linear.cu: output tiles of ltTile x ltTile, k in slices of ltK.
const (
	ltTile    = 64
	ltK       = 16
	ltThreads = 512 // LT_THREADS
	// ltCluster is LT_CLUSTER: the blocks of a cluster, and of a split sum
	// on sm_90.
	ltCluster = 8
	// ltMinSteps is the fewest slices of k a block of a split sum takes
	// without clusters: below it the partial tile's trip through L2 costs
	// more than the slices.
	ltMinSteps = 4
	// ltCounters is the number of tile counters of split sums (one per
	// tile of a launch that splits).
	ltCounters = 1024
	// linearTiledRows is the largest batch given to the tiled kernels:
	// there a 64-row tile leaves most of the GPU idle unless sums are
	// split, which cuBLAS does in extra launches, faster at batch 1024.
	linearTiledRows = 256
)

// tiledLinear says whether an n x in x out layer goes to linear.cu. Its int
// offsets need 64 times either stride below 2^31.
func (b *Backend) tiledLinear(n, in, out int) bool {
	return !b.noLinearTiled && n <= linearTiledRows && max(in, out) < 1<<25
}

// The backend's counters (tileCounters), in this order: ltCounters for
// split sums without clusters, linear_xent's count of blocks (narrow.go),
// the register-tiled input gradient's queue of images (conv_rt.go), then
// the reductions' counts of blocks done (ops_reduce.go): Sum's, and one
// per channel of the per-channel sums. The reductions run on the main
// stream only, so no two kernels in flight share a counter.
const (
	xentDone = ltCounters
	// rtQueue: one counter per group of 4 input channels, up to
	// rtQueueGroups, then the count of blocks done (ember_image_queue).
	rtQueue       = xentDone + 1
	rtQueueGroups = 64
	sumDone       = rtQueue + rtQueueGroups + 1
	chanDone      = sumDone + 1
	counterSlots  = chanDone + chanWave
)

// allocTileCounters gives the backend its counters: zeroed once here, and
// reset by the kernels themselves after each use. They live as long as the
// backend, outside any graph's pool.
func (b *Backend) allocTileCounters() error {
	if !b.tileCounters.IsZero() {
		return nil
	}
	blk, err := b.alloc.Alloc(4*counterSlots, b.stream)
	if err != nil {
		return err
	}
	b.tileCounters = blk
	return b.x.memset32(blk.Ptr(), 0, counterSlots)
}

// probeClusters launches the forward cluster kernel once on a tiny layer (1
// x 512 x 1: one tile, its sum split over a cluster of 8) and turns
// clusters off when the driver refuses the launch: the kernels compile
// for every sm_90 device, but a device partitioned so that 8 SMs of one GPC
// cannot take a block each (MIG, MPS limits) refuses the launch.
func (b *Backend) probeClusters() error {
	if !b.clusters() {
		return nil
	}
	const in = 512
	blk, err := b.alloc.Alloc(4*(2*in+1), b.stream)
	if err != nil {
		return err
	}
	defer b.release(blk)
	p := blk.Ptr()
	if err := b.x.memset32(p, 0, 2*in+1); err != nil {
		return err
	}
	splits, steps := b.ltSplit(1, in)
	err = b.x.launch(b.kernel("ember_linear_tiled_cluster"), Dim3{X: b.ltBlocks(1, splits), Y: 1, Z: 1}, Dim3{X: ltThreads, Y: 1, Z: 1},
		[]any{p + 4*2*in, p, p + 4*in, uintptr(0), int32(1), int32(in), int32(1), int32(0), int32(splits), int32(steps), uintptr(0), uintptr(0)})
	if err != nil { // refused at launch: not a failure of the context
		b.noClusters = true
		return nil
	}
	return b.x.synchronize()
}

// clusters says whether split sums go through thread block clusters.
func (b *Backend) clusters() bool {
	return b.hasKernel("ember_linear_tiled_cluster") && b.hasKernel("ember_linear_grads_tiled_cluster") && !b.noClusters
}

// ltSplit chooses how many blocks share each of a product's tiles when the
// tiles alone are fewer than the SMs: with clusters ltCluster when k has at
// least two slices per block (the last blocks may get none: they add
// zeros), else 1; without clusters about one block per SM over all tiles,
// at least ltMinSteps slices each and no more tiles than counters. It
// returns the splits and the slices each takes.
func (b *Backend) ltSplit(tiles, k int) (splits, steps int) {
	target := 132 // an H200's SMs, for the recording backend of the tests
	if b.dev != nil {
		target = b.dev.MultiprocessorCount()
	}
	kSteps := (k + ltK - 1) / ltK
	splits = 1
	switch {
	case tiles >= target:
	case b.clusters():
		if kSteps >= 2*ltCluster {
			splits = ltCluster
		}
	case tiles <= ltCounters:
		splits = max(1, min((target+tiles-1)/tiles, kSteps/ltMinSteps))
	}
	steps = (kSteps + splits - 1) / splits
	if !b.clusters() {
		splits = (kSteps + steps - 1) / steps // no empty splits
	}
	return splits, steps
}

// ltBlocks is the blocks a product of tiles x splits takes: with clusters,
// a whole number of clusters.
func (b *Backend) ltBlocks(tiles, splits int) int {
	n := tiles * splits
	if b.clusters() {
		n = (n + ltCluster - 1) / ltCluster * ltCluster
	}
	return n
}

// ltTiles is the number of output tiles of an m x n product.
func ltTiles(m, n int) int { return ((m + ltTile - 1) / ltTile) * ((n + ltTile - 1) / ltTile) }

// Linear implements tensor.LinearBackend.
func (b *Backend) Linear(y, x, w, bias tensor.Buffer, n, in, out int, relu bool) {
	const op = "linear"
	linearSizes(op, n, in, out)
	need(op, "y", y, n*out)
	need(op, "x", x, n*in)
	need(op, "w", w, out*in)
	py, px, pw := b.f32(op, y), b.f32(op, x), b.f32(op, w)
	var pbias uintptr
	if !bias.Empty() {
		need(op, "bias", bias, out)
		pbias = b.f32(op, bias)
	}
	switch {
	case n*out == 0:
	case in == 0:
		// No products: y = ReLU(0 + bias).
		devCheck(op, b.x.memset32(py, 0, n*out))
		b.linearEpilogue(op, py, pbias, n, out, relu)
	case b.ltFirst(n, in, out) && b.linearLt(op, py, px, pw, pbias, n, in, out, relu):
	case !relu && smallProduct(n, out, in):
		b.matmul(op, py, px, pw, pbias, n, out, in, false, true, 1, 0)
	case b.tiledLinear(n, in, out):
		tiles := ltTiles(n, out)
		splits, steps := b.ltSplit(tiles, in)
		ws := b.splitWorkspace(op, splits, n*out)
		defer b.release(ws)
		f := b.kernel("ember_linear_tiled")
		if b.clusters() {
			f = b.kernel("ember_linear_tiled_cluster")
		}
		devCheck(op, b.x.launch(f, Dim3{X: b.ltBlocks(tiles, splits), Y: 1, Z: 1}, Dim3{X: ltThreads, Y: 1, Z: 1}, []any{py, px, pw, pbias,
			i32arg(op, n), i32arg(op, in), i32arg(op, out), flag(relu), i32arg(op, splits), i32arg(op, steps), ws.Ptr(), b.tileCounters.Ptr()}))
	case b.ltLinear(n, in, out) && b.linearLt(op, py, px, pw, pbias, n, in, out, relu):
	default:
		b.matmul(op, py, px, pw, 0, n, out, in, false, true, 1, 0)
		b.linearEpilogue(op, py, pbias, n, out, relu)
	}
}

// linearEpilogue adds the bias (when pbias is not 0) to y [n, out] and
// applies the ReLU when relu, in one pass.
func (b *Backend) linearEpilogue(op string, py, pbias uintptr, n, out int, relu bool) {
	total := n * out
	switch {
	case relu && pbias != 0:
		b.launch(op, b.kernel("ember_add_bias_relu"), total, py, pbias, int64(total), int64(out))
	case relu:
		b.launch(op, b.kernel("ember_relu"), total, py, py, int64(total))
	case pbias != 0:
		b.launch(op, b.kernel("ember_add_bias"), total, py, pbias, int64(total), int64(out), int64(1))
	}
}

// LinearGrads implements tensor.LinearBackend: one launch of
// ember_linear_grads_narrow (at most narrowOut outputs, narrow.go), of
// ember_linear_grads_small (small layers without ReLU) or of
// ember_linear_grads_tiled; otherwise the mask and bias gradient in one
// pass and two cuBLAS products.
func (b *Backend) LinearGrads(dx, dw, db, g, y, x, w tensor.Buffer, n, in, out int, accX, accW, accB bool) {
	const op = "linear_grads"
	linearSizes(op, n, in, out)
	need(op, "g", g, n*out)
	need(op, "x", x, n*in)
	need(op, "w", w, out*in)
	pdx, pdw, pdb := b.f32Opt(op, "dx", dx, n*in), b.f32Opt(op, "dw", dw, out*in), b.f32Opt(op, "db", db, out)
	py := b.f32Opt(op, "y", y, n*out)
	if pdx == 0 && pdw == 0 && pdb == 0 {
		return
	}
	// One launch runs the three products at once, so they must not write
	// the same memory (x and w the same tensor: Linear(x, x, b)).
	apart := !overlaps(pdx, 4*n*in, pdw, 4*out*in) && !overlaps(pdx, 4*n*in, pdb, 4*out) && !overlaps(pdw, 4*out*in, pdb, 4*out)
	empty := n == 0 || in == 0 || out == 0
	pg, px, pw := b.f32(op, g), b.f32(op, x), b.f32(op, w)
	uses := []span{{pdx, 4 * n * in, true}, {pdw, 4 * out * in, true}, {pdb, 4 * out, true},
		{pg, 4 * n * out, false}, {py, 4 * n * out, false}, {px, 4 * n * in, false}, {pw, 4 * out * in, false}}
	if apart && !empty && pdx == 0 && b.side != nil && b.narrowOut(out) && in < 1<<26 {
		// Only the weight gradients: a last layer, whose input gradient
		// its forward pass gave (LinearCrossEntropy). In a captured graph
		// they run on the side stream, beside the backward pass of the
		// layers below, so the narrow kernel takes every batch size: its
		// loop over all the rows (slower than cuBLAS at batch 1024) is off
		// the main path there. Eager launches take
		// the same kernel, so that both give the same bits; without a side
		// lane the general paths below take them.
		devCheck(op, b.x.detach(uses, func(ex executor) {
			b.linearGradsNarrow(ex, op, pdx, pdw, pdb, pg, py, px, pw, n, in, out, accX, accW, accB)
		}))
		return
	}
	devCheck(op, b.x.beside(uses, func() {
		b.linearGrads(op, pdx, pdw, pdb, pg, py, px, pw, n, in, out, accX, accW, accB, apart && !empty)
	}))
}

// linearGrads queues LinearGrads through the first kernel that takes its
// sizes (fused ones only when apart: the outputs share no memory and no size
// is 0).
func (b *Backend) linearGrads(op string, pdx, pdw, pdb, pg, py, px, pw uintptr, n, in, out int, accX, accW, accB, apart bool) {
	if b.ltFirst(n, in, out) {
		apart = false // the cuBLAS and cuBLASLt products below, for comparisons
	}
	switch {
	case apart && b.narrowGrads(n, in, out):
		b.linearGradsNarrow(b.x, op, pdx, pdw, pdb, pg, py, px, pw, n, in, out, accX, accW, accB)
	case apart && py == 0 && out <= 128 && n <= 128 && smallProduct(n, in, out) && smallProduct(out, in, n):
		b.linearGradsSmall(op, pdx, pdw, pdb, pg, px, pw, n, in, out, accX, accW, accB)
	case apart && b.tiledLinear(n, in, out):
		b.linearGradsTiled(op, pdx, pdw, pdb, pg, py, px, pw, n, in, out, accX, accW, accB)
	default:
		if py != 0 && n*out > 0 {
			// g through the ReLU's mask, and db from it on the way.
			gm := b.workspace(op, 4*n*out)
			defer b.release(gm)
			b.biasGradCols(op, pdb, gm.Ptr(), pg, py, n, out, accB)
			pg, pdb = gm.Ptr(), 0
		}
		if pdx != 0 && pdw != 0 && b.weightGradsBeside(op, pdx, pdw, pdb, pg, px, pw, n, in, out, accX, accW, accB) {
			return
		}
		if pdx != 0 {
			b.product(op, pdx, pg, pw, n, in, out, false, accX)
		}
		if pdw != 0 && pdb != 0 && !accB && n*in*out > 0 && b.ltLinear(n, in, out) && !overlaps(pdw, 4*out*in, pdb, 4*out) &&
			b.weightGradsLt(op, pdw, pdb, pg, px, n, in, out, accW) {
			pdw, pdb = 0, 0
		}
		if pdw != 0 {
			b.product(op, pdw, pg, px, out, in, n, true, accW)
		}
		if pdb != 0 && b.side != nil && b.ltFirst(n, in, out) && biasColsRowsPerBlock(n) >= n {
			// g came masked (no y): db off the main stream, as above.
			b.biasGradAside(op, pdb, pg, n, out, accB)
			pdb = 0
		}
		if pdb != 0 {
			b.biasGrad(op, pdb, pg, 0, 0, n, out, 1, accB)
		}
	}
}

// weightGradsBeside queues the weight gradient dw (+)= gᵀ·x, with db (+)=
// the column sums of g where pdb is not 0, beside the input gradient dx
// (+)= g·w: the first on the side lane (one cuBLASLt product whose
// algorithm needs no workspace; db in its epilogue when written, else added
// by ember_bias_grad_cols as a task detached after it), the second on this
// stream, joined before the next operation. It takes the layers of at most linearTiledRows rows that go
// to cuBLASLt first (ltFirst): there each product alone leaves most of the
// device idle (the MLP at batch 64: 16 to 64 blocks of cuBLAS's on 132
// SMs), so that in a captured step the two run in the time of one. Eager
// launches take the same algorithms one after the other, so both give the
// same bits. False, having queued nothing, when it does not apply.
func (b *Backend) weightGradsBeside(op string, pdx, pdw, pdb, pg, px, pw uintptr, n, in, out int, accX, accW, accB bool) bool {
	// db on the side lane takes one block row of bias_grad_cols (no
	// partials to finish): up to 128 rows; above, cuBLASLt's epilogue
	// writes it, which cannot add into it.
	sideDB := pdb != 0 && biasColsRowsPerBlock(n) >= n
	if b.side == nil || !b.ltFirst(n, in, out) || n > linearTiledRows || n*in*out == 0 || pdb != 0 && !sideDB && accB ||
		overlaps(pdx, 4*n*in, pdw, 4*out*in) || pdb != 0 && (overlaps(pdb, 4*out, pdx, 4*n*in) || overlaps(pdb, 4*out, pdw, 4*out*in)) {
		return false
	}
	epi := driver.LtDefault
	if pdb != 0 && !sideDB {
		epi = driver.LtBGradA
	}
	g := weightGradGemm(n, in, out, epi)
	g.NoWorkspace = true
	pepi := pdb // db's pointer in the epilogue
	if sideDB {
		pepi = 0
	}
	g, ok := b.ltPlan(g, pg, px, pdw, pepi)
	if !ok {
		return false
	}
	b.tuneLt(op, g, 1, pg, px, beta32(accW), pepi)
	devCheck(op, b.x.parallel(func(ex executor) {
		lx, ok := ex.(ltExec)
		if !ok {
			devCheck(op, errors.New("cuda: the side lane's executor queues no cuBLASLt products"))
		}
		devCheck(op, lx.ltMatmul(g, 1, pg, px, beta32(accW), pdw, pepi, 0))
	}, func() {
		b.product(op, pdx, pg, pw, n, in, out, false, accX)
	}))
	b.ltCalls.Add(1)
	if sideDB {
		b.biasGradAside(op, pdb, pg, n, out, accB)
	}
	return true
}

// biasGradAside sets (adds, with acc) db [out] to the column sums of g
// [n, out] (n at most 128: one block row of ember_bias_grad_cols) as a
// task detached on the side lane: nothing before the optimiser reads db,
// so the main stream goes on without waiting for it (in a capture;
// eagerly it runs at once).
func (b *Backend) biasGradAside(op string, pdb, pg uintptr, n, out int, acc bool) {
	devCheck(op, b.x.detach([]span{{pg, 4 * n * out, false}, {pdb, 4 * out, true}}, func(ex executor) {
		b.biasGradColsOn(ex, op, pdb, 0, 0, pg, 0, n, out, n, 1, acc)
	}))
}

// product queues c [m, n] = A·B (+ c when acc), A [m, k] or its transpose
// [k, m], B [k, n]; an empty sum (k == 0) leaves c zero (or unchanged).
func (b *Backend) product(op string, pc, pa, pb uintptr, m, n, k int, transA, acc bool) {
	switch {
	case m*n == 0:
	case k == 0:
		if !acc {
			devCheck(op, b.x.memset32(pc, 0, m*n))
		}
	default:
		b.matmul(op, pc, pa, pb, 0, m, n, k, transA, false, 1, beta32(acc))
	}
}

// linearGradsSmall queues ember_linear_grads_small: dx, dw and db of a layer
// whose products are all small, as three gemm_small_t products in one grid.
func (b *Backend) linearGradsSmall(op string, pdx, pdw, pdb, pg, px, pw uintptr, n, in, out int, accX, accW, accB bool) {
	var blocksX, blocksW, blocksB int
	if pdx != 0 {
		blocksX = min((n*in+31)/32, maxGrid)
	}
	if pdw != 0 {
		blocksW = min((out*in+31)/32, maxGrid)
	}
	if pdb != 0 {
		blocksB = (out + 31) / 32
	}
	grid := Dim3{X: blocksX + blocksW + blocksB, Y: 1, Z: 1}
	devCheck(op, b.x.launch(b.kernel("ember_linear_grads_small"), grid, Dim3{X: 32, Y: 8, Z: 1}, []any{pdx, pdw, pdb, pg, px, pw,
		i32arg(op, n), i32arg(op, in), i32arg(op, out), beta32(accX), beta32(accW), beta32(accB), i32arg(op, blocksX), i32arg(op, blocksW)}))
}

// linearGradsTiled queues ember_linear_grads_tiled: dx's tiles, then dw's
// with db as its extra column, each product split over k as ltSplit
// chooses (their counters side by side).
func (b *Backend) linearGradsTiled(op string, pdx, pdw, pdb, pg, py, px, pw uintptr, n, in, out int, accX, accW, accB bool) {
	var tilesX, splitsX, stepsX, tilesW, splitsW, stepsW int
	if pdx != 0 {
		tilesX = ltTiles(n, in)
		splitsX, stepsX = b.ltSplit(tilesX, out)
	}
	cols := 0 // dw's columns, and db's
	if pdw != 0 {
		cols = in
	}
	if pdb != 0 {
		cols++
	}
	if cols > 0 {
		tilesW = ltTiles(out, cols)
		splitsW, stepsW = b.ltSplit(tilesW, n)
		if !b.clusters() && splitsW > 1 && splitsX > 1 && tilesX+tilesW > ltCounters {
			splitsW, stepsW = 1, (n+ltK-1)/ltK
		}
	}
	wsX := b.splitWorkspace(op, splitsX, n*in)
	defer b.release(wsX)
	wsW := b.splitWorkspace(op, splitsW, out*cols)
	defer b.release(wsW)
	counters := b.tileCounters.Ptr() // not read by the cluster kernels
	countersW := counters
	if splitsX > 1 && counters != 0 {
		countersW += uintptr(4 * tilesX)
	}
	f := b.kernel("ember_linear_grads_tiled")
	if b.clusters() {
		f = b.kernel("ember_linear_grads_tiled_cluster")
	}
	blocksX := b.ltBlocks(tilesX, splitsX)
	devCheck(op, b.x.launch(f, Dim3{X: blocksX + b.ltBlocks(tilesW, splitsW), Y: 1, Z: 1}, Dim3{X: ltThreads, Y: 1, Z: 1}, []any{
		pdx, pdw, pdb, pg, py, px, pw, i32arg(op, n), i32arg(op, in), i32arg(op, out), beta32(accX), beta32(accW), beta32(accB),
		i32arg(op, splitsX), i32arg(op, stepsX), i32arg(op, splitsW), i32arg(op, stepsW), i32arg(op, blocksX),
		wsX.Ptr(), wsW.Ptr(), counters, countersW}))
}

// splitWorkspace is the partial tiles of a product of size outputs split
// splits ways: none (a zero Block) without a split, or with clusters (the
// partials stay in shared memory).
func (b *Backend) splitWorkspace(op string, splits, size int) Block {
	if splits <= 1 || b.clusters() {
		return Block{}
	}
	return b.workspace(op, 4*splits*size)
}

// linearSizes panics on negative sizes of a linear layer.
func linearSizes(op string, n, in, out int) {
	if n < 0 || in < 0 || out < 0 {
		panic(fmt.Sprintf("cuda: %s: negative size n=%d in=%d out=%d", op, n, in, out))
	}
}

// overlaps says whether [a, a+an) and [b, b+bn) share a byte (0 is no
// buffer).
func overlaps(a uintptr, an int, b uintptr, bn int) bool {
	return a != 0 && b != 0 && a < b+uintptr(bn) && b < a+uintptr(an)
}

// beta32 is a GEMM's beta for an accumulate flag.
func beta32(acc bool) float32 {
	if acc {
		return 1
	}
	return 0
}
