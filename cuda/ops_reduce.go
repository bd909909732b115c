package cuda

import (
	"fmt"
	"math"

	"github.com/ember-ml/ember/tensor"
)

// rowBlockMin is the row length from which a row is reduced by a whole
// block (256 threads) rather than a warp: below it a warp's 32 lanes have
// few elements each and a block would leave most threads idle.
const rowBlockMin = 2048

// Rows are split into chunks of splitChunk elements, reduced by separate
// blocks and joined in a second pass, when there are fewer than
// splitRowsMax rows of at least splitRowMin elements: a block per row
// would leave most of the GPU idle (one row: one SM of 132). The chunking
// depends on n alone, so results do not depend on the device.
const (
	splitRowsMax = 128
	splitRowMin  = 16384
	splitChunk   = 8192
)

// reduceSplitRows is Reduce of few long rows in two passes (partials in a
// workspace: a double sum, an extreme and its index per chunk).
func (b *Backend) reduceSplitRows(name string, op tensor.ReduceOp, pf, pi, px uintptr, rows, n int, accumulate bool) {
	chunks := (n + splitChunk - 1) / splitChunk
	cnt := rows * chunks
	ws := b.workspace(name, cnt*(8+8+4))
	defer b.release(ws)
	psum, pat := ws.Ptr(), ws.Ptr()+uintptr(8*cnt)
	pv := pat + uintptr(8*cnt)
	devCheck(name, b.x.launch(b.kernel("ember_reduce_rows_part"), Dim3{X: chunks, Y: rows, Z: 1}, Dim3{X: blockSize, Y: 1, Z: 1},
		[]any{psum, pv, pat, px, int64(n), int64(splitChunk), int32(op)}))
	warps := blockSize / 32
	b.launchGrid(name, b.kernel("ember_reduce_rows_join"), (rows+warps-1)/warps, blockSize,
		pf, pi, psum, pv, pat, int64(rows), int64(n), i32arg(name, chunks), int32(op), flag(accumulate))
}

// Columns are split along the axis as rows are when there are fewer than
// splitColGroups groups of 32 columns: the axis is cut into chunks (at
// least splitColChunkMin long) so that there are about splitColBlocks
// blocks, a function of the shape alone. Axes of at most colsShortMax are
// not split: a block of 32 row lanes per group reads them in one launch
// (at most 32 elements a thread), where the split's two launches cost
// more than the reading.
const (
	splitColGroups   = 256
	splitColChunkMin = 64
	splitColBlocks   = 1024
	colsShortMax     = 1024
)

func (b *Backend) reduceSplitCols(name string, op tensor.ReduceOp, pf, pi, px uintptr, outer, n, inner int, accumulate bool) {
	m := outer * inner
	groups := (m + 31) / 32
	chunks := min(max(splitColBlocks/groups, 1), n/splitColChunkMin, 65535)
	chunk := (n + chunks - 1) / chunks
	chunks = (n + chunk - 1) / chunk
	cnt := m * chunks
	ws := b.workspace(name, cnt*(8+8+4))
	defer b.release(ws)
	psum, pat := ws.Ptr(), ws.Ptr()+uintptr(8*cnt)
	pv := pat + uintptr(8*cnt)
	devCheck(name, b.x.launch(b.kernel("ember_reduce_cols_part"), Dim3{X: groups, Y: chunks, Z: 1}, Dim3{X: 32, Y: 8, Z: 1},
		[]any{psum, pv, pat, px, int64(outer), int64(n), int64(inner), int64(chunk), int32(op)}))
	b.launch(name, b.kernel("ember_reduce_cols_join"), m, pf, pi, psum, pv, pat, int64(m), int64(n), i32arg(name, chunks), int32(op), flag(accumulate))
}

// Reduce runs kernels/reduce_axis.cu: rows (inner == 1) a warp or a block
// each, columns (inner > 1) coalesced over adjacent outputs.
func (b *Backend) Reduce(op tensor.ReduceOp, dst, x tensor.Buffer, outer, n, inner int, accumulate bool) {
	const name = "reduce"
	if op >= tensor.NumReduceOps {
		panic(fmt.Sprintf("cuda: %s: unknown op %d", name, op))
	}
	if outer < 0 || n < 0 || inner < 0 {
		panic(fmt.Sprintf("cuda: %s of [%d, %d, %d]", name, outer, n, inner))
	}
	if n == 0 && op != tensor.ReduceSum {
		panic(fmt.Sprintf("cuda: %s: op %d over an empty axis ([%d, 0, %d])", name, op, outer, inner))
	}
	if (op == tensor.ReduceArgmax || op == tensor.ReduceArgmin) && n > math.MaxInt32 {
		panic(fmt.Sprintf("cuda: %s: an index over %d elements does not fit the int32 result", name, n))
	}
	if accumulate && op != tensor.ReduceSum {
		panic(fmt.Sprintf("cuda: %s: op %d cannot accumulate (sums only)", name, op))
	}
	m := outer * inner
	need(name, "x", x, outer*n*inner)
	need(name, "dst", dst, m)
	px := b.f32(name, x)
	var pf, pi uintptr
	if op == tensor.ReduceArgmax || op == tensor.ReduceArgmin {
		pi = b.i32(name, dst)
	} else {
		pf = b.f32(name, dst)
	}
	if m == 0 {
		return
	}
	if n == 0 { // an empty sum
		if !accumulate {
			devCheck(name, b.x.memset32(pf, 0, m))
		}
		return
	}
	args := []any{pf, pi, px}
	switch {
	case inner == 1 && outer < splitRowsMax && n >= splitRowMin:
		b.reduceSplitRows(name, op, pf, pi, px, outer, n, accumulate)
	case inner == 1 && n >= rowBlockMin:
		args = append(args, int64(outer), int64(n), int32(op), flag(accumulate))
		b.launchGrid(name, b.kernel("ember_reduce_rows_block"), min(outer, maxGrid), blockSize, args...)
	case inner == 1 && (op == tensor.ReduceSum || op == tensor.ReduceMean) && n%4 == 0 && aligned16(px):
		warps := blockSize / 32
		kernel := "ember_reduce_rows_sum4"
		if !b.streamed(4 * outer * n) {
			kernel = "ember_reduce_rows_sum4_l2"
		}
		b.launchGrid(name, b.kernel(kernel), min((outer+warps-1)/warps, maxGrid), blockSize,
			pf, px, int64(outer), int64(n), meanScale(op, n), flag(accumulate))
	case inner == 1:
		args = append(args, int64(outer), int64(n), int32(op), flag(accumulate))
		warps := blockSize / 32
		b.launchGrid(name, b.kernel("ember_reduce_rows_warp"), min((outer+warps-1)/warps, maxGrid), blockSize, args...)
	case (m+31)/32 < splitColGroups && n <= colsShortMax:
		args = append(args, int64(outer), int64(n), int64(inner), int32(op), flag(accumulate))
		grid := Dim3{X: (m + 31) / 32, Y: 1, Z: 1}
		devCheck(name, b.x.launch(b.kernel("ember_reduce_cols32"), grid, Dim3{X: 32, Y: 32, Z: 1}, args))
	case (m+31)/32 < splitColGroups:
		b.reduceSplitCols(name, op, pf, pi, px, outer, n, inner, accumulate)
	default:
		args = append(args, int64(outer), int64(n), int64(inner), int32(op), flag(accumulate))
		grid := Dim3{X: min((m+31)/32, maxGrid), Y: 1, Z: 1}
		devCheck(name, b.x.launch(b.kernel("ember_reduce_cols"), grid, Dim3{X: 32, Y: 8, Z: 1}, args))
	}
}

// A channel of the per-channel reduction (kernels/reduce_axis.cu,
// ember_reduce_channels) is cut into chunks of at least chanChunkMin
// elements, so that there are about chanBlocks blocks: several waves of
// 132 SMs, each block's threads with two rounds of four float4 loads or
// more. The cut is a function of the shape alone. Below chanInnerMin
// contiguous elements per row a warp's loads would touch many rows (and
// sectors) for few elements: such shapes keep the Reduce stages. They are
// variables so that the operator benchmark can sweep them.
var (
	chanBlocks   = 4096
	chanChunkMin = 8192
)

const chanInnerMin = 8

// chanSplits is the number of blocks per channel and the elements each
// takes (a multiple of 4) for channels of per elements.
func chanSplits(channels, per int) (splits, chunk int) {
	splits = min(max((chanBlocks+channels-1)/channels, 1), max(per/chanChunkMin, 1), maxGridY)
	chunk = ((per+splits-1)/splits + 3) &^ 3
	return (per + chunk - 1) / chunk, chunk
}

// Where there are at least chanWholeMin channels, each of rows of at least
// chanWholeInnerMin floats, a block sums a whole channel
// (ember_reduce_channel_whole_*): the channels alone fill the GPU, and no
// block waits on another's partial sum. On the H200 that read
// [512,128,14,14] in 14.7 µs and [512,64,28,28] in 26.3, where a channel
// split over blocks joined by the last to arrive took 16.2 and 27.5
// (docs/performance.md, round 36). With fewer channels, or shorter rows,
// the split kernels below.
const (
	chanWholeMin      = 64
	chanWholeInnerMin = 32
)

// chanWholeKernel is the entry point of the whole-channel sums for rows of
// inner floats, read as float4 when vec (inner a multiple of 4 from a
// 16-byte aligned x), with streaming loads (once) and with plain ones (l2);
// the rows a warp takes at a time; and a row's length in units of its
// loads. A warp's loads cover about a row, or a few short ones, at once.
func chanWholeKernel(inner int, vec bool) (once, l2 string, rows, innerV int) {
	if vec && inner >= 128 {
		switch v := inner / 4; {
		case v <= 64:
			return "ember_reduce_channel_whole4_u2v2", "ember_reduce_channel_whole4_u2v2_l2", 2, v
		case v > chanRowsLong4 && v <= chanRowsLong7:
			return "ember_reduce_channel_whole4_u1v7", "ember_reduce_channel_whole4_u1v7_l2", 1, v
		default:
			return "ember_reduce_channel_whole4_u1v4", "ember_reduce_channel_whole4_u1v4_l2", 1, v
		}
	}
	switch {
	case inner <= 64:
		return "ember_reduce_channel_whole1_u4v2", "ember_reduce_channel_whole1_u4v2_l2", 4, inner
	case inner <= 128:
		return "ember_reduce_channel_whole1_u2v4", "ember_reduce_channel_whole1_u2v4_l2", 2, inner
	default:
		return "ember_reduce_channel_whole1_u1v8", "ember_reduce_channel_whole1_u1v8_l2", 1, inner
	}
}

// chanWholeThreads is the block of the whole-channel sums: a warp for each
// group of rows a warp takes at once, at most 1,024 threads.
func chanWholeThreads(outer, rows int) int {
	return 32 * min(32, max(1, (outer+rows-1)/rows))
}

// With fewer channels, rows of at least chanRowsMin floats (a multiple of
// 4, 16-byte aligned) go to ember_reduce_channel_rows: a warp a row, a
// channel's rows split over blocks so that there are about chanWave
// blocks, which fits the 1,056 places of 256-thread blocks on 132 SMs in
// one wave (each block's arrival at its channel's join costs it an L2
// round trip). A
// channel over several blocks takes a counter (chanDone), so a split is
// chosen only for fewer than chanWave channels. Shorter rows would leave
// lanes of each warp idle.
const (
	chanWave    = 1024
	chanRowsMin = 128
)

// Rows of more than chanRowsLong4 float4 and at most chanRowsLong7 take
// the kernel's _long entry points: seven float4 loads a lane instead of
// four, one batch a row.
const (
	chanRowsLong4 = 4 * 32
	chanRowsLong7 = 7 * 32
)

// meanScale is the factor of a sum's kernels that take one (a mean of n is
// the sum times 1/n, in double, rounded once).
func meanScale(op tensor.ReduceOp, n int) float64 {
	if op == tensor.ReduceMean {
		return 1 / float64(n)
	}
	return 1
}

// chanRowSplits is the grid's blocks per channel, and the rows each takes,
// for channels of outer rows.
func chanRowSplits(channels, outer int) (splits, rowsPer int) {
	return rowSplits(channels, outer, chanWave)
}

// rowSplits is chanRowSplits for about wave blocks (the host test's waves
// are smaller).
func rowSplits(channels, outer, wave int) (splits, rowsPer int) {
	splits = min(max(wave/channels, 1), outer)
	rowsPer = (outer + splits - 1) / splits
	return (outer + rowsPer - 1) / rowsPer, rowsPer
}

// ReduceChannels implements tensor.ChannelReduceBackend: one pass of
// ember_reduce_channel_whole_*, ember_reduce_channel_rows, or
// ember_reduce_channels (and its join when a channel spans several
// blocks), where rows are long enough (reduceChannels), else the Reduce
// stages.
func (b *Backend) ReduceChannels(op tensor.ReduceOp, dst, x tensor.Buffer, outer, channels, inner int, accumulate bool) {
	const name = "reduce_channels"
	if op != tensor.ReduceSum && op != tensor.ReduceMean {
		panic(fmt.Sprintf("cuda: %s: op %d (sums and means only)", name, op))
	}
	if outer < 0 || channels < 0 || inner < 0 {
		panic(fmt.Sprintf("cuda: %s of [%d, %d, %d]", name, outer, channels, inner))
	}
	if accumulate && op != tensor.ReduceSum {
		panic(fmt.Sprintf("cuda: %s: op %d cannot accumulate (sums only)", name, op))
	}
	need(name, "x", x, outer*channels*inner)
	need(name, "dst", dst, channels)
	switch {
	case channels == 0:
	case outer*inner == 0:
		if op != tensor.ReduceSum {
			panic(fmt.Sprintf("cuda: %s: op %d over no elements ([%d, %d, %d])", name, op, outer, channels, inner))
		}
		if !accumulate {
			devCheck(name, b.x.memset32(b.f32(name, dst), 0, channels))
		}
	case outer == 1: // rows of inner
		b.Reduce(op, dst, x, channels, inner, 1, accumulate)
	case inner == 1: // columns, coalesced along the channels
		b.Reduce(op, dst, x, 1, outer, channels, accumulate)
	case inner < chanInnerMin:
		// Short rows, then the columns of their sums (of their means: the
		// mean of equal-sized means is the mean).
		t, err := b.Alloc(outer*channels, tensor.Float32)
		if err != nil {
			panic(&tensor.Error{Op: "cuda: " + name, Err: err})
		}
		defer b.Free(t)
		b.Reduce(op, t, x, outer*channels, inner, 1, false)
		b.Reduce(op, dst, t, 1, outer, channels, accumulate)
	default:
		b.reduceChannels(name, op, b.f32(name, dst), b.f32(name, x), outer, channels, inner, accumulate)
	}
}

// reduceChannels queues the per-channel sums over x [outer, channels,
// inner] into dst [channels] (all positive): a block a channel
// (ember_reduce_channel_whole_*) for many channels of rows long enough,
// else ember_reduce_channel_rows for long aligned float4 rows, else
// ember_reduce_channels, and its join over a workspace of partial sums when
// a channel spans several blocks.
func (b *Backend) reduceChannels(name string, op tensor.ReduceOp, pdst, px uintptr, outer, channels, inner int, accumulate bool) {
	if channels >= chanWholeMin && inner >= chanWholeInnerMin {
		kernel, l2, rows, innerV := chanWholeKernel(inner, inner%4 == 0 && aligned16(px))
		if !b.streamed(4 * outer * channels * inner) {
			kernel = l2
		}
		devCheck(name, b.x.launch(b.kernel(kernel), Dim3{X: int(i32arg(name, channels)), Y: 1, Z: 1}, Dim3{X: chanWholeThreads(outer, rows), Y: 1, Z: 1},
			[]any{pdst, px, int64(outer), int64(channels), int64(innerV), meanScale(op, outer*inner), flag(accumulate)}))
		return
	}
	if inner >= chanRowsMin && inner%4 == 0 && aligned16(px) {
		splits, rowsPer := chanRowSplits(channels, outer)
		var part, counters uintptr
		if splits > 1 {
			ws := b.workspace(name, 8*channels*splits)
			defer b.release(ws)
			part, counters = ws.Ptr(), b.tileCounters.Ptr()+4*chanDone
		}
		long, streamed := inner/4 > chanRowsLong4 && inner/4 <= chanRowsLong7, b.streamed(4*outer*channels*inner)
		kernel := "ember_reduce_channel_rows"
		switch {
		case long && streamed:
			kernel = "ember_reduce_channel_rows_long"
		case long:
			kernel = "ember_reduce_channel_rows_long_l2"
		case !streamed:
			kernel = "ember_reduce_channel_rows_l2"
		}
		devCheck(name, b.x.launch(b.kernel(kernel), Dim3{X: int(i32arg(name, channels)), Y: splits, Z: 1}, Dim3{X: blockSize, Y: 1, Z: 1},
			[]any{pdst, part, counters, px, int64(outer), int64(channels), int64(inner), int64(rowsPer), meanScale(op, outer*inner), flag(accumulate)}))
		return
	}
	splits, chunk := chanSplits(channels, outer*inner)
	var part uintptr
	if splits > 1 {
		ws := b.workspace(name, 8*channels*splits)
		defer b.release(ws)
		part = ws.Ptr()
	}
	devCheck(name, b.x.launch(b.kernel("ember_reduce_channels"), Dim3{X: int(i32arg(name, channels)), Y: splits, Z: 1}, Dim3{X: blockSize, Y: 1, Z: 1},
		[]any{pdst, part, px, int64(outer), int64(channels), int64(inner), int64(chunk), int32(op), flag(accumulate)}))
	if splits > 1 {
		const warps = blockSize / 32
		b.launchGrid(name, b.kernel("ember_reduce_channels_join"), min((channels+warps-1)/warps, maxGrid), blockSize,
			pdst, part, int64(channels), i32arg(name, splits), int64(outer*inner), int32(op), flag(accumulate))
	}
}
