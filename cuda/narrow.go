package cuda

import "github.com/ember-ml/ember/tensor"

// Layers with few outputs (narrow.cu): a classifier's last layer fused with
// its cross entropy (tensor.LinearCrossEntropyBackend), and the gradients
// of any linear layer of at most narrowOut outputs: fewer launches where
// their fixed costs dominate (docs/performance.md has the timings).
// EMBER_LINEAR_NARROW=0 turns them off, for comparisons.

const (
	// narrowOut is the most outputs (classes) the narrow kernels take: one
	// register per class and thread, one lane per class in the softmax.
	narrowOut = 32
	// xentRows is the most rows linear_xent takes: up to it, no slower
	// than the unfused launches.
	xentRows = 1024
	// narrowRows is the most rows linear_grads_narrow takes with the input
	// gradient: beyond it the cuBLAS path is faster (its weight-gradient
	// strips are one block's loop over every row). Weight gradients alone
	// it takes at any batch size, for the side stream (LinearGrads).
	narrowRows = 256
)

// byClasses is 0 for at most 16 classes, else 1: the kernels' register
// arrays are sized 16 or 32.
func byClasses(classes int) int {
	if classes <= 16 {
		return 0
	}
	return 1
}

// xentBlock is the threads of a block of ember_linear_xent_c16 and its
// other forms, which take rows of at least 4·xentBlock inputs (read in
// float4 pieces where the rows, w and dx are aligned, else single floats): a
// thread's loads of a row are then all issued at once. Shorter rows go to
// ember_linear_xent (a warp a logit), which measured faster at LeNet's
// 500 inputs: 106.2-106.3 against 107.6-107.7 us a step
// (docs/performance.md, round 32).
const xentBlock = 256

// linearXentKernels are the fused last layers and losses by byClasses,
// then by whether the rows are read in float4 pieces.
var linearXentKernels = [2][2]string{{"ember_linear_xent_c16", "ember_linear_xent_c16_v4"}, {"ember_linear_xent_c32", "ember_linear_xent_c32_v4"}}

// linearGradsNarrowKernels are the gradient kernels by byClasses.
var linearGradsNarrowKernels = [2]string{"ember_linear_grads_narrow_c16", "ember_linear_grads_narrow_c32"}

// LinearCrossEntropy implements tensor.LinearCrossEntropyBackend: one
// launch of ember_linear_xent (or ember_linear_xent_c16 and its other
// forms, for long rows) for the logits, their cross entropy, its
// gradient and the input's gradient, for 1 to narrowOut classes and up to
// xentRows rows; with reluX, dx is written through x's ReLU mask (x > 0) in
// the same pass. It reports false for other sizes.
func (b *Backend) LinearCrossEntropy(loss, lossSum, dlogits, dx, x, w, bias, labels tensor.Buffer, n, in, classes int, reluX bool) bool {
	const op = "linear_cross_entropy"
	if n < 1 || n > xentRows || in < 0 || classes < 1 || classes > narrowOut || b.noNarrow {
		return false
	}
	need(op, "loss", loss, 1)
	need(op, "x", x, n*in)
	need(op, "w", w, classes*in)
	need(op, "labels", labels, n)
	pl, px, pw, py := b.f32(op, loss), b.f32(op, x), b.f32(op, w), b.i32(op, labels)
	psum, pb := b.f32Opt(op, "lossSum", lossSum, 1), b.f32Opt(op, "bias", bias, classes)
	pdl := b.f32Opt(op, "dlogits", dlogits, n*classes)
	var pdx uintptr // dx only with dlogits
	if pdl != 0 {
		pdx = b.f32Opt(op, "dx", dx, n*in)
	}
	v4 := 0
	if in%4 == 0 && aligned16(px) && aligned16(pw) && (pdx == 0 || aligned16(pdx)) {
		v4 = 1
	}
	blocks := min(n, maxGrid)
	var part Block
	if blocks > 1 {
		part = b.workspace(op, 8*blocks)
		defer b.release(part)
	}
	if in < 4*xentBlock {
		// Short rows: a block a row, a warp a logit (rows·classes <= 32).
		const rows = 1
		b.launchGrid(op, b.kernel("ember_linear_xent"), blocks, rows*classes*32, pl, psum, pdl, pdx, px, pw, pb, py,
			i32arg(op, n), i32arg(op, in), i32arg(op, classes), i32arg(op, rows), flag(reluX), part.Ptr(), b.tileCounters.Ptr()+4*xentDone)
		return true
	}
	// A block a row at a time, its threads over the row's pieces (float4
	// where the rows and w allow).
	b.launchGrid(op, b.kernel(linearXentKernels[byClasses(classes)][v4]), blocks, xentBlock, pl, psum, pdl, pdx, px, pw, pb, py,
		i32arg(op, n), i32arg(op, in), i32arg(op, classes), flag(reluX), part.Ptr(), b.tileCounters.Ptr()+4*xentDone)
	return true
}

// narrowGrads says whether LinearGrads of an n x in x out layer goes to
// linear_grads_narrow.
func (b *Backend) narrowGrads(n, in, out int) bool {
	return b.narrowOut(out) && n <= narrowRows && in < 1<<26
}

// narrowOut says whether the narrow kernels take a layer of out outputs.
func (b *Backend) narrowOut(out int) bool { return !b.noNarrow && out <= narrowOut }

// linearGradsNarrow queues ember_linear_grads_narrow: dx's 32 x 32 tiles,
// dw's 32-column strips, then db's block.
func (b *Backend) linearGradsNarrow(ex executor, op string, pdx, pdw, pdb, pg, py, px, pw uintptr, n, in, out int, accX, accW, accB bool) {
	colTiles := (in + 31) / 32
	var blocksX, blocksW, blocksB int
	if pdx != 0 {
		blocksX = (n + 31) / 32 * colTiles
	}
	if pdw != 0 {
		blocksW = colTiles
	}
	if pdb != 0 {
		blocksB = 1
	}
	devCheck(op, ex.launch(b.kernel(linearGradsNarrowKernels[byClasses(out)]), Dim3{X: blocksX + blocksW + blocksB, Y: 1, Z: 1},
		Dim3{X: 32, Y: 8, Z: 1}, []any{pdx, pdw, pdb, pg, py, px, pw, i32arg(op, n), i32arg(op, in), i32arg(op, out),
			flag(accX), flag(accW), flag(accB), i32arg(op, blocksX), i32arg(op, blocksW)}))
}
