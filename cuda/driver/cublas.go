package driver

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"unsafe"
)

// cuBLAS bindings (libcublas.so.N) with row-major helpers.
//
// Row-major convention. Every matrix argument of Sgemm and
// SgemmStridedBatched is a ROW-MAJOR array in device memory: element (i, j)
// of an r x c matrix X with leading dimension ldX (>= c, the distance in
// elements between the starts of consecutive rows) is at X[i*ldX + j].
// The call computes
//
//	C = alpha * op(A) * op(B) + beta * C
//
// where op(X) is X, or X transposed when transX is true, op(A) is m x k,
// op(B) is k x n and C is m x n. So A is stored m x k (lda >= k) when
// transA is false and k x m (lda >= m) when true; B is k x n (ldb >= n) or
// n x k (ldb >= k); C is m x n (ldc >= n).
//
// cuBLAS is column-major. A row-major r x c array with leading dimension ld
// is, read column-major, the c x r transpose with the same ld. Hence
// computing the row-major C = op(A) op(B) is computing, column-major,
// C^T = op(B)^T op(A)^T: the helpers call cublasSgemm with the operands
// swapped (B first, A second), m and n swapped, the transpose flags passed
// through unchanged (transB for the first operand, transA for the second)
// and the leading dimensions swapped with their operands. No data is
// transposed or copied.

var cublasLib = &Library{
	What:    "cuBLAS",
	Display: "libcublas.so.13, .12, .11",
	Install: "cuBLAS, e.g. the CUDA toolkit's libcublas package",
	Dirs:    ExtraLibDirs,
}

var cublasFn struct {
	create              uintptr // cublasStatus_t cublasCreate_v2(cublasHandle_t *handle)
	destroy             uintptr // cublasStatus_t cublasDestroy_v2(cublasHandle_t handle)
	getVersion          uintptr // cublasStatus_t cublasGetVersion_v2(cublasHandle_t handle, int *version)
	setStream           uintptr // cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId)
	setMathMode         uintptr // cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
	setWorkspace        uintptr // cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void *workspace, size_t workspaceSizeInBytes); optional
	sgemm               uintptr // cublasStatus_t cublasSgemm_v2(h, transa, transb, int m, int n, int k, const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta, float *C, int ldc)
	sgemmStridedBatched uintptr // cublasStatus_t cublasSgemmStridedBatched(h, transa, transb, int m, int n, int k, const float *alpha, const float *A, int lda, long long strideA, const float *B, int ldb, long long strideB, const float *beta, float *C, int ldc, long long strideC, int batchCount)
	// cublasStatus_t cublasGemmEx(h, transa, transb, int m, int n, int k, const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B, cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc, cublasComputeType_t computeType, cublasGemmAlgo_t algo)
	gemmEx uintptr
	// cublasStatus_t cublasGemmStridedBatchedEx(h, transa, transb, int m, int n, int k, const void *alpha, const void *A, cudaDataType Atype, int lda, long long strideA, const void *B, cudaDataType Btype, int ldb, long long strideB, const void *beta, void *C, cudaDataType Ctype, int ldc, long long strideC, int batchCount, cublasComputeType_t computeType, cublasGemmAlgo_t algo)
	gemmStridedBatchedEx uintptr
}

// cuBLAS enum values (cublas_api.h).
const (
	cublasOpN = 0 // CUBLAS_OP_N
	cublasOpT = 1 // CUBLAS_OP_T

	cublasDefaultMath      = 0 // CUBLAS_DEFAULT_MATH
	cublasTF32TensorOpMath = 3 // CUBLAS_TF32_TENSOR_OP_MATH
	cublasPedanticMath     = 2 // CUBLAS_PEDANTIC_MATH

	cudaR32F  = 0  // CUDA_R_32F (library_types.h)
	cudaR16BF = 14 // CUDA_R_16BF

	cublasCompute32F  = 68 // CUBLAS_COMPUTE_32F: float32 accumulation, no reduced-precision inputs beyond the operands' own
	cublasGemmDefault = -1 // CUBLAS_GEMM_DEFAULT: cuBLAS's heuristics pick the kernel (tensor cores for bfloat16)
)

var (
	cublasOnce sync.Once
	cublasErr  error
)

func cublasNames(driverMajor int) []string {
	return append(versionedNames("libcublas.so", []int{13, 12, 11}, driverMajor), "libcublas.so")
}

func loadCublas() error {
	cublasOnce.Do(func() {
		cublasLib.Names = cublasNames(driverMajor())
		h, err := cublasLib.Open()
		if err != nil {
			cublasErr = err
			return
		}
		c := &cublasFn
		cublasErr = cublasLib.Resolve(h, []Symbol{
			RequiredSymbol(&c.create, "cublasCreate_v2", "cublasCreate"),
			RequiredSymbol(&c.destroy, "cublasDestroy_v2", "cublasDestroy"),
			RequiredSymbol(&c.getVersion, "cublasGetVersion_v2", "cublasGetVersion"),
			RequiredSymbol(&c.setStream, "cublasSetStream_v2", "cublasSetStream"),
			RequiredSymbol(&c.setMathMode, "cublasSetMathMode"),
			OptionalSymbol(&c.setWorkspace, "cublasSetWorkspace_v2", "cublasSetWorkspace"),
			RequiredSymbol(&c.sgemm, "cublasSgemm_v2", "cublasSgemm"),
			RequiredSymbol(&c.sgemmStridedBatched, "cublasSgemmStridedBatched"),
			OptionalSymbol(&c.gemmEx, "cublasGemmEx"),
			OptionalSymbol(&c.gemmStridedBatchedEx, "cublasGemmStridedBatchedEx"),
		})
	})
	return cublasErr
}

// BLAS is a cuBLAS handle on one device, bound to one stream. It is safe for
// concurrent use (calls are serialized on the handle); use one BLAS per
// stream for concurrency on the GPU. The scalars alpha and beta are passed
// in host pointer mode: they are read when the call is made (and baked into
// a graph when captured).
type BLAS struct {
	d      *Device
	mu     sync.Mutex
	h      uintptr
	stream Stream
	tf32   bool
	scal   *[2]float32 // alpha, beta: stable heap storage for the by-pointer scalars
}

// NewBLAS creates a cuBLAS handle on d (cublasCreate_v2) bound to stream s
// (cublasSetStream_v2), with CUBLAS_DEFAULT_MATH: full FP32 arithmetic, no
// TF32 (see SetTF32).
func (d *Device) NewBLAS(s Stream) (*BLAS, error) {
	if err := loadCublas(); err != nil {
		return nil, err
	}
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer d.leave()
	var h uintptr
	if err := cublasCheck("cublasCreate_v2", CCall(cublasFn.create, uintptr(unsafe.Pointer(&h)))); err != nil {
		return nil, err
	}
	b := &BLAS{d: d, h: h, stream: s, scal: new([2]float32)}
	if err := cublasCheck("cublasSetStream_v2", CCall(cublasFn.setStream, h, uintptr(s))); err != nil {
		CCall(cublasFn.destroy, h)
		return nil, err
	}
	if err := cublasCheck("cublasSetMathMode", CCall(cublasFn.setMathMode, h, cublasDefaultMath)); err != nil {
		CCall(cublasFn.destroy, h)
		return nil, err
	}
	return b, nil
}

// Device is the device the handle lives on.
func (b *BLAS) Device() *Device { return b.d }

// Stream is the stream cuBLAS queues work on.
func (b *BLAS) Stream() Stream {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stream
}

// SetStream binds the handle to stream s (cublasSetStream_v2).
func (b *BLAS) SetStream(s Stream) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.do("cublasSetStream_v2", func() uintptr { return CCall(cublasFn.setStream, b.h, uintptr(s)) }, func() { b.stream = s })
}

// SetTF32 selects the math mode: on = CUBLAS_TF32_TENSOR_OP_MATH (FP32
// GEMMs may round inputs to TF32, 10-bit mantissa, on tensor cores: much
// faster on Ampere and later, relative error ~1e-3); off =
// CUBLAS_DEFAULT_MATH (full FP32, the default).
func (b *BLAS) SetTF32(on bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	mode := uintptr(cublasDefaultMath)
	if on {
		mode = cublasTF32TensorOpMath
	}
	return b.do("cublasSetMathMode", func() uintptr { return CCall(cublasFn.setMathMode, b.h, mode) }, func() { b.tf32 = on })
}

// SetWorkspace gives cuBLAS the device memory [ptr, ptr+bytes) as its
// workspace (cublasSetWorkspace_v2) instead of the one it allocates itself;
// bytes 0 means none, which rules out split-K kernels. The memory must stay
// allocated while the handle uses it.
func (b *BLAS) SetWorkspace(ptr uintptr, bytes int) error {
	if cublasFn.setWorkspace == 0 {
		return errors.New("cuda: this cuBLAS has no cublasSetWorkspace_v2")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.do("cublasSetWorkspace_v2", func() uintptr { return CCall(cublasFn.setWorkspace, b.h, ptr, uintptr(bytes)) }, func() {})
}

// CanSetWorkspace reports whether this cuBLAS has cublasSetWorkspace_v2,
// without which SetWorkspace fails and cuBLAS keeps its own workspace.
func (b *BLAS) CanSetWorkspace() bool { return cublasFn.setWorkspace != 0 }

// TF32 reports whether TF32 math is enabled.
func (b *BLAS) TF32() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.tf32
}

// Version is the cuBLAS version, e.g. 120402 for 12.4.2.
func (b *BLAS) Version() (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var v int32
	err := b.do("cublasGetVersion_v2", func() uintptr { return CCall(cublasFn.getVersion, b.h, uintptr(unsafe.Pointer(&v))) }, nil)
	return int(v), err
}

// Close destroys the handle (cublasDestroy_v2). Idempotent.
func (b *BLAS) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.h == 0 {
		return nil
	}
	err := b.do("cublasDestroy_v2", func() uintptr { return CCall(cublasFn.destroy, b.h) }, nil)
	b.h = 0
	return err
}

// do runs one cuBLAS call with the device context current; b.mu is held.
func (b *BLAS) do(name string, fn func() uintptr, onOK func()) error {
	if b.h == 0 {
		return errors.New("cuda: BLAS handle is closed")
	}
	if err := b.d.enter(); err != nil {
		return err
	}
	r := fn()
	b.d.leave()
	if err := cublasCheck(name, r); err != nil {
		return err
	}
	if onOK != nil {
		onOK()
	}
	return nil
}

// gemmArgs are the arguments of the column-major cuBLAS call equivalent to a
// row-major GEMM. The first operand is B and the second A.
type gemmArgs struct {
	transa, transb int // cublasOperation_t of the first (B) and second (A) operand
	m, n, k        int
	lda, ldb, ldc  int // leading dimensions of the first (B) and second (A) operands, and of C
}

func cublasOp(t bool) int {
	if t {
		return cublasOpT
	}
	return cublasOpN
}

// CheckRowMajorGemm reports what is wrong with a row-major GEMM's shape and
// leading dimensions, as Sgemm would (nil when they are valid): for
// executors that record launches instead of running them.
func CheckRowMajorGemm(transA, transB bool, m, n, k, lda, ldb, ldc int) error {
	_, err := rowMajorGemm(transA, transB, m, n, k, lda, ldb, ldc)
	return err
}

// rowMajorGemm validates a row-major GEMM and maps it onto column-major
// cuBLAS arguments (see the comment at the top of this file).
func rowMajorGemm(transA, transB bool, m, n, k, lda, ldb, ldc int) (gemmArgs, error) {
	if m < 0 || n < 0 || k < 0 {
		return gemmArgs{}, fmt.Errorf("cuda: gemm: negative size m=%d n=%d k=%d", m, n, k)
	}
	// Row-major storage widths (number of columns as stored).
	aCols, bCols := k, n
	if transA {
		aCols = m
	}
	if transB {
		bCols = k
	}
	if lda < max(1, aCols) {
		return gemmArgs{}, fmt.Errorf("cuda: gemm: lda=%d < %d (A is stored with %d columns)", lda, max(1, aCols), aCols)
	}
	if ldb < max(1, bCols) {
		return gemmArgs{}, fmt.Errorf("cuda: gemm: ldb=%d < %d (B is stored with %d columns)", ldb, max(1, bCols), bCols)
	}
	if ldc < max(1, n) {
		return gemmArgs{}, fmt.Errorf("cuda: gemm: ldc=%d < %d (C is m x n, n=%d)", ldc, max(1, n), n)
	}
	for _, v := range []int{m, n, k, lda, ldb, ldc} {
		if v > math.MaxInt32 {
			return gemmArgs{}, fmt.Errorf("cuda: gemm: dimension %d exceeds cuBLAS's 32-bit int", v)
		}
	}
	return gemmArgs{
		transa: cublasOp(transB), transb: cublasOp(transA),
		m: n, n: m, k: k,
		lda: ldb, ldb: lda, ldc: ldc,
	}, nil
}

// Sgemm computes, for ROW-MAJOR float32 matrices in device memory,
//
//	C[m x n] = alpha * op(A) * op(B) + beta * C
//
// with op(A) m x k and op(B) k x n (see the row-major convention at the top
// of cublas.go for the shapes and leading dimensions). It is queued on the
// handle's stream. With beta == 0, C need not be initialized (NaNs in C are
// ignored).
func (b *BLAS) Sgemm(transA, transB bool, m, n, k int, alpha float32, a uintptr, lda int, bm uintptr, ldb int, beta float32, c uintptr, ldc int) error {
	g, err := rowMajorGemm(transA, transB, m, n, k, lda, ldb, ldc)
	if err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.scal[0], b.scal[1] = alpha, beta
	return b.do("cublasSgemm_v2", func() uintptr {
		return CCall(cublasFn.sgemm, b.h, uintptr(g.transa), uintptr(g.transb),
			uintptr(g.m), uintptr(g.n), uintptr(g.k),
			uintptr(unsafe.Pointer(&b.scal[0])),
			bm, uintptr(g.lda), // first operand: B
			a, uintptr(g.ldb), // second operand: A
			uintptr(unsafe.Pointer(&b.scal[1])),
			c, uintptr(g.ldc))
	}, nil)
}

// checkBatch checks a strided-batched product's batch count and strides
// (elements apart; 0 reuses one matrix) for op.
func checkBatch(op string, batch int, strides ...int64) error {
	if batch < 0 || batch > math.MaxInt32 {
		return fmt.Errorf("cuda: %s: batch count %d out of range", op, batch)
	}
	for _, st := range strides {
		if st < 0 {
			return fmt.Errorf("cuda: %s: negative stride", op)
		}
	}
	return nil
}

// SgemmStridedBatched computes batch independent row-major GEMMs
//
//	C_i = alpha * op(A_i) * op(B_i) + beta * C_i,  i = 0 .. batch-1
//
// where X_i starts strideX elements (not bytes) after X_{i-1}; shapes and
// leading dimensions are as for Sgemm. A stride of 0 reuses one matrix for
// every batch entry (e.g. a shared weight matrix).
func (b *BLAS) SgemmStridedBatched(transA, transB bool, m, n, k int, alpha float32,
	a uintptr, lda int, strideA int64, bm uintptr, ldb int, strideB int64,
	beta float32, c uintptr, ldc int, strideC int64, batch int) error {
	g, err := rowMajorGemm(transA, transB, m, n, k, lda, ldb, ldc)
	if err != nil {
		return err
	}
	if err := checkBatch("SgemmStridedBatched", batch, strideA, strideB, strideC); err != nil {
		return err
	}
	if batch == 0 {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.scal[0], b.scal[1] = alpha, beta
	return b.do("cublasSgemmStridedBatched", func() uintptr {
		return CCall(cublasFn.sgemmStridedBatched, b.h, uintptr(g.transa), uintptr(g.transb),
			uintptr(g.m), uintptr(g.n), uintptr(g.k),
			uintptr(unsafe.Pointer(&b.scal[0])),
			bm, uintptr(g.lda), uintptr(strideB), // first operand: B
			a, uintptr(g.ldb), uintptr(strideA), // second operand: A
			uintptr(unsafe.Pointer(&b.scal[1])),
			c, uintptr(g.ldc), uintptr(strideC),
			uintptr(batch))
	}, nil)
}

// errNoGemmEx is the error of the bfloat16 products on a cuBLAS without
// cublasGemmEx or cublasGemmStridedBatchedEx (before CUDA 11, which
// introduced bfloat16).
var errNoGemmEx = errors.New("cuda: this cuBLAS has no cublasGemmEx/cublasGemmStridedBatchedEx (bfloat16 products need cuBLAS 11 or later)")

// GemmBF16 computes, for ROW-MAJOR matrices in device memory, A and B of
// bfloat16 and C of float32,
//
//	C[m x n] = alpha * op(A) * op(B) + beta * C
//
// with cublasGemmEx in CUBLAS_COMPUTE_32F: the products of the bfloat16
// elements are exact in float32 and summed in float32. Shapes and leading
// dimensions are as for Sgemm; the handle's TF32 setting does not apply.
func (b *BLAS) GemmBF16(transA, transB bool, m, n, k int, alpha float32, a uintptr, lda int, bm uintptr, ldb int, beta float32, c uintptr, ldc int) error {
	if cublasFn.gemmEx == 0 {
		return errNoGemmEx
	}
	g, err := rowMajorGemm(transA, transB, m, n, k, lda, ldb, ldc)
	if err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.scal[0], b.scal[1] = alpha, beta
	algo := int32(cublasGemmDefault)
	return b.do("cublasGemmEx", func() uintptr {
		return CCall(cublasFn.gemmEx, b.h, uintptr(g.transa), uintptr(g.transb),
			uintptr(g.m), uintptr(g.n), uintptr(g.k),
			uintptr(unsafe.Pointer(&b.scal[0])),
			bm, cudaR16BF, uintptr(g.lda), // first operand: B
			a, cudaR16BF, uintptr(g.ldb), // second operand: A
			uintptr(unsafe.Pointer(&b.scal[1])),
			c, cudaR32F, uintptr(g.ldc),
			cublasCompute32F, uintptr(uint32(algo)))
	}, nil)
}

// GemmStridedBatchedBF16 is GemmBF16 over batch matrices, X_i starting
// strideX elements after X_{i-1} (cublasGemmStridedBatchedEx; a stride of
// 0 reuses one matrix), as SgemmStridedBatched.
func (b *BLAS) GemmStridedBatchedBF16(transA, transB bool, m, n, k int, alpha float32,
	a uintptr, lda int, strideA int64, bm uintptr, ldb int, strideB int64,
	beta float32, c uintptr, ldc int, strideC int64, batch int) error {
	if cublasFn.gemmStridedBatchedEx == 0 {
		return errNoGemmEx
	}
	g, err := rowMajorGemm(transA, transB, m, n, k, lda, ldb, ldc)
	if err != nil {
		return err
	}
	if err := checkBatch("GemmStridedBatchedBF16", batch, strideA, strideB, strideC); err != nil {
		return err
	}
	if batch == 0 {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.scal[0], b.scal[1] = alpha, beta
	algo := int32(cublasGemmDefault)
	return b.do("cublasGemmStridedBatchedEx", func() uintptr {
		return CCall(cublasFn.gemmStridedBatchedEx, b.h, uintptr(g.transa), uintptr(g.transb),
			uintptr(g.m), uintptr(g.n), uintptr(g.k),
			uintptr(unsafe.Pointer(&b.scal[0])),
			bm, cudaR16BF, uintptr(g.lda), uintptr(strideB), // first operand: B
			a, cudaR16BF, uintptr(g.ldb), uintptr(strideA), // second operand: A
			uintptr(unsafe.Pointer(&b.scal[1])),
			c, cudaR32F, uintptr(g.ldc), uintptr(strideC),
			uintptr(batch), cublasCompute32F, uintptr(uint32(algo)))
	}, nil)
}
