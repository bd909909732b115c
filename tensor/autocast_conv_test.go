package tensor_test

import (
	"math/rand/v2"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// lowpConvCPU is the CPU backend with bfloat16 convolutions: Conv2dLowp
// and Conv2dBackwardLowp round x and w to bfloat16 and run the float32
// convolution (dy and the results are not rounded here), so that an
// autocast convolution on it must equal the float32 convolution of rounded
// operands bit for bit. It counts its calls.
type lowpConvCPU struct {
	tensor.Backend
	lp        tensor.LowPrecisionBackend
	fwd, bwd  int
	refuseAll bool
}

func newLowpConvCPU() *lowpConvCPU {
	return &lowpConvCPU{Backend: tensor.CPU, lp: tensor.CPU.(tensor.LowPrecisionBackend)}
}

func (b *lowpConvCPU) Cast(dst, src tensor.Buffer) { b.lp.Cast(dst, src) }
func (b *lowpConvCPU) MatMulLowp(c, x, y tensor.Buffer, m, n, k int, ta, tb bool, alpha, beta float32) {
	b.lp.MatMulLowp(c, x, y, m, n, k, ta, tb, alpha, beta)
}
func (b *lowpConvCPU) MatMulBatchedLowp(c, x, y tensor.Buffer, batch, m, n, k, sa, sb, sc int, ta, tb bool, alpha, beta float32) {
	b.lp.MatMulBatchedLowp(c, x, y, batch, m, n, k, sa, sb, sc, ta, tb, alpha, beta)
}

// rounded is a float32 copy of f rounded to bfloat16.
func (b *lowpConvCPU) rounded(f tensor.Buffer) tensor.Buffer {
	if f.DType != tensor.Float32 {
		panic("lowpConvCPU: a convolution operand is not float32")
	}
	h, err := b.Alloc(f.Len, tensor.BFloat16)
	if err != nil {
		panic(err)
	}
	r, err := b.Alloc(f.Len, tensor.Float32)
	if err != nil {
		panic(err)
	}
	b.Cast(h, f)
	b.Cast(r, h)
	return r
}

func (b *lowpConvCPU) ConvLowp(tensor.ConvGeom) bool { return !b.refuseAll }
func (b *lowpConvCPU) Conv2dLowp(y, x, w, bias tensor.Buffer, g tensor.ConvGeom) {
	b.fwd++
	b.Conv2d(y, b.rounded(x), b.rounded(w), bias, g)
}
func (b *lowpConvCPU) Conv2dBackwardLowp(dx, dw, db, dy, x, w, y tensor.Buffer, g tensor.ConvGeom) {
	b.bwd++
	b.Conv2dBackward(dx, dw, db, dy, b.rounded(x), b.rounded(w), y, g)
}

// TestAutocastConvolution: under autocast a convolution on a backend with
// bfloat16 convolutions runs forward and backward through them, with x
// and w rounded to bfloat16 and everything else float32: its output and
// gradients equal those of the float32 convolution of rounded copies, bit
// for bit. Without autocast, or where the backend refuses the geometry,
// the convolution stays float32 (no call, unrounded result).
func TestAutocastConvolution(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	be := newLowpConvCPU()
	opts := tensor.ConvOptions{Stride: [2]int{2, 1}, Padding: [2]int{1, 2}, Dilation: [2]int{1, 2}, Groups: 2}
	mk := func(s *tensor.Scope, v []float32, shape ...int) *tensor.Tensor {
		return tensor.FromFloat32(be, s, v, shape...)
	}
	x0 := randomTensor(rng, nil, 3, 4, 9, 8)
	w0 := randomTensor(rng, nil, 6, 2, 3, 3)
	b0 := randomTensor(rng, nil, 6)
	defer x0.Release()
	defer w0.Release()
	defer b0.Release()

	// run convolves (x, w, b) in a scope with autocast dt, with ReLU, and
	// returns y and the gradients of sum(y·g) for a fixed g.
	var gv []float32
	run := func(dt tensor.DType, x, w, b []float32) (y, dx, dw, db []float32) {
		s := tensor.NewScope()
		defer s.Release()
		s.SetAutocast(dt)
		xt := mk(s, x, 3, 4, 9, 8).SetRequiresGrad(true)
		wt := mk(nil, w, 6, 2, 3, 3).SetRequiresGrad(true)
		bt := mk(nil, b, 6).SetRequiresGrad(true)
		defer wt.Release()
		defer bt.Release()
		out := tensor.ReLU(tensor.Conv2dWith(xt, wt, bt, opts))
		if gv == nil {
			gv = make([]float32, out.Len())
			for i := range gv {
				gv[i] = float32(rng.NormFloat64())
			}
		}
		tensor.Sum(tensor.Mul(out, mk(s, gv, out.Shape()...))).Backward()
		return out.Float32s(), xt.Grad().Float32s(), wt.Grad().Float32s(), bt.Grad().Float32s()
	}
	rounded := func(t *tensor.Tensor) []float32 { return roundedCopy(t, nil).Float32s() }

	y, dx, dw, db := run(tensor.BFloat16, x0.Float32s(), w0.Float32s(), b0.Float32s())
	if be.fwd != 1 || be.bwd != 1 {
		t.Fatalf("autocast: %d bfloat16 forward and %d backward convolutions, want 1 and 1", be.fwd, be.bwd)
	}
	fwd, bwd := be.fwd, be.bwd
	ry, rdx, rdw, rdb := run(tensor.Float32, rounded(x0), rounded(w0), b0.Float32s())
	if be.fwd != fwd || be.bwd != bwd {
		t.Fatal("without autocast a bfloat16 convolution ran")
	}
	sameBits(t, "y", y, ry)
	sameBits(t, "dx", dx, rdx)
	sameBits(t, "dw", dw, rdw)
	sameBits(t, "db", db, rdb)

	// The unrounded float32 convolution differs (so the comparison above
	// can fail), and a refused geometry gives it.
	py, _, _, _ := run(tensor.Float32, x0.Float32s(), w0.Float32s(), b0.Float32s())
	differ := false
	for i := range py {
		differ = differ || py[i] != y[i]
	}
	if !differ {
		t.Fatal("the autocast convolution equals the unrounded one: the operands were not rounded")
	}
	be.refuseAll = true
	fy, _, _, _ := run(tensor.BFloat16, x0.Float32s(), w0.Float32s(), b0.Float32s())
	if be.fwd != fwd || be.bwd != bwd {
		t.Fatal("a refused geometry ran in bfloat16")
	}
	sameBits(t, "refused y", fy, py)
}
