package tensor

import "fmt"

// Cast converts between float32 and bfloat16 bit patterns (BFloat16Bits
// and BFloat16Float32, ops_cast.go).
func (*cpuBackend) Cast(dst, src Buffer) {
	if dst.Len != src.Len {
		panic(fmt.Sprintf("tensor: cpu: cast of %d elements into %d", src.Len, dst.Len))
	}
	switch {
	case src.DType == Float32 && dst.DType == BFloat16:
		d, s := bf16(dst), f32(src)
		for i, v := range s {
			d[i] = BFloat16Bits(v)
		}
	case src.DType == BFloat16 && dst.DType == Float32:
		d, s := f32(dst), bf16(src)
		for i, v := range s {
			d[i] = BFloat16Float32(v)
		}
	case src.DType == dst.DType:
		(&cpuBackend{}).Copy(dst, src)
	default:
		panic(fmt.Sprintf("tensor: cpu: no cast from %v to %v", src.DType, dst.DType))
	}
}

// UnaryCast is Unary then Cast in one pass, without the float32 output:
// the same unary32 of each element, rounded as Cast rounds it.
func (*cpuBackend) UnaryCast(op UnaryOp, dst, x Buffer, n int, a, b float32) {
	d, s := bf16(dst)[:n], f32(x)[:n]
	for i, v := range s {
		d[i] = BFloat16Bits(unary32(op, v, a, b))
	}
}

var _ UnaryCastBackend = (*cpuBackend)(nil)

// MatMulLowp widens the bfloat16 operands to float32 (exactly) and runs
// the float32 SGEMM: the same products as cuBLAS's bfloat16 GEMM with
// float32 accumulation, summed in another order.
func (c *cpuBackend) MatMulLowp(dst, a, b Buffer, m, n, k int, transA, transB bool, alpha, beta float32) {
	c.MatMulBatchedLowp(dst, a, b, 1, m, n, k, 0, 0, m*n, transA, transB, alpha, beta)
}

// MatMulBatchedLowp is MatMulLowp over a batch (MatMulBatched's strides).
func (c *cpuBackend) MatMulBatchedLowp(dst, a, b Buffer, batch, m, n, k int, strideA, strideB, strideC int, transA, transB bool, alpha, beta float32) {
	wa, wb := c.widen(a), c.widen(b)
	c.MatMulBatched(dst, wa, wb, batch, m, n, k, strideA, strideB, strideC, transA, transB, alpha, beta)
}

// widen returns a float32 copy of a bfloat16 buffer.
func (c *cpuBackend) widen(b Buffer) Buffer {
	if b.DType != BFloat16 {
		panic(fmt.Sprintf("tensor: cpu: low-precision product of a %v operand, want bfloat16", b.DType))
	}
	w, _ := c.Alloc(b.Len, Float32)
	c.Cast(w, b)
	return w
}

// bf16Round is v rounded to bfloat16, as float32.
func bf16Round(v float32) float32 { return BFloat16Float32(BFloat16Bits(v)) }

// roundedF32 is a float32 buffer holding the first n values of b rounded
// to bfloat16.
func (c *cpuBackend) roundedF32(b Buffer, n int) Buffer {
	r, _ := c.Alloc(n, Float32)
	d := f32(r)
	for i, v := range f32(b)[:n] {
		d[i] = bf16Round(v)
	}
	return r
}

// ConvLowp is true: every geometry runs in bfloat16 under autocast.
func (*cpuBackend) ConvLowp(ConvGeom) bool { return true }

// Conv2dLowp rounds x and w to bfloat16, runs the float32 convolution
// (exact products of the rounded operands, float32 sums), rounds the sum
// to bfloat16, then adds the bias and applies the ReLU: what the GPU's
// cuDNN path computes, summed in another order.
func (c *cpuBackend) Conv2dLowp(y, x, w, bias Buffer, g ConvGeom) {
	n := g.N * g.K * g.OutH() * g.OutW()
	plain := g
	plain.ReLU = false
	c.Conv2d(y, c.roundedF32(x, g.N*g.C*g.H*g.W), c.roundedF32(w, g.WeightLen()), Buffer{}, plain)
	out, p := f32(y)[:n], g.OutH()*g.OutW()
	var b []float32
	if !bias.Empty() {
		b = f32(bias)
	}
	for i, v := range out {
		v = bf16Round(v)
		if b != nil {
			v += b[i/p%g.K]
		}
		if g.ReLU && !(v > 0) && v == v { // NaN stays NaN, as in Conv2d
			v = 0
		}
		out[i] = v
	}
}

// Conv2dBackwardLowp sums db from the float32 dy (masked under g.ReLU),
// rounds the masked dy, x and w to bfloat16, runs the float32 backward
// pass on them and rounds the input and weight gradients to bfloat16
// before dx is written and dw added into.
func (c *cpuBackend) Conv2dBackwardLowp(dx, dw, db, dy, x, w, y Buffer, g ConvGeom) {
	n := g.N * g.K * g.OutH() * g.OutW()
	if !db.Empty() {
		c.Conv2dBackward(Buffer{}, Buffer{}, db, dy, x, w, y, g)
	}
	if dx.Empty() && dw.Empty() {
		return
	}
	gr, _ := c.Alloc(n, Float32)
	d, src := f32(gr), f32(dy)[:n]
	var mask []float32
	if g.ReLU {
		mask = f32(y)
	}
	for i, v := range src {
		if mask != nil && mask[i] <= 0 {
			v = 0
		}
		d[i] = bf16Round(v)
	}
	plain := g
	plain.ReLU = false
	wLen := g.WeightLen()
	rw := c.roundedF32(w, wLen)
	if !dw.Empty() {
		part, _ := c.Alloc(wLen, Float32)
		c.Conv2dBackward(Buffer{}, part, Buffer{}, gr, c.roundedF32(x, g.N*g.C*g.H*g.W), rw, Buffer{}, plain)
		acc := f32(dw)
		for i, v := range f32(part) {
			acc[i] += bf16Round(v)
		}
	}
	if !dx.Empty() {
		c.Conv2dBackward(dx, Buffer{}, Buffer{}, gr, Buffer{}, rw, Buffer{}, plain)
		out := f32(dx)[:g.N*g.C*g.H*g.W]
		for i, v := range out {
			out[i] = bf16Round(v)
		}
	}
}
