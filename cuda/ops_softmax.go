package cuda

import (
	"fmt"

	"github.com/ember-ml/ember/tensor"
)

// softmaxWarps is the warps per block of the row kernels (a warp a row).
const softmaxWarps = 8

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
		args = append(args, int64(outer), i32arg(op, n))
		for _, f := range flags {
			args = append(args, f)
		}
		grid := min((outer+softmaxWarps-1)/softmaxWarps, maxGrid)
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
