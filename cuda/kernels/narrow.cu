// Linear layers with few outputs (at most 32: a classifier's last layer,
// LeNet's fc2 with 10). Their products are too thin for tiles: a sum of
// `in` terms per logit, or of 10 terms per input gradient. Two kernels:
//
//   linear_xent: the last layer and the cross entropy of its output, in one
//   pass: logits, loss, the logits' gradient and the input's gradient;
//   linear_grads_narrow: the gradients of such a layer (dx, dw, db), in one
//   launch.
//
// At batch 64, LeNet's fc2 forward, cross entropy and fc2 backward were
// three launches of about 5 us each, mostly fixed costs.

#define EMBER_NARROW_WARPS 8  // warps per block of linear_xent

// narrow_load reads one float or two consecutive floats (one 8-byte access:
// a packed parameter buffer aligns its tensors to 8 bytes when their
// lengths are even, not to 16); narrow_store writes them.
__device__ __forceinline__ void narrow_load(float (&v)[1], const float* p) { v[0] = p[0]; }
__device__ __forceinline__ void narrow_load(float (&v)[2], const float* p) {
    const ember_f2 q = *reinterpret_cast<const ember_f2*>(p);
    v[0] = q.x, v[1] = q.y;
}
__device__ __forceinline__ void narrow_store(float* p, const float (&v)[1]) { p[0] = v[0]; }
__device__ __forceinline__ void narrow_store(float* p, const float (&v)[2]) {
    ember_f2 q;
    q.x = v[0], q.y = v[1];
    *reinterpret_cast<ember_f2*>(p) = q;
}

// narrow_row_sums: v[c] holds lane's part of sum c (c < CMAX, a power of
// two up to 32); returns, in every lane, the whole sum of class lane /
// (32/CMAX). Each step pairs lanes o apart: one keeps the lower half of its
// values, the other the upper half, each adds its partner's copy of the
// half it keeps. CMAX-1 shuffles, where a xor tree per class takes 5·CMAX.
template <int CMAX>
__device__ __forceinline__ float narrow_row_sums(float (&v)[CMAX], int lane) {
#pragma unroll
    for (int h = CMAX / 2, o = 16; h >= 1; h >>= 1, o >>= 1) {
        const bool low = (lane & o) == 0;
#pragma unroll
        for (int j = 0; j < h; j++) {
            const float send = low ? v[j + h] : v[j];
            const float keep = low ? v[j] : v[j + h];
            v[j] = keep + __shfl_xor_sync(0xffffffffu, send, o);
        }
    }
#pragma unroll
    for (int o = 16 / CMAX; o > 0; o >>= 1) v[0] += __shfl_xor_sync(0xffffffffu, v[0], o);
    return v[0];
}

// linear_xent: for rows r < n of x [n, in], with w [classes, in], bias
// [classes] (or null) and labels [n]:
//   z = x[r]·wᵀ + bias          (the product, then the bias, as AddBias)
//   loss_r = (m - z[y]) + log(sum exp(z - m)),  m = max z (NaN propagates)
//   dlogits[r, c] = exp(z[c] - m)/se/n - (c == y)/n      (when not null)
//   dx[r] = dlogits[r]·w                                 (when not null too)
// and loss[0] = the mean of loss_r, as ember_cross_entropy computes it from
// the logits. A label outside [0, classes) makes its row NaN.
//
// A block takes R = 64/CMAX rows at a time; its 8 warps split the columns
// (32·V a step each, V consecutive per lane), so that every w value a lane
// loads serves R rows and the chain of dependent loads is in/(256·V) steps
// long (a warp per row, walking all of `in`, took 15 us at batch 64). Each
// lane keeps R x CMAX partial sums (CMAX >= classes; w's rows past the last
// class repeat row 0, so that all loads go out at once rather than under a
// branch per class); narrow_row_sums adds each row's over the warp, shared
// memory over the warps in order, then warp i does row i's softmax and
// writes its dlogits to shared memory, from which every warp forms its
// columns of dx. The row losses are added in double in row order; with
// several blocks, block b writes partial[b], and the last block to finish
// (counted in *doneOrNull, which it resets) adds the partials in a fixed
// tree, so the loss does not depend on which block finishes last.
template <int CMAX, int V>
__device__ __forceinline__ void linear_xent_body(float* loss, float* dlogitsOrNull, float* dxOrNull, const float* x,
                                                 const float* w, const float* biasOrNull, const int* labels, int n,
                                                 int in, int classes, double* partialOrNull, int* doneOrNull) {
    constexpr int R = 64 / CMAX, KW = 32 * V, KB = EMBER_NARROW_WARPS * KW, LPC = 32 / CMAX;
    __shared__ float zpart[EMBER_NARROW_WARPS][R][CMAX];
    __shared__ float dsh[R][CMAX];
    __shared__ double rowLoss[R];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float nf = (float)n;
    const float* wrow[CMAX];
#pragma unroll
    for (int c = 0; c < CMAX; c++) wrow[c] = w + (long long)(c < classes ? c : 0) * in;
    double bsum = 0.0;  // thread 0's
    for (int r0 = blockIdx.x * R; r0 < n; r0 += gridDim.x * R) {
        float acc[R][CMAX];
#pragma unroll
        for (int i = 0; i < R; i++) {
#pragma unroll
            for (int c = 0; c < CMAX; c++) acc[i][c] = 0.0f;
        }
        for (int k = warp * KW + lane * V; k < in; k += KB) {
            float wv[CMAX][V];
#pragma unroll
            for (int c = 0; c < CMAX; c++) narrow_load(wv[c], wrow[c] + k);
#pragma unroll
            for (int i = 0; i < R; i++) {
                float xv[V];
                narrow_load(xv, x + (long long)ember_imin(r0 + i, n - 1) * in + k);
#pragma unroll
                for (int c = 0; c < CMAX; c++) {
#pragma unroll
                    for (int j = 0; j < V; j++) acc[i][c] = __fmaf_rn(xv[j], wv[c][j], acc[i][c]);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < R; i++) {
            const float s = narrow_row_sums(acc[i], lane);
            if (lane % LPC == 0) zpart[warp][i][lane / LPC] = s;
        }
        __syncthreads();
        if (warp < R) {
            const int r = r0 + warp;
            const bool row = r < n;  // the same in the whole warp
            float z = ember_neg_inf();  // lanes past the classes: none
            if (row && lane < classes) {
                z = zpart[0][warp][lane];
                for (int v = 1; v < EMBER_NARROW_WARPS; v++) z += zpart[v][warp][lane];
                if (biasOrNull != 0) z = z + biasOrNull[lane];
            }
            const float m = ember_warp_max(z);
            const float e = lane < classes ? expf(z - m) : 0.0f;
            const float se = ember_warp_sum(e);
            const int y = row ? labels[r] : 0;
            const bool bad = y < 0 || y >= classes;
            const float zy = __shfl_sync(0xffffffffu, z, bad ? 0 : y);
            float d = e / se / nf;
            if (lane == y) d -= 1.0f / nf;
            if (bad) d = ember_nan();
            if (lane < CMAX) dsh[warp][lane] = (row && lane < classes) ? d : 0.0f;
            if (lane == 0) rowLoss[warp] = !row ? 0.0 : bad ? (double)ember_nan() : (double)((m - zy) + logf(se));
            if (row && dlogitsOrNull != 0 && lane < classes) dlogitsOrNull[(long long)r * classes + lane] = d;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int i = 0; i < R && r0 + i < n; i++) bsum += rowLoss[i];
        }
        if (dxOrNull != 0) {
            for (int k = warp * KW + lane * V; k < in; k += KB) {
                float wv[CMAX][V];
#pragma unroll
                for (int c = 0; c < CMAX; c++) narrow_load(wv[c], wrow[c] + k);
#pragma unroll
                for (int i = 0; i < R; i++) {
                    if (r0 + i >= n) break;
                    float o[V];
#pragma unroll
                    for (int j = 0; j < V; j++) o[j] = 0.0f;
#pragma unroll
                    for (int c = 0; c < CMAX; c++) {
                        const float dc = dsh[i][c];
                        if (c < classes) {
#pragma unroll
                            for (int j = 0; j < V; j++) o[j] = __fmaf_rn(dc, wv[c][j], o[j]);
                        }
                    }
                    narrow_store(dxOrNull + (long long)(r0 + i) * in + k, o);
                }
            }
        }
        __syncthreads();  // zpart, dsh and rowLoss are the next rows'
    }
    __shared__ int lastBlock;
    if (threadIdx.x == 0) {
        if (gridDim.x == 1) {
            loss[0] = (float)(bsum / (double)n);
        } else {
            partialOrNull[blockIdx.x] = bsum;
            __threadfence();
            lastBlock = atomicAdd(doneOrNull, 1) == (int)gridDim.x - 1;
        }
    }
    if (gridDim.x == 1) return;
    __syncthreads();
    if (!lastBlock) return;
    // The last block adds the partials with all its threads (one L2 round
    // trip each, all in flight; thread 0 alone took one after the other,
    // 25 us for 256 blocks) in a fixed tree.
    __threadfence();
    double t = 0.0;
    for (int b = threadIdx.x; b < (int)gridDim.x; b += blockDim.x) t += __ldcg(partialOrNull + b);
    t = ember_block_sum_d(t);
    if (threadIdx.x == 0) {
        loss[0] = (float)(t / (double)n);
        *doneOrNull = 0;
    }
}

#define LINEAR_XENT_ARGS loss, dlogitsOrNull, dxOrNull, x, w, biasOrNull, labels, n, in, classes, partialOrNull, doneOrNull
extern "C" __global__ void __launch_bounds__(EMBER_NARROW_WARPS * 32)
ember_linear_xent_c16(float* loss, float* dlogitsOrNull, float* dxOrNull, const float* x, const float* w, const float* biasOrNull,
    const int* labels, int n, int in, int classes, double* partialOrNull, int* doneOrNull) {
    linear_xent_body<16, 1>(LINEAR_XENT_ARGS);
}
extern "C" __global__ void __launch_bounds__(EMBER_NARROW_WARPS * 32)
ember_linear_xent_c32(float* loss, float* dlogitsOrNull, float* dxOrNull, const float* x, const float* w, const float* biasOrNull,
    const int* labels, int n, int in, int classes, double* partialOrNull, int* doneOrNull) {
    linear_xent_body<32, 1>(LINEAR_XENT_ARGS);
}
extern "C" __global__ void __launch_bounds__(EMBER_NARROW_WARPS * 32)
ember_linear_xent_c16_v2(float* loss, float* dlogitsOrNull, float* dxOrNull, const float* x, const float* w, const float* biasOrNull,
    const int* labels, int n, int in, int classes, double* partialOrNull, int* doneOrNull) {
    linear_xent_body<16, 2>(LINEAR_XENT_ARGS);
}
extern "C" __global__ void __launch_bounds__(EMBER_NARROW_WARPS * 32)
ember_linear_xent_c32_v2(float* loss, float* dlogitsOrNull, float* dxOrNull, const float* x, const float* w, const float* biasOrNull,
    const int* labels, int n, int in, int classes, double* partialOrNull, int* doneOrNull) {
    linear_xent_body<32, 2>(LINEAR_XENT_ARGS);
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
        __syncthreads();
        narrow_stage<CMAX>(gs, g, yOrNull, r0, NARROW_CHUNK, n, out);
        __syncthreads();
        float xv[NARROW_CHUNK / 8];
#pragma unroll
        for (int i = 0; i < NARROW_CHUNK / 8; i++) {
            const int r = r0 + ty + 8 * i;
            xv[i] = (!live || r >= n) ? 0.0f : bias ? 1.0f : x[(long long)r * in + col];
        }
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
