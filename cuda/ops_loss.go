package cuda

import (
	"fmt"
	"math"

	"github.com/ember-ml/ember/tensor"
)

var _ tensor.ClassLossBackend = (*Backend)(nil)

// Launch shape of the class loss (kernels/xent.cu). xentWarps is the rows
// per block of ember_class_loss_rows (a warp a row, as the kernel's
// EMBER_XENT_WARPS). xentCountBlocks caps the blocks that count the
// targets: every block of the loss pass adds their counts again, so they
// stay few (16 labels per thread before a second block is used).
const (
	xentWarps       = 8
	xentCountBlocks = 64
)

// ClassLoss computes the loss of tensor.ClassLossBackend in three launches
// on the stream (count, per-target losses and gradient, final sum) with no
// synchronization, so that it can be captured in a CUDA graph. The grid
// sizes depend on the shape alone, which keeps the sums' order, and hence
// the result, the same from run to run.
func (b *Backend) ClassLoss(loss, dlogits, logits, labels tensor.Buffer, s tensor.ClassLossSpec) {
	const op = "class_loss"
	outer, classes, inner := s.Outer, s.Classes, s.Inner
	if outer < 0 || classes < 0 || inner < 0 {
		panic(fmt.Sprintf("cuda: %s of [%d, %d, %d]", op, outer, classes, inner))
	}
	targets := outer * inner
	need(op, "loss", loss, 1)
	need(op, "logits", logits, targets*classes)
	need(op, "labels", labels, targets)
	pl, pz, py := b.f32(op, loss), b.f32(op, logits), b.i32(op, labels)
	pd := b.f32Opt(op, "dlogits", dlogits, targets*classes)
	if targets == 0 {
		v := float32(0) // the sum of nothing; the mean of nothing is 0/0
		if !s.Sum {
			v = float32(math.NaN())
		}
		devCheck(op, b.x.memset32(pl, math.Float32bits(v), 1))
		return
	}
	countBlocks := min((targets+blockSize*16-1)/(blockSize*16), xentCountBlocks)
	parts := gridFor(targets).X
	if inner == 1 {
		parts = min((outer+xentWarps-1)/xentWarps, maxGrid)
	}
	ws := b.workspace(op, parts*8+countBlocks*4)
	defer b.release(ws)
	part := ws.Ptr()
	counts := part + uintptr(parts*8)
	nc := i32arg(op, classes)
	b.launchGrid(op, b.kernel("ember_class_loss_count"), countBlocks, blockSize, counts, py, int64(targets), nc,
		s.IgnoreIndex, flag(s.Ignore))
	if inner == 1 {
		b.launchGrid(op, b.kernel("ember_class_loss_rows"), parts, 32*xentWarps, part, pd, pz, py, counts, int32(countBlocks),
			int64(outer), nc, s.Smoothing, s.IgnoreIndex, flag(s.Ignore), flag(s.Sum))
	} else {
		b.launchGrid(op, b.kernel("ember_class_loss_cols"), parts, blockSize, part, pd, pz, py, counts, int32(countBlocks),
			int64(outer), nc, int64(inner), s.Smoothing, s.IgnoreIndex, flag(s.Ignore), flag(s.Sum))
	}
	b.launchGrid(op, b.kernel("ember_class_loss_final"), 1, blockSize, pl, part, int32(parts), counts, int32(countBlocks), flag(s.Sum))
}
