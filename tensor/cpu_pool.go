package tensor

import "math"

// Average and adaptive pooling on the CPU (PoolBackend): plain loops, one
// plane per task. The backward passes scatter each output's gradient over
// its window in row-major window order; the CUDA kernels gather in that
// same order, so both add the same terms in the same sequence.

func (*cpuBackend) AvgPool2d(y, x Buffer, g AvgPoolGeom) {
	out, in := f32(y), f32(x)
	oh, ow := g.OutH(), g.OutW()
	parallelFor(g.N*g.C, func(lo, hi int) {
		for p := lo; p < hi; p++ {
			plane := in[p*g.H*g.W : (p+1)*g.H*g.W]
			for i := 0; i < oh; i++ {
				h0, h1 := clampedWindow(i*g.StrideH-g.PadH, g.KH, g.H)
				for j := 0; j < ow; j++ {
					w0, w1 := clampedWindow(j*g.StrideW-g.PadW, g.KW, g.W)
					var s float32
					for h := h0; h < h1; h++ {
						for w := w0; w < w1; w++ {
							s += plane[h*g.W+w]
						}
					}
					out[(p*oh+i)*ow+j] = s / float32(g.WindowDivisor(i, j))
				}
			}
		}
	})
}

// clampedWindow is the part [lo, hi) of the window [start, start+k) that
// lies inside [0, n).
func clampedWindow(start, k, n int) (lo, hi int) { return max(start, 0), min(start+k, n) }

func (*cpuBackend) AvgPool2dBackward(dx, dy Buffer, g AvgPoolGeom, accumulate bool) {
	d, grad := f32(dx), f32(dy)
	oh, ow := g.OutH(), g.OutW()
	parallelFor(g.N*g.C, func(lo, hi int) {
		for p := lo; p < hi; p++ {
			plane := d[p*g.H*g.W : (p+1)*g.H*g.W]
			if !accumulate {
				clear(plane)
			}
			for i := 0; i < oh; i++ {
				h0, h1 := clampedWindow(i*g.StrideH-g.PadH, g.KH, g.H)
				for j := 0; j < ow; j++ {
					w0, w1 := clampedWindow(j*g.StrideW-g.PadW, g.KW, g.W)
					v := grad[(p*oh+i)*ow+j] / float32(g.WindowDivisor(i, j))
					for h := h0; h < h1; h++ {
						for w := w0; w < w1; w++ {
							plane[h*g.W+w] += v
						}
					}
				}
			}
		}
	})
}

func (*cpuBackend) AdaptiveAvgPool2d(y, x Buffer, g AdaptivePoolGeom) {
	out, in := f32(y), f32(x)
	parallelFor(g.N*g.C, func(lo, hi int) {
		for p := lo; p < hi; p++ {
			plane := in[p*g.H*g.W : (p+1)*g.H*g.W]
			for i := 0; i < g.OutH; i++ {
				h0, h1 := g.Rows(i)
				for j := 0; j < g.OutW; j++ {
					w0, w1 := g.Cols(j)
					var s float32
					for h := h0; h < h1; h++ {
						for w := w0; w < w1; w++ {
							s += plane[h*g.W+w]
						}
					}
					out[(p*g.OutH+i)*g.OutW+j] = s / float32((h1-h0)*(w1-w0))
				}
			}
		}
	})
}

func (*cpuBackend) AdaptiveAvgPool2dBackward(dx, dy Buffer, g AdaptivePoolGeom, accumulate bool) {
	d, grad := f32(dx), f32(dy)
	parallelFor(g.N*g.C, func(lo, hi int) {
		for p := lo; p < hi; p++ {
			plane := d[p*g.H*g.W : (p+1)*g.H*g.W]
			if !accumulate {
				clear(plane)
			}
			for i := 0; i < g.OutH; i++ {
				h0, h1 := g.Rows(i)
				for j := 0; j < g.OutW; j++ {
					w0, w1 := g.Cols(j)
					v := grad[(p*g.OutH+i)*g.OutW+j] / float32((h1-h0)*(w1-w0))
					for h := h0; h < h1; h++ {
						for w := w0; w < w1; w++ {
							plane[h*g.W+w] += v
						}
					}
				}
			}
		}
	})
}

func (*cpuBackend) AdaptiveMaxPool2d(y, argmax, x Buffer, g AdaptivePoolGeom) {
	out, idx, in := f32(y), i32(argmax), f32(x)
	parallelFor(g.N*g.C, func(lo, hi int) {
		for p := lo; p < hi; p++ {
			plane := in[p*g.H*g.W : (p+1)*g.H*g.W]
			for i := 0; i < g.OutH; i++ {
				h0, h1 := g.Rows(i)
				for j := 0; j < g.OutW; j++ {
					w0, w1 := g.Cols(j)
					best, at := float32(math.Inf(-1)), -1
					for h := h0; h < h1; h++ {
						for w := w0; w < w1; w++ {
							if v := plane[h*g.W+w]; at < 0 || v > best || v != v {
								best, at = v, h*g.W+w
							}
						}
					}
					o := (p*g.OutH+i)*g.OutW + j
					out[o], idx[o] = best, int32(at)
				}
			}
		}
	})
}

func (*cpuBackend) AdaptiveMaxPool2dBackward(dx, dy, argmax Buffer, g AdaptivePoolGeom, accumulate bool) {
	d, grad, idx := f32(dx), f32(dy), i32(argmax)
	plane, outPlane := g.H*g.W, g.OutH*g.OutW
	if !accumulate {
		clear(d)
	}
	for p := 0; p < g.N*g.C; p++ {
		for o := 0; o < outPlane; o++ {
			d[p*plane+int(idx[p*outPlane+o])] += grad[p*outPlane+o]
		}
	}
}
