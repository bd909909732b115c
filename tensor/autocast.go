package tensor

import "fmt"

// Autocast, as torch.autocast does it for bfloat16 on the GPU: under a scope
// with SetAutocast(BFloat16), the matrix products (MatMul, Linear and
// LinearReLU, BatchMatMul, ScaledDotProductAttention's two products, and
// LinearCrossEntropy's linear part) round their float32 operands to
// bfloat16, multiply them with float32 accumulation and give float32
// results; their backward passes round the incoming gradient to bfloat16
// too and multiply the same way. Parameters, their gradients and the
// optimiser's state stay float32 (torch's "master weights"), as does every
// other operation: softmax, normalisation, losses, reductions, elementwise
// arithmetic. As torch's autocast, which saves a product's bfloat16 inputs
// for its backward pass, MatMul, Linear and BatchMatMul cast each float32
// operand once per step: the forward pass keeps its bfloat16 copies of the
// operands until the backward pass has read them (or drops them at once
// when no backward pass will run), and the backward pass casts the
// incoming gradient once for both of its products. A step's memory grows
// by those bfloat16 copies (half the size of the float32 inputs that the
// backward pass keeps anyway).
//
// Convolutions (Conv2d, Conv2dReLU, Conv2dWith) run in bfloat16 the same way
// on a backend that implements LowPrecisionConvBackend and takes their
// geometry (the CPU, and the GPU where cuDNN is); elsewhere they stay
// float32. Their outputs and input and weight gradients are rounded to
// bfloat16 too (torch's autocast convolutions give bfloat16 tensors).

// SetAutocast sets the element type of the matrix products of the
// operations on this scope's tensors: BFloat16 turns autocast on, Float32
// off (the default). The choice is read when an operation runs, and its
// backward pass follows the choice of its forward pass; Reset keeps it, so
// that a training loop sets it once on the scope it reuses every step.
func (s *Scope) SetAutocast(dt DType) {
	if dt != Float32 && dt != BFloat16 {
		panic(fmt.Sprintf("tensor: SetAutocast(%v): want bfloat16 (on) or float32 (off)", dt))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.autocast = dt
}

// Autocast is the element type of the scope's matrix products (Float32
// when autocast is off, or for a nil scope).
func (s *Scope) Autocast() DType {
	if s == nil {
		return Float32
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.autocast
}

// AutocastOf is the element type the matrix products of an operation on ts
// run in: the autocast of the scope the output joins (the first scoped
// operand's), Float32 when none of them is scoped.
func AutocastOf(ts ...*Tensor) DType { return scopeOf(ts...).Autocast() }

// products runs the matrix products of one operation, forward and backward:
// float32 GEMMs, or under autocast bfloat16 ones with float32 results.
type products struct {
	be Backend
	lp LowPrecisionBackend // nil: float32
	s  *Scope              // where the transient bfloat16 copies live
}

// productsFor picks the products of an operation whose output joins scope
// s on backend be.
func productsFor(be Backend, s *Scope) products {
	p := products{be: be, s: s}
	if s.Autocast() == BFloat16 {
		lp, ok := be.(LowPrecisionBackend)
		if !ok {
			panic(fmt.Sprintf("tensor: autocast to bfloat16 on backend %s, which has no low-precision products", be.Name()))
		}
		p.lp = lp
	}
	return p
}

// lowp reports whether the products run in bfloat16.
func (p products) lowp() bool { return p.lp != nil }

// inScope is p with its transient copies in s (a backward pass's scope).
func (p products) inScope(s *Scope) products { p.s = s; return p }

// operand is a float32 operand of a product and, under autocast, its
// bfloat16 copy when one is at hand (h nil: the product casts it itself).
type operand struct {
	f Buffer
	h *Tensor
	// borrowed: h is the caller's bfloat16 tensor, not a copy of f made
	// here, and release leaves it alone.
	borrowed bool
}

// keep is src as an operand of several products: under autocast cast to
// bfloat16 once here, so that the products share the copy; the caller
// releases it (operand.release) after queueing the last of them.
func (p products) keep(src Buffer) operand {
	o := operand{f: src}
	if p.lowp() {
		o.h = p.half(src)
	}
	return o
}

// keepInput is keep of x's buffer, or under autocast x itself when it is
// bfloat16 already (an activation that wrote the product's operand):
// nothing is cast, and release leaves x to its holders.
func (p products) keepInput(x *Tensor) operand {
	if p.lowp() && x.DType() == BFloat16 {
		return operand{h: x, borrowed: true}
	}
	return p.keep(x.buffer())
}

// release frees a kept bfloat16 copy (the products that read it are
// queued first, so the memory is reused after them).
func (o operand) release() {
	if o.h != nil && !o.borrowed {
		o.h.Release()
	}
}

// owned is the copy that o made, nil for none or a borrowed tensor.
func (o operand) owned() *Tensor {
	if o.borrowed {
		return nil
	}
	return o.h
}

// matMulOf is MatMul's c = alpha·op(a)·op(b) + beta·c of operands whose
// bfloat16 copies may be kept ones; those it casts itself it releases
// after the product.
func (p products) matMulOf(c Buffer, a, b operand, m, n, k int, transA, transB bool, alpha, beta float32) {
	if !p.lowp() {
		p.be.MatMul(c, a.f, b.f, m, n, k, transA, transB, alpha, beta)
		return
	}
	ha, hb := p.halfOf(a), p.halfOf(b)
	p.lp.MatMulLowp(c, ha.h.buffer(), hb.h.buffer(), m, n, k, transA, transB, alpha, beta)
	p.releaseOwn(a, ha)
	p.releaseOwn(b, hb)
}

// linearBiasOf is, under autocast on a backend with
// LowPrecisionBiasBackend, y = x·wᵀ + bias as one product with the bias in
// its epilogue, from the kept bfloat16 x and w; false (nothing done) when
// not under autocast, without a bias, or where the backend declines.
func (p products) linearBiasOf(y Buffer, x, w operand, bias *Tensor, n, in, out int) bool {
	if !p.lowp() || bias == nil || x.h == nil || w.h == nil {
		return false
	}
	lb, ok := p.be.(LowPrecisionBiasBackend)
	return ok && lb.LinearLowp(y, x.h.buffer(), w.h.buffer(), bias.buffer(), n, in, out)
}

// linearOf is y = x·wᵀ + bias (float32 y): one product with the bias in
// its epilogue where the backend takes it, else the product and AddBias.
func (p products) linearOf(y Buffer, x, w operand, bias *Tensor, n, in, out int) {
	if p.linearBiasOf(y, x, w, bias, n, in, out) {
		return
	}
	p.matMulOf(y, x, w, n, out, in, false, true, 1, 0)
	if bias != nil {
		Complete(p.be).AddBias(y, bias.buffer(), n, out, 1)
	}
}

// linearHalfOf is linearOf with y BFloat16 under autocast and the bias
// rounded to bfloat16 as well (as torch's autocast linear rounds it): one
// product that rounds as it writes on a LinearCastBackend, else linearOf's
// float32 result (with the rounded bias, widened) cast.
func (p products) linearHalfOf(y Buffer, x, w operand, bias *Tensor, n, in, out int) {
	var hb *Tensor
	if bias != nil {
		hb = p.half(bias.buffer())
		defer hb.Release()
	}
	if cb, ok := p.be.(LinearCastBackend); ok && x.h != nil && w.h != nil {
		var bb Buffer
		if hb != nil {
			bb = hb.buffer()
		}
		if cb.LinearLowpCast(y, x.h.buffer(), w.h.buffer(), bb, n, in, out) {
			return
		}
	}
	var rb *Tensor
	if hb != nil {
		rb = newTensor(p.be, Float32, p.s, out)
		defer rb.Release()
		p.lp.Cast(rb.buffer(), hb.buffer())
	}
	f := Empty(p.be, p.s, n, out)
	defer f.Release()
	p.linearOf(f.buffer(), x, w, rb, n, in, out)
	p.lp.Cast(y, f.buffer())
}

// batchedOf is MatMulBatched's batch of products of operands whose
// bfloat16 copies may be kept ones.
func (p products) batchedOf(c Buffer, a, b operand, batch, m, n, k int, strideA, strideB, strideC int, transA, transB bool, alpha, beta float32) {
	if !p.lowp() {
		p.be.MatMulBatched(c, a.f, b.f, batch, m, n, k, strideA, strideB, strideC, transA, transB, alpha, beta)
		return
	}
	ha, hb := p.halfOf(a), p.halfOf(b)
	p.lp.MatMulBatchedLowp(c, ha.h.buffer(), hb.h.buffer(), batch, m, n, k, strideA, strideB, strideC, transA, transB, alpha, beta)
	p.releaseOwn(a, ha)
	p.releaseOwn(b, hb)
}

// halfOf is o with its bfloat16 copy: the kept one, or a new one.
func (p products) halfOf(o operand) operand {
	if o.h == nil {
		o.h = p.half(o.f)
	}
	return o
}

// releaseOwn releases the copy of h that halfOf made for o (not a kept one).
func (p products) releaseOwn(o, h operand) {
	if o.h == nil {
		h.h.Release()
	}
}

// half is a transient bfloat16 copy of a float32 operand.
func (p products) half(src Buffer) *Tensor {
	h := newTensor(p.be, BFloat16, p.s, src.Len)
	p.lp.Cast(h.buffer(), src)
	return h
}

// Precision is a training run's arithmetic, as a --precision flag names it.
// It has two parts: whether float32 products and convolutions may round
// their inputs to TF32 on tensor cores (a setting of the GPU backend), and
// the scope's autocast (bfloat16 products and convolutions with float32
// sums, results, master weights and optimiser state).
type Precision string

// The precisions.
const (
	// FP32 is full float32 arithmetic everywhere, the default: GPU and CPU
	// results agree to float32's rounding.
	FP32 Precision = "fp32"
	// TF32 lets float32 matrix products and convolutions round their
	// inputs to TF32 (10-bit mantissa) on tensor cores, as PyTorch's
	// default for cuDNN convolutions.
	TF32 Precision = "tf32"
	// BF16 is autocast to bfloat16 (SetAutocast(BFloat16)).
	BF16 Precision = "bf16"
)

// ParsePrecision reads fp32, tf32 or bf16 ("" is fp32).
func ParsePrecision(s string) (Precision, error) {
	switch p := Precision(s); p {
	case "":
		return FP32, nil
	case FP32, TF32, BF16:
		return p, nil
	}
	return "", fmt.Errorf("precision %q: want fp32, tf32 or bf16", s)
}

// AllowTF32 reports whether float32 products may round to TF32.
func (p Precision) AllowTF32() bool { return p == TF32 }

// Autocast is the element type of the scope's products and convolutions:
// BFloat16 for BF16, else Float32.
func (p Precision) Autocast() DType {
	if p == BF16 {
		return BFloat16
	}
	return Float32
}
