package tensor

import (
	"fmt"
	"math"
)

// The CPU's strided elementwise core. Every function is computed in float32
// operation by operation (transcendentals through float64 math and rounded
// once), in the order the CUDA kernels of cuda/kernels/strided.cu use, so
// that single IEEE operations give the same bits on both backends.

// Constants of the GELU forms.
const (
	geluInvSqrt2   = float32(0.70710678118654752440) // 1/√2
	geluInvSqrt2Pi = float32(0.39894228040143267794) // 1/√(2π)
	geluTanhK      = float32(0.79788456080286535588) // √(2/π)
	geluTanhC      = float32(0.044715)
)

func exp32(x float32) float32  { return float32(math.Exp(float64(x))) }
func tanh32(x float32) float32 { return float32(math.Tanh(float64(x))) }
func erf32(x float32) float32  { return float32(math.Erf(float64(x))) }
func sqrt32(x float32) float32 { return float32(math.Sqrt(float64(x))) }

func sigmoid32(x float32) float32 { return 1 / (1 + exp32(-x)) }

// unary32 is f(x) of UnaryOp op.
func unary32(op UnaryOp, x, a, b float32) float32 {
	switch op {
	case OpIdentity:
		return x
	case OpNeg:
		return -x
	case OpAbs:
		return float32(math.Abs(float64(x)))
	case OpExp:
		return exp32(x)
	case OpLog:
		return float32(math.Log(float64(x)))
	case OpSqrt:
		return sqrt32(x)
	case OpRsqrt:
		return 1 / sqrt32(x)
	case OpRecip:
		return 1 / x
	case OpSquare:
		return x * x
	case OpTanh:
		return tanh32(x)
	case OpSigmoid:
		return sigmoid32(x)
	case OpReLU:
		if x > 0 || x != x {
			return x
		}
		return 0
	case OpLeakyReLU:
		if x > 0 {
			return x
		}
		return a * x
	case OpGELU:
		cdf := float32(0.5) * (1 + erf32(x*geluInvSqrt2))
		return x * cdf
	case OpGELUTanh:
		u := geluTanhK * (x + geluTanhC*(x*x*x))
		return float32(0.5) * x * (1 + tanh32(u))
	case OpSiLU:
		return x * sigmoid32(x)
	case OpClamp:
		if x != x {
			return x
		}
		if x < a {
			return a
		}
		if x > b {
			return b
		}
		return x
	case OpPowScalar:
		return float32(math.Pow(float64(x), float64(a)))
	case OpAddScalar:
		return x + a
	case OpMulScalar:
		return x * a
	case OpAffine:
		return float32(x*a) + b
	case OpSin:
		return float32(math.Sin(float64(x)))
	case OpCos:
		return float32(math.Cos(float64(x)))
	}
	panic(fmt.Sprintf("tensor: cpu: unknown unary op %d", op))
}

// unaryGrad32 is dy·f'(x) of UnaryOp op. Where f has a kink the choice is
// torch's: |x|' = 0 at 0, ReLU' = 0 at 0 (a NaN input passes dy, as
// ReLUBackward does), Clamp' = 1 on the closed interval [a, b].
func unaryGrad32(op UnaryOp, x, dy, a, b float32) float32 {
	switch op {
	case OpIdentity, OpAddScalar:
		return dy
	case OpNeg:
		return -dy
	case OpAbs:
		switch {
		case x > 0:
			return dy
		case x < 0:
			return -dy
		case x == 0:
			return 0
		}
		return x // NaN
	case OpExp:
		return dy * exp32(x)
	case OpLog:
		return dy / x
	case OpSqrt:
		return dy / (2 * sqrt32(x))
	case OpRsqrt:
		r := 1 / sqrt32(x)
		return dy * (float32(-0.5) * (r * r * r))
	case OpRecip:
		r := 1 / x
		return -dy * (r * r)
	case OpSquare:
		return dy * (2 * x)
	case OpTanh:
		t := tanh32(x)
		return dy * (1 - t*t)
	case OpSigmoid:
		s := sigmoid32(x)
		return dy * (s * (1 - s))
	case OpReLU:
		if x <= 0 {
			return 0
		}
		return dy
	case OpLeakyReLU:
		if x > 0 {
			return dy
		}
		return dy * a
	case OpGELU:
		cdf := float32(0.5) * (1 + erf32(x*geluInvSqrt2))
		pdf := geluInvSqrt2Pi * exp32(float32(-0.5)*(x*x))
		return dy * (cdf + x*pdf)
	case OpGELUTanh:
		u := geluTanhK * (x + geluTanhC*(x*x*x))
		t := tanh32(u)
		du := geluTanhK * (1 + 3*geluTanhC*(x*x))
		return dy * (float32(0.5)*(1+t) + float32(0.5)*x*((1-t*t)*du))
	case OpSiLU:
		s := sigmoid32(x)
		return dy * (s * (1 + x*(1-s)))
	case OpClamp:
		if x >= a && x <= b {
			return dy
		}
		return 0
	case OpPowScalar:
		if a == 0 {
			return 0
		}
		return dy * (a * float32(math.Pow(float64(x), float64(a-1))))
	case OpMulScalar, OpAffine:
		return dy * a
	case OpSin:
		return dy * float32(math.Cos(float64(x)))
	case OpCos:
		return -dy * float32(math.Sin(float64(x)))
	}
	panic(fmt.Sprintf("tensor: cpu: unknown unary op %d", op))
}

func bool32(v bool) float32 {
	if v {
		return 1
	}
	return 0
}

// binary32 is op(x, y) of BinaryOp op.
func binary32(op BinaryOp, x, y float32) float32 {
	switch op {
	case OpAdd:
		return x + y
	case OpSub:
		return x - y
	case OpMul:
		return x * y
	case OpDiv:
		return x / y
	case OpPow:
		return float32(math.Pow(float64(x), float64(y)))
	case OpMaximum:
		if x != x || y != y {
			return x + y // NaN
		}
		if x >= y {
			return x
		}
		return y
	case OpMinimum:
		if x != x || y != y {
			return x + y
		}
		if x <= y {
			return x
		}
		return y
	case OpEq:
		return bool32(x == y)
	case OpNe:
		return bool32(x != y)
	case OpLt:
		return bool32(x < y)
	case OpLe:
		return bool32(x <= y)
	case OpGt:
		return bool32(x > y)
	case OpGe:
		return bool32(x >= y)
	}
	panic(fmt.Sprintf("tensor: cpu: unknown binary op %d", op))
}

// stridedWalk calls f with the offsets (into each view's memory, Off
// included) of every element of shape in row-major order. It checks that
// each view stays inside its memory.
func stridedWalk(op string, shape []int, views []View, f func(offs []int)) {
	n := 1
	for _, d := range shape {
		if d < 0 {
			panic(fmt.Sprintf("tensor: cpu: %s: negative dimension in shape %v", op, shape))
		}
		n *= d
	}
	offs := make([]int, len(views))
	for j, v := range views {
		if len(v.Strides) != len(shape) {
			panic(fmt.Sprintf("tensor: cpu: %s: view strides %v for shape %v", op, v.Strides, shape))
		}
		if n == 0 {
			continue
		}
		last := 0
		for k, d := range shape {
			if v.Strides[k] < 0 {
				panic(fmt.Sprintf("tensor: cpu: %s: negative stride in %v", op, v.Strides))
			}
			last += (d - 1) * v.Strides[k]
		}
		if last >= v.Buf.Len {
			panic(fmt.Sprintf("tensor: cpu: %s: view of shape %v strides %v reaches element %d of a buffer of %d", op, shape, v.Strides, last, v.Buf.Len))
		}
		offs[j] = v.Buf.Off
	}
	if n == 0 {
		return
	}
	idx := make([]int, len(shape))
	for range n {
		f(offs)
		for k := len(shape) - 1; k >= 0; k-- {
			idx[k]++
			for j, v := range views {
				offs[j] += v.Strides[k]
			}
			if idx[k] < shape[k] {
				break
			}
			for j, v := range views {
				offs[j] -= shape[k] * v.Strides[k]
			}
			idx[k] = 0
		}
	}
}

func mem32(b Buffer) []float32 {
	if b.DType != Float32 {
		panic(fmt.Sprintf("tensor: cpu: want a float32 buffer, have %v", b.DType))
	}
	return b.Mem.(*cpuMem).f
}

func denseOut(op string, dst Buffer, shape []int) View {
	if n := numel(shape); dst.Len < n {
		panic(fmt.Sprintf("tensor: cpu: %s: destination of %d elements for shape %v", op, dst.Len, shape))
	}
	return Dense(dst, shape)
}

func (*cpuBackend) Unary(op UnaryOp, dst Buffer, x View, shape []int, a, b float32) {
	d, s := mem32(dst), mem32(x.Buf)
	stridedWalk("Unary", shape, []View{denseOut("Unary", dst, shape), x}, func(o []int) {
		d[o[0]] = unary32(op, s[o[1]], a, b)
	})
}

func (*cpuBackend) UnaryBackward(op UnaryOp, dx, dy, x Buffer, n int, a, b float32, accumulate bool) {
	d, g, s := f32(dx)[:n], f32(dy)[:n], f32(x)[:n]
	for i := range d {
		v := unaryGrad32(op, s[i], g[i], a, b)
		if accumulate {
			d[i] += v
		} else {
			d[i] = v
		}
	}
}

func (*cpuBackend) Binary(op BinaryOp, dst Buffer, x, y View, shape []int) {
	d, xs, ys := mem32(dst), mem32(x.Buf), mem32(y.Buf)
	stridedWalk("Binary", shape, []View{denseOut("Binary", dst, shape), x, y}, func(o []int) {
		d[o[0]] = binary32(op, xs[o[1]], ys[o[2]])
	})
}

func (*cpuBackend) Where(dst Buffer, cond, x, y View, shape []int) {
	d, cs, xs, ys := mem32(dst), mem32(cond.Buf), mem32(x.Buf), mem32(y.Buf)
	stridedWalk("Where", shape, []View{denseOut("Where", dst, shape), cond, x, y}, func(o []int) {
		if cs[o[1]] != 0 {
			d[o[0]] = xs[o[2]]
		} else {
			d[o[0]] = ys[o[3]]
		}
	})
}

func (*cpuBackend) CopyView(dst, src View, shape []int, accumulate bool) {
	d, s := mem32(dst.Buf), mem32(src.Buf)
	stridedWalk("CopyView", shape, []View{dst, src}, func(o []int) {
		if accumulate {
			d[o[0]] += s[o[1]]
		} else {
			d[o[0]] = s[o[1]]
		}
	})
}
