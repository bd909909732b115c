package driver

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"
)

// cuBLASLt bindings (libcublasLt.so.N): matrix products with an epilogue
// (bias, ReLU, GELU, their gradients and the bias gradient) in the same
// kernel, the algorithm chosen once per shape by cuBLASLt's heuristics (or
// by the caller among their ranked candidates: Lt.Candidates, Lt.Use).
//
// The arguments are ROW-MAJOR, as for Sgemm (cublas.go): the column-major
// call computes C^T = op(B)^T op(A)^T, B first. So a bias added along the
// row-major columns of C (one value per output feature) is cuBLASLt's bias
// over the rows of its D, and a bias gradient summed over the rows of
// row-major op(A) is its BGRADB (the reduction of its second operand over
// k).

var cublasLtLib = &Library{
	What:    "cuBLASLt",
	Display: "libcublasLt.so.13, .12, .11",
	Install: "cuBLAS, e.g. the CUDA toolkit's libcublas package (it ships libcublasLt)",
	Dirs:    ExtraLibDirs,
}

var ltFn struct {
	create           uintptr // cublasStatus_t cublasLtCreate(cublasLtHandle_t *)
	destroy          uintptr // cublasStatus_t cublasLtDestroy(cublasLtHandle_t)
	descCreate       uintptr // cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *, cublasComputeType_t, cudaDataType_t scaleType)
	descDestroy      uintptr // cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t)
	descSetAttribute uintptr // cublasLtMatmulDescSetAttribute(desc, attr, const void *buf, size_t)
	layoutCreate     uintptr // cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *, cudaDataType, uint64_t rows, uint64_t cols, int64_t ld)
	layoutDestroy    uintptr // cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t)
	prefCreate       uintptr // cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *)
	prefDestroy      uintptr // cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t)
	prefSetAttribute uintptr // cublasLtMatmulPreferenceSetAttribute(pref, attr, const void *buf, size_t)
	algoGetHeuristic uintptr // cublasLtMatmulAlgoGetHeuristic(h, op, A, B, C, D, pref, int requested, cublasLtMatmulHeuristicResult_t *, int *returned)
	matmul           uintptr // cublasLtMatmul(h, op, alpha*, A, Adesc, B, Bdesc, beta*, C, Cdesc, D, Ddesc, const cublasLtMatmulAlgo_t *, void *ws, size_t wsBytes, cudaStream_t)
	getVersion       uintptr // size_t cublasLtGetVersion(void)
}

// cublasLt.h enum values.
const (
	ltDescComputeType = 0  // CUBLASLT_MATMUL_DESC_COMPUTE_TYPE
	ltDescTransA      = 3  // CUBLASLT_MATMUL_DESC_TRANSA (int32)
	ltDescTransB      = 4  // CUBLASLT_MATMUL_DESC_TRANSB (int32)
	ltDescEpilogue    = 7  // CUBLASLT_MATMUL_DESC_EPILOGUE (uint32)
	ltDescBiasPointer = 8  // CUBLASLT_MATMUL_DESC_BIAS_POINTER (void *)
	ltDescAuxPointer  = 11 // CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER (void *)
	ltDescAuxLD       = 12 // CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD (int64)

	ltPrefMaxWorkspace = 1 // CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES (uint64)
	ltPrefMinAlignA    = 5 // CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES (uint32); B, C, D follow

	cublasCompute32FFastTF32 = 77 // CUBLAS_COMPUTE_32F_FAST_TF32
)

// LtEpilogue is what a cuBLASLt product does to its result in the same
// kernel (cublasLtEpilogue_t). In row-major terms: bias vectors have one
// element per column of C (N); the bias gradient LtBGradA sums op(A) over
// k, one element per row of C (M).
type LtEpilogue uint32

// The epilogues (cublasLt.h values).
const (
	LtDefault     LtEpilogue = 1   // C = alpha·op(A)·op(B) + beta·C
	LtReLU        LtEpilogue = 2   // max(·, 0)
	LtBias        LtEpilogue = 4   // + bias[j]
	LtReLUBias    LtEpilogue = 6   // max(· + bias[j], 0)
	LtGELU        LtEpilogue = 32  // GELU (tanh approximation)
	LtGELUAux     LtEpilogue = 160 // GELU, its input written to aux
	LtGELUBias    LtEpilogue = 36  // GELU(· + bias[j])
	LtGELUAuxBias LtEpilogue = 164 // GELU(· + bias[j]), its input written to aux
	LtDReLUBGrad  LtEpilogue = 152 // · times ReLU'(aux bit mask), and the bias gradient of that
	LtDGELU       LtEpilogue = 192 // · times GELU'(aux)
	LtDGELUBGrad  LtEpilogue = 208 // · times GELU'(aux), and the bias gradient of that
	// LtBGradA writes bias[i] = sum over k of op(A)[i, k] (cuBLASLt's
	// BGRADB: A is its second operand).
	LtBGradA LtEpilogue = 512
	// LtBGradB writes bias[j] = sum over k of op(B)[k, j] (BGRADA).
	LtBGradB LtEpilogue = 256
)

// ErrLtUnsupported is returned (wrapped) by Lt.Prepare when cuBLASLt has no
// algorithm for a product: callers fall back to another path.
var ErrLtUnsupported = errors.New("cuda: cuBLASLt has no algorithm for this product")

var (
	ltOnce sync.Once
	ltErr  error
)

func loadCublasLt() error {
	ltOnce.Do(func() {
		cublasLtLib.Names = append(versionedNames("libcublasLt.so", []int{13, 12, 11}, driverMajor()), "libcublasLt.so")
		h, err := cublasLtLib.Open()
		if err != nil {
			ltErr = err
			return
		}
		f := &ltFn
		ltErr = cublasLtLib.Resolve(h, []Symbol{
			RequiredSymbol(&f.create, "cublasLtCreate"),
			RequiredSymbol(&f.destroy, "cublasLtDestroy"),
			RequiredSymbol(&f.descCreate, "cublasLtMatmulDescCreate"),
			RequiredSymbol(&f.descDestroy, "cublasLtMatmulDescDestroy"),
			RequiredSymbol(&f.descSetAttribute, "cublasLtMatmulDescSetAttribute"),
			RequiredSymbol(&f.layoutCreate, "cublasLtMatrixLayoutCreate"),
			RequiredSymbol(&f.layoutDestroy, "cublasLtMatrixLayoutDestroy"),
			RequiredSymbol(&f.prefCreate, "cublasLtMatmulPreferenceCreate"),
			RequiredSymbol(&f.prefDestroy, "cublasLtMatmulPreferenceDestroy"),
			RequiredSymbol(&f.prefSetAttribute, "cublasLtMatmulPreferenceSetAttribute"),
			RequiredSymbol(&f.algoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic"),
			RequiredSymbol(&f.matmul, "cublasLtMatmul"),
			OptionalSymbol(&f.getVersion, "cublasLtGetVersion"),
		})
	})
	return ltErr
}

// ltHeuristicResult is cublasLtMatmulHeuristicResult_t: the algorithm
// (cublasLtMatmulAlgo_t, 8 uint64), its workspace, its status, the waves
// it fills and reserved words.
type ltHeuristicResult struct {
	algo      [8]uint64
	workspace uint64
	state     int32
	waves     float32
	reserved  [4]int32
}

// LtGemm is one row-major product shape for cuBLASLt: C[M x N] =
// epilogue(alpha·op(A)·op(B) + beta·C), float32 operands and results, the
// leading dimensions as for Sgemm. TF32 lets the product round its inputs
// to TF32 (CUBLAS_COMPUTE_32F_FAST_TF32); BF16 makes A and B bfloat16
// (C, the bias and the sums stay float32, as GemmBF16's). It is
// comparable: plans are kept per LtGemm.
type LtGemm struct {
	TransA, TransB bool
	M, N, K        int
	LDA, LDB, LDC  int
	Epilogue       LtEpilogue
	AuxLD          int // elements between aux's rows (row-major), for the epilogues with aux
	TF32           bool
	BF16           bool
	// OutBF16 (with BF16) makes C and the bias bfloat16: the float32
	// sums plus the widened bias, rounded as they are written (cuBLASLt
	// takes no float32 bias with a bfloat16 result).
	OutBF16 bool
	// Align16 chooses among the algorithms that take pointers aligned to
	// 16 bytes only (views into a larger buffer); otherwise every pointer
	// must be 256-byte aligned, as the allocator's blocks are.
	Align16 bool
	// NoWorkspace chooses among the algorithms that need no workspace, for
	// a stream that has none of its own (a second stream beside the one
	// the workspace belongs to).
	NoWorkspace bool
}

// workspace is the workspace g's algorithms may ask for, of at most
// wsMax bytes.
func (g LtGemm) workspace(wsMax int) int {
	if g.NoWorkspace {
		return 0
	}
	return wsMax
}

// align is the pointer alignment g's algorithm needs.
func (g LtGemm) align() uintptr {
	if g.Align16 {
		return 16
	}
	return 256
}

// ltPlan is an LtGemm's descriptors and the algorithm chosen for it.
type ltPlan struct {
	desc, a, b, c uintptr // matmul descriptor; layouts of the first operand (row-major B), second (A), and C = D
	algo          ltHeuristicResult
	cands         []ltHeuristicResult // the heuristics' ranked algorithms, once Candidates asked for them
}

// Lt is a cuBLASLt handle on one device with its plans, one per product
// shape (LtGemm): the descriptors and the algorithm are made on a shape's
// first use (Prepare, host-only work that queues nothing and does not
// synchronise, so it may happen during a stream capture) and reused. It is
// safe for concurrent use.
type Lt struct {
	d     *Device
	mu    sync.Mutex
	h     uintptr
	plans map[LtGemm]*ltPlan
	bad   map[LtGemm]error // shapes cuBLASLt refused, remembered
	wsMax int              // the workspace the algorithms may ask for
	scal  *[2]float32      // alpha, beta: stable heap storage for the by-pointer scalars
	ptrs  *[3]uint64       // bias pointer, aux pointer, aux ld: stable storage for the attributes
}

// NewLt creates a cuBLASLt handle on d (cublasLtCreate). Algorithms are
// chosen for a workspace of at most workspaceBytes; Matmul must then be
// given one that large (0: algorithms without workspace).
func (d *Device) NewLt(workspaceBytes int) (*Lt, error) {
	if err := loadCublasLt(); err != nil {
		return nil, err
	}
	if workspaceBytes < 0 {
		return nil, fmt.Errorf("cuda: NewLt: negative workspace %d", workspaceBytes)
	}
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer d.leave()
	var h uintptr
	if err := cublasCheck("cublasLtCreate", CCall(ltFn.create, uintptr(unsafe.Pointer(&h)))); err != nil {
		return nil, err
	}
	return &Lt{d: d, h: h, plans: map[LtGemm]*ltPlan{}, bad: map[LtGemm]error{}, wsMax: workspaceBytes,
		scal: new([2]float32), ptrs: new([3]uint64)}, nil
}

// Version is cuBLASLt's version (cublasLtGetVersion), e.g. 130100; 0 when
// the library does not say.
func (l *Lt) Version() int {
	if ltFn.getVersion == 0 {
		return 0
	}
	return int(CCall(ltFn.getVersion))
}

// Close destroys the plans and the handle. Idempotent.
func (l *Lt) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.h == 0 {
		return nil
	}
	if err := l.d.enter(); err != nil {
		return err
	}
	defer l.d.leave()
	var errs []error
	for k, p := range l.plans {
		errs = append(errs, p.destroy())
		delete(l.plans, k)
	}
	errs = append(errs, cublasCheck("cublasLtDestroy", CCall(ltFn.destroy, l.h)))
	l.h = 0
	return errors.Join(errs...)
}

func (p *ltPlan) destroy() error {
	var errs []error
	if p.desc != 0 {
		errs = append(errs, cublasCheck("cublasLtMatmulDescDestroy", CCall(ltFn.descDestroy, p.desc)))
	}
	for _, l := range []uintptr{p.a, p.b, p.c} {
		if l != 0 {
			errs = append(errs, cublasCheck("cublasLtMatrixLayoutDestroy", CCall(ltFn.layoutDestroy, l)))
		}
	}
	return errors.Join(errs...)
}

func ltSet(name string, fn, obj uintptr, attr int, v unsafe.Pointer, size uintptr) error {
	return cublasCheck(name, CCall(fn, obj, uintptr(attr), uintptr(v), size))
}

// Prepare makes g's plan now (descriptors, heuristic algorithm choice)
// unless it exists; Matmul calls it. An error wrapping ErrLtUnsupported
// means cuBLASLt has no algorithm for g. Errors are remembered: a shape
// that failed fails again at once.
func (l *Lt) Prepare(g LtGemm) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, err := l.plan(g)
	return err
}

// plan returns g's plan, making it on first use; l.mu is held.
func (l *Lt) plan(g LtGemm) (*ltPlan, error) {
	if p := l.plans[g]; p != nil {
		return p, nil
	}
	if err := l.bad[g]; err != nil {
		return nil, err
	}
	if l.h == 0 {
		return nil, errors.New("cuda: cuBLASLt handle is closed")
	}
	ga, err := rowMajorGemm(g.TransA, g.TransB, g.M, g.N, g.K, g.LDA, g.LDB, g.LDC)
	if err != nil {
		return nil, err
	}
	if err := l.d.enter(); err != nil {
		return nil, err
	}
	defer l.d.leave()
	p := &ltPlan{}
	if err := l.makePlan(p, g, ga); err != nil {
		// Remembered whatever it was: the next call of the shape takes
		// the caller's fallback at once.
		err = errors.Join(err, p.destroy())
		l.bad[g] = err
		return nil, err
	}
	l.plans[g] = p
	return p, nil
}

func (l *Lt) makePlan(p *ltPlan, g LtGemm, ga gemmArgs) error {
	compute := uintptr(cublasCompute32F)
	if g.TF32 && !g.BF16 {
		compute = cublasCompute32FFastTF32
	}
	if err := cublasCheck("cublasLtMatmulDescCreate", CCall(ltFn.descCreate, uintptr(unsafe.Pointer(&p.desc)), compute, cudaR32F)); err != nil {
		return err
	}
	ta, tb, epi := int32(ga.transa), int32(ga.transb), uint32(g.Epilogue)
	if err := ltSet("cublasLtMatmulDescSetAttribute(TRANSA)", ltFn.descSetAttribute, p.desc, ltDescTransA, unsafe.Pointer(&ta), 4); err != nil {
		return err
	}
	if err := ltSet("cublasLtMatmulDescSetAttribute(TRANSB)", ltFn.descSetAttribute, p.desc, ltDescTransB, unsafe.Pointer(&tb), 4); err != nil {
		return err
	}
	if err := ltSet("cublasLtMatmulDescSetAttribute(EPILOGUE)", ltFn.descSetAttribute, p.desc, ltDescEpilogue, unsafe.Pointer(&epi), 4); err != nil {
		return err
	}
	if g.AuxLD > 0 {
		ld := int64(g.AuxLD)
		if err := ltSet("cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_LD)", ltFn.descSetAttribute, p.desc, ltDescAuxLD, unsafe.Pointer(&ld), 8); err != nil {
			return err
		}
	}
	operands, result := uintptr(cudaR32F), uintptr(cudaR32F)
	if g.BF16 {
		operands = cudaR16BF
	}
	if g.OutBF16 {
		if !g.BF16 {
			return fmt.Errorf("cuda: a cuBLASLt product with a bfloat16 result needs bfloat16 operands (%+v)", g)
		}
		result = cudaR16BF
	}
	for i, l := range ltLayouts(ga) {
		dst, typ := []*uintptr{&p.a, &p.b, &p.c}[i], operands
		if i == 2 {
			typ = result
		}
		if err := cublasCheck("cublasLtMatrixLayoutCreate", CCall(ltFn.layoutCreate, uintptr(unsafe.Pointer(dst)), typ, uintptr(l.rows), uintptr(l.cols), uintptr(l.ld))); err != nil {
			return err
		}
	}
	pref, err := l.preference(g)
	if err != nil {
		return err
	}
	defer CCall(ltFn.prefDestroy, pref)
	// The heuristics look at the bias and aux pointers' alignment.
	if err := l.setPointers(p, g, g.align(), g.align()); err != nil {
		return err
	}
	var n int32
	r := CCall(ltFn.algoGetHeuristic, l.h, p.desc, p.a, p.b, p.c, p.c, pref, 1, uintptr(unsafe.Pointer(&p.algo)), uintptr(unsafe.Pointer(&n)))
	if st := uint32(r); st == cublasStatusNotSupported || (st == 0 && (n == 0 || p.algo.state != 0)) {
		return fmt.Errorf("%w (%+v: status %d, %d results)", ErrLtUnsupported, g, st, n)
	}
	return cublasCheck("cublasLtMatmulAlgoGetHeuristic", r)
}

// LtCandidate describes one of the algorithms cuBLASLt's heuristics rank
// for a product: the workspace it asks for and how many waves of the
// device's SMs its grid fills.
type LtCandidate struct {
	Workspace int
	Waves     float32
}

// Candidates returns the algorithms cuBLASLt's heuristics rank for g, best
// first, at most max of them (the first is the one a plan takes by
// default), for a caller that times them and keeps the fastest (Use).
func (l *Lt) Candidates(g LtGemm, max int) ([]LtCandidate, error) {
	if max < 1 {
		return nil, fmt.Errorf("cuda: Lt.Candidates: max %d; want at least 1", max)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	p, err := l.plan(g)
	if err != nil {
		return nil, err
	}
	if err := l.d.enter(); err != nil {
		return nil, err
	}
	defer l.d.leave()
	pref, err := l.preference(g)
	if err != nil {
		return nil, err
	}
	defer CCall(ltFn.prefDestroy, pref)
	res := make([]ltHeuristicResult, max)
	var n int32
	r := CCall(ltFn.algoGetHeuristic, l.h, p.desc, p.a, p.b, p.c, p.c, pref, uintptr(max), uintptr(unsafe.Pointer(&res[0])), uintptr(unsafe.Pointer(&n)))
	if err := cublasCheck("cublasLtMatmulAlgoGetHeuristic", r); err != nil {
		return nil, err
	}
	p.cands = p.cands[:0]
	var out []LtCandidate
	for _, c := range res[:n] {
		if c.state == 0 {
			p.cands = append(p.cands, c)
			out = append(out, LtCandidate{Workspace: int(c.workspace), Waves: c.waves})
		}
	}
	return out, nil
}

// Use makes g's plan run candidate i of the last Candidates call for g.
func (l *Lt) Use(g LtGemm, i int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.plans[g]
	if p == nil || i < 0 || i >= len(p.cands) {
		return fmt.Errorf("cuda: Lt.Use: no candidate %d for %+v", i, g)
	}
	p.algo = p.cands[i]
	return nil
}

// preference makes the search preference of g (its workspace and
// alignment); the caller destroys it. l.d is entered.
func (l *Lt) preference(g LtGemm) (uintptr, error) {
	var pref uintptr
	if err := cublasCheck("cublasLtMatmulPreferenceCreate", CCall(ltFn.prefCreate, uintptr(unsafe.Pointer(&pref)))); err != nil {
		return 0, err
	}
	ws := uint64(g.workspace(l.wsMax))
	err := ltSet("cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)", ltFn.prefSetAttribute, pref, ltPrefMaxWorkspace, unsafe.Pointer(&ws), 8)
	if g.Align16 && err == nil {
		a16 := uint32(16)
		for attr := ltPrefMinAlignA; attr <= ltPrefMinAlignA+3 && err == nil; attr++ {
			err = ltSet("cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)", ltFn.prefSetAttribute, pref, attr, unsafe.Pointer(&a16), 4)
		}
	}
	if err != nil {
		CCall(ltFn.prefDestroy, pref)
		return 0, err
	}
	return pref, nil
}

// ltLayout is a column-major matrix layout: rows, columns and leading
// dimension as stored.
type ltLayout struct{ rows, cols, ld int }

// ltLayouts are the layouts of the column-major call's first operand
// (row-major B), second (row-major A) and C: op(first) is m x k, so it is
// stored m x k, or k x m when transposed; op(second) is k x n; C is m x n.
func ltLayouts(ga gemmArgs) [3]ltLayout {
	stored := func(trans, rows, cols, ld int) ltLayout {
		if trans == cublasOpT {
			rows, cols = cols, rows
		}
		return ltLayout{rows, cols, ld}
	}
	return [3]ltLayout{stored(ga.transa, ga.m, ga.k, ga.lda), stored(ga.transb, ga.k, ga.n, ga.ldb), {ga.m, ga.n, ga.ldc}}
}

// cublasStatusNotSupported is CUBLAS_STATUS_NOT_SUPPORTED.
const cublasStatusNotSupported = 15

// setPointers sets the bias and aux pointers of p's descriptor (for the
// epilogues that read or write them); l.mu is held.
func (l *Lt) setPointers(p *ltPlan, g LtGemm, bias, aux uintptr) error {
	if g.Epilogue&(LtBias|LtBGradA|LtBGradB|16) != 0 {
		l.ptrs[0] = uint64(bias)
		if err := ltSet("cublasLtMatmulDescSetAttribute(BIAS_POINTER)", ltFn.descSetAttribute, p.desc, ltDescBiasPointer, unsafe.Pointer(&l.ptrs[0]), 8); err != nil {
			return err
		}
	}
	if g.Epilogue&128 != 0 {
		l.ptrs[1] = uint64(aux)
		if err := ltSet("cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_POINTER)", ltFn.descSetAttribute, p.desc, ltDescAuxPointer, unsafe.Pointer(&l.ptrs[1]), 8); err != nil {
			return err
		}
	}
	return nil
}

// Matmul queues g on stream s: C = epilogue(alpha·op(A)·op(B) + beta·C),
// bias (the bias, or the bias gradient written) and aux (the epilogue's
// extra matrix) where g.Epilogue uses them, ws the workspace of at least
// the bytes NewLt was given (none with g.NoWorkspace). Every pointer must
// be 256-byte aligned (16 with g.Align16). The scalars are read when the
// call is made (baked into a graph when captured).
func (l *Lt) Matmul(g LtGemm, alpha float32, a, b uintptr, beta float32, c, bias, aux, ws uintptr, wsBytes int, s Stream) error {
	for _, v := range []uintptr{a, b, c, bias, aux, ws} {
		if v%g.align() != 0 {
			return fmt.Errorf("cuda: cuBLASLt product: pointer %#x is not %d-byte aligned", v, g.align())
		}
	}
	need := g.workspace(l.wsMax)
	if wsBytes < need {
		return fmt.Errorf("cuda: cuBLASLt product: workspace of %d bytes, want %d", wsBytes, need)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	p, err := l.plan(g)
	if err != nil {
		return err
	}
	if err := l.d.enter(); err != nil {
		return err
	}
	defer l.d.leave()
	if err := l.setPointers(p, g, bias, aux); err != nil {
		return err
	}
	l.scal[0], l.scal[1] = alpha, beta
	return cublasCheck("cublasLtMatmul", CCall(ltFn.matmul, l.h, p.desc,
		uintptr(unsafe.Pointer(&l.scal[0])),
		b, p.a, // first operand: row-major B
		a, p.b, // second operand: row-major A
		uintptr(unsafe.Pointer(&l.scal[1])),
		c, p.c, c, p.c,
		uintptr(unsafe.Pointer(&p.algo.algo)), ws, uintptr(need), uintptr(s)))
}

// Plans is the number of product shapes with a plan (for tests: that a
// product went through cuBLASLt).
func (l *Lt) Plans() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.plans)
}

// Refused lists the product shapes that got no plan, with why (for tests
// and benchmarks: which epilogues this cuBLASLt lacks).
func (l *Lt) Refused() map[LtGemm]error {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[LtGemm]error, len(l.bad))
	for g, err := range l.bad {
		out[g] = err
	}
	return out
}
