package tensor

import (
	"fmt"
	"math"
)

// Softmax and its backward pass view x as [outer, n, inner] and work on the
// n elements of each (outer, inner) column. The sums are in float64 and the
// maximum is subtracted first, so that no exponential overflows; the CUDA
// kernels (kernels/softmax.cu) do the same steps in the same order.

func (*cpuBackend) Softmax(y, x Buffer, outer, n, inner int, log bool) {
	checkSoftmaxDims("Softmax", outer, n, inner, y, x)
	out, in := f32(y), f32(x)
	parallelFor(outer*inner, func(lo, hi int) {
		for col := lo; col < hi; col++ {
			o, r := col/inner, col%inner
			base := o*n*inner + r
			m := float32(math.Inf(-1))
			for i := 0; i < n; i++ {
				m = max(m, in[base+i*inner]) // NaN propagates, as Go's max does
			}
			var s float64
			for i := 0; i < n; i++ {
				s += math.Exp(float64(in[base+i*inner] - m))
			}
			if log {
				ls := float32(math.Log(s))
				for i := 0; i < n; i++ {
					out[base+i*inner] = in[base+i*inner] - m - ls
				}
				continue
			}
			inv := 1 / s
			for i := 0; i < n; i++ {
				out[base+i*inner] = float32(math.Exp(float64(in[base+i*inner]-m)) * inv)
			}
		}
	})
}

func (*cpuBackend) SoftmaxBackward(dx, dy, y Buffer, outer, n, inner int, log, accumulate bool) {
	checkSoftmaxDims("SoftmaxBackward", outer, n, inner, dx, dy, y)
	d, g, out := f32(dx), f32(dy), f32(y)
	parallelFor(outer*inner, func(lo, hi int) {
		for col := lo; col < hi; col++ {
			o, r := col/inner, col%inner
			base := o*n*inner + r
			var s float64 // Σ dy (log) or Σ dy·y
			for i := 0; i < n; i++ {
				if log {
					s += float64(g[base+i*inner])
				} else {
					s += float64(g[base+i*inner]) * float64(out[base+i*inner])
				}
			}
			for i := 0; i < n; i++ {
				j := base + i*inner
				var v float32
				if log {
					v = float32(float64(g[j]) - math.Exp(float64(out[j]))*s)
				} else {
					v = float32(float64(out[j]) * (float64(g[j]) - s))
				}
				if accumulate {
					d[j] += v
				} else {
					d[j] = v
				}
			}
		}
	})
}

// checkSoftmaxDims panics unless every buffer holds outer·n·inner elements.
func checkSoftmaxDims(op string, outer, n, inner int, bufs ...Buffer) {
	if outer < 0 || n < 1 || inner < 0 {
		panic(fmt.Sprintf("tensor: cpu: %s of [%d, %d, %d]", op, outer, n, inner))
	}
	for _, b := range bufs {
		if b.Len != outer*n*inner {
			panic(fmt.Sprintf("tensor: cpu: %s of [%d, %d, %d]: a buffer of %d elements", op, outer, n, inner, b.Len))
		}
	}
}
