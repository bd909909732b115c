package tensor

import "fmt"

// Reduce sums in float64 (rounded once at the end, a mean divided first),
// as Sum does; the CUDA
// kernels sum in double too, in a fixed tree, so the two agree to the last
// bit nearly always. Max and min take the first NaN, else the extreme;
// the arg forms take the first index of it.
func (*cpuBackend) Reduce(op ReduceOp, dst, x Buffer, outer, n, inner int, accumulate bool) {
	if outer < 0 || n < 0 || inner < 0 {
		panic(fmt.Sprintf("tensor: cpu: Reduce of [%d, %d, %d]", outer, n, inner))
	}
	if n == 0 && op != ReduceSum {
		panic(fmt.Sprintf("tensor: cpu: Reduce op %d over an empty axis ([%d, 0, %d])", op, outer, inner))
	}
	if accumulate && op != ReduceSum {
		panic("tensor: cpu: Reduce accumulates only sums")
	}
	xs := f32(x)[:outer*n*inner]
	var fd []float32
	var id []int32
	if op == ReduceArgmax || op == ReduceArgmin {
		id = i32(dst)[:outer*inner]
	} else {
		fd = f32(dst)[:outer*inner]
	}
	for o := range outer {
		for i := range inner {
			base := o*n*inner + i
			out := o*inner + i
			if op == ReduceSum || op == ReduceMean {
				var s float64
				for k := range n {
					s += float64(xs[base+k*inner])
				}
				if op == ReduceMean {
					s /= float64(n)
				}
				if accumulate {
					fd[out] += float32(s)
				} else {
					fd[out] = float32(s)
				}
				continue
			}
			best, at := xs[base], 0
			for k := 1; k < n && best == best; k++ {
				v := xs[base+k*inner]
				if v != v || (op == ReduceMax || op == ReduceArgmax) && v > best || (op == ReduceMin || op == ReduceArgmin) && v < best {
					best, at = v, k
				}
			}
			switch op {
			case ReduceMax, ReduceMin:
				fd[out] = best
			case ReduceArgmax, ReduceArgmin:
				id[out] = int32(at)
			default:
				panic(fmt.Sprintf("tensor: cpu: unknown reduce op %d", op))
			}
		}
	}
}

// ReduceChannels sums each channel in float64, as BiasGrad.
func (*cpuBackend) ReduceChannels(op ReduceOp, dst, x Buffer, outer, channels, inner int, accumulate bool) {
	if op != ReduceSum && op != ReduceMean {
		panic(fmt.Sprintf("tensor: cpu: ReduceChannels op %d (sums and means only)", op))
	}
	if outer < 0 || channels < 0 || inner < 0 {
		panic(fmt.Sprintf("tensor: cpu: ReduceChannels of [%d, %d, %d]", outer, channels, inner))
	}
	if accumulate && op != ReduceSum {
		panic("tensor: cpu: ReduceChannels accumulates only sums")
	}
	count := outer * inner
	if count == 0 && op != ReduceSum {
		panic(fmt.Sprintf("tensor: cpu: ReduceChannels op %d over no elements ([%d, %d, %d])", op, outer, channels, inner))
	}
	xs, d := f32(x)[:outer*channels*inner], f32(dst)[:channels]
	parallelFor(channels, func(lo, hi int) {
		for c := lo; c < hi; c++ {
			var s float64
			for o := range outer {
				for _, v := range xs[(o*channels+c)*inner : (o*channels+c+1)*inner] {
					s += float64(v)
				}
			}
			switch {
			case op == ReduceMean:
				d[c] = float32(s / float64(count))
			case accumulate:
				d[c] += float32(s)
			default:
				d[c] = float32(s)
			}
		}
	})
}
