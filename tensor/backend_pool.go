package tensor

// AvgPoolGeom is a PoolGeom with torch's rules for the divisor of an
// average: each window divides by Divisor when it is positive, else by the
// number of its elements inside the input (ExcludePad) or inside the
// padded input (torch's default, count_include_pad=true). A ceil-mode
// window hanging off the far edge counts only up to the end of the
// padding, as torch does.
type AvgPoolGeom struct {
	PoolGeom
	ExcludePad bool
	Divisor    int
}

// WindowDivisor is the divisor of output (i, j)'s average.
func (g AvgPoolGeom) WindowDivisor(i, j int) int {
	if g.Divisor > 0 {
		return g.Divisor
	}
	h0, w0 := i*g.StrideH-g.PadH, j*g.StrideW-g.PadW
	h1, w1 := min(h0+g.KH, g.H+g.PadH), min(w0+g.KW, g.W+g.PadW)
	if g.ExcludePad {
		h0, w0, h1, w1 = max(h0, 0), max(w0, 0), min(h1, g.H), min(w1, g.W)
	}
	return (h1 - h0) * (w1 - w0)
}

// AdaptivePoolGeom describes an adaptive pooling of NCHW input to an
// OutH×OutW output: output row i covers the input rows
// [floor(i·H/OutH), ceil((i+1)·H/OutH)), and columns likewise, torch's
// rule (windows overlap when the sizes do not divide).
type AdaptivePoolGeom struct {
	N, C, H, W int
	OutH, OutW int
}

// Rows is the window [lo, hi) of output row i.
func (g AdaptivePoolGeom) Rows(i int) (lo, hi int) { return adaptiveWindow(i, g.H, g.OutH) }

// Cols is the window [lo, hi) of output column j.
func (g AdaptivePoolGeom) Cols(j int) (lo, hi int) { return adaptiveWindow(j, g.W, g.OutW) }

func adaptiveWindow(i, in, out int) (lo, hi int) {
	return i * in / out, ((i+1)*in + out - 1) / out
}

// PoolBackend is implemented by backends that run average and adaptive
// pooling (the CPU and CUDA backends). Without it the tensor layer can
// only take AdaptiveAvgPool2d to 1×1 (global average pooling), as a sum
// over each plane (the core's Reduce) scaled by 1/(H·W); the other
// operations panic naming the missing interface.
type PoolBackend interface {
	// AvgPool2d sets y [N, C, OutH, OutW] to the window averages of x.
	AvgPool2d(y, x Buffer, g AvgPoolGeom)
	// AvgPool2dBackward sets dx (+= when accumulate) to the gradient of
	// AvgPool2d: each dy shared equally by its window's input elements.
	AvgPool2dBackward(dx, dy Buffer, g AvgPoolGeom, accumulate bool)
	// AdaptiveAvgPool2d sets y [N, C, OutH, OutW] to the window averages
	// of x.
	AdaptiveAvgPool2d(y, x Buffer, g AdaptivePoolGeom)
	// AdaptiveAvgPool2dBackward sets dx (+= when accumulate) to the
	// gradient of AdaptiveAvgPool2d.
	AdaptiveAvgPool2dBackward(dx, dy Buffer, g AdaptivePoolGeom, accumulate bool)
	// AdaptiveMaxPool2d sets y to the window maxima of x and argmax (int32)
	// to their flat positions h*W+w in the input plane, with MaxPool2d's
	// rules (first maximum wins, NaN propagates).
	AdaptiveMaxPool2d(y, argmax, x Buffer, g AdaptivePoolGeom)
	// AdaptiveMaxPool2dBackward sets dx (+= when accumulate) to dy routed
	// to the saved argmax positions (summed where windows share one).
	AdaptiveMaxPool2dBackward(dx, dy, argmax Buffer, g AdaptivePoolGeom, accumulate bool)
}

// MaxPoolBackend is implemented by backends with a max-pooling kernel.
// Without it (Complete) the window maxima are found by the core's Reduce
// over each plane's positions masked to the window (memory and work
// H·W·OutH·OutW per plane, in chunks of planes: correct, for a backend to
// start with) and their gradient is routed by IndexAdd.
type MaxPoolBackend interface {
	// MaxPool2d sets y to the window maxima of x and argmax (int32) to the
	// flat index within the input plane (h*W+w) of each maximum; ties pick
	// the first in row-major order, as PyTorch does.
	MaxPool2d(y, argmax, x Buffer, g PoolGeom)
	// MaxPool2dBackward routes dy to the saved argmax positions of dx.
	MaxPool2dBackward(dx, dy, argmax Buffer, g PoolGeom, accumulate bool)
}
