package cuda

import (
	"errors"

	"github.com/ember-ml/ember/cuda/driver"
	"github.com/ember-ml/ember/tensor"
)

// Linear layers through cuBLASLt: the product and its epilogue in one
// kernel. The forward pass takes the bias and the ReLU (LtBias, LtReLUBias)
// instead of a cuBLAS SGEMM followed by ember_add_bias_relu, which reads
// and writes y once more; the weight gradient of a layer without ReLU takes
// the bias gradient (LtBGradA, db = the column sums of g) instead of a
// separate reduction over g. The products without an epilogue (dx, and dw
// behind the ReLU's mask, whose pass already sums db) stay on cuBLAS.
//
// Which layers: by default the wide ones of at most linearTiledRows rows
// (in·out from ltWideMin), where cuBLASLt measured faster than the tiled
// kernels of linear.cu (BackendOptions.NoLinearLtWide, EMBER_LINEAR_LT=0,
// keeps them tiled); with BackendOptions.LinearLt (EMBER_LINEAR_LT=1) also
// the batches above linearTiledRows, which go to cuBLAS otherwise and have
// not been timed on cuBLASLt; LinearLtEverywhere (EMBER_LINEAR_LT=all)
// every layer cuBLASLt takes, for comparisons.
//
// cuBLASLt ranks algorithms per shape from its heuristics on the shape's
// first call (host-only work: nothing is queued or waited for, so a first
// call inside a stream capture is safe); outside a capture the first few
// are timed and the fastest is kept (linear_lt_tune.go), inside one the
// first is (driver.Lt). A shape it refuses, or pointers not 16-byte
// aligned, take the cuBLAS path instead.

// ltExec is an executor that queues cuBLASLt products.
type ltExec interface {
	ltMatmul(g LtGemm, alpha float32, a, b uintptr, beta float32, c, bias, aux uintptr) error
}

func (g *gpuExec) ltMatmul(p LtGemm, alpha float32, a, b uintptr, beta float32, c, bias, aux uintptr) error {
	if g.lt == nil {
		return errors.New("cuda: a cuBLASLt product queued on an executor without cuBLASLt")
	}
	if err := g.settle(); err != nil {
		return err
	}
	ws, size := uintptr(0), 0
	if !g.ltWS.IsZero() {
		ws, size = g.ltWS.Ptr(), g.ltWS.Size()
	}
	return g.lt.Matmul(p, alpha, a, b, beta, c, bias, aux, ws, size, g.stream)
}

// openLt opens cuBLASLt, sharing cuBLAS's workspace (the two queue on the
// same stream, one after the other). Without it, lt stays nil and ltErr
// says why: the linear layers keep the cuBLAS path.
func (b *Backend) openLt() {
	b.ltEverywhere, b.ltWide = b.opt.LinearLtEverywhere, !b.opt.NoLinearLtWide
	if !b.opt.LinearLt && !b.opt.LinearLtEverywhere && !b.ltWide {
		b.ltErr = errors.New("cuBLASLt turned off (BackendOptions.NoLinearLtWide, EMBER_LINEAR_LT=0)")
		return
	}
	ws := 0
	if !b.blasWorkspace.IsZero() {
		ws = b.blasWorkspace.Size()
	}
	lt, err := b.dev.NewLt(ws)
	if err != nil {
		b.ltErr = err
		return
	}
	b.lt = lt
	if g, ok := b.x.(*gpuExec); ok {
		g.lt, g.ltWS = lt, b.blasWorkspace
	}
}

// LtError says why linear layers do not use cuBLASLt (nil when they do).
func (b *Backend) LtError() error { return b.ltErr }

// ltWideMin is the smallest in·out of a layer of at most 256 rows that
// goes to cuBLASLt ahead of the tiled kernels: in the MLP 784-1024-1024-10
// at batch 64 its two wide layers through cuBLASLt (and their backward
// through cuBLAS) took the epoch from 0.0908 to 0.0739 s, while LeNet's
// fc1 (800·500) was slower there (0.0979 → 0.1004 s with every layer on
// cuBLASLt).
const ltWideMin = 1 << 19

// ltFirst says whether an n x in x out layer goes to cuBLASLt ahead of the
// tiled and small-product kernels (its backward then takes the cuBLAS
// products).
func (b *Backend) ltFirst(n, in, out int) bool {
	return b.lt != nil && (b.ltEverywhere || b.ltWide && n <= linearTiledRows && in*out >= ltWideMin)
}

// ltLinear says whether an n x in x out layer may go to cuBLASLt: first
// (ltFirst), or above 256 rows with LinearLt.
func (b *Backend) ltLinear(n, in, out int) bool {
	return b.ltFirst(n, in, out) || b.lt != nil && b.opt.LinearLt && n > linearTiledRows
}

// ltRun queues g through cuBLASLt and reports true, or reports false
// having queued nothing when cuBLASLt cannot take it (no cuBLASLt, the
// pointers' alignment, no algorithm for the shape).
func (b *Backend) ltRun(op string, g LtGemm, alpha float32, pa, pb uintptr, beta float32, pc, pbias, paux uintptr) bool {
	x, ok := b.x.(ltExec)
	if !ok {
		return false
	}
	g, ok = b.ltPlan(g, pa, pb, pc, pbias, paux)
	if !ok {
		return false
	}
	b.tuneLt(op, g, alpha, pa, pb, beta, pbias)
	devCheck(op, x.ltMatmul(g, alpha, pa, pb, beta, pc, pbias, paux))
	b.ltCalls.Add(1)
	return true
}

// ltPlan completes g for its pointers and this backend's precision and
// makes its plan; false when cuBLASLt cannot take it.
func (b *Backend) ltPlan(g LtGemm, ptrs ...uintptr) (LtGemm, bool) {
	if b.lt == nil {
		return g, false
	}
	// The algorithms are chosen for an alignment of the base pointers
	// (cuBLASLt sees the leading dimensions in the layouts).
	var or uintptr
	for _, p := range ptrs {
		or |= p
	}
	switch {
	case or%256 == 0:
	case or%16 == 0:
		g.Align16 = true
	default:
		return g, false
	}
	g.TF32 = !g.BF16 && b.blas.TF32()
	return g, b.lt.Prepare(g) == nil
}

// linearLt queues y [n, out] = x [n, in] · wᵀ (+ bias) (then the ReLU)
// through cuBLASLt; false when it cannot take the layer.
func (b *Backend) linearLt(op string, py, px, pw, pbias uintptr, n, in, out int, relu bool) bool {
	epi := driver.LtDefault
	switch {
	case relu && pbias != 0:
		epi = driver.LtReLUBias
	case relu:
		epi = driver.LtReLU
	case pbias != 0:
		epi = driver.LtBias
	}
	g := LtGemm{TransB: true, M: n, N: out, K: in, LDA: in, LDB: in, LDC: out, Epilogue: epi}
	return b.ltRun(op, g, 1, px, pw, 0, py, pbias, 0)
}

// weightGradsLt queues dw [out, in] (+)= gᵀ · x and db [out] = the column
// sums of g [n, out] in one cuBLASLt product; false when it cannot take it.
// db is written, never added to.
func (b *Backend) weightGradsLt(op string, pdw, pdb, pg, px uintptr, n, in, out int, accW bool) bool {
	return b.ltRun(op, weightGradGemm(n, in, out, driver.LtBGradA), 1, pg, px, beta32(accW), pdw, pdb, 0)
}

// weightGradGemm is the product dw [out, in] = gᵀ · x of a layer of n rows,
// with epi (LtBGradA: db, the column sums of g, in the same pass).
func weightGradGemm(n, in, out int, epi driver.LtEpilogue) LtGemm {
	return LtGemm{TransA: true, M: out, N: in, K: n, LDA: out, LDB: in, LDC: in, Epilogue: epi}
}

// LinearLowp implements tensor.LowPrecisionBiasBackend: y [n, out] =
// x [n, in] · wᵀ + bias, x and w bfloat16, y and bias float32, as one
// cuBLASLt product with the bias in its epilogue (the sums in float32,
// the bias added to their float32 result). Under autocast a linear
// layer's bias is then no separate pass over y (in the GPT's MLP that
// pass read and wrote 200 MB a layer). False, having queued nothing,
// where cuBLASLt is off or does not take the shape.
func (b *Backend) LinearLowp(y, x, w, bias tensor.Buffer, n, in, out int) bool {
	const op = "linear_lowp"
	if n <= 0 || in <= 0 || out <= 0 || b.lt == nil {
		return false
	}
	need(op, "x", x, n*in)
	need(op, "w", w, out*in)
	need(op, "bias", bias, out)
	need(op, "y", y, n*out)
	py, px, pw := b.f32(op, y), b.ptr(op, x, tensor.BFloat16), b.ptr(op, w, tensor.BFloat16)
	g := LtGemm{TransB: true, M: n, N: out, K: in, LDA: in, LDB: in, LDC: out, Epilogue: driver.LtBias, BF16: true}
	return b.ltRun(op, g, 1, px, pw, 0, py, b.f32(op, bias), 0)
}

// LinearLowpCast implements tensor.LinearCastBackend: y = x·wᵀ + bias
// with y and bias bfloat16, the float32 sums plus the widened bias rounded
// as cuBLASLt writes them (no float32 result, no separate cast). bias may
// be empty. False, having queued nothing, where cuBLASLt is off or does
// not take the product.
func (b *Backend) LinearLowpCast(y, x, w, bias tensor.Buffer, n, in, out int) bool {
	const op = "linear_lowp_cast"
	if n <= 0 || in <= 0 || out <= 0 || b.lt == nil {
		return false
	}
	need(op, "x", x, n*in)
	need(op, "w", w, out*in)
	need(op, "y", y, n*out)
	py, px, pw := b.ptr(op, y, tensor.BFloat16), b.ptr(op, x, tensor.BFloat16), b.ptr(op, w, tensor.BFloat16)
	g := LtGemm{TransB: true, M: n, N: out, K: in, LDA: in, LDB: in, LDC: out, Epilogue: driver.LtDefault, BF16: true, OutBF16: true}
	var pbias uintptr
	if !bias.Empty() {
		need(op, "bias", bias, out)
		pbias, g.Epilogue = b.ptr(op, bias, tensor.BFloat16), driver.LtBias
	}
	return b.ltRun(op, g, 1, px, pw, 0, py, pbias, 0)
}

var (
	_ tensor.LowPrecisionBiasBackend = (*Backend)(nil)
	_ tensor.LinearCastBackend       = (*Backend)(nil)
)
