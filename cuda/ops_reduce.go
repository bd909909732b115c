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
