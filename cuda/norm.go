package cuda

import "github.com/ember-ml/ember/tensor"

// Batch and layer normalisation (tensor.NormBackend): one block per
// channel or row for the statistics and the per-group gradient sums (double
// precision, fixed trees: deterministic), elementwise grid-stride kernels
// for the rest. kernels/norm.cu mirrors tensor/cpu_norm.go.

// normGroups is the grid of a per-group kernel: one block per group, at
// most maxGrid (the kernels loop over the rest).
func normGroups(groups int) int { return min(max(groups, 1), maxGrid) }

// BatchNorm normalises x [n, c, inner] per channel (tensor.NormBackend).
func (b *Backend) BatchNorm(y, saveMean, saveInvStd, runMean, runVar, x, weight, bias tensor.Buffer, n, c, inner int, training bool, momentum, eps float32) {
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
	b.launchGrid(op, b.kernel("ember_batch_norm_stats"), normGroups(c), blockSize, pm, pi, prm, prv, px,
		int64(n), int64(c), int64(inner), flag(training), momentum, eps)
	b.launch(op, b.kernel("ember_batch_norm_apply"), total, b.f32(op, y), px, pm, pi,
		b.f32Opt(op, "weight", weight, c), b.f32Opt(op, "bias", bias, c), int64(total), int64(c), int64(inner))
}

// BatchNormBackward computes dx, dweight and dbias of BatchNorm
// (tensor.NormBackend): a per-channel reduction of Σdy and Σdy·x̂ (which
// also writes the parameters' gradients), then dx elementwise.
func (b *Backend) BatchNormBackward(dx, dweight, dbias, dy, x, weight, saveMean, saveInvStd tensor.Buffer, n, c, inner int, training, accX, accW, accB bool) {
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
	var sums uintptr
	if training && !dx.Empty() {
		ws := b.workspace(op, 2*c*8)
		defer b.release(ws)
		sums = ws.Ptr()
	}
	if sums != 0 || pdw != 0 || pdb != 0 {
		b.launchGrid(op, b.kernel("ember_batch_norm_backward_reduce"), normGroups(c), blockSize, sums, pdw, pdb,
			pdy, px, pm, pi, int64(n), int64(c), int64(inner), flag(accW), flag(accB))
	}
	if !dx.Empty() {
		b.launch(op, b.kernel("ember_batch_norm_backward_dx"), total, b.f32Opt(op, "dx", dx, total), pdy, px,
			b.f32Opt(op, "weight", weight, c), pm, pi, sums, int64(total), int64(c), int64(inner), flag(training), flag(accX))
	}
}

// LayerNorm normalises each row of x [rows, cols] (tensor.NormBackend).
func (b *Backend) LayerNorm(y, saveMean, saveInvStd, x, weight, bias tensor.Buffer, rows, cols int, eps float32) {
	const op = "layer_norm"
	need(op, "x", x, rows*cols)
	need(op, "y", y, rows*cols)
	need(op, "saveMean", saveMean, rows)
	need(op, "saveInvStd", saveInvStd, rows)
	if rows == 0 {
		return
	}
	b.launchGrid(op, b.kernel("ember_layer_norm"), normGroups(rows), blockSize, b.f32(op, y), b.f32(op, saveMean),
		b.f32(op, saveInvStd), b.f32(op, x), b.f32Opt(op, "weight", weight, cols), b.f32Opt(op, "bias", bias, cols),
		int64(rows), int64(cols), eps)
}

// LayerNormBackward computes dx (one block per row) and dweight, dbias (one
// thread per column, the rows in order) of LayerNorm (tensor.NormBackend).
func (b *Backend) LayerNormBackward(dx, dweight, dbias, dy, x, weight, saveMean, saveInvStd tensor.Buffer, rows, cols int, accX, accW, accB bool) {
	const op = "layer_norm_backward"
	need(op, "dy", dy, rows*cols)
	need(op, "x", x, rows*cols)
	need(op, "saveMean", saveMean, rows)
	need(op, "saveInvStd", saveInvStd, rows)
	pdy, px, pm, pi := b.f32(op, dy), b.f32(op, x), b.f32(op, saveMean), b.f32(op, saveInvStd)
	if !dx.Empty() && rows > 0 {
		b.launchGrid(op, b.kernel("ember_layer_norm_backward_dx"), normGroups(rows), blockSize,
			b.f32Opt(op, "dx", dx, rows*cols), pdy, px, b.f32Opt(op, "weight", weight, cols), pm, pi,
			int64(rows), int64(cols), flag(accX))
	}
	if !dweight.Empty() || !dbias.Empty() {
		b.launch(op, b.kernel("ember_layer_norm_backward_params"), cols, b.f32Opt(op, "dweight", dweight, cols),
			b.f32Opt(op, "dbias", dbias, cols), pdy, px, pm, pi, int64(rows), int64(cols), flag(accW), flag(accB))
	}
}
