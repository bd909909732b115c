package cuda

import (
	"fmt"

	"github.com/ember-ml/ember/tensor"
)

// softmaxWarps is the warps per block of the row kernels (a warp a row).
const softmaxWarps = 8

// softmaxMaxGrid caps the grid of the size-class row kernels: a block per
// softmaxWarps·R rows up to it (the warps of a finished block make way for
// a new block rather than looping), the grid-stride loop beyond.
const softmaxMaxGrid = 1 << 20

// softmaxClass picks the row kernel for rows of n whose float4 groups are
// aligned (y and x 16-byte aligned, n a multiple of 4, at most 1024): the
// kernel of n's size class (128·J elements, J float4 a lane) and the rows
// each warp takes at a time. ok is false for the other rows, which the
// general kernel takes.
func softmaxClass(n int, py, px uintptr) (kernel string, rowsPerWarp int, ok bool) {
	if n%4 != 0 || n > 1024 || (py|px)%16 != 0 {
		return "", 0, false
	}
	j := 1
	for 128*j < n {
		j *= 2
	}
	r := softmaxRowsPerWarp[j]
	return fmt.Sprintf("ember_softmax_rows4_%dx%d", j, r), r, true
}

// softmaxRowsPerWarp is the rows a warp of each size class takes at a
// time (J = n/128 float4 a lane). Measured on the H200: rows of 256 (J
// 2) 51.9 us with one row a warp, 52.1-52.8 with two; rows of 96 (J 1)
// 6.3 us with two, 8.3-8.7 with one or four (the shared kernel: 58.2 and
// 7.7 us).
var softmaxRowsPerWarp = map[int]int{1: 2, 2: 1, 4: 1, 8: 1}

// softmaxLaunch checks the [outer, n, inner] view of every buffer and
// launches the row kernel (inner == 1) or the column kernel; args are the
// leading pointer arguments, flags the trailing int flags.
func (b *Backend) softmaxLaunch(op, rows, cols string, outer, n, inner int, bufs []tensor.Buffer, flags ...int32) {
	if outer < 0 || n < 1 || inner < 0 {
		panic(fmt.Sprintf("cuda: %s of [%d, %d, %d]", op, outer, n, inner))
	}
	total := outer * n * inner
	args := make([]any, 0, len(bufs)+3+len(flags))
	for _, buf := range bufs {
		if buf.Len != total {
			panic(fmt.Sprintf("cuda: %s of [%d, %d, %d]: a buffer of %d elements", op, outer, n, inner, buf.Len))
		}
		args = append(args, b.f32(op, buf))
	}
	if total == 0 {
		return
	}
	if inner == 1 {
		rowsPerWarp := 1
		if rows == "ember_softmax_rows" {
			if k, r, ok := softmaxClass(n, args[0].(uintptr), args[1].(uintptr)); ok {
				rows, rowsPerWarp = k, r
			}
		}
		args = append(args, int64(outer), i32arg(op, n))
		for _, f := range flags {
			args = append(args, f)
		}
		per := softmaxWarps * rowsPerWarp
		grid := min((outer+per-1)/per, softmaxMaxGrid)
		if rowsPerWarp == 1 && rows == "ember_softmax_rows" {
			grid = min(grid, maxGrid)
		}
		b.launchGrid(op, b.kernel(rows), grid, 32*softmaxWarps, args...)
		return
	}
	args = append(args, int64(outer), i32arg(op, n), int64(inner))
	for _, f := range flags {
		args = append(args, f)
	}
	b.launch(op, b.kernel(cols), outer*inner, args...)
}

// Softmax sets y to the softmax (log-softmax when log) of x over the middle
// axis of [outer, n, inner] (kernels/softmax.cu).
func (b *Backend) Softmax(y, x tensor.Buffer, outer, n, inner int, log bool) {
	b.softmaxLaunch("softmax", "ember_softmax_rows", "ember_softmax_cols", outer, n, inner, []tensor.Buffer{y, x}, flag(log))
}

// SoftmaxBackward sets (or adds to) dx the gradient through Softmax.
func (b *Backend) SoftmaxBackward(dx, dy, y tensor.Buffer, outer, n, inner int, log, accumulate bool) {
	b.softmaxLaunch("softmax_backward", "ember_softmax_backward_rows", "ember_softmax_backward_cols", outer, n, inner,
		[]tensor.Buffer{dx, dy, y}, flag(log), flag(accumulate))
}

// CausalSoftmax sets y to the softmax of each row of causal attention
// scores over the keys up to its query, 0 after them
// (ember_softmax_rows_causal: the masked scores are not read).
func (b *Backend) CausalSoftmax(y, x tensor.Buffer, rows, t, n int) {
	const name = "causal_softmax"
	if rows < 0 || t < 1 || n < 1 {
		panic(fmt.Sprintf("cuda: %s of [%d, %d] over %d queries", name, rows, n, t))
	}
	need(name, "x", x, rows*n)
	need(name, "y", y, rows*n)
	py, px := b.f32(name, y), b.f32(name, x)
	if rows == 0 {
		return
	}
	grid := min((rows+softmaxWarps-1)/softmaxWarps, maxGrid)
	b.launchGrid(name, b.kernel("ember_softmax_rows_causal"), grid, 32*softmaxWarps, py, px, int64(rows), i32arg(name, n), int64(t))
}
