// common.cu: definitions shared by every ember kernel. The Go side
// (cuda/kernels.go) compiles the .cu files of this directory as a few NVRTC
// translation units, concurrently, each starting with this file, and looks
// every kernel up in the module that holds it. NVRTC sees no system
// headers: only built-in types and CUDA device intrinsics are used.
//
// Conventions of all kernels:
//   - every kernel is extern "C" (unmangled, found by name from Go);
//   - element counts and sizes are long long (Go int64); small dimensions
//     (channels, kernel sizes, strides) are int (Go int32);
//   - 1-D kernels use grid-stride loops, so any grid size is correct; the Go
//     side caps the grid (see gridFor in backend.go);
//   - kernels that do much index arithmetic (divisions) run a 32-bit
//     instantiation when every index fits comfortably (< 2^30, so that
//     i + gridDim*blockDim cannot overflow) and a 64-bit one otherwise;
//   - reductions are deterministic: fixed-shape trees, no atomics, so
//     results do not depend on scheduling (one exception, documented at
//     IndexAdd: many repeated indices into a small destination add up
//     with atomics);
//   - the module is compiled with --fmad=false: a*b+c is rounded twice, as Go
//     does on amd64, so elementwise results equal the CPU backend's bit for
//     bit.

#define EMBER_SMALL_INDEX(n) ((long long)(n) < (1LL << 30))

// Grid-stride loop over [0, n) with index type T.
#define EMBER_LOOP(T, i, n)                                                  \
    for (T i = (T)blockIdx.x * (T)blockDim.x + (T)threadIdx.x; i < (T)(n); \
         i += (T)blockDim.x * (T)gridDim.x)

// ember_divide divides an index n < 2^31 by a fixed d with a multiply-high,
// an add and a shift instead of a division (Granlund and Montgomery,
// "Division by invariant integers using multiplication", 1994); the host
// computes mul and shift (newDivider in divider.go, tested there).
__device__ __forceinline__ unsigned int ember_divide(unsigned int n, unsigned int mul, unsigned int shift) {
    return (__umulhi(n, mul) + n) >> shift;
}

__device__ __forceinline__ float ember_neg_inf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ float ember_nan() { return __int_as_float(0x7fc00000); }

__device__ __forceinline__ int ember_imin(int a, int b) { return a < b ? a : b; }

// Four floats loaded or stored as one 16-byte access (the CUDA headers'
// float4, which NVRTC sources cannot include).
struct __attribute__((aligned(16))) ember_f4 {
    float x, y, z, w;
};
struct __attribute__((aligned(8))) ember_f2 {
    float x, y;
};

// ember_stream runs st(q, ld(q)) for every q < n4 (the float4 groups of a
// dense operation), EMBER_STREAM_U groups a thread at a time: their loads are issued
// before the first store, so that a thread has that many 16-byte accesses of each
// operand in flight (a store may alias a later load's address only at the
// same q, which the same thread loads first). Threads stride by the grid.
// Measured on the H200 (1 GiB copy, dense Add of 103 MB operands): one
// group a thread in a grid capped at 4096 blocks ran at 3.9 TB/s (Add 81.5
// us), two groups a thread in a grid of n4/512 blocks at 4.2 TB/s (Add
// 73.7 us, as PyTorch's 74.3), four no better (74.3 us). The Go side
// (launch4) sizes the grid to n4 / (EMBER_STREAM_U * blockDim), so that
// each thread makes one pass and finished blocks make way for new ones.
#define EMBER_STREAM_U 2
template <typename V, typename Ld, typename St>
__device__ __forceinline__ void ember_stream(long long n4, Ld ld, St st) {
    const long long step = (long long)gridDim.x * blockDim.x * EMBER_STREAM_U;
    for (long long q0 = (long long)blockIdx.x * blockDim.x * EMBER_STREAM_U + threadIdx.x; q0 < n4; q0 += step) {
        V v[EMBER_STREAM_U];
#pragma unroll
        for (int u = 0; u < EMBER_STREAM_U; u++) {
            const long long q = q0 + (long long)u * blockDim.x;
            if (q < n4) v[u] = ld(q);
        }
#pragma unroll
        for (int u = 0; u < EMBER_STREAM_U; u++) {
            const long long q = q0 + (long long)u * blockDim.x;
            if (q < n4) st(q, v[u]);
        }
    }
}

// Two and three float4 loaded together (the operands of one group).
struct ember_f4x2 {
    ember_f4 a, b;
};
struct ember_f4x3 {
    ember_f4 a, b, c;
};

// ember_nan_max is max that propagates NaN (Go's built-in max does; fmaxf
// does not).
__device__ __forceinline__ float ember_nan_max(float a, float b) {
    return (a > b || a != a) ? a : b;
}

// Warp-wide reductions by xor butterfly: every lane ends with the same
// value (IEEE addition is commutative, so mirrored partners compute equal
// sums), and the tree shape is fixed, so the result is deterministic. All 32
// lanes must take part.
__device__ __forceinline__ float ember_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = ember_nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float ember_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ double ember_warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// ember_fence_acq_rel orders this thread's memory accesses before and after
// it for the whole GPU, as a release and acquire (a block publishing a
// partial result, and the last block reading them all). __threadfence is
// a sequentially consistent fence, stronger than that and slower.
#ifdef EMBER_HOST_EMU
__device__ __forceinline__ void ember_fence_acq_rel() { __atomic_thread_fence(__ATOMIC_ACQ_REL); }
#else
__device__ __forceinline__ void ember_fence_acq_rel() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
#endif

// c += a·b for one m16n8k16 tile of bfloat16 operands with float32 sums
// (mma.sync, sm_80 on; attention_bf16.cu describes the fragments). The
// host emulation has its own (host_emu.h).
#if !defined(EMBER_HOST_EMU) && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800)
__device__ __forceinline__ void ember_mma_bf16(float c[4], const unsigned int a[4], unsigned int b0, unsigned int b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif

// 2^x and 1/x by the hardware's approximations, subnormal results flushed
// to zero: one instruction each (ex2.approx.ftz, rcp.approx.ftz), where
// exp2f's and __fdividef's non-flushing forms add a range fix of a few
// more. The host emulation computes them exactly.
#ifdef EMBER_HOST_EMU
__device__ __forceinline__ float ember_ex2_ftz(float x) { return exp2f(x); }
__device__ __forceinline__ float ember_rcp_ftz(float x) { return 1.0f / x; }
#else
__device__ __forceinline__ float ember_ex2_ftz(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
__device__ __forceinline__ float ember_rcp_ftz(float x) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
#endif

// ember_ld_once loads 16 bytes that the kernel reads once and never writes:
// through the read-only path, without a line in L1
// (ld.global.nc.L1::no_allocate). In the reductions' sweeps on the H200 it
// beat a plain load by 2-6% (docs/performance.md, round 20).
__device__ __forceinline__ ember_f4 ember_ld_once(const ember_f4* p) {
#ifdef EMBER_HOST_EMU
    return *p;
#else
    ember_f4 v;
    asm("ld.global.nc.L1::no_allocate.v4.f32 {%0,%1,%2,%3}, [%4];"
        : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
        : "l"(p));
    return v;
#endif
}

// ember_ld_read loads 16 bytes that a kernel only reads: through
// ember_ld_once when once (the host sets it for inputs that do not fit half
// the L2 cache, which it streams past), else a plain load, whose lines stay
// in L2 for the next reader. On the H200 the rows' sums of a 25 MB input
// read call after call took 5.5 us with plain loads and 8.4 with
// ember_ld_once, which left nothing in L2 for the next call; of a 103 MB
// input 29.5 and 26.3 (docs/performance.md, round 20).
__device__ __forceinline__ ember_f4 ember_ld_read(const ember_f4* p, int once) { return once ? ember_ld_once(p) : *p; }

// The same for one float (rows that are no whole float4).
__device__ __forceinline__ float ember_ld_once(const float* p) {
#ifdef EMBER_HOST_EMU
    return *p;
#else
    float v;
    asm("ld.global.nc.L1::no_allocate.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
#endif
}
__device__ __forceinline__ float ember_ld_read(const float* p, int once) { return once ? ember_ld_once(p) : *p; }

// ember_block_sum_d sums one double per thread over the block; the result is
// valid in thread 0 only. blockDim.x must be a multiple of 32 (at most 1024)
// and every thread of the block must call it (it synchronizes). Warps are
// added in order by thread 0, so the result is deterministic. It can be
// called repeatedly (the trailing barrier protects the shared array).
__device__ double ember_block_sum_d(double v) {
    __shared__ double part[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = ember_warp_sum_d(v);
    if (lane == 0) part[warp] = v;
    __syncthreads();
    double s = 0.0;
    if (threadIdx.x == 0) {
        const int nw = blockDim.x >> 5;
        for (int w = 0; w < nw; w++) s += part[w];
    }
    __syncthreads();
    return s;
}

#if __CUDA_ARCH__ >= 900
// Thread block clusters (sm_90). ember_cluster_sync is a barrier of every
// thread of the cluster's blocks (release and acquire: shared-memory
// writes before it are seen by the other blocks' reads after it).
__device__ __forceinline__ void ember_cluster_sync() {
    asm volatile("barrier.cluster.arrive.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
}
// ember_cluster_rank is this block's rank in its cluster.
__device__ __forceinline__ unsigned ember_cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
// ember_cluster_map is the distributed shared memory address of local's
// place in the shared memory of the cluster's block rank.
__device__ __forceinline__ unsigned ember_cluster_map(const void* local, unsigned rank) {
    unsigned long long generic = (unsigned long long)local, shared;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(shared) : "l"(generic));
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"((unsigned)shared), "r"(rank));
    return remote;
}
// ember_cluster_ld_f32 and ember_cluster_ld_f64 read the value at local's
// place in the shared memory of the cluster's block rank.
__device__ __forceinline__ float ember_cluster_ld_f32(const float* local, unsigned rank) {
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(ember_cluster_map(local, rank)) : "memory");
    return v;
}
__device__ __forceinline__ double ember_cluster_ld_f64(const double* local, unsigned rank) {
    double v;
    asm volatile("ld.shared::cluster.f64 %0, [%1];" : "=d"(v) : "r"(ember_cluster_map(local, rank)) : "memory");
    return v;
}
#endif

// ember_last_arrival counts this block in at *counter once thread 0 has
// stored the block's partial result, and tells every thread of the block
// whether it is the last of the count blocks to arrive; the last one
// resets the counter to 0 for the next launch and may then read every
// block's partial. One launch instead of a second kernel for the join:
// the fence and the atomic cost each block an L2 round trip, so the
// kernels that use it run a grid that fits the GPU in one wave (more
// waves pay it once a wave). Every thread must call it.
__device__ bool ember_last_arrival(unsigned* counter, unsigned count) {
    __shared__ int last;
    if (threadIdx.x == 0) {
        ember_fence_acq_rel();  // the partial before the count
        last = atomicAdd(counter, 1u) == count - 1;
        if (last) *counter = 0;
    }
    __syncthreads();
    const bool l = last;
    if (l) ember_fence_acq_rel();  // every partial before what follows
    return l;
}

// ember_block_sum_f sums one float per thread over a block of any shape
// (blockDim.x*blockDim.y a multiple of 32, at most 1024): a xor butterfly
// within each warp, then warp 0 adds the warp sums the same way. The tree
// is fixed, so the result (valid in thread 0) is deterministic. Every thread
// must call it.
__device__ float ember_block_sum_f(float v) {
    __shared__ float part[32];
    const int t = threadIdx.y * blockDim.x + threadIdx.x;
    const int lane = t & 31, warp = t >> 5, nw = (blockDim.x * blockDim.y) >> 5;
    v = ember_warp_sum(v);
    if (lane == 0) part[warp] = v;
    __syncthreads();
    float s = 0.0f;
    if (warp == 0) s = ember_warp_sum(lane < nw ? part[lane] : 0.0f);
    __syncthreads();
    return s;
}

// Shared-memory fills by the whole block. Each thread issues up to
// EMBER_RT_LOADS global loads before it stores any, so that their latencies
// overlap, and divides at most once per row: one dependent load at a time,
// with two integer divisions per element, made the copies cost more than
// the arithmetic at LeNet's conv2.
#define EMBER_RT_LOADS 8

// ember_zero clears n floats.
__device__ __forceinline__ void ember_zero(float* dst, int n) {
    for (int t = threadIdx.x; t < n; t += blockDim.x) dst[t] = 0.0f;
}

// ember_block_each runs use(i, ld(i)) for every i < n, the block's threads
// striding by blockDim.x, U loads of a thread issued before it uses the
// first (a block's share of a copy or a transposition, latency hidden by
// the loads in flight rather than by more threads).
template <int U, typename V, typename Ld, typename Use>
__device__ __forceinline__ void ember_block_each(int n, Ld ld, Use use) {
    for (int i0 = threadIdx.x; i0 < n; i0 += U * blockDim.x) {
        V v[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int i = i0 + u * blockDim.x;
            if (i < n) v[u] = ld(i);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int i = i0 + u * blockDim.x;
            if (i < n) use(i, v[u]);
        }
    }
}

// ember_copy copies n contiguous floats.
__device__ __forceinline__ void ember_copy(float* dst, const float* src, int n) {
    ember_block_each<EMBER_RT_LOADS, float>(n, [&](int t) { return src[t]; }, [&](int t, float v) { dst[t] = v; });
}

// ember_copy_run copies the first min(n, EMBER_RT_LOADS) floats of s to d,
// all loads before any store.
__device__ __forceinline__ void ember_copy_run(float* d, const float* s, int n) {
    float v[EMBER_RT_LOADS];
#pragma unroll
    for (int j = 0; j < EMBER_RT_LOADS; j++) v[j] = j < n ? s[j] : 0.0f;
#pragma unroll
    for (int j = 0; j < EMBER_RT_LOADS; j++)
        if (j < n) d[j] = v[j];
}

// ember_copy_rows copies rows of width floats, one row per thread: row i
// from src(i) to dst(i). Elements around the rows are left as they are
// (zeroed once, they stay zero).
template <typename D, typename F>
__device__ __forceinline__ void ember_copy_rows(int rows, int width, D dst, F src) {
    for (int i = threadIdx.x; i < rows; i += blockDim.x) {
        const float* s = src(i);
        float* d = dst(i);
        for (int j0 = 0; j0 < width; j0 += EMBER_RT_LOADS) ember_copy_run(d + j0, s + j0, width - j0);
    }
}

// ember_copy_image copies image x [C, H, W] into the interior of img [C,
// H+2PH, XS] (rows start at column PW), whose padding was zeroed. Without
// padding and with XS == W it is one contiguous copy; otherwise each thread
// takes segments of up to EMBER_RT_LOADS columns of a row, so that all
// threads load even when there are few rows (a thread per row left 228 of
// 256 threads waiting at the barrier for LeNet's 28-row input: 54 us for
// conv1's weight gradient at batch 1024).
__device__ __forceinline__ void ember_copy_image(float* img, const float* x, int C, int H, int W, int PH, int PW,
                                                 int XS) {
    if (PH == 0 && PW == 0 && XS == W) {
        ember_copy(img, x, C * H * W);
        return;
    }
    const int segs = (W + EMBER_RT_LOADS - 1) / EMBER_RT_LOADS;
    // Row i = c*H + h goes to padded row c*(H+2PH) + h + PH = i + c*2PH + PH.
    for (int t = threadIdx.x; t < C * H * segs; t += blockDim.x) {
        const int i = t / segs, j0 = (t - i * segs) * EMBER_RT_LOADS;
        const int c = i / H;
        ember_copy_run(img + (i + c * 2 * PH + PH) * XS + PW + j0, x + (long long)i * W + j0, W - j0);
    }
}

// ReLU, then the pooling comparison (first maximum wins, NaN wins).
__device__ __forceinline__ void relu_pool_step(float v, int pos, float& best, int& at) {
    if (!(v > 0.0f) && v == v) v = 0.0f;
    if (at < 0 || v > best || v != v) {
        best = v;
        at = pos;
    }
}

// bfloat16 (stored as its 16-bit pattern, unsigned short) from float32 and
// back, for mixed precision (cast.cu, and kernels that round their
// operands as autocast does). The rounding is done on the integer bits,
// not with the CUDA headers' intrinsics, so that it is the CPU backend's
// (tensor.BFloat16Bits) and torch's bit for bit: to nearest, ties to even,
// subnormals kept, and every NaN the quiet NaN 0x7FC0 (the intrinsics
// give another NaN pattern).
__device__ __forceinline__ unsigned short ember_bf16_from_f32(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (unsigned short)0x7fc0u;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

__device__ __forceinline__ float ember_f32_from_bf16(unsigned short h) {
    return __uint_as_float(((unsigned int)h) << 16);
}

// The bfloat16 pair (lo in the low half, hi in the high one), each rounded
// as ember_bf16_from_f32 rounds: one cvt.rn.bf16x2 (sm_80 on; it keeps
// subnormals), whose NaNs are then made 0x7FC0, in place of the integer
// rounding's five instructions a value. Before sm_80, and in the host
// emulation of the tests, the integer rounding (the same bits).
#if !defined(EMBER_HOST_EMU) && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800)
#define EMBER_CVT_BF16X2 1
#endif
__device__ __forceinline__ unsigned int ember_bf16x2_from_f32(float lo, float hi) {
#ifdef EMBER_CVT_BF16X2
    unsigned int r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    // One test of the pair on the common path (two compares and a branch,
    // where a fix of each half unconditionally took six instructions).
    if (__builtin_expect(lo != lo || hi != hi, 0)) {
        if (lo != lo) r = (r & 0xffff0000u) | 0x7fc0u;
        if (hi != hi) r = (r & 0x0000ffffu) | 0x7fc00000u;
    }
    return r;
#else
    return (unsigned int)ember_bf16_from_f32(lo) | ((unsigned int)ember_bf16_from_f32(hi) << 16);
#endif
}

// The pair rounded as ember_bf16x2_from_f32 rounds, a NaN left as the
// conversion gives it (some NaN): for values rounded on their way to
// another operation rather than to memory.
__device__ __forceinline__ unsigned int ember_bf16x2_rn(float lo, float hi) {
#ifdef EMBER_CVT_BF16X2
    unsigned int r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return ember_bf16x2_from_f32(lo, hi);
#endif
}

// v rounded to bfloat16, as a float32.
__device__ __forceinline__ float ember_bf16_round(float v) { return __uint_as_float(ember_bf16x2_from_f32(0.0f, v) & 0xffff0000u); }
