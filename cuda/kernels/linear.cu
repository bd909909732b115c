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
        ember_cluster_sync();
        const int rows = LT_BM / C;
        for (int e = threadIdx.x; e < rows * LT_BN; e += LT_THREADS) {
            const int il = split * rows + e / LT_BN, jl = e % LT_BN;
            float v[C];
#pragma unroll
            for (int t = 0; t < C; t++) v[t] = ember_cluster_ld_f32(&part[il * LT_BN + jl], t);
            float sum = v[0];
#pragma unroll
            for (int t = 1; t < C; t++) sum += v[t];
            const int i = i0 + il, j = j0 + jl;
            if (i < p.M && j < p.N) lt_put(p, i, j, sum);
        }
        ember_cluster_sync();  // no block leaves while others read its tile
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
