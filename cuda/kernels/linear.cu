// Linear layers as tiled products with their epilogues (bias, ReLU, the
// ReLU's mask on the incoming gradient, the bias gradient) and their split-K
// reduction inside the same launch.
//
// Every product here is C(i, j) = sum_k A(i, k) B(j, k) with A and B read
// through strides, so that one tile routine serves the three products of a
// layer y = x·wᵀ + b (x [n, in], w [out, in], g = dy [n, out]):
//
//   forward  y  [n, out]: A(i, k) = x[i, k],  B(j, k) = w[j, k]
//   backward dx [n, in]:  A(i, k) = g[i, k],  B(j, k) = w[k, j]
//   backward dw [out, in]: A(i, k) = g[k, i], B(j, k) = x[k, j]
//
// A block computes a 64x64 tile of C over a range of k (its split) with 512
// threads, each holding a 2x4 sub-tile in registers; 16-deep slices of A and
// B go through shared memory, loaded (coalesced along whichever index is
// contiguous) while the previous slice is multiplied. When a tile's k range
// is split over several blocks, each writes its partial tile to a
// workspace and counts itself in; the last block of the tile adds the
// partials in split order (so results do not depend on which block finishes
// last), applies the epilogue and resets the counter for the next launch or
// graph replay. At batch 64, LeNet's fc1 forward was cuBLAS's split-K kernel,
// its reduction and a bias + ReLU pass; here it is one launch, and its
// backward (mask, bias gradient, dx, dw) another.

#define LT_BM 64
#define LT_BN 64
#define LT_BK 16
#define LT_LD (LT_BM + 4)  // row pitch of the shared slices: float4-aligned, fewer bank conflicts
// 16 warps, each thread 2 rows x 4 columns of the tile and 2 elements of
// each slice: at batch 64 an SM holds one block, and 8 warps of 4x4 left
// it waiting on shared-memory and global latency (Nsight: 5.3 cycles per
// issued instruction).
#define LT_THREADS 512
#define LT_LOADS (LT_BM * LT_BK / LT_THREADS)

// lt_problem is one product and its epilogue. Rows i < M, columns j < N,
// sums over k < K. Column onesCol (or none when < 0) of B is all ones, and
// that column of C goes to d[i] instead of c: with A = g and onesCol = in,
// the dw product also gives the bias gradient. mask, when not null, zeroes
// A(i, k) where mask (laid out as A) is not positive: the ReLU's backward.
struct lt_problem {
    const float* a;
    long long sai, sak;
    const float* mask;
    const float* b;
    long long sbj, sbk;
    int onesCol;
    int M, N, K;
    float* c;
    long long ldc;
    float betaC;
    const float* bias;  // per column j, after the product (forward)
    int relu;
    float* d;
    float betaD;
    int splits, steps;  // k is split into splits ranges of steps slices of LT_BK
    float* ws;          // splits x M x N partial sums when splits > 1 outside clusters (else null)
    int* counters;      // one per tile when splits > 1 outside clusters, zero between launches
};

// lt_src is where one thread fetches its LT_LOADS elements of each 64 x 16 slice
// of an operand (coalesced along the operand's contiguous index): worked
// out once per tile, so that a slice costs a bounds test and a load per
// element. The offsets are ints: the backend keeps 64 * each stride below
// 2^31 (linear.go).
struct lt_src {
    const float* base;  // the slice's first element (row r0, k0)
    const float* mask;  // null, or the mask (laid out as the operand) at base
    long long adv;      // base's advance per slice: LT_BK * sk
    int off[LT_LOADS];    // element q's offset from base
    int kl[LT_LOADS];     // element q's k within the slice
    int state[LT_LOADS];  // 0: past the last row (zero), 1: a row, 2: the ones column
    bool kContiguous;   // sk == 1: the slice is stored transposed
};

__device__ __forceinline__ lt_src lt_src_at(const float* p, long long sr, long long sk, const float* mask, int onesCol,
                                            int rows, int r0, int k0) {
    lt_src s;
    s.kContiguous = sk == 1;
    const long long start = (long long)r0 * sr + (long long)k0 * sk;
    s.base = p + start;
    s.mask = mask != 0 ? mask + start : 0;
    s.adv = LT_BK * sk;
#pragma unroll
    for (int q = 0; q < LT_LOADS; q++) {
        const int e = threadIdx.x + q * LT_THREADS;
        const int rl = s.kContiguous ? e >> 4 : e & 63;
        s.kl[q] = s.kContiguous ? e & 15 : e >> 6;
        s.off[q] = (int)(rl * sr + s.kl[q] * sk);
        const int gr = r0 + rl;
        s.state[q] = gr >= rows ? 0 : gr == onesCol ? 2 : 1;
    }
    return s;
}

// lt_fetch loads the thread's elements of the slice at k0 into v and moves
// s to the next slice.
__device__ __forceinline__ void lt_fetch(float v[LT_LOADS], lt_src& s, int k0, int K) {
#pragma unroll
    for (int q = 0; q < LT_LOADS; q++) {
        float x = 0.0f;
        if (s.state[q] != 0 && k0 + s.kl[q] < K) {
            if (s.state[q] == 2) {
                x = 1.0f;
            } else {
                x = s.base[s.off[q]];
                if (s.mask != 0 && !(s.mask[s.off[q]] > 0.0f)) x = 0.0f;
            }
        }
        v[q] = x;
    }
    s.base += s.adv;
    if (s.mask != 0) s.mask += s.adv;
}

// lt_store puts what lt_fetch loaded into a shared slice [k][row].
__device__ __forceinline__ void lt_store(float (*sh)[LT_LD], const float v[LT_LOADS], const lt_src& s) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int q = 0; q < LT_LOADS; q++) {
        const int e = tid + q * LT_THREADS;
        if (s.kContiguous) {
            sh[e & 15][e >> 4] = v[q];
        } else {
            sh[e >> 6][e & 63] = v[q];
        }
    }
}

// lt_put writes one finished element of C (or of d, for the ones column).
__device__ __forceinline__ void lt_put(const lt_problem p, int i, int j, float v) {
    if (j == p.onesCol) {
        if (p.betaD != 0.0f) v = v + p.betaD * p.d[i];
        p.d[i] = v;
        return;
    }
    const long long o = (long long)i * p.ldc + j;
    if (p.betaC != 0.0f) v = v + p.betaC * p.c[o];
    if (p.bias != 0) v = v + p.bias[j];
    if (p.relu) v = (v > 0.0f || v != v) ? v : 0.0f;
    p.c[o] = v;
}

// lt_each calls f(r, c, i, j) for each element (r, c) of a thread's 2x4
// sub-tile, at (i, j) in C, that lies inside the M x N product.
template <class F>
__device__ __forceinline__ void lt_each(int i0, int j0, int M, int N, F f) {
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const int i = i0 + r, j = j0 + c;
            if (i < M && j < N) f(r, c, i, j);
        }
}

// Thread block clusters (sm_90): the CS blocks that split a tile's sum form
// a cluster, keep their partial tiles in their own shared memory and add
// them through distributed shared memory, each block finishing 64 / CS rows
// of the tile. This replaces the workspace, the fence, the counter and the
// last block's reloads of the portable path, whose serial round trips
// through L2 cost more than the slices themselves at batch 64.
#if __CUDA_ARCH__ >= 900
#define LT_CLUSTER 8
__device__ __forceinline__ void lt_cluster_sync() {
    asm volatile("barrier.cluster.arrive.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
}
// lt_cluster_load reads the float at local's offset in the shared memory of
// the cluster's block rank.
__device__ __forceinline__ float lt_cluster_load(const float* local, unsigned rank) {
    unsigned long long generic = (unsigned long long)local, shared;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(shared) : "l"(generic));
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"((unsigned)shared), "r"(rank));
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
    return v;
}
#endif

// lt_tile computes block `blk` of problem p: tile blk / splits over split
// blk % splits (blocks past the last tile do nothing). CS is the cluster
// size, 0 outside clusters: then split sums go through p.ws and
// p.counters. Inlined, so that p's fields stay in registers or constants
// (passed to a call, the struct lives in local memory and every slice
// reloads its strides and pointers from there).
template <int CS>
__device__ __forceinline__ void lt_tile(const lt_problem p, int blk) {
    // The two slices of A and of B; after the products, a cluster's
    // partial tile.
    __shared__ __attribute__((aligned(16))) float sh[2 * 2 * LT_BK * LT_LD];
    float(*As)[LT_BK][LT_LD] = reinterpret_cast<float(*)[LT_BK][LT_LD]>(sh);
    float(*Bs)[LT_BK][LT_LD] = reinterpret_cast<float(*)[LT_BK][LT_LD]>(sh + 2 * LT_BK * LT_LD);
    __shared__ int last;
    const int tilesN = (p.N + LT_BN - 1) / LT_BN;
    const int tiles = ((p.M + LT_BM - 1) / LT_BM) * tilesN;
    const int tile = blk / p.splits, split = blk % p.splits;
    if (tile >= tiles) return;  // padding of a cluster-sized grid (never in a split cluster)
    const int i0 = (tile / tilesN) * LT_BM, j0 = (tile % tilesN) * LT_BN;
    const int kSteps = (p.K + LT_BK - 1) / LT_BK;
    const int s0 = split * p.steps, s1 = ember_imin(kSteps, s0 + p.steps);
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;

    float acc[2][4];
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
        for (int c = 0; c < 4; c++) acc[r][c] = 0.0f;

    float va[LT_LOADS], vb[LT_LOADS];
    lt_src sa = lt_src_at(p.a, p.sai, p.sak, p.mask, -1, p.M, i0, s0 * LT_BK);
    lt_src sb = lt_src_at(p.b, p.sbj, p.sbk, 0, p.onesCol, p.N, j0, s0 * LT_BK);
    int cur = 0;
    if (s0 < s1) {
        lt_fetch(va, sa, s0 * LT_BK, p.K);
        lt_fetch(vb, sb, s0 * LT_BK, p.K);
        lt_store(As[0], va, sa);
        lt_store(Bs[0], vb, sb);
        __syncthreads();
    }
    for (int s = s0; s < s1; s++) {
        const bool more = s + 1 < s1;
        if (more) {  // the next slice travels while this one is multiplied
            lt_fetch(va, sa, (s + 1) * LT_BK, p.K);
            lt_fetch(vb, sb, (s + 1) * LT_BK, p.K);
        }
#pragma unroll
        for (int k = 0; k < LT_BK; k++) {
            const ember_f2 a = *reinterpret_cast<const ember_f2*>(&As[cur][k][ty * 2]);
            const ember_f4 b = *reinterpret_cast<const ember_f4*>(&Bs[cur][k][tx * 4]);
            const float av[2] = {a.x, a.y}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int r = 0; r < 2; r++)
#pragma unroll
                for (int c = 0; c < 4; c++) acc[r][c] = __fmaf_rn(av[r], bv[c], acc[r][c]);
        }
        if (more) {
            lt_store(As[cur ^ 1], va, sa);
            lt_store(Bs[cur ^ 1], vb, sb);
        }
        __syncthreads();
        cur ^= 1;
    }

    const int ti = i0 + ty * 2, tj = j0 + tx * 4;  // the thread's sub-tile in C
    if (p.splits == 1) {
        lt_each(ti, tj, p.M, p.N, [&](int r, int c, int i, int j) { lt_put(p, i, j, acc[r][c]); });
        return;
    }
#if __CUDA_ARCH__ >= 900
    if (CS > 1) {
        constexpr int C = CS > 1 ? CS : 1;  // CS, in code also compiled for CS = 0
        float* part = sh;  // [64][64]: the slices are done (the loop ended on a barrier)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            ember_f4 v = {acc[r][0], acc[r][1], acc[r][2], acc[r][3]};
            *reinterpret_cast<ember_f4*>(&part[(ti - i0 + r) * LT_BN + tx * 4]) = v;
        }
        lt_cluster_sync();
        const int rows = LT_BM / C;
        for (int e = threadIdx.x; e < rows * LT_BN; e += LT_THREADS) {
            const int il = split * rows + e / LT_BN, jl = e % LT_BN;
            float v[C];
#pragma unroll
            for (int t = 0; t < C; t++) v[t] = lt_cluster_load(&part[il * LT_BN + jl], t);
            float sum = v[0];
#pragma unroll
            for (int t = 1; t < C; t++) sum += v[t];
            const int i = i0 + il, j = j0 + jl;
            if (i < p.M && j < p.N) lt_put(p, i, j, sum);
        }
        lt_cluster_sync();  // no block leaves while others read its tile
        return;
    }
#endif
    const long long plane = (long long)p.M * p.N;
    lt_each(ti, tj, p.M, p.N,
            [&](int r, int c, int i, int j) { p.ws[split * plane + (long long)i * p.N + j] = acc[r][c]; });
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&p.counters[tile], 1) == p.splits - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    // The partial tiles in split order, all 8 of a thread's loads of one
    // split in flight together.
    lt_each(ti, tj, p.M, p.N, [&](int r, int c, int, int) { acc[r][c] = 0.0f; });
    for (int t = 0; t < p.splits; t++) {
        const float* w = p.ws + t * plane;
        lt_each(ti, tj, p.M, p.N, [&](int r, int c, int i, int j) { acc[r][c] += __ldcg(w + (long long)i * p.N + j); });
    }
    lt_each(ti, tj, p.M, p.N, [&](int r, int c, int i, int j) { lt_put(p, i, j, acc[r][c]); });
    if (threadIdx.x == 0) p.counters[tile] = 0;
}

// linear_tiled: y [n, out] = x·wᵀ (+ bias[o]) (ReLU'd when relu), over
// splits ranges of k (wsOrNull and countersOrNull when splits > 1).
#define LT_FORWARD_ARGS y, x, w, bias, n, in, out, relu, splits, steps, wsOrNull, countersOrNull
template <int CS>
__device__ __forceinline__ void lt_forward(float* y, const float* x, const float* w, const float* bias, int n, int in, int out, int relu, int splits, int steps, float* wsOrNull, int* countersOrNull) {
    lt_problem p;
    p.a = x, p.sai = in, p.sak = 1, p.mask = 0;
    p.b = w, p.sbj = in, p.sbk = 1, p.onesCol = -1;
    p.M = n, p.N = out, p.K = in;
    p.c = y, p.ldc = out, p.betaC = 0.0f, p.bias = bias, p.relu = relu;
    p.d = 0, p.betaD = 0.0f;
    p.splits = splits, p.steps = steps, p.ws = wsOrNull, p.counters = countersOrNull;
    lt_tile<CS>(p, blockIdx.x);
}

// linear_grads_tiled: the gradients of y = x·wᵀ + b (ReLU'd when mask, its
// output, is not null: g passes where mask > 0) from g = dy [n, out], in
// one launch. The first blocksX blocks make dx [n, in] = g·w; the rest make
// dw [out, in] = gᵀ·x and, as dw's extra column of ones, db [out] (each
// skipped when null; dw and db both null: no blocks). Each is added to when
// its beta is 1.
#define LT_GRADS_ARGS                                                                                                 \
    dxOrNull, dw, db, g, mask, x, w, n, in, out, betaX, betaW, betaB, splitsX, stepsX, splitsW, stepsW, blocksX, wsXOrNull, wsWOrNull, \
        countersXOrNull, countersWOrNull
template <int CS>
__device__ __forceinline__ void lt_grads(float* dxOrNull, float* dw, float* db, const float* g, const float* mask, const float* x, const float* w, int n, int in, int out, float betaX, float betaW, float betaB, int splitsX, int stepsX, int splitsW, int stepsW, int blocksX, float* wsXOrNull, float* wsWOrNull, int* countersXOrNull, int* countersWOrNull) {
    lt_problem p;
    p.mask = mask;
    p.relu = 0, p.bias = 0;
    if ((int)blockIdx.x < blocksX) {
        p.a = g, p.sai = out, p.sak = 1;
        p.b = w, p.sbj = 1, p.sbk = in, p.onesCol = -1;
        p.M = n, p.N = in, p.K = out;
        p.c = dxOrNull, p.ldc = in, p.betaC = betaX;
        p.d = 0, p.betaD = 0.0f;
        p.splits = splitsX, p.steps = stepsX, p.ws = wsXOrNull, p.counters = countersXOrNull;
        lt_tile<CS>(p, blockIdx.x);
        return;
    }
    // Without dw, the product is db's column alone (column 0, all ones).
    const int cols = dw != 0 ? in : 0;
    p.a = g, p.sai = 1, p.sak = out;
    p.b = x, p.sbj = 1, p.sbk = in, p.onesCol = db != 0 ? cols : -1;
    p.M = out, p.N = cols + (db != 0 ? 1 : 0), p.K = n;
    p.c = dw, p.ldc = in, p.betaC = betaW;
    p.d = db, p.betaD = betaB;
    p.splits = splitsW, p.steps = stepsW, p.ws = wsWOrNull, p.counters = countersWOrNull;
    lt_tile<CS>(p, blockIdx.x - blocksX);
}

extern "C" __global__ void __launch_bounds__(LT_THREADS) ember_linear_tiled(float* y, const float* x, const float* w, const float* bias, int n, int in, int out, int relu, int splits, int steps, float* wsOrNull, int* countersOrNull) {
    lt_forward<0>(LT_FORWARD_ARGS);
}
extern "C" __global__ void __launch_bounds__(LT_THREADS) ember_linear_grads_tiled(float* dxOrNull, float* dw, float* db, const float* g, const float* mask, const float* x, const float* w, int n, int in, int out, float betaX, float betaW, float betaB, int splitsX, int stepsX, int splitsW, int stepsW, int blocksX, float* wsXOrNull, float* wsWOrNull, int* countersXOrNull, int* countersWOrNull) {
    lt_grads<0>(LT_GRADS_ARGS);
}

// The same, with the blocks that split a tile's sum in a cluster of
// LT_CLUSTER (splits is 1 or LT_CLUSTER; the grid, and blocksX, are
// multiples of LT_CLUSTER).
#if __CUDA_ARCH__ >= 900
extern "C" __global__ void __cluster_dims__(LT_CLUSTER, 1, 1) __launch_bounds__(LT_THREADS)
    ember_linear_tiled_cluster(float* y, const float* x, const float* w, const float* bias, int n, int in, int out, int relu, int splits, int steps, float* wsOrNull, int* countersOrNull) {
    lt_forward<LT_CLUSTER>(LT_FORWARD_ARGS);
}
extern "C" __global__ void __cluster_dims__(LT_CLUSTER, 1, 1) __launch_bounds__(LT_THREADS)
    ember_linear_grads_tiled_cluster(float* dxOrNull, float* dw, float* db, const float* g, const float* mask, const float* x, const float* w, int n, int in, int out, float betaX, float betaW, float betaB, int splitsX, int stepsX, int splitsW, int stepsW, int blocksX, float* wsXOrNull, float* wsWOrNull, int* countersXOrNull, int* countersWOrNull) {
    lt_grads<LT_CLUSTER>(LT_GRADS_ARGS);
}
#endif

// Products of at most 64 rows through a wide layer (an MLP's step at batch
// 64, a few inputs at inference): C [M, N] (+)= A·Bᵀ, or A·B, with A
// [M, K] and B [N, K], or [K, N], rows contiguous. At 64 rows such a
// product is about 2 µs of the device's FP32 arithmetic when every SM takes
// a share, which needs its sum split over k; lt_tile's 16-deep slices then
// each wait on their loads (one slice ahead hides one slice's compute, a
// tenth of a load's latency). Here a block's whole range of k (SK_KC at a
// time) is copied into shared memory at once by cp.async, in four groups
// multiplied as each lands, so a block waits on about one load. The
// SK_CLUSTER blocks that split a tile's sum form a cluster and add their
// partial tiles through distributed shared memory in rank order (the bits
// do not depend on timing), each finishing 64 / SK_CLUSTER rows with the
// epilogue: beta·C, the bias, the ReLU.
#if __CUDA_ARCH__ >= 900
#define SK_COLS 64
#define SK_KC 128
#define SK_KP (SK_KC + 4)    // pitch of a k-contiguous row: float4-aligned, consecutive rows 4 banks apart
#define SK_JP (SK_COLS + 4)  // pitch of a k-major row of B
// 16 warps a block, each thread 2 rows x 4 columns of the tile: a block has
// an SM to itself (128 blocks for 1024 columns), and at 4 warps (8 rows x 4
// columns a thread) each SM issued about one instruction a cycle, its
// warps waiting on shared-memory loads and on each other's sums (Nsight).
#define SK_THREADS 512
#define SK_CLUSTER 8
// The dynamic shared memory a block takes: A's rows, then B's (the larger
// of its two layouts). The Go side sets it as the kernel's limit
// (linear_skinny.go).
#define SK_SHARED_FLOATS (64 * SK_KP + (64 * SK_KP > SK_KC * SK_JP ? 64 * SK_KP : SK_KC * SK_JP))

__device__ __forceinline__ void sk_cp16(float* dst, const float* src, bool in) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }\n" : "=r"(a) : "l"(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(src), "r"(in ? 16 : 0) : "memory");
}
__device__ __forceinline__ void sk_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int pending>
__device__ __forceinline__ void sk_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(pending) : "memory");
}

// sk_fetch copies quarter q (32 k) of the piece [k0, kEnd) of A's rows and
// of B's tile into shared memory, zeros past M, N and kEnd, as one group.
template <bool BKMAJOR>
__device__ __forceinline__ void sk_fetch(float* As, float* Bs, const float* a, const float* b, int M, int N, int K, int j0,
                                         int k0, int kEnd, int q) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int e = tid; e < 64 * 8; e += SK_THREADS) {
        const int r = e >> 3, kk = 32 * q + 4 * (e & 7);
        const bool in = r < M && k0 + kk < kEnd;
        sk_cp16(As + r * SK_KP + kk, in ? a + (long long)r * K + k0 + kk : a, in);
    }
    if (BKMAJOR) {
#pragma unroll
        for (int e = tid; e < 32 * 16; e += SK_THREADS) {
            const int kk = 32 * q + (e >> 4), j = j0 + 4 * (e & 15);
            const bool in = k0 + kk < kEnd && j < N;
            sk_cp16(Bs + kk * SK_JP + 4 * (e & 15), in ? b + (long long)(k0 + kk) * N + j : b, in);
        }
    } else {
#pragma unroll
        for (int e = tid; e < 64 * 8; e += SK_THREADS) {
            const int r = e >> 3, kk = 32 * q + 4 * (e & 7);
            const bool in = j0 + r < N && k0 + kk < kEnd;
            sk_cp16(Bs + r * SK_KP + kk, in ? b + (long long)(j0 + r) * K + k0 + kk : b, in);
        }
    }
    sk_commit();
}

// sk_column is the tile column of a thread's c-th column: 16 apart where B
// is k-contiguous (its rows then 4 banks apart in shared memory), 4 together
// where it is k-major (one float4 of a row of B).
template <bool BKMAJOR>
__device__ __forceinline__ int sk_column(int tx, int c) {
    return BKMAJOR ? 4 * tx + c : tx + 16 * c;
}

// sk_multiply adds the products over the 32 k of one quarter (As and Bs at
// its first k; past the operands' ends the copies wrote zeros) to the
// thread's 2 x 4 sums, rows ty and ty + 32 (R = 1: row ty only, the other
// being past M), k ascending for each. Unrolled whole, so that the next
// loads from shared memory are issued while these sums run (rolled, with
// its length a variable, each sum waited on its load).
template <bool BKMAJOR, int R>
__device__ __forceinline__ void sk_multiply(float acc[2][4], const float* As, const float* Bs, int tx, int ty) {
#pragma unroll
    for (int kk = 0; kk < 32; kk += 4) {
        ember_f4 av[R];
#pragma unroll
        for (int r = 0; r < R; r++) av[r] = *reinterpret_cast<const ember_f4*>(As + (ty + 32 * r) * SK_KP + kk);
        if (BKMAJOR) {
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const ember_f4 bv = *reinterpret_cast<const ember_f4*>(Bs + (kk + u) * SK_JP + 4 * tx);
                const float bs[4] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const float a = u == 0 ? av[r].x : u == 1 ? av[r].y : u == 2 ? av[r].z : av[r].w;
#pragma unroll
                    for (int c = 0; c < 4; c++) acc[r][c] = __fmaf_rn(a, bs[c], acc[r][c]);
                }
            }
        } else {
            ember_f4 bv[4];
#pragma unroll
            for (int c = 0; c < 4; c++) bv[c] = *reinterpret_cast<const ember_f4*>(Bs + (tx + 16 * c) * SK_KP + kk);
#pragma unroll
            for (int u = 0; u < 4; u++)
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const float a = u == 0 ? av[r].x : u == 1 ? av[r].y : u == 2 ? av[r].z : av[r].w;
#pragma unroll
                    for (int c = 0; c < 4; c++) {
                        const float bb = u == 0 ? bv[c].x : u == 1 ? bv[c].y : u == 2 ? bv[c].z : bv[c].w;
                        acc[r][c] = __fmaf_rn(a, bb, acc[r][c]);
                    }
                }
        }
    }
}

// sk_product: block blockIdx.x is column tile blockIdx.x / SK_CLUSTER and
// its rank in the cluster the split of k [rank·chunk, (rank+1)·chunk)
// (chunk a multiple of 4; K too, and N where B is k-major, so that every
// 16-byte copy lies wholly inside or outside the operand).
template <bool BKMAJOR>
__device__ __forceinline__ void sk_product(float* c, const float* a, const float* b, const float* bias, int M, int N, int K,
                                           int chunk, float beta, int relu) {
    extern __shared__ __attribute__((aligned(16))) float sk_sh[];
    float* As = sk_sh;
    float* Bs = sk_sh + 64 * SK_KP;
    const unsigned rank = blockIdx.x % SK_CLUSTER;
    const int j0 = (blockIdx.x / SK_CLUSTER) * SK_COLS;
    const int kBegin = ember_imin(K, (int)rank * chunk), kEnd = ember_imin(K, kBegin + chunk);
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;

    float acc[2][4];
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
        for (int cc = 0; cc < 4; cc++) acc[r][cc] = 0.0f;

    for (int k0 = kBegin; k0 < kEnd; k0 += SK_KC) {
        const int len = ember_imin(SK_KC, kEnd - k0);
        const int quarters = (len + 31) / 32;
        // All of the piece's copies first, then each quarter as it lands.
#pragma unroll
        for (int q = 0; q < 4; q++) {
            if (q < quarters) {
                sk_fetch<BKMAJOR>(As, Bs, a, b, M, N, K, j0, k0, kEnd, q);
            } else {
                sk_commit();  // an empty group keeps the count of pending groups
            }
        }
#pragma unroll
        for (int q = 0; q < 4; q++) {
            if (q >= quarters) break;
            if (q == 0) sk_wait<3>();
            if (q == 1) sk_wait<2>();
            if (q == 2) sk_wait<1>();
            if (q == 3) sk_wait<0>();
            __syncthreads();
            const float* Aq = As + 32 * q;
            const float* Bq = BKMAJOR ? Bs + 32 * q * SK_JP : Bs + 32 * q;
            if (M > 32) {
                sk_multiply<BKMAJOR, 2>(acc, Aq, Bq, tx, ty);
            } else {
                sk_multiply<BKMAJOR, 1>(acc, Aq, Bq, tx, ty);
            }
        }
        sk_wait<0>();
        __syncthreads();  // the next piece's copies overwrite these
    }

    // The partial tile [64][SK_COLS] over A's rows, then the cluster's sum.
    float* part = sk_sh;
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
        for (int cc = 0; cc < 4; cc++) part[(ty + 32 * r) * SK_COLS + sk_column<BKMAJOR>(tx, cc)] = acc[r][cc];
    lt_cluster_sync();
    constexpr int rows = 64 / SK_CLUSTER;
    for (int e = threadIdx.x; e < rows * SK_COLS; e += SK_THREADS) {
        const int i = rank * rows + e / SK_COLS, jl = e % SK_COLS, j = j0 + jl;
        if (i >= M || j >= N) continue;
        float v[SK_CLUSTER];
#pragma unroll
        for (int t = 0; t < SK_CLUSTER; t++) v[t] = lt_cluster_load(&part[i * SK_COLS + jl], t);
        float sum = v[0];
#pragma unroll
        for (int t = 1; t < SK_CLUSTER; t++) sum += v[t];
        const long long o = (long long)i * N + j;
        if (beta != 0.0f) sum = sum + beta * c[o];
        if (bias != 0) sum = sum + bias[j];
        if (relu) sum = (sum > 0.0f || sum != sum) ? sum : 0.0f;
        c[o] = sum;
    }
    lt_cluster_sync();  // no block leaves while others read its partial tile
}

// linear_skinny: c [m, n] (+ beta·c) = a [m, k] · b [n, k]ᵀ (+ bias, ReLU'd
// when relu), m <= 64: a layer's forward pass.
extern "C" __global__ void __cluster_dims__(SK_CLUSTER, 1, 1) __launch_bounds__(SK_THREADS)
    ember_linear_skinny(float* c, const float* a, const float* b, const float* biasOrNull, int m, int n, int k, int chunk, float beta, int relu) {
    sk_product<false>(c, a, b, biasOrNull, m, n, k, chunk, beta, relu);
}
// linear_skinny_kmajor: c [m, n] (+ beta·c) = a [m, k] · b [k, n], m <= 64:
// a layer's input gradient g·w.
extern "C" __global__ void __cluster_dims__(SK_CLUSTER, 1, 1) __launch_bounds__(SK_THREADS)
    ember_linear_skinny_kmajor(float* c, const float* a, const float* b, int m, int n, int k, int chunk, float beta) {
    sk_product<true>(c, a, b, 0, m, n, k, chunk, beta, 0);
}
#endif
