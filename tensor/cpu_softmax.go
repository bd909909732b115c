package tensor

import (
	"fmt"
	"math"
)

// Softmax and its backward pass view x as [outer, n, inner] and work on the
// n elements of each (outer, inner) column. The maximum is subtracted
// first, so that no exponential overflows; the CUDA kernels
// (kernels/softmax.cu) do the same steps in the same order. Softmax over
// rows (inner == 1) is in float32, summed as a warp of 32 lanes does (see
// softmaxRow); columns and the backward pass sum in float64.

func (*cpuBackend) Softmax(y, x Buffer, outer, n, inner int, log bool) {
	checkSoftmaxDims("Softmax", outer, n, inner, y, x)
	out, in := f32(y), f32(x)
	if inner == 1 {
		parallelFor(outer, func(lo, hi int) {
			for r := lo; r < hi; r++ {
				softmaxRow(out[r*n:(r+1)*n], in[r*n:(r+1)*n], log, n%4 == 0)
			}
		})
		return
	}
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

// softmaxRow is the float32 softmax of one row in the GPU's order: the
// elements are dealt to 32 lanes, element i to lane i mod 32, or, when
// fours (the rows of a tensor are a multiple of 4 long, whatever part of
// them is taken), element i to lane (i/4) mod 32 (the GPU then reads
// groups of four); each lane adds e^(x-m) of its elements in turn, the
// lanes are joined by an xor butterfly (warpSum32), then y = e^(x-m)·(1/s),
// or x - m - log s. Each float32 exponential and logarithm is the float64
// one rounded (the GPU's expf and logf are within 2 ulp of it). A lane sums
// about n/32 terms and the tree adds 5 levels, so s errs by at most (n/32 +
// 5)·2⁻²⁴ relatively (8·10⁻⁶ for n = 4096), against float64 sequential
// sums.
func softmaxRow(out, in []float32, log, fours bool) {
	m := float32(math.Inf(-1))
	for _, v := range in {
		m = max(m, v) // NaN propagates, as Go's max does
	}
	shift := 0
	if fours {
		shift = 2
	}
	var lanes [32]float32
	for i, v := range in {
		lanes[(i>>shift)%32] += expf32(v - m)
	}
	s := warpSum32(&lanes)
	if log {
		ls := float32(math.Log(float64(s)))
		for i, v := range in {
			out[i] = v - m - ls
		}
		return
	}
	inv := 1 / s
	for i, v := range in {
		out[i] = expf32(v-m) * inv
	}
}

// CausalSoftmax is softmaxRow of each row's first min(q+1, n) elements,
// q = row mod t, and 0 after them, as the GPU's.
func (*cpuBackend) CausalSoftmax(y, x Buffer, rows, t, n int) {
	if rows < 0 || t < 1 || n < 1 {
		panic(fmt.Sprintf("tensor: cpu: CausalSoftmax of [%d, %d] over %d queries", rows, n, t))
	}
	checkSoftmaxDims("CausalSoftmax", rows, n, 1, y, x)
	out, in := f32(y), f32(x)
	parallelFor(rows, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			kept := min(r%t+1, n)
			softmaxRow(out[r*n:r*n+kept], in[r*n:r*n+kept], false, n%4 == 0)
			clear(out[r*n+kept : (r+1)*n])
		}
	})
}

// expf32 is e^x rounded to float32.
func expf32(x float32) float32 { return float32(math.Exp(float64(x))) }

// warpSum32 is the sum of 32 lanes by the xor butterfly of the CUDA
// kernels' ember_warp_sum: at each step lane l adds lane l^o, o = 16..1.
func warpSum32(lanes *[32]float32) float32 {
	for o := 16; o > 0; o >>= 1 {
		var next [32]float32
		for l := range lanes {
			next[l] = lanes[l] + lanes[l^o]
		}
		*lanes = next
	}
	return lanes[0]
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
