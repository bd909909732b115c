package tensor

import (
	"fmt"
	"math"
	"slices"
)

// Reductions over any set of axes, with torch's keepdim. Sums and means
// over every axis but one run of kept axes are one ReduceChannels of
// [outer, C, inner] to [C]. Otherwise each run of
// adjacent axes is one Backend.Reduce over [outer, n, inner] of a dense
// input, innermost run first: [512,64,784] over axes 0 and 2 is 784-long
// rows, then the 512-long columns of the [512,64] partial sums, without
// the full copy that moving the axes together would take. A strided input
// is made dense first. Sum(x), the sum of all elements, is in ops.go.

// normAxes returns the sorted distinct axes of a rank-r tensor (negative
// axes count from the end); none means all.
func normAxes(op string, shape []int, axes []int) []int {
	r := len(shape)
	if len(axes) == 0 {
		all := make([]int, r)
		for i := range all {
			all[i] = i
		}
		return all
	}
	out := make([]int, 0, len(axes))
	for _, a := range axes {
		k := a
		if k < 0 {
			k += r
		}
		if k < 0 || k >= r {
			panic(fmt.Sprintf("tensor: %s of %v over axis %d: out of range", op, shape, a))
		}
		if slices.Contains(out, k) {
			panic(fmt.Sprintf("tensor: %s of %v: axis %d given twice in %v", op, shape, a, axes))
		}
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// reducedShape is x's shape with the axes removed, or set to 1 when keep.
func reducedShape(shape, axes []int, keep bool) []int {
	var out []int
	for k, d := range shape {
		switch {
		case !slices.Contains(axes, k):
			out = append(out, d)
		case keep:
			out = append(out, 1)
		}
	}
	return out
}

// reduceRaw reduces x over the sorted axes with op into a new tensor of
// dtype dt shaped [kept dims...] (no gradient recorded).
func reduceRaw(x *Tensor, axes []int, op ReduceOp, dt DType, s *Scope) *Tensor {
	be := x.st.b
	kept := reducedShape(x.shape, axes, false)
	out := newTensor(be, dt, s, kept...)
	if len(axes) == 0 { // a rank-0 tensor: each output is its one input
		src := x.Detach().Contiguous()
		be.Reduce(op, out.buffer(), src.buffer(), x.Len(), 1, 1, false)
		if src.st != x.st {
			src.Release()
		}
		return out
	}
	src := x.Detach()
	if !x.IsContiguous() {
		src = x.Detach().copyDense(s)
		defer src.Release()
	}
	// Sums and means over all but one run of kept axes ([outer, C, inner]
	// to [C]: NCHW over (0, 2, 3)) are one per-channel reduction, not two
	// stages.
	if runs := adjacentRuns(axes); len(runs) == 2 && runs[0][0] == 0 && runs[1][1] == len(x.shape) &&
		(op == ReduceSum || op == ReduceMean) && dt == Float32 && axesCount(x.shape, axes) > 0 {
		i, j := runs[0][1], runs[1][0]
		Complete(be).ReduceChannels(op, out.buffer(), src.buffer(), numel(x.shape[:i]), numel(x.shape[i:j]), numel(x.shape[j:]), false)
		return out
	}
	// Each run of adjacent axes is one Reduce, the last run first, so that
	// the earlier runs keep their places in the shrinking shape; no stage
	// copies or permutes, and each reads only the previous stage's output.
	runs := adjacentRuns(axes)
	cur, shape := src, slices.Clone(x.shape)
	for r := len(runs) - 1; r >= 0; r-- {
		i, j := runs[r][0], runs[r][1]
		next := slices.Concat(shape[:i], shape[j:])
		dst := out
		if r > 0 {
			dst = newTensor(be, Float32, s, next...)
		}
		be.Reduce(op, dst.buffer(), cur.buffer(), numel(shape[:i]), numel(shape[i:j]), numel(shape[j:]), false)
		if cur != src {
			cur.Release()
		}
		cur, shape = dst, next
	}
	return out
}

// adjacentRuns splits sorted axes into runs of consecutive axes, each as
// the half-open range [first, last+1).
func adjacentRuns(axes []int) [][2]int {
	var runs [][2]int
	for _, a := range axes {
		if n := len(runs); n > 0 && runs[n-1][1] == a {
			runs[n-1][1] = a + 1
			continue
		}
		runs = append(runs, [2]int{a, a + 1})
	}
	return runs
}

func reshapedView(t *Tensor, shape []int) *Tensor {
	return t.rawView(t.off, slices.Clone(shape), contiguousStrides(shape))
}

// SumAxes sums x over axes (all when none), keeping them as size 1 when
// keepdim, as torch.sum(x, dim, keepdim). Each run of adjacent axes is
// summed in float64 on every backend and rounded to float32 once, so a sum
// over k separate runs rounds k times (a relative error of about k·2⁻²⁴
// of Σ|x|); a sum over all axes but one run of kept axes (NCHW over 0, 2,
// 3) is one ReduceChannels, rounded once.
func SumAxes(x *Tensor, axes []int, keepdim bool) *Tensor {
	ax := normAxes("SumAxes", x.shape, axes)
	out := reshapedView(reduceRaw(x, ax, ReduceSum, Float32, x.scope), reducedShape(x.shape, ax, keepdim))
	keepShape := reducedShape(x.shape, ax, true)
	record(out, "sum_axes", func(g *Tensor, e *engine) {
		if g.Len() == 1 {
			giveUniform(e, x, g)
			return
		}
		dst, acc := e.sink(x)
		gk := reshapedView(g, keepShape)
		x.st.b.CopyView(Dense(dst, x.shape), viewOf(gk, x.shape), x.shape, acc)
	}, x)
	return out
}

// axesCount is the number of elements each output of a reduction over
// axes takes in.
func axesCount(shape, axes []int) int {
	n := 1
	for _, a := range axes {
		n *= shape[a]
	}
	return n
}

// MeanAxes is SumAxes divided by the number of elements reduced: each run
// of adjacent axes is one ReduceMean (the division in the reduction, before
// its one rounding, not a pass of its own), and the mean of equal-sized
// means is the mean; over all axes but one kept run it is one
// ReduceChannels. The gradient is g/n broadcast back.
func MeanAxes(x *Tensor, axes []int, keepdim bool) *Tensor {
	ax := normAxes("MeanAxes", x.shape, axes)
	if axesCount(x.shape, ax) == 0 { // 0/0: NaN, as torch's
		return MulScalar(SumAxes(x, ax, keepdim), float32(math.NaN()))
	}
	out := reshapedView(reduceRaw(x, ax, ReduceMean, Float32, x.scope), reducedShape(x.shape, ax, keepdim))
	keepShape := reducedShape(x.shape, ax, true)
	inv := 1 / float32(axesCount(x.shape, ax))
	record(out, "mean_axes", func(g *Tensor, e *engine) {
		if !x.requiresGrad {
			return
		}
		be := x.st.b
		gs := rawUnary(e.scopeFor(x), be, OpMulScalar, denseView(g), g.shape, inv, 0)
		if g.Len() == 1 {
			if !giveUniform(e, x, gs) {
				gs.Release() // else x's gradient is a view of it
			}
			return
		}
		dst, acc := e.sink(x)
		defer gs.Release()
		be.CopyView(Dense(dst, x.shape), viewOf(reshapedView(gs, keepShape), x.shape), x.shape, acc)
	}, x)
	return out
}

// MaxAxes is the maximum over axes (NaN if any is NaN). Its gradient is
// split evenly among the maxima of each output, as torch.amax's (torch.max
// over one dim gives it all to the first maximum; the two agree without
// ties); where the maximum is NaN it is 0.
func MaxAxes(x *Tensor, axes []int, keepdim bool) *Tensor {
	return extremeAxes("MaxAxes", ReduceMax, x, axes, keepdim)
}

// MinAxes is the minimum over axes, as MaxAxes.
func MinAxes(x *Tensor, axes []int, keepdim bool) *Tensor {
	return extremeAxes("MinAxes", ReduceMin, x, axes, keepdim)
}

func extremeAxes(name string, op ReduceOp, x *Tensor, axes []int, keepdim bool) *Tensor {
	ax := normAxes(name, x.shape, axes)
	out := reshapedView(reduceRaw(x, ax, op, Float32, x.scope), reducedShape(x.shape, ax, keepdim))
	keepShape := reducedShape(x.shape, ax, true)
	record(out, name, func(g *Tensor, e *engine) {
		be := x.st.b
		s := e.scopeFor(x)
		mask := rawBinary(s, be, OpEq, denseView(x), viewOf(reshapedView(out, keepShape), x.shape), x.shape)
		defer mask.Release()
		cnt := reduceRaw(mask, ax, ReduceSum, Float32, s)
		defer cnt.Release()
		q := rawBinary(s, be, OpDiv, denseView(reshapedView(g, cnt.shape)), denseView(cnt), cnt.shape)
		defer q.Release()
		zero := Zeros(be, s, 1)
		defer zero.Release()
		gx := Empty(be, s, x.shape...)
		be.Where(gx.buffer(), denseView(mask), viewOf(reshapedView(q, keepShape), x.shape), viewOf(zero, x.shape), x.shape)
		e.give(x, gx)
	}, x)
	return out
}

// ArgmaxAxis returns the int32 index along axis of the first maximum (of
// the first NaN, if any), as torch.argmax(x, dim, keepdim). No gradient.
func ArgmaxAxis(x *Tensor, axis int, keepdim bool) *Tensor {
	return argAxis("ArgmaxAxis", ReduceArgmax, x, axis, keepdim)
}

// ArgminAxis is ArgmaxAxis for the first minimum.
func ArgminAxis(x *Tensor, axis int, keepdim bool) *Tensor {
	return argAxis("ArgminAxis", ReduceArgmin, x, axis, keepdim)
}

func argAxis(name string, op ReduceOp, x *Tensor, axis int, keepdim bool) *Tensor {
	ax := normAxes(name, x.shape, []int{axis})
	if x.shape[ax[0]] == 0 {
		panic(fmt.Sprintf("tensor: %s of %v over the empty axis %d", name, x.shape, axis))
	}
	return reshapedView(reduceRaw(x, ax, op, Int32, x.scope), reducedShape(x.shape, ax, keepdim))
}

// VarAxes is the variance over axes with Bessel's correction: Σ(x-mean)²
// / (n - correction), as torch.var(x, dim, correction=..., keepdim)
// (torch's default correction is 1). It is composed of differentiable
// operations, so its gradient is theirs.
func VarAxes(x *Tensor, axes []int, correction int, keepdim bool) *Tensor {
	ax := normAxes("VarAxes", x.shape, axes)
	n := axesCount(x.shape, ax)
	m := MeanAxes(x, ax, true)
	d := Sub(x, m)
	return MulScalar(SumAxes(Square(d), ax, keepdim), 1/float32(n-correction))
}

// StdAxes is the square root of VarAxes.
func StdAxes(x *Tensor, axes []int, correction int, keepdim bool) *Tensor {
	return Sqrt(VarAxes(x, axes, correction, keepdim))
}

// LogSumExp is log Σ e^x over axes, computed stably: the maximum m is
// subtracted first (and held constant: the result does not depend on it,
// so its gradient is exactly softmax(x)). Outputs whose inputs are all -∞
// give NaN (torch gives -∞).
func LogSumExp(x *Tensor, axes []int, keepdim bool) *Tensor {
	ax := normAxes("LogSumExp", x.shape, axes)
	m := reshapedView(reduceRaw(x, ax, ReduceMax, Float32, x.scope), reducedShape(x.shape, ax, true))
	s := SumAxes(Exp(Sub(x, m)), ax, keepdim)
	return Add(Log(s), reshapedView(m, s.shape))
}
