package driver

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unsafe"
)

// cuBLASLt bindings (libcublasLt.so.N): matrix products with an epilogue
// (bias, ReLU, GELU, their gradients and the bias gradient) in the same
// kernel, the algorithm chosen once per shape: cuBLASLt's heuristics rank
// a few, and Tune times them (as cuDNN's searches do for convolutions)
// where the caller can wait for the GPU.
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
	configSet        uintptr // cublasLtMatmulAlgoConfigSetAttribute(cublasLtMatmulAlgo_t *, attr, const void *buf, size_t)
	configGet        uintptr // cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t *, attr, void *buf, size_t, size_t *written)
	algoCheck        uintptr // cublasLtMatmulAlgoCheck(h, op, A, B, C, D, const cublasLtMatmulAlgo_t *, cublasLtMatmulHeuristicResult_t *)
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

	ltConfigSplitK    = 2 // CUBLASLT_ALGO_CONFIG_SPLITK_NUM (uint32)
	ltConfigReduction = 3 // CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME (uint32)
	ltReduceInPlace   = 1 // CUBLASLT_REDUCTION_SCHEME_INPLACE: the parts added into D in turn
	ltReduceCompute   = 2 // CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE: the parts in the workspace, then added
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
			OptionalSymbol(&f.configSet, "cublasLtMatmulAlgoConfigSetAttribute"),
			OptionalSymbol(&f.configGet, "cublasLtMatmulAlgoConfigGetAttribute"),
			OptionalSymbol(&f.algoCheck, "cublasLtMatmulAlgoCheck"),
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
	// Align16 chooses among the algorithms that take pointers aligned to
	// 16 bytes only (views into a larger buffer); otherwise every pointer
	// must be 256-byte aligned, as the allocator's blocks are.
	Align16 bool
}

// align is the pointer alignment g's algorithm needs.
func (g LtGemm) align() uintptr {
	if g.Align16 {
		return 16
	}
	return 256
}

// LtCandidates is how many of the heuristics' algorithms a plan keeps for
// Tune to time (split-sum variants of a few come after them: addSplitK).
// The heuristics rank without running anything, so their first pick need
// not be the fastest on this device.
const LtCandidates = 8

// ltPlan is an LtGemm's descriptors and the algorithms the heuristics
// ranked for it, best first; pick is the one products use.
type ltPlan struct {
	desc, a, b, c uintptr // matmul descriptor; layouts of the first operand (row-major B), second (A), and C = D
	cands         []ltHeuristicResult
	pick          int
	tuned         bool   // pick was chosen by timing (Tune)
	splitNote     string // what addSplitK tried
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
	operands := uintptr(cudaR32F)
	if g.BF16 {
		operands = cudaR16BF
	}
	for i, l := range ltLayouts(ga) {
		dst, typ := []*uintptr{&p.a, &p.b, &p.c}[i], operands
		if i == 2 {
			typ = cudaR32F
		}
		if err := cublasCheck("cublasLtMatrixLayoutCreate", CCall(ltFn.layoutCreate, uintptr(unsafe.Pointer(dst)), typ, uintptr(l.rows), uintptr(l.cols), uintptr(l.ld))); err != nil {
			return err
		}
	}
	var pref uintptr
	if err := cublasCheck("cublasLtMatmulPreferenceCreate", CCall(ltFn.prefCreate, uintptr(unsafe.Pointer(&pref)))); err != nil {
		return err
	}
	defer CCall(ltFn.prefDestroy, pref)
	ws := uint64(l.wsMax)
	if err := ltSet("cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)", ltFn.prefSetAttribute, pref, ltPrefMaxWorkspace, unsafe.Pointer(&ws), 8); err != nil {
		return err
	}
	if g.Align16 {
		a16 := uint32(16)
		for attr := ltPrefMinAlignA; attr <= ltPrefMinAlignA+3; attr++ {
			if err := ltSet("cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)", ltFn.prefSetAttribute, pref, attr, unsafe.Pointer(&a16), 4); err != nil {
				return err
			}
		}
	}
	// The heuristics look at the bias and aux pointers' alignment.
	if err := l.setPointers(p, g, g.align(), g.align()); err != nil {
		return err
	}
	var n int32
	res := make([]ltHeuristicResult, LtCandidates)
	r := CCall(ltFn.algoGetHeuristic, l.h, p.desc, p.a, p.b, p.c, p.c, pref, LtCandidates, uintptr(unsafe.Pointer(&res[0])), uintptr(unsafe.Pointer(&n)))
	if st := uint32(r); st != 0 && st != cublasStatusNotSupported {
		return cublasCheck("cublasLtMatmulAlgoGetHeuristic", r)
	}
	for _, c := range res[:max(0, min(int(n), len(res)))] {
		if c.state == 0 {
			p.cands = append(p.cands, c)
		}
	}
	if len(p.cands) == 0 {
		return fmt.Errorf("%w (%+v: status %d, %d results)", ErrLtUnsupported, g, uint32(r), n)
	}
	l.addSplitK(p, g)
	return nil
}

// Split sums (split-K) for products of few outputs and a long sum: their
// candidates are the heuristics' first ltSplitBases algorithms with the sum
// cut into each of ltSplits parts (where K leaves at least ltSplitMinK a
// part), reduced in place or through the workspace, as cuBLASLt accepts
// them (cublasLtMatmulAlgoCheck). At 64 rows the heuristics' own picks
// leave most SMs idle: an MLP's 64 x 1024 output is 64 tiles of 32 x 32,
// each summing 1024 terms in turn. Both reductions add the parts in a
// fixed order, so a kept candidate gives the same bits every run.
const (
	ltSplitBases   = 4
	ltSplitMaxOut  = 1 << 21 // M·N: about 128 tiles of 128 x 128, one per SM
	ltSplitMinK    = 32
	ltSplitMaxCand = 48
)

var ltSplits = [...]uint32{2, 4, 8, 16, 32}

// addSplitK appends p's split-sum candidates (l.mu held, inside
// l.d.enter), and notes in p.splitNote what cuBLASLt made of them. A
// cuBLASLt without the algorithm-configuration calls gets none.
func (l *Lt) addSplitK(p *ltPlan, g LtGemm) {
	if ltFn.configSet == 0 || ltFn.configGet == 0 || ltFn.algoCheck == 0 || g.M*g.N > ltSplitMaxOut {
		return
	}
	var note []string
	bases := p.cands[:min(len(p.cands), ltSplitBases)]
	for i, base := range bases {
		var have uint32
		var written uintptr
		CCall(ltFn.configGet, uintptr(unsafe.Pointer(&base.algo)), ltConfigSplitK, uintptr(unsafe.Pointer(&have)), 4, uintptr(unsafe.Pointer(&written)))
		for _, parts := range ltSplits {
			if g.K < int(parts)*ltSplitMinK {
				break
			}
			if parts == have {
				continue // the heuristics' own split
			}
			for _, scheme := range []uint32{ltReduceInPlace, ltReduceCompute} {
				if len(p.cands) >= ltSplitMaxCand {
					break
				}
				c := base
				st1 := CCall(ltFn.configSet, uintptr(unsafe.Pointer(&c.algo)), ltConfigSplitK, uintptr(unsafe.Pointer(&parts)), 4)
				st2 := CCall(ltFn.configSet, uintptr(unsafe.Pointer(&c.algo)), ltConfigReduction, uintptr(unsafe.Pointer(&scheme)), 4)
				var res ltHeuristicResult
				st3 := CCall(ltFn.algoCheck, l.h, p.desc, p.a, p.b, p.c, p.c, uintptr(unsafe.Pointer(&c.algo)), uintptr(unsafe.Pointer(&res)))
				ok := st1 == 0 && st2 == 0 && st3 == 0 && res.state == 0 && res.workspace <= uint64(l.wsMax)
				note = append(note, fmt.Sprintf("%d(split %d)x%d/%d: %d %d %d %d %v", i, have, parts, scheme, st1, st2, st3, res.state, ok))
				if ok {
					c.workspace = res.workspace
					p.cands = append(p.cands, c)
				}
			}
		}
	}
	p.splitNote = strings.Join(note, "; ")
}

// SplitNote says, for tests and logs, which split-sum candidates g's plan
// tried and what cuBLASLt answered: base(its own split)xparts/scheme, the
// three calls' statuses, the check's state, and whether it was kept.
func (l *Lt) SplitNote(g LtGemm) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := l.plans[g]; p != nil {
		return p.splitNote
	}
	return ""
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
// the bytes NewLt was given. Every pointer must be 256-byte aligned (16
// with g.Align16). The
// scalars are read when the call is made (baked into a graph when
// captured).
func (l *Lt) Matmul(g LtGemm, alpha float32, a, b uintptr, beta float32, c, bias, aux, ws uintptr, wsBytes int, s Stream) error {
	return l.MatmulCandidate(g, -1, alpha, a, b, beta, c, bias, aux, ws, wsBytes, s)
}

// MatmulCandidate is Matmul with candidate i of g's algorithms (0 is the
// heuristics' first pick; -1 the one kept), leaving the choice unchanged:
// for tests and benchmarks that compare them.
func (l *Lt) MatmulCandidate(g LtGemm, i int, alpha float32, a, b uintptr, beta float32, c, bias, aux, ws uintptr, wsBytes int, s Stream) error {
	if err := l.check(g, a, b, c, bias, aux, ws, wsBytes); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	p, err := l.plan(g)
	if err != nil {
		return err
	}
	if i < 0 {
		i = p.pick
	}
	if i >= len(p.cands) {
		return fmt.Errorf("cuda: cuBLASLt product: candidate %d of %d", i, len(p.cands))
	}
	return l.queue(p, i, g, alpha, a, b, beta, c, bias, aux, ws, s)
}

// Candidates is the number of algorithms the heuristics ranked for g (at
// most LtCandidates), making g's plan if it has none.
func (l *Lt) Candidates(g LtGemm) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p, err := l.plan(g)
	if err != nil {
		return 0, err
	}
	return len(p.cands), nil
}

// check validates Matmul's pointers and workspace.
func (l *Lt) check(g LtGemm, a, b, c, bias, aux, ws uintptr, wsBytes int) error {
	for _, v := range []uintptr{a, b, c, bias, aux, ws} {
		if v%g.align() != 0 {
			return fmt.Errorf("cuda: cuBLASLt product: pointer %#x is not %d-byte aligned", v, g.align())
		}
	}
	if wsBytes < l.wsMax {
		return fmt.Errorf("cuda: cuBLASLt product: workspace of %d bytes, want %d", wsBytes, l.wsMax)
	}
	return nil
}

// queue queues p's product with its candidate algorithm i; l.mu is held.
func (l *Lt) queue(p *ltPlan, i int, g LtGemm, alpha float32, a, b uintptr, beta float32, c, bias, aux, ws uintptr, s Stream) error {
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
		uintptr(unsafe.Pointer(&p.cands[i].algo)), ws, uintptr(l.wsMax), uintptr(s)))
}

// LtTuning is what Tune measured: the time of one product with each
// candidate the heuristics ranked (in their order; 0 where the candidate
// failed to run), and the one kept.
type LtTuning struct {
	Times []time.Duration
	Pick  int
}

// ltTuneRuns is how many products of each candidate Tune times, after
// one untimed run that loads its kernel.
const ltTuneRuns = 3

// Tuned reports whether g's algorithm was chosen by Tune.
func (l *Lt) Tuned(g LtGemm) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.plans[g]
	return p != nil && p.tuned
}

// Tune times each candidate algorithm of g's plan on stream s with
// Matmul's arguments and keeps the fastest for g's later products. Every
// run writes c (and the bias gradient or aux its epilogue writes): a
// caller whose product accumulates into c (beta != 0) passes scratch of
// c's size. It waits for s, so it cannot run during a stream capture.
// Where only one candidate exists it is kept untimed.
func (l *Lt) Tune(g LtGemm, alpha float32, a, b uintptr, beta float32, c, bias, aux, ws uintptr, wsBytes int, s Stream) (LtTuning, error) {
	if err := l.check(g, a, b, c, bias, aux, ws, wsBytes); err != nil {
		return LtTuning{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	p, err := l.plan(g)
	if err != nil {
		return LtTuning{}, err
	}
	t := LtTuning{Times: make([]time.Duration, len(p.cands))}
	if len(p.cands) == 1 {
		p.tuned = true
		return t, nil
	}
	events := make([]Event, 2*len(p.cands))
	defer func() {
		for _, e := range events {
			_ = l.d.EventDestroy(e)
		}
	}()
	for i := range events {
		if events[i], err = l.d.NewEvent(true); err != nil {
			return t, err
		}
	}
	ran := make([]bool, len(p.cands))
	for i := range p.cands {
		// A candidate that fails to queue (a kernel that does not launch
		// on this device) is skipped; the others still compete.
		if l.queue(p, i, g, alpha, a, b, beta, c, bias, aux, ws, s) != nil {
			continue
		}
		if err := l.d.RecordEvent(events[2*i], s); err != nil {
			return t, err
		}
		ok := true
		for range ltTuneRuns {
			ok = ok && l.queue(p, i, g, alpha, a, b, beta, c, bias, aux, ws, s) == nil
		}
		if err := l.d.RecordEvent(events[2*i+1], s); err != nil {
			return t, err
		}
		ran[i] = ok
	}
	best := -1
	for i := range p.cands {
		if !ran[i] {
			continue
		}
		d, err := l.d.EventElapsed(events[2*i], events[2*i+1])
		if err != nil {
			return t, err
		}
		t.Times[i] = d / ltTuneRuns
		if best < 0 || t.Times[i] < t.Times[best] {
			best = i
		}
	}
	if best < 0 {
		return t, fmt.Errorf("cuda: cuBLASLt: no candidate algorithm of %+v ran", g)
	}
	p.pick, p.tuned, t.Pick = best, true, best
	return t, nil
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
