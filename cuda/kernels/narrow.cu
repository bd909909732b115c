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
// A block of rows·classes warps (rows·classes <= 32) takes that many rows
// at a time: warp (i, c) forms logit c of row i as ember_gemm_small does
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
