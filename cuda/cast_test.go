package cuda

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// gemmBF16 checks a bfloat16 GEMM as sgemm checks a float32 one, with
// 2-byte A and B and 4-byte C elements: valid leading dimensions, and every
// matrix of every operand inside one allocation.
func (r *recExec) gemmBF16(transA, transB bool, m, n, k int, alpha float32, a uintptr, lda int, strideA int64,
	b uintptr, ldb int, strideB int64, beta float32, c uintptr, ldc int, strideC int64, batch int) error {
	r.mu.Lock()
	r.gemmsBF++
	r.mu.Unlock()
	if _, err := rowMajorGemm(transA, transB, m, n, k, lda, ldb, ldc); err != nil {
		r.errorf("gemmBF16: %v", err)
	}
	extent := func(size, rows, cols, ld int) int { return size * ((rows-1)*ld + cols) }
	ar, ac := m, k
	if transA {
		ar, ac = k, m
	}
	br, bc := k, n
	if transB {
		br, bc = n, k
	}
	for i := int64(0); i < int64(batch); i++ {
		for _, o := range []struct {
			name  string
			p     uintptr
			bytes int
		}{
			{"A", a + uintptr(2*i*strideA), extent(2, ar, ac, lda)},
			{"B", b + uintptr(2*i*strideB), extent(2, br, bc, ldb)},
			{"C", c + uintptr(4*i*strideC), extent(4, m, n, ldc)},
		} {
			if !r.mem.inside(o.p, o.bytes) {
				r.errorf("gemmBF16 m=%d n=%d k=%d transA=%v transB=%v, matrix %d: operand %s (%d bytes at %#x) is not inside one allocation",
					m, n, k, transA, transB, i, o.name, o.bytes, o.p)
			}
		}
	}
	return nil
}

// TestRecordedCastAndLowPrecisionProducts queues the casts and the
// bfloat16 products on the recorder, transposed, batched, broadcast and
// empty: kernel signatures, operand extents and the calls made are checked.
func TestRecordedCastAndLowPrecisionProducts(t *testing.T) {
	b, rec := newRecordingBackend(t)
	alloc := func(n int, dt tensor.DType) tensor.Buffer {
		buf, err := b.Alloc(n, dt)
		if err != nil {
			t.Fatal(err)
		}
		return buf
	}
	f := func(n int) tensor.Buffer { return alloc(n, tensor.Float32) }
	h := func(n int) tensor.Buffer { return alloc(n, tensor.BFloat16) }
	if got := h(5).Mem.Bytes(); got != 10 {
		t.Errorf("5 bfloat16 elements take %d bytes, want 10", got)
	}
	b.Cast(h(1000), f(1000))
	b.Cast(f(1000), h(1000))
	b.Cast(h(7), h(7)) // same type: a copy
	if rec.launches["ember_cast_f32_bf16"] != 1 || rec.launches["ember_cast_bf16_f32"] != 1 || rec.copies != 1 {
		t.Errorf("casts: %v, %d copies; want one launch each way and one copy", rec.launches, rec.copies)
	}
	b.MatMulLowp(f(6*4), h(6*5), h(5*4), 6, 4, 5, false, false, 1, 0)
	b.MatMulLowp(f(6*4), h(5*6), h(4*5), 6, 4, 5, true, true, 0.5, 1)
	b.MatMulBatchedLowp(f(3*6*4), h(3*6*5), h(5*4), 3, 6, 4, 5, 30, 0, 24, false, false, 1, 0)
	b.MatMulBatchedLowp(f(3*30), h(3*5*6), h(3*4*5), 3, 6, 4, 5, 30, 20, 30, true, true, 1, 0) // gaps in c
	if rec.gemmsBF != 4 || rec.gemms != 0 {
		t.Errorf("4 low-precision products made %d bfloat16 and %d float32 GEMM calls; want 4 and 0", rec.gemmsBF, rec.gemms)
	}
	b.MatMulBatchedLowp(f(2*6), h(0), h(0), 2, 2, 3, 0, 0, 0, 6, false, false, 1, 2) // k = 0: c scaled
	if rec.gemmsBF != 4 || rec.launches["ember_scale"] != 2 {
		t.Errorf("k = 0: %d bfloat16 GEMMs, %d scale launches; want none and 2", rec.gemmsBF-4, rec.launches["ember_scale"])
	}
	if err := b.Synchronize(); err != nil {
		t.Errorf("Synchronize: %v", err)
	}
	for _, c := range []struct {
		name, want string
		f          func()
	}{
		{"float32 operands", "want a bfloat16 buffer", func() { b.MatMulLowp(f(4), f(4), f(4), 2, 2, 2, false, false, 1, 0) }},
		{"bfloat16 result", "want a float32 buffer", func() { b.MatMulLowp(h(4), h(4), h(4), 2, 2, 2, false, false, 1, 0) }},
		{"short operand", "has 3 elements, need 4", func() { b.MatMulLowp(f(4), h(3), h(4), 2, 2, 2, false, false, 1, 0) }},
		{"int32 cast", "no cast from float32 to int32", func() { b.Cast(alloc(4, tensor.Int32), f(4)) }},
		{"cast lengths", "cast of 4 elements into 5", func() { b.Cast(h(5), f(4)) }},
		{"strided bfloat16", "strided bfloat16 views are not supported", func() { b.CopyStrided(h(4), h(8), []int{4}, []int{2}) }},
	} {
		msg := func() (msg string) {
			defer func() { msg = recoveredString(recover()) }()
			c.f()
			return ""
		}()
		if !strings.Contains(msg, c.want) {
			t.Errorf("%s: panic %q, want one containing %q", c.name, msg, c.want)
		}
	}
}

// recoveredString is the text of a recovered panic value ("" for none).
func recoveredString(r any) string {
	switch v := r.(type) {
	case nil:
		return ""
	case error:
		return v.Error()
	case string:
		return v
	}
	return "unexpected panic value"
}

// TestRecordedAutocast runs the autocast operations forward and backward on
// the recorder: every product is a bfloat16 GEMM (none a float32 one, and
// the fused linear kernels are not used), and without autocast there is
// no bfloat16 GEMM at all and the linear layers take their fused kernels.
func TestRecordedAutocast(t *testing.T) {
	b, rec := newRecordingBackend(t)
	run := func(dt tensor.DType) {
		s := tensor.NewScope()
		defer s.Release()
		s.SetAutocast(dt)
		param := func(shape ...int) *tensor.Tensor { return tensor.Zeros(b, s, shape...).SetRequiresGrad(true) }
		x, w, bias := param(8, 5), param(4, 5), param(4)
		tensor.Sum(tensor.Linear(x, w, bias)).Backward()
		tensor.Sum(tensor.LinearReLU(x, w, bias)).Backward()
		tensor.LinearCrossEntropy(x, w, bias, tensor.FromInt32(b, s, make([]int32, 8), 8)).Backward()
		tensor.Sum(tensor.MatMul(x, param(5, 3))).Backward()
		tensor.Sum(tensor.BatchMatMul(param(2, 3, 4, 5), param(2, 3, 5, 6))).Backward()
		tensor.Sum(tensor.ScaledDotProductAttention(param(2, 3, 5, 4), param(2, 3, 6, 4), param(2, 3, 6, 7), true, 0)).Backward()
		if err := b.Synchronize(); err != nil {
			t.Errorf("Synchronize: %v", err)
		}
	}
	rec.reset()
	run(tensor.BFloat16)
	// Forward and two gradients for each of the six products (attention
	// has two).
	if rec.gemmsBF != 3*7 || rec.gemms != 0 {
		t.Errorf("autocast: %d bfloat16 and %d float32 GEMM calls, want %d and 0", rec.gemmsBF, rec.gemms, 3*7)
	}
	for name, n := range rec.launches {
		if strings.HasPrefix(name, "ember_linear") || strings.HasPrefix(name, "ember_gemm_small") {
			t.Errorf("autocast: %d launches of %s, a float32 product", n, name)
		}
	}
	rec.reset()
	run(tensor.Float32)
	if rec.gemmsBF != 0 {
		t.Errorf("without autocast: %d bfloat16 GEMM calls", rec.gemmsBF)
	}
	fused := 0
	for name, n := range rec.launches {
		if strings.HasPrefix(name, "ember_linear") {
			fused += n
		}
	}
	if fused == 0 { // else the check above could not tell the paths apart
		t.Error("without autocast the linear layers launched no fused linear kernel")
	}
}

// TestGPUGemmBF16MatchesCPU compares cuBLAS's bfloat16 GEMMs (one and a
// strided batch, with transposes, alpha and beta) with the CPU backend's
// products of the same bfloat16 operands: the same exact products summed
// in float32 in another order. The CPU's sum errs by at most (k+2)·2⁻²⁴ of
// Σ|alpha·a·b| + |beta·c| (the recursive-summation bound, as in
// tensortest's MatMulLowp), the GPU's by twice that (tensortest allows
// tensor-core accumulation that double): they differ by at most three
// times the bound.
func TestGPUGemmBF16MatchesCPU(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	rng := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct {
		batch, m, n, k int
		ta, tb         bool
		bcastB         bool
		alpha, beta    float32
	}{
		{1, 64, 48, 96, false, false, false, 1, 0},
		{1, 33, 17, 250, true, false, false, 0.5, 1},
		{4, 20, 30, 40, false, true, false, 1, 0},
		{3, 16, 8, 512, true, true, true, 2, 0.25},
	} {
		sa, sb := c.m*c.k, c.k*c.n
		if c.bcastB {
			sb = 0
		}
		lenA, lenB, lenC := (c.batch-1)*sa+c.m*c.k, (c.batch-1)*sb+c.k*c.n, c.batch*c.m*c.n
		bitsA, bitsB := make([]uint16, lenA), make([]uint16, lenB)
		for i := range bitsA {
			bitsA[i] = tensor.BFloat16Bits(float32(rng.NormFloat64()))
		}
		for i := range bitsB {
			bitsB[i] = tensor.BFloat16Bits(float32(rng.NormFloat64()))
		}
		c0 := make([]float32, lenC)
		for i := range c0 {
			c0[i] = float32(rng.NormFloat64())
		}
		results := make([][]float32, 2)
		for i, be := range []tensor.Backend{tensor.CPU, b} {
			s := tensor.NewScope()
			ta, tb := tensor.FromBFloat16Bits(be, s, bitsA, lenA), tensor.FromBFloat16Bits(be, s, bitsB, lenB)
			tc := tensor.FromFloat32(be, s, c0, lenC)
			be.(tensor.LowPrecisionBackend).MatMulBatchedLowp(tc.Buffer(), ta.Buffer(), tb.Buffer(), c.batch, c.m, c.n, c.k, sa, sb, c.m*c.n, c.ta, c.tb, c.alpha, c.beta)
			results[i] = tc.Float32s()
			s.Release()
		}
		for q := 0; q < c.batch; q++ {
			for i := 0; i < c.m; i++ {
				for j := 0; j < c.n; j++ {
					bound := math.Abs(float64(c.beta * c0[(q*c.m+i)*c.n+j]))
					for p := 0; p < c.k; p++ {
						ai, bi := q*sa+i*c.k+p, q*sb+p*c.n+j
						if c.ta {
							ai = q*sa + p*c.m + i
						}
						if c.tb {
							bi = q*sb + j*c.k + p
						}
						bound += math.Abs(float64(c.alpha) * float64(tensor.BFloat16Float32(bitsA[ai])) * float64(tensor.BFloat16Float32(bitsB[bi])))
					}
					at := (q*c.m+i)*c.n + j
					got, want := float64(results[1][at]), float64(results[0][at])
					if tol := 3 * float64(c.k+2) * 0x1p-24 * bound; math.Abs(got-want) > tol {
						t.Fatalf("%+v: element [%d, %d, %d]: GPU %.9g, CPU %.9g, allowed %.3g", c, q, i, j, got, want, tol)
					}
				}
			}
		}
	}
}

// TestRecordedLeNetAutocastStep runs LeNet training steps with autocast on
// the step's scope, as a trainer's --precision bf16 would: the linear
// layers' products become bfloat16 GEMMs (forward and both gradients of
// each of its two linear layers), every launch and GEMM checked by the
// recorder.
func TestRecordedLeNetAutocastStep(t *testing.T) {
	b, rec := newRecordingBackend(t)
	l := newLeNetTrainer(t, b, 64)
	defer l.close()
	l.scope.SetAutocast(tensor.BFloat16)
	l.step()
	rec.reset()
	l.step() // the scope was Reset: autocast must still be on
	if rec.gemmsBF != 2*3 {
		t.Errorf("one autocast LeNet step made %d bfloat16 GEMM calls, want 6 (2 linear layers, forward and two gradients)", rec.gemmsBF)
	}
}

// TestLeNetAutocastLossFollowsFloat32 trains LeNet on the CPU for a few
// steps from the same initialisation with and without autocast: the losses
// must agree within 2e-2 relative (bfloat16 rounds each product's operands
// by up to 2⁻⁹ ≈ 2e-3; the loss of a few steps drifts by a few times that).
func TestLeNetAutocastLossFollowsFloat32(t *testing.T) {
	const steps = 5
	var losses [2][steps]float32
	for i, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16} {
		l := newLeNetTrainer(t, tensor.CPU, 64)
		l.scope.SetAutocast(dt)
		for s := range steps {
			losses[i][s] = l.step()
		}
		l.close()
	}
	for s := range steps {
		f32, bf := float64(losses[0][s]), float64(losses[1][s])
		if math.Abs(bf-f32) > 2e-2*math.Abs(f32) {
			t.Errorf("step %d: loss %.6g with autocast, %.6g without", s, bf, f32)
		}
	}
	t.Logf("float32 %v, autocast %v", losses[0], losses[1])
}
