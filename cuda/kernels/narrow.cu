// Linear layers with few outputs (at most 32: a classifier's last layer,
// LeNet's fc2 with 10). Their products are too thin for tiles: a sum of
// `in` terms per logit, or of 10 terms per input gradient. Two kernels:
//
//   linear_xent: the last layer and the cross entropy of its output, in one
//   launch: logits, loss, the logits' gradient and the input's gradient;
//   linear_grads_narrow: the gradients of such a layer (dx, dw, db), in one
//   launch.
//
// At batch 64, LeNet's fc2 forward, cross entropy and fc2 backward were
// three launches of about 5 us each, mostly fixed costs.

// linear_xent: for rows r < n of x [n, in], with w [classes, in], bias
// [classes] (or null) and labels [n]:
//   z = x[r]·wᵀ + bias          (the product, then the bias, as AddBias)
//   loss_r = (m - z[y]) + log(sum exp(z - m)),  m = max z (NaN propagates)
//   dlogits[r, c] = exp(z[c] - m)/se/n - (c == y)/n      (when not null)
//   dx[r] = dlogits[r]·w                                 (when not null too)
//           where x[r] > 0 and 0 elsewhere when reluX (x a ReLU's output:
//           its gradient then needs no pass of its own through the mask)
// and loss[0] = the mean of loss_r, as ember_cross_entropy computes it from
// the logits (also added to lossSum[0], a running total, when not null). A
// label outside [0, classes) makes its row NaN.
//
// ember_linear_xent, for rows of fewer than a block's worth of pieces
// (LeNet's fc2, 500 inputs: 1.7% slower a step with the kernels below,
// docs/performance.md, round 32): a block of rows·classes warps
// (rows·classes <= 32) takes that many rows at a time: warp (i, c) forms logit c of row i as ember_gemm_small does
// (lanes take k = lane, lane+32, ..., a xor tree adds them: the same bits),
// warp i then does row i's softmax from shared memory, and the whole block
// forms the rows' dx, a thread per element. Every chain of dependent loads
// is short: designs with a warp per row, or a block's warps splitting the
// columns of several rows with a register per class, took 10 to 16 us at
// batch 64 for the same work. The row losses are added in double in row
// order; with several blocks, block b writes partial[b], and the last block
// to finish (counted in *doneOrNull, which it resets) adds the partials in
// a fixed tree, so the loss does not depend on which block finishes last.
extern "C" __global__ void __launch_bounds__(1024)
ember_linear_xent(float* loss, float* lossSumOrNull, float* dlogitsOrNull, float* dxOrNull, const float* x, const float* w,
                  const float* biasOrNull, const int* labels, int n, int in, int classes, int rows, int reluX,
                  double* partialOrNull, int* doneOrNull) {
    __shared__ float zs[32];      // the block's logits, then their gradients: [rows][classes]
    __shared__ double rowLoss[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float nf = (float)n;
    double bsum = 0.0;  // thread 0's
    for (int r0 = blockIdx.x * rows; r0 < n; r0 += gridDim.x * rows) {
        // The softmax warps' label and bias, loaded now rather than after
        // the logits (two round trips off the chain).
        const int rs = r0 + warp;
        const int y = (warp < rows && rs < n) ? labels[rs] : 0;
        const float bl = (warp < rows && biasOrNull != 0 && lane < classes) ? biasOrNull[lane] : 0.0f;
        {
            const int i = warp / classes, c = warp - i * classes, r = r0 + i;
            float s = 0.0f;
            if (r < n) {
                const float* xr = x + (long long)r * in;
                const float* wc = w + (long long)c * in;
#pragma unroll 4
                for (int k = lane; k < in; k += 32) s = __fmaf_rn(xr[k], wc[k], s);
            }
            s = ember_warp_sum(s);
            if (lane == 0) zs[warp] = s;
        }
        __syncthreads();
        float d = 0.0f;
        if (warp < rows) {
            const int r = r0 + warp;
            const bool row = r < n;  // the same in the whole warp
            const float z = (row && lane < classes) ? zs[warp * classes + lane] + bl : ember_neg_inf();
            const float m = ember_warp_max(z);
            const float e = lane < classes ? expf(z - m) : 0.0f;
            const float se = ember_warp_sum(e);
            const bool bad = y < 0 || y >= classes;
            const float zy = __shfl_sync(0xffffffffu, z, bad ? 0 : y);
            d = e / se / nf;
            if (lane == y) d -= 1.0f / nf;
            if (bad) d = ember_nan();
            if (lane == 0) rowLoss[warp] = !row ? 0.0 : bad ? (double)ember_nan() : (double)((m - zy) + logf(se));
            if (row && dlogitsOrNull != 0 && lane < classes) dlogitsOrNull[(long long)r * classes + lane] = d;
        }
        __syncthreads();  // every warp has read zs
        if (warp < rows && lane < classes) zs[warp * classes + lane] = d;
        if (threadIdx.x == 0) {
            for (int i = 0; i < rows && r0 + i < n; i++) bsum += rowLoss[i];
        }
        __syncthreads();
        if (dxOrNull != 0) {
            const int count = ember_imin(rows, n - r0) * in;
            for (int e = threadIdx.x; e < count; e += blockDim.x) {
                const int i = e / in, k = e - i * in;
                float o = 0.0f;
                for (int c = 0; c < classes; c++) o = __fmaf_rn(zs[i * classes + c], w[(long long)c * in + k], o);
                const long long at = (long long)(r0 + i) * in + k;
                // Through x's ReLU mask (x a ReLU's output), as narrow_g.
                if (reluX && !(x[at] > 0.0f)) o = 0.0f;
                dxOrNull[at] = o;
            }
        }
        __syncthreads();  // zs and rowLoss are the next rows'
    }
    __shared__ int lastBlock;
    if (threadIdx.x == 0) {
        if (gridDim.x == 1) {
            const float l = (float)(bsum / (double)n);
            loss[0] = l;
            if (lossSumOrNull != 0) lossSumOrNull[0] += l;
        } else {
            partialOrNull[blockIdx.x] = bsum;
            ember_fence_acq_rel();
            lastBlock = atomicAdd(doneOrNull, 1) == (int)gridDim.x - 1;
        }
    }
    if (gridDim.x == 1) return;
    __syncthreads();
    if (!lastBlock) return;
    // The last block adds the partials with all its threads (one L2 round
    // trip each, all in flight; thread 0 alone took one after the other)
    // in a fixed tree.
    ember_fence_acq_rel();
    double t = 0.0;
    for (int b = threadIdx.x; b < (int)gridDim.x; b += blockDim.x) t += __ldcg(partialOrNull + b);
    t = ember_block_sum_d(t);
    if (threadIdx.x == 0) {
        const float l = (float)(t / (double)n);
        loss[0] = l;
        if (lossSumOrNull != 0) lossSumOrNull[0] += l;
        *doneOrNull = 0;
    }
}

// ember_linear_xent_c16 and its other forms, for longer rows (the MLP's
// 1,024 inputs): a block takes a row at a time (1-D blocks of a multiple
// of 32 threads):
// thread t takes the row's V-float pieces t, t + blockDim.x, ... (V = 4
// where the rows and w are 16-byte aligned, else 1) and keeps a partial
// logit per class (CMAX >= classes registers), so that all of a row's
// loads of x and w are issued together, one round trip; each logit is
// then a xor tree within the warps and the warps' sums added in order, so
// the bits do not depend on timing. Warp 0 does the row's softmax, and
// every thread forms dx at its pieces, reading w again where it just read
// it (L1). The loops over the classes stop at classes (a branch, not
// predicated instructions for the unused registers). The earlier design,
// a warp a logit with each lane's loads in a chain and the input gradient
// a loop of class loads per element (ember_linear_xent above), took 9-11
// us at batch 64 for 1,024 inputs (docs/performance.md, round 32). The row losses are added in
// double in row order; with several blocks, block b writes partial[b], and
// the last block to finish (counted in *doneOrNull, which it resets) adds
// the partials in a fixed tree, so the loss does not depend on which block
// finishes last.
template <int V>
struct xent_piece;
template <>
struct xent_piece<1> {
    float v;
    __device__ __forceinline__ static xent_piece load(const float* p) { return {*p}; }
    __device__ __forceinline__ float dot(const xent_piece& o, float s) const { return __fmaf_rn(v, o.v, s); }
};
template <>
struct xent_piece<4> {
    ember_f4 v;
    __device__ __forceinline__ static xent_piece load(const float* p) { return {*reinterpret_cast<const ember_f4*>(p)}; }
    __device__ __forceinline__ float dot(const xent_piece& o, float s) const {
        s = __fmaf_rn(v.x, o.v.x, s);
        s = __fmaf_rn(v.y, o.v.y, s);
        s = __fmaf_rn(v.z, o.v.z, s);
        return __fmaf_rn(v.w, o.v.w, s);
    }
};

template <int CMAX, int V>
__device__ __forceinline__ void linear_xent(float* loss, float* lossSumOrNull, float* dlogitsOrNull, float* dxOrNull,
                                            const float* x, const float* w, const float* biasOrNull, const int* labels,
                                            int n, int in, int classes, int reluX, double* partialOrNull, int* doneOrNull) {
    __shared__ float red[32][CMAX];  // the warps' partial logits
    __shared__ float ds[CMAX];       // the row's logit gradients
    __shared__ double rowLoss;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const float nf = (float)n;
    const int pieces = in / V;
    double bsum = 0.0;  // thread 0's
    for (int r = blockIdx.x; r < n; r += gridDim.x) {
        // Warp 0's label and bias, loaded now rather than after the
        // logits (a round trip off the chain).
        const int y = warp == 0 ? labels[r] : 0;
        const float bl = (warp == 0 && biasOrNull != 0 && lane < classes) ? biasOrNull[lane] : 0.0f;
        const float* xr = x + (long long)r * in;
        float part[CMAX];
#pragma unroll
        for (int c = 0; c < CMAX; c++) part[c] = 0.0f;
        for (int q = threadIdx.x; q < pieces; q += blockDim.x) {
            const xent_piece<V> xv = xent_piece<V>::load(xr + q * V);
            const float* wp = w + q * V;
#pragma unroll
            for (int c = 0; c < CMAX; c++) {
                if (c >= classes) break;
                part[c] = xv.dot(xent_piece<V>::load(wp), part[c]);
                wp += in;
            }
        }
#pragma unroll
        for (int c = 0; c < CMAX; c++) {
            if (c >= classes) break;
            const float v = ember_warp_sum(part[c]);
            if (lane == 0) red[warp][c] = v;
        }
        __syncthreads();
        if (warp == 0) {
            const bool badLabel = y < 0 || y >= classes;
            float z = ember_neg_inf();
            if (lane < classes) {
                float s = 0.0f;
                for (int i = 0; i < nw; i++) s += red[i][lane];
                z = s + bl;
            }
            const float m = ember_warp_max(z);
            const float e = lane < classes ? expf(z - m) : 0.0f;
            const float se = ember_warp_sum(e);
            const float zy = __shfl_sync(0xffffffffu, z, badLabel ? 0 : y);
            float d = e / se / nf;
            if (lane == y) d -= 1.0f / nf;
            if (badLabel) d = ember_nan();
            if (lane == 0) rowLoss = badLabel ? (double)ember_nan() : (double)((m - zy) + logf(se));
            if (lane < classes) {
                ds[lane] = d;
                if (dlogitsOrNull != 0) dlogitsOrNull[(long long)r * classes + lane] = d;
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) bsum += rowLoss;
        if (dxOrNull != 0) {
            float dc[CMAX];
#pragma unroll
            for (int c = 0; c < CMAX; c++) dc[c] = c < classes ? ds[c] : 0.0f;
            float* dxr = dxOrNull + (long long)r * in;
            for (int q = threadIdx.x; q < pieces; q += blockDim.x) {
                float o[V];
#pragma unroll
                for (int j = 0; j < V; j++) o[j] = 0.0f;
                const float* wp = w + q * V;
#pragma unroll
                for (int c = 0; c < CMAX; c++) {
                    if (c >= classes) break;
                    const xent_piece<V> wv = xent_piece<V>::load(wp);
                    const float* wf = reinterpret_cast<const float*>(&wv.v);
#pragma unroll
                    for (int j = 0; j < V; j++) o[j] = __fmaf_rn(dc[c], wf[j], o[j]);
                    wp += in;
                }
                const xent_piece<V> xv = xent_piece<V>::load(xr + q * V);
                const float* xf = reinterpret_cast<const float*>(&xv.v);
#pragma unroll
                for (int j = 0; j < V; j++) {
                    // Through x's ReLU mask (x a ReLU's output), as narrow_g.
                    if (reluX && !(xf[j] > 0.0f)) o[j] = 0.0f;
                }
                if (V == 4) {
                    *reinterpret_cast<ember_f4*>(dxr + q * V) = ember_f4{o[0], o[V > 1 ? 1 : 0], o[V > 2 ? 2 : 0], o[V > 3 ? 3 : 0]};
                } else {
                    dxr[q] = o[0];
                }
            }
        }
        __syncthreads();  // red, ds and rowLoss are the next row's
    }
    __shared__ int lastBlock;
    if (threadIdx.x == 0) {
        if (gridDim.x == 1) {
            const float l = (float)(bsum / (double)n);
            loss[0] = l;
            if (lossSumOrNull != 0) lossSumOrNull[0] += l;
        } else {
            partialOrNull[blockIdx.x] = bsum;
            ember_fence_acq_rel();
            lastBlock = atomicAdd(doneOrNull, 1) == (int)gridDim.x - 1;
        }
    }
    if (gridDim.x == 1) return;
    __syncthreads();
    if (!lastBlock) return;
    // The last block adds the partials with all its threads (one L2 round
    // trip each, all in flight; thread 0 alone took one after the other)
    // in a fixed tree.
    ember_fence_acq_rel();
    double t = 0.0;
    for (int b = threadIdx.x; b < (int)gridDim.x; b += blockDim.x) t += __ldcg(partialOrNull + b);
    t = ember_block_sum_d(t);
    if (threadIdx.x == 0) {
        const float l = (float)(t / (double)n);
        loss[0] = l;
        if (lossSumOrNull != 0) lossSumOrNull[0] += l;
        *doneOrNull = 0;
    }
}

// The entry points: up to 16 classes (a classifier of ten) and up to 32,
// each with rows read in float4 pieces (in a multiple of 4, x and w
// 16-byte aligned) or single floats.
extern "C" __global__ void __launch_bounds__(256)
ember_linear_xent_c16(float* loss, float* lossSumOrNull, float* dlogitsOrNull, float* dxOrNull, const float* x, const float* w,
    const float* biasOrNull, const int* labels, int n, int in, int classes, int reluX, double* partialOrNull, int* doneOrNull) {
    linear_xent<16, 1>(loss, lossSumOrNull, dlogitsOrNull, dxOrNull, x, w, biasOrNull, labels, n, in, classes, reluX, partialOrNull, doneOrNull);
}
extern "C" __global__ void __launch_bounds__(256)
ember_linear_xent_c32(float* loss, float* lossSumOrNull, float* dlogitsOrNull, float* dxOrNull, const float* x, const float* w,
    const float* biasOrNull, const int* labels, int n, int in, int classes, int reluX, double* partialOrNull, int* doneOrNull) {
    linear_xent<32, 1>(loss, lossSumOrNull, dlogitsOrNull, dxOrNull, x, w, biasOrNull, labels, n, in, classes, reluX, partialOrNull, doneOrNull);
}
extern "C" __global__ void __launch_bounds__(256)
ember_linear_xent_c16_v4(float* loss, float* lossSumOrNull, float* dlogitsOrNull, float* dxOrNull, const float* x, const float* w,
    const float* biasOrNull, const int* labels, int n, int in, int classes, int reluX, double* partialOrNull, int* doneOrNull) {
    linear_xent<16, 4>(loss, lossSumOrNull, dlogitsOrNull, dxOrNull, x, w, biasOrNull, labels, n, in, classes, reluX, partialOrNull, doneOrNull);
}
extern "C" __global__ void __launch_bounds__(256)
ember_linear_xent_c32_v4(float* loss, float* lossSumOrNull, float* dlogitsOrNull, float* dxOrNull, const float* x, const float* w,
    const float* biasOrNull, const int* labels, int n, int in, int classes, int reluX, double* partialOrNull, int* doneOrNull) {
    linear_xent<32, 4>(loss, lossSumOrNull, dlogitsOrNull, dxOrNull, x, w, biasOrNull, labels, n, in, classes, reluX, partialOrNull, doneOrNull);
}

// narrow_g is g[i] through the ReLU's mask y > 0 (none when yOrNull is null).
__device__ __forceinline__ float narrow_g(const float* g, const float* yOrNull, long long i) {
    const float v = g[i];
    return (yOrNull == 0 || yOrNull[i] > 0.0f) ? v : 0.0f;
}

#define NARROW_CHUNK 64  // rows of g staged in shared memory at a time

// narrow_stage copies rows [r0, r0+rows) of g (masked) into gs, CMAX
// columns a row, with zeros past n rows and out columns. The whole block
// takes part; the caller synchronises around it.
template <int CMAX>
__device__ __forceinline__ void narrow_stage(float (*gs)[CMAX], const float* g, const float* yOrNull, int r0,
                                             int rows, int n, int out) {
    const int tid = threadIdx.y * 32 + threadIdx.x;
    for (int i = tid; i < rows * CMAX; i += 256) {
        const int rr = i / CMAX, c = i % CMAX, r = r0 + rr;
        gs[rr][c] = (r < n && c < out) ? narrow_g(g, yOrNull, (long long)r * out + c) : 0.0f;
    }
}

// linear_grads_narrow: the gradients of y = x·wᵀ + bias with out <= CMAX
// (x [n, in], w [out, in], g = dy [n, out], counted only where y > 0 when
// yOrNull is not null): dx = g·w, dw = gᵀ·x, db = the column sums of g,
// each set or, when its acc flag is set, added to; null pointers are
// skipped. Blocks of (32, 8) threads, lanes along x's columns; g goes
// through shared memory NARROW_CHUNK rows at a time, CMAX columns a row
// (zeros past out), so that a thread reads a row of it as a few broadcast
// loads:
//   blocks [0, blocksX): dx in tiles of 32 rows x 32 columns; a thread
//     keeps w's column in registers and takes 4 rows;
//   the next blocksW: dw in strips of 32 columns over all n rows; a thread
//     takes the rows r = threadIdx.y mod 8, 8 of them in flight per chunk,
//     then the 8 partial sums are added in order through shared memory;
//   the last block, when db: the same with a column of ones for x, in
//     lane 0.
template <int CMAX>
__device__ __forceinline__ void linear_grads_narrow_body(float* dxOrNull, float* dwOrNull, float* dbOrNull,
                                                         const float* g, const float* yOrNull, const float* x,
                                                         const float* w, int n, int in, int out, int accX,
                                                         int accW, int accB, int blocksX, int blocksW) {
    __shared__ __attribute__((aligned(16))) float gs[NARROW_CHUNK][CMAX];
    __shared__ float part[8][CMAX][32];
    const int lane = threadIdx.x, ty = threadIdx.y;
    const int colTiles = (in + 31) / 32;
    int bid = blockIdx.x;
    if (bid < blocksX) {
        const int col = (bid % colTiles) * 32 + lane;
        const int r0 = (bid / colTiles) * 32;
        narrow_stage<CMAX>(gs, g, yOrNull, r0, 32, n, out);
        float wc[CMAX];
#pragma unroll
        for (int c = 0; c < CMAX; c++) wc[c] = (c < out && col < in) ? w[(long long)c * in + col] : 0.0f;
        __syncthreads();
        if (col >= in) return;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int rr = ty + 8 * i, r = r0 + rr;
            if (r >= n) break;
            float s = 0.0f;
#pragma unroll
            for (int c = 0; c < CMAX; c++) s = __fmaf_rn(gs[rr][c], wc[c], s);
            float* p = dxOrNull + (long long)r * in + col;
            *p = accX ? *p + s : s;
        }
        return;
    }
    bid -= blocksX;
    const bool bias = bid >= blocksW;  // the db block: a column of ones in lane 0
    const int col = bias ? 0 : bid * 32 + lane;
    const bool live = bias ? lane == 0 : col < in;
    float acc[CMAX];
#pragma unroll
    for (int c = 0; c < CMAX; c++) acc[c] = 0.0f;
    for (int r0 = 0; r0 < n; r0 += NARROW_CHUNK) {
        // x's rows first, so that their loads and the staging's are in
        // flight together.
        float xv[NARROW_CHUNK / 8];
#pragma unroll
        for (int i = 0; i < NARROW_CHUNK / 8; i++) {
            const int r = r0 + ty + 8 * i;
            xv[i] = (!live || r >= n) ? 0.0f : bias ? 1.0f : x[(long long)r * in + col];
        }
        __syncthreads();
        narrow_stage<CMAX>(gs, g, yOrNull, r0, NARROW_CHUNK, n, out);
        __syncthreads();
#pragma unroll
        for (int i = 0; i < NARROW_CHUNK / 8; i++) {
#pragma unroll
            for (int c = 0; c < CMAX; c++) acc[c] = __fmaf_rn(gs[ty + 8 * i][c], xv[i], acc[c]);
        }
    }
#pragma unroll
    for (int c = 0; c < CMAX; c++) part[ty][c][lane] = acc[c];
    __syncthreads();
    for (int c = ty; c < out && live; c += 8) {
        float s = part[0][c][lane];
        for (int i = 1; i < 8; i++) s += part[i][c][lane];
        float* p = bias ? dbOrNull + c : dwOrNull + (long long)c * in + col;
        *p = (bias ? accB : accW) ? *p + s : s;
    }
}

#define LINEAR_GRADS_NARROW_ARGS dxOrNull, dwOrNull, dbOrNull, g, yOrNull, x, w, n, in, out, accX, accW, accB, blocksX, blocksW
extern "C" __global__ void __launch_bounds__(256)
ember_linear_grads_narrow_c16(float* dxOrNull, float* dwOrNull, float* dbOrNull, const float* g, const float* yOrNull, const float* x,
    const float* w, int n, int in, int out, int accX, int accW, int accB, int blocksX, int blocksW) {
    linear_grads_narrow_body<16>(LINEAR_GRADS_NARROW_ARGS);
}
extern "C" __global__ void __launch_bounds__(256)
ember_linear_grads_narrow_c32(float* dxOrNull, float* dwOrNull, float* dbOrNull, const float* g, const float* yOrNull, const float* x,
    const float* w, int n, int in, int out, int accX, int accW, int accB, int blocksX, int blocksW) {
    linear_grads_narrow_body<32>(LINEAR_GRADS_NARROW_ARGS);
}
