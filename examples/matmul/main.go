// Command matmul is the matrix-multiply case study of the PyCUDA tutorials,
// done in Go with ember's custom-kernel API: it copies two float32 matrices
// to the GPU, multiplies them with a 16x16 tiled shared-memory kernel
// compiled at run time, checks the result against a CPU product, and times
// the kernel against cuBLAS SGEMM on the same data.
//
//	go run ./examples/matmul            # 1024 x 1024
//	go run ./examples/matmul -n 1000    # sizes need not be multiples of 16
//
// Exit status: 0 success, 1 wrong result or CUDA error, 2 no usable GPU.
package main

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/ember-ml/ember/cuda"
)

// tile is the side of the square thread block and of the shared-memory
// tiles; it must match TILE in the kernel source.
const tile = 16

// kernelSource computes C = A * B for row-major A (M x K), B (K x N) and
// C (M x N). Each 16x16 block computes one 16x16 tile of C; for every
// 16-wide slab of K it loads one tile of A and one of B into shared memory
// (each thread one element of each), synchronizes, and accumulates 16
// products from shared memory. Sizes that are not multiples of 16 are
// handled by loading zeros outside the matrices (zeros add nothing to the
// dot products) and by writing only elements inside C. Every thread,
// including those outside C, reaches both __syncthreads(): a barrier inside
// a divergent branch is undefined behaviour, a classic bug of tutorial
// versions that return early for out-of-range threads.
const kernelSource = `
#define TILE 16
extern "C" __global__ void matmul_tiled(const float * __restrict__ A,
                                        const float * __restrict__ B,
                                        float * __restrict__ C,
                                        int M, int N, int K) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * TILE + ty;   // row of C (and of A)
    const int col = blockIdx.x * TILE + tx;   // column of C (and of B)
    float acc = 0.0f;
    for (int t = 0; t < K; t += TILE) {
        const int ak = t + tx;                // column of A this thread loads
        const int bk = t + ty;                // row of B this thread loads
        As[ty][tx] = (row < M && ak < K) ? A[(size_t)row * K + ak] : 0.0f;
        Bs[ty][tx] = (bk < K && col < N) ? B[(size_t)bk * N + col] : 0.0f;
        __syncthreads();
        #pragma unroll
        for (int k = 0; k < TILE; ++k)
            acc += As[ty][k] * Bs[k][tx];
        __syncthreads();
    }
    if (row < M && col < N)
        C[(size_t)row * N + col] = acc;
}
`

// Tolerance. Both GPU products accumulate K float32 products; recursive
// summation in float32 has |error| <= K*u*sum_k |a_ik*b_kj| with
// u = 2^-24 ~ 6e-8, i.e. 6.1e-5 for K = 1024 (typical errors are ~sqrt(K)*u,
// a few 1e-7). The error is therefore measured relative to
// sum_k |a_ik*b_kj| (relative to |c_ij| itself is meaningless where the dot
// product cancels to near zero) and must stay below 1e-4, which holds by the
// worst-case bound up to K ~ 1600 and in practice far beyond; an indexing or
// synchronization bug gives errors of order 1. With -tf32 cuBLAS rounds
// inputs to TF32 (10-bit mantissa) and is held to 1e-2 instead.
const (
	tolFP32 = 1e-4
	tolTF32 = 1e-2
)

func main() {
	n := flag.Int("n", 1024, "matrix size: A is n x n, B n x n (overridden per dimension by -m and -k)")
	mFlag := flag.Int("m", 0, "rows of A and C (default n)")
	kFlag := flag.Int("k", 0, "columns of A, rows of B (default n)")
	runs := flag.Int("runs", 11, "timed runs per method (the median is reported)")
	device := flag.Int("device", 0, "CUDA device ordinal")
	tf32 := flag.Bool("tf32", false, "let cuBLAS use TF32 tensor cores")
	flag.Parse()
	M, N, K := *n, *n, *n
	if *mFlag > 0 {
		M = *mFlag
	}
	if *kFlag > 0 {
		K = *kFlag
	}
	if M <= 0 || N <= 0 || K <= 0 || *runs <= 0 {
		fmt.Fprintln(os.Stderr, "matmul: sizes and -runs must be positive")
		os.Exit(2)
	}

	if err := cuda.Available(); err != nil {
		fmt.Printf("matmul: no usable GPU, nothing to do: %v\n", err)
		os.Exit(2)
	}
	ok, err := run(*device, M, N, K, *runs, *tf32)
	if err != nil {
		fmt.Fprintln(os.Stderr, "matmul:", err)
		os.Exit(1)
	}
	if !ok {
		os.Exit(1)
	}
}

func run(ordinal, M, N, K, runs int, tf32 bool) (ok bool, err error) {
	d, err := cuda.Open(ordinal)
	if err != nil {
		return false, err
	}
	defer d.Close()
	major, minor := d.ComputeCapability()
	fmt.Printf("device %d: %s (sm_%d%d, %d SMs)\n", ordinal, d.Name(), major, minor, d.MultiprocessorCount())
	fmt.Printf("C[%dx%d] = A[%dx%d] * B[%dx%d], float32, row-major\n", M, N, M, K, K, N)

	// Host data, reproducible.
	r := rand.New(rand.NewPCG(1, 2))
	a, b := make([]float32, M*K), make([]float32, K*N)
	for i := range a {
		a[i] = r.Float32()*2 - 1
	}
	for i := range b {
		b[i] = r.Float32()*2 - 1
	}

	// Device buffers: allocate, copy in; freed on return.
	var bufs []*cuda.Float32Buffer
	defer func() {
		for _, buf := range bufs {
			if ferr := buf.Free(); ferr != nil && err == nil {
				err = ferr
			}
		}
	}()
	alloc := func(n int) *cuda.Float32Buffer {
		if err != nil {
			return nil
		}
		var buf *cuda.Float32Buffer
		buf, err = d.AllocFloat32(n)
		if err == nil {
			bufs = append(bufs, buf)
		}
		return buf
	}
	dA, dB, dC, dC2 := alloc(M*K), alloc(K*N), alloc(M*N), alloc(M*N)
	if err != nil {
		return false, err
	}
	if err := dA.CopyFromHost(a); err != nil {
		return false, err
	}
	if err := dB.CopyFromHost(b); err != nil {
		return false, err
	}

	// Compile (or load from the kernel cache) and look up the kernel.
	t0 := time.Now()
	mod, err := d.Compile(kernelSource)
	if err != nil {
		return false, err
	}
	defer mod.Unload()
	kern, err := mod.Function("matmul_tiled")
	if err != nil {
		return false, err
	}
	st := cuda.ReadKernelStats()
	how := "compiled with NVRTC"
	if st.CacheHits > 0 {
		how = "loaded from the kernel cache"
	}
	fmt.Printf("kernel %s for %s (%v) in %v\n", how, mod.Arch, mod.Kind, time.Since(t0).Round(time.Millisecond))

	grid := cuda.Dim3{X: (N + tile - 1) / tile, Y: (M + tile - 1) / tile, Z: 1}
	block := cuda.Dim3{X: tile, Y: tile, Z: 1}
	custom := func() error {
		return kern.Launch(grid, block, 0, 0, dA.Ptr(), dB.Ptr(), dC.Ptr(), int32(M), int32(N), int32(K))
	}

	blas, err := d.NewBLAS(0)
	if err != nil {
		return false, err
	}
	defer blas.Close()
	if err := blas.SetTF32(tf32); err != nil {
		return false, err
	}
	cublas := func() error {
		// Row-major C = A*B: A is M x K (lda K), B is K x N (ldb N), C ldc N.
		return blas.Sgemm(false, false, M, N, K, 1, dA.Ptr(), K, dB.Ptr(), N, 0, dC2.Ptr(), N)
	}

	tCustom, err := timeIt(d, custom, runs)
	if err != nil {
		return false, fmt.Errorf("tiled kernel: %w", err)
	}
	tBLAS, err := timeIt(d, cublas, runs)
	if err != nil {
		return false, fmt.Errorf("cuBLAS: %w", err)
	}

	// Copy back and check against the CPU.
	c, c2 := make([]float32, M*N), make([]float32, M*N)
	if err := dC.CopyToHost(c); err != nil {
		return false, err
	}
	if err := dC2.CopyToHost(c2); err != nil {
		return false, err
	}
	t0 = time.Now()
	ref, scale := cpuProduct(a, b, M, N, K)
	fmt.Printf("CPU reference (float64, %d goroutines) in %v\n", runtime.GOMAXPROCS(0), time.Since(t0).Round(time.Millisecond))

	flops := 2 * float64(M) * float64(N) * float64(K)
	blasTol, blasName := tolFP32, "cuBLAS Sgemm (FP32)"
	if tf32 {
		blasTol, blasName = tolTF32, "cuBLAS Sgemm (TF32)"
	}
	ok = true
	for _, res := range []struct {
		name string
		c    []float32
		t    time.Duration
		tol  float64
	}{
		{"tiled 16x16 kernel", c, tCustom, tolFP32},
		{blasName, c2, tBLAS, blasTol},
	} {
		rel, abs := maxError(res.c, ref, scale)
		verdict := "OK"
		if rel > res.tol || math.IsNaN(rel) {
			verdict, ok = "FAIL", false
		}
		fmt.Printf("%-20s median %9.3f ms  %8.1f GFLOP/s  max error %.2e (abs %.2e), tolerance %.0e: %s\n",
			res.name, float64(res.t)/1e6, flops/res.t.Seconds()/1e9, rel, abs, res.tol, verdict)
	}
	if !ok {
		fmt.Println("error relative to sum_k |a_ik*b_kj|; see the tolerance note in main.go")
	}
	return ok, nil
}

// timeIt runs f once to warm up, then runs times between two CUDA events on
// stream 0, and returns the median GPU time.
func timeIt(d *cuda.Device, f func() error, runs int) (time.Duration, error) {
	if err := f(); err != nil {
		return 0, err
	}
	if err := d.Synchronize(0); err != nil {
		return 0, err
	}
	start, err := d.NewEvent(true)
	if err != nil {
		return 0, err
	}
	defer d.EventDestroy(start)
	end, err := d.NewEvent(true)
	if err != nil {
		return 0, err
	}
	defer d.EventDestroy(end)
	times := make([]time.Duration, 0, runs)
	for i := 0; i < runs; i++ {
		if err := d.RecordEvent(start, 0); err != nil {
			return 0, err
		}
		if err := f(); err != nil {
			return 0, err
		}
		if err := d.RecordEvent(end, 0); err != nil {
			return 0, err
		}
		el, err := d.EventElapsed(start, end)
		if err != nil {
			return 0, err
		}
		times = append(times, el)
	}
	slices.Sort(times)
	return times[len(times)/2], nil
}

// cpuProduct computes A*B in float64 and, per element, the error scale
// sum_k |a_ik*b_kj|, over all CPUs.
func cpuProduct(a, b []float32, M, N, K int) (ref, scale []float64) {
	ref, scale = make([]float64, M*N), make([]float64, M*N)
	var wg sync.WaitGroup
	rows := make(chan int, M)
	for i := 0; i < M; i++ {
		rows <- i
	}
	close(rows)
	for w := 0; w < runtime.GOMAXPROCS(0); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rows {
				r, s := ref[i*N:(i+1)*N], scale[i*N:(i+1)*N]
				for k := 0; k < K; k++ {
					aik := float64(a[i*K+k])
					brow := b[k*N : (k+1)*N]
					for j, bkj := range brow {
						p := aik * float64(bkj)
						r[j] += p
						s[j] += math.Abs(p)
					}
				}
			}
		}()
	}
	wg.Wait()
	return ref, scale
}

// maxError returns the largest |c - ref| / scale and the largest |c - ref|.
func maxError(c []float32, ref, scale []float64) (rel, abs float64) {
	for i := range c {
		e := math.Abs(float64(c[i]) - ref[i])
		if math.IsNaN(e) {
			return math.NaN(), math.NaN()
		}
		abs = max(abs, e)
		if scale[i] > 0 {
			rel = max(rel, e/scale[i])
		} else if e > 0 {
			rel = math.Inf(1)
		}
	}
	return rel, abs
}
