package tensor

import (
	"fmt"
	"math"
)

// BFloat16Bits rounds f to bfloat16 and returns its bit pattern: to
// nearest, ties to even, on the integer bits (so subnormals round as
// normal numbers do and a value past the largest bfloat16 becomes an
// infinity), and every NaN becomes the quiet NaN 0x7FC0. This is torch's
// conversion (c10's round_to_nearest_even), and the CUDA kernel's, bit for
// bit.
func BFloat16Bits(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return 0x7fc0
	}
	// Adding 0x7FFF rounds the low half up when it is above one half; the
	// kept half's lowest bit adds the last 1 for ties, toward even.
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

// BFloat16Float32 is the float32 of a bfloat16 bit pattern (exact: the
// pattern is the float32's upper half).
func BFloat16Float32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// Cast returns x converted to dt: Float32 to BFloat16 (rounded as
// BFloat16Bits) or back (exact); x itself when it already has that type.
// Gradients stay float32 in this package, even for a bfloat16 tensor, so
// the backward pass rounds the incoming gradient to bfloat16 and widens it
// again, as torch's gradient would be a bfloat16 tensor cast back to the
// source's type.
func Cast(x *Tensor, dt DType) *Tensor {
	src := x.DType()
	if src == dt {
		return x
	}
	lb, ok := x.st.b.(LowPrecisionBackend)
	if !ok {
		panic(fmt.Sprintf("tensor: Cast to %v: backend %s has no low-precision support", dt, x.st.b.Name()))
	}
	if !(src == Float32 && dt == BFloat16) && !(src == BFloat16 && dt == Float32) {
		panic(fmt.Sprintf("tensor: Cast from %v to %v: only float32 and bfloat16 convert", src, dt))
	}
	if !x.IsContiguous() {
		if src != Float32 {
			panic("tensor: Cast of a strided bfloat16 view; cast a contiguous tensor")
		}
		x = x.Contiguous()
	}
	out := newTensor(x.st.b, dt, x.scope, x.shape...)
	lb.Cast(out.buffer(), x.buffer())
	record(out, "cast", func(g *Tensor, e *engine) {
		dst, acc := e.sink(x)
		if dst.Empty() {
			return
		}
		r := roundedThroughBFloat16(g, e.scopeFor(x))
		defer r.Release()
		if acc {
			Complete(x.st.b).Axpy(dst, 1, r.buffer())
		} else {
			x.st.b.Copy(dst, r.buffer())
		}
	}, x)
	return out
}

// roundedThroughBFloat16 is float32(bfloat16(g)): the values a bfloat16
// gradient would hold, in float32.
func roundedThroughBFloat16(g *Tensor, s *Scope) *Tensor {
	g = g.Contiguous()
	lb := g.st.b.(LowPrecisionBackend)
	h := newTensor(g.st.b, BFloat16, s, g.shape...)
	lb.Cast(h.buffer(), g.buffer())
	out := newTensor(g.st.b, Float32, s, g.shape...)
	lb.Cast(out.buffer(), h.buffer())
	h.Release()
	return out
}

// FromBFloat16Bits copies bfloat16 bit patterns into a new BFloat16 tensor.
func FromBFloat16Bits(b Backend, s *Scope, bits []uint16, shape ...int) *Tensor {
	checkLen(len(bits), shape)
	t := newTensor(b, BFloat16, s, shape...)
	b.Upload(t.buffer(), bits)
	return t
}

// BFloat16s copies a contiguous bfloat16 tensor's bit patterns to a new
// host slice.
func (t *Tensor) BFloat16s() []uint16 {
	out := make([]uint16, t.Len())
	t.st.b.Download(out, t.buffer())
	return out
}
