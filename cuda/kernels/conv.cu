// conv.cu: the kernels of convolution and pooling (NCHW float32).
//
// Convolution is lowered to one GEMM over the whole batch, exactly as the CPU
// backend does (tensor/cpu_conv.go): im2col fills col [C*R*S, N*P]
// (P = OH*OW) from x, cuBLAS computes W [K, CRS] x col -> yt [K, N*P], and
// swap01 moves yt [K, N, P] to y [N, K, P] adding the bias on the way.
// Backward: swap01 dy -> dyt [K, N*P]; dw += dyt x col^T; dcol = W^T x dyt;
// col2im gathers dcol into dx. col2im is atomic-free: one thread per input
// pixel adds the (r, s) contributions in the CPU's order, so dx is
// deterministic and equal to the CPU's up to the GEMM's rounding.
//
// Max pooling: one thread per output for the forward pass (first maximum
// wins, a NaN always wins so that it propagates, as PyTorch and the CPU
// backend); the backward pass is atomic-free too: one thread per input
// element scans the (at most ceil(KH/SH)*ceil(KW/SW)) windows that cover it
// and adds dy where the saved argmax points at it, in increasing window
// order, the order the CPU adds them in.

// DH, DW: the dilation (1: adjacent taps). Groups need nothing here: the
// rows of one group's channels are a contiguous block of col, and the Go
// side runs one GEMM per group on those blocks.
struct ConvDims {
    int N, C, H, W, R, S, SH, SW, PH, PW, OH, OW, DH, DW;
};

// im2col: col [C*R*S, N*P] from x [N, C, H, W]. 2-D grid: blockIdx.y
// (grid-stride) walks the C*R (channel, kernel row) pairs, x (grid-stride)
// the N*P columns q. A thread splits its column into (n, i, j) once (two
// divisions, instead of seven per element before) and writes the S
// consecutive rows (c, r, 0..S-1) of it: each warp store is 128 contiguous
// bytes of one col row, each load reads a row of x at consecutive w (stride 1).
// Cost: writes colLen*4 bytes, reads x (mostly from L2): LeNet conv2
// (col 500 x 4096 = 8.2 MB) ~3 us at 3 TB/s, conv1 (25 x 36864 = 3.7 MB)
// ~1.5 us, plus ~2 us of launch and tail.
template <typename I>
__device__ __forceinline__ void im2col_body(float* col, const float* x, const ConvDims d) {
    const I P = (I)d.OH * d.OW;
    const I NP = (I)d.N * P;
    const int CR = d.C * d.R;
    for (int cr = blockIdx.y; cr < CR; cr += gridDim.y) {
        const int c = cr / d.R;
        const int r = cr - c * d.R;
        float* const rows = col + (long long)cr * d.S * (long long)NP;
        for (I q = (I)blockIdx.x * blockDim.x + threadIdx.x; q < NP; q += (I)blockDim.x * gridDim.x) {
            const I n = q / P;
            const I pq = q - n * P;
            const int i = (int)(pq / d.OW);
            const int j = (int)(pq - (I)i * d.OW);
            const int h = i * d.SH + r * d.DH - d.PH;
            const int w0 = j * d.SW - d.PW;
            const bool hok = h >= 0 && h < d.H;
            const float* xrow = x + (((long long)n * d.C + c) * d.H + (hok ? h : 0)) * d.W;
            float* o = rows + q;
            for (int s = 0; s < d.S; s++) {
                const int w = w0 + s * d.DW;
                *o = (hok && w >= 0 && w < d.W) ? xrow[w] : 0.0f;
                o += NP;
            }
        }
    }
}

// Launch (Go: Backend.im2col): grid (ceil(N*P/256) capped, min(C*R, 65535)),
// block 256. np = N*P selects the 32-bit instantiation.
extern "C" __global__ void ember_im2col(float* col, const float* x, int N, int C, int H, int W, int R, int S, int SH,
                                        int SW, int PH, int PW, int OH, int OW, int DH, int DW, long long np) {
    const ConvDims d = {N, C, H, W, R, S, SH, SW, PH, PW, OH, OW, DH, DW};
    if (EMBER_SMALL_INDEX(np)) {
        im2col_body<int>(col, x, d);
    } else {
        im2col_body<long long>(col, x, d);
    }
}

// a / b for a >= 0, b >= 1, skipping the division in the common b == 1.
__device__ __forceinline__ int ember_div(int a, int b) { return b == 1 ? a : a / b; }

// dx[n, c, h, w] = sum over (r, s) of col[(c, r, s), (n, i, j)] where
// h = i*SH + r - PH and w = j*SW + s - PW (overwrites dx). One thread per
// pixel (gather, no atomics). Only the (i, j) that hit the pixel are
// visited: i in [i0, i1] with i1 = min((h+PH)/SH, OH-1) and i0 the smallest
// i with r = h+PH - i*SH < R (and j likewise); r = h+PH-i*SH only matches
// when i*SH steps land exactly, which iterating over i guarantees. i and j
// run downwards so that r and s ascend: the CPU's order of addition
// (tensor/cpu_conv.go col2im), so dx equals the CPU's bit for bit given the
// same col.
// Cost: reads col once (colLen*4 bytes: LeNet conv2 8.2 MB) and writes dx
// (0.74 MB): ~3 us at 3 TB/s (was 20.7 us: R*S modulo tests per pixel).
template <typename I>
__device__ __forceinline__ void col2im_body(float* dx, const float* col, const ConvDims d, I total) {
    const I P = (I)d.OH * d.OW;
    const I NP = (I)d.N * P;
    const I HW = (I)d.H * d.W;
    const I RSNP = (I)d.R * d.S * NP;
    EMBER_LOOP(I, idx, total) {
        const I plane = idx / HW;
        const int hw = (int)(idx - plane * HW);
        const int h = hw / d.W;
        const int w = hw - h * d.W;
        const I n = plane / d.C;
        const I c = plane - n * d.C;
        const int hp = h + d.PH, wp = w + d.PW;
        const float* base = col + c * RSNP + n * P;
        float sum = 0.0f;
        if (d.DH != 1 || d.DW != 1) {
            // Dilated: tap r reaches this pixel from output row i when
            // hp - r*DH = i*SH. r and s ascend, the CPU's order again.
            for (int r = 0; r < d.R && hp - r * d.DH >= 0; r++) {
                const int ti = hp - r * d.DH;
                const int i = ember_div(ti, d.SH);
                if (i * d.SH != ti || i >= d.OH) continue;
                for (int s = 0; s < d.S && wp - s * d.DW >= 0; s++) {
                    const int tj = wp - s * d.DW;
                    const int j = ember_div(tj, d.SW);
                    if (j * d.SW != tj || j >= d.OW) continue;
                    sum += base[(I)(r * d.S + s) * NP + (I)i * d.OW + j];
                }
            }
            dx[idx] = sum;
            continue;
        }
        const int i1 = ember_imin(ember_div(hp, d.SH), d.OH - 1);
        const int i0 = hp < d.R ? 0 : ember_div(hp - d.R, d.SH) + 1;
        const int j1 = ember_imin(ember_div(wp, d.SW), d.OW - 1);
        const int j0 = wp < d.S ? 0 : ember_div(wp - d.S, d.SW) + 1;
        for (int i = i1; i >= i0; i--) {
            const int r = hp - i * d.SH;
            const float* rowp = base + (I)(r * d.S) * NP + (I)i * d.OW;
            for (int j = j1; j >= j0; j--) {
                const int s = wp - j * d.SW;
                sum += rowp[(I)s * NP + j];
            }
        }
        dx[idx] = sum;
    }
}

extern "C" __global__ void ember_col2im(float* dx, const float* col, int N, int C, int H, int W, int R, int S, int SH,
                                        int SW, int PH, int PW, int OH, int OW, int DH, int DW, long long total,
                                        long long colTotal) {
    const ConvDims d = {N, C, H, W, R, S, SH, SW, PH, PW, OH, OW, DH, DW};
    if (EMBER_SMALL_INDEX(total) && EMBER_SMALL_INDEX(colTotal)) {
        col2im_body<int>(dx, col, d, (int)total);
    } else {
        col2im_body<long long>(dx, col, d, total);
    }
}

// swap01: out [B, A, P] = in [A, B, P] with the first two axes swapped, plus
// bias[a] when bias is not null, then max(., 0) when relu (NaN stays NaN, -0
// and negatives become +0, as tensor/cpu_conv.go). Conv2d: in = yt [K, N, P]
// (A = K), out = y, bias = conv bias, relu = ConvGeom.ReLU (the fused
// conv+ReLU epilogue, no extra launch). Conv2dBackward without db: in = dy
// [N, K, P] (A = N), out = dyt (with db, ember_bias_grad_rows transposes).
// 2-D tiles: threadIdx.x (and blockIdx.x) over P, (blockIdx.y, threadIdx.y)
// grid-stride over the B*A output rows; one division per row, none per
// element. Reads and writes are contiguous along P.
// Cost: 8 bytes per element: LeNet conv1 fwd (737k) 5.9 MB ~2 us; conv2 fwd
// (205k) 1.6 MB ~0.6 us (+ launch, ~2 us).
template <typename I>
__device__ __forceinline__ void swap01_body(float* out, const float* in, const float* bias, I A, I B, I P, int relu) {
    const I rows = A * B;
    for (I t = (I)blockIdx.y * blockDim.y + threadIdx.y; t < rows; t += (I)gridDim.y * blockDim.y) {
        const I b = t / A;
        const I a = t - b * A;
        const float* src = in + (a * B + b) * P;
        float* dst = out + t * P;
        const float bv = bias != 0 ? bias[a] : 0.0f;
        for (I p = (I)blockIdx.x * blockDim.x + threadIdx.x; p < P; p += (I)gridDim.x * blockDim.x) {
            float v = src[p];
            if (bias != 0) v = v + bv;
            if (relu && !(v > 0.0f) && v == v) v = 0.0f;
            dst[p] = v;
        }
    }
}

extern "C" __global__ void ember_swap01(float* out, const float* in, const float* bias, long long A, long long B,
                                        long long P, int relu) {
    if (EMBER_SMALL_INDEX(A * B * P)) {
        swap01_body<int>(out, in, bias, (int)A, (int)B, (int)P, relu);
    } else {
        swap01_body<long long>(out, in, bias, A, B, P, relu);
    }
}

// PH, PW: implicit -inf padding (it never wins); rows and columns of a
// window outside the input, padding or a ceil-mode overhang, are skipped.
struct PoolDims {
    int H, W, KH, KW, SH, SW, PH, PW, OH, OW;
};

template <typename I>
__device__ __forceinline__ void maxpool_body(float* y, int* argmax, const float* x, const PoolDims d, I total) {
    const I OP = (I)d.OH * d.OW;
    const I IP = (I)d.H * d.W;
    EMBER_LOOP(I, idx, total) {
        const I p = idx / OP;
        const int o = (int)(idx - p * OP);
        const int i = o / d.OW;
        const int j = o - i * d.OW;
        const float* plane = x + p * IP;
        float best = ember_neg_inf();
        int at = -1;
        for (int r = 0; r < d.KH; r++) {
            const int h = i * d.SH - d.PH + r;
            if (h < 0 || h >= d.H) continue;
            for (int s = 0; s < d.KW; s++) {
                const int w = j * d.SW - d.PW + s;
                if (w < 0 || w >= d.W) continue;
                const int hw = h * d.W + w;
                const float v = plane[hw];
                // First maximum wins; a NaN always wins, so that it propagates.
                if (at < 0 || v > best || v != v) {
                    best = v;
                    at = hw;
                }
            }
        }
        y[idx] = best;
        argmax[idx] = at;
    }
}

extern "C" __global__ void ember_maxpool2d(float* y, int* argmax, const float* x, int H, int W, int KH, int KW, int SH,
                                           int SW, int PH, int PW, int OH, int OW, long long total, long long xTotal) {
    const PoolDims d = {H, W, KH, KW, SH, SW, PH, PW, OH, OW};
    if (EMBER_SMALL_INDEX(total) && EMBER_SMALL_INDEX(xTotal)) {
        maxpool_body<int>(y, argmax, x, d, (int)total);
    } else {
        maxpool_body<long long>(y, argmax, x, d, total);
    }
}

// dx[p, h, w] = sum of dy[p, i, j] over the windows (i, j) covering (h, w)
// whose argmax is h*W + w (+ dx when acc). Windows covering row h are
// i in [ceil((h+PH-KH+1)/SH), floor((h+PH)/SH)] intersected with [0, OH).
template <typename I>
__device__ __forceinline__ void maxpool_backward_body(float* dx, const float* dy, const int* argmax, const PoolDims d,
                                                      I total, int acc) {
    const I OP = (I)d.OH * d.OW;
    const I IP = (I)d.H * d.W;
    EMBER_LOOP(I, idx, total) {
        const I p = idx / IP;
        const int hw = (int)(idx - p * IP);
        const int h = hw / d.W;
        const int w = hw - h * d.W;
        const int hp = h + d.PH, wp = w + d.PW;
        const int i0 = hp < d.KH ? 0 : (hp - d.KH) / d.SH + 1;
        const int i1 = ember_imin(hp / d.SH, d.OH - 1);
        const int j0 = wp < d.KW ? 0 : (wp - d.KW) / d.SW + 1;
        const int j1 = ember_imin(wp / d.SW, d.OW - 1);
        const int* am = argmax + p * OP;
        const float* g = dy + p * OP;
        float sum = acc ? dx[idx] : 0.0f;
        for (int i = i0; i <= i1; i++) {
            for (int j = j0; j <= j1; j++) {
                const int o = i * d.OW + j;
                if (am[o] == hw) sum += g[o];
            }
        }
        dx[idx] = sum;
    }
}

extern "C" __global__ void ember_maxpool2d_backward(float* dx, const float* dy, const int* argmax, int H, int W, int KH,
                                                    int KW, int SH, int SW, int PH, int PW, int OH, int OW,
                                                    long long total, long long yTotal, int acc) {
    const PoolDims d = {H, W, KH, KW, SH, SW, PH, PW, OH, OW};
    if (EMBER_SMALL_INDEX(total) && EMBER_SMALL_INDEX(yTotal)) {
        maxpool_backward_body<int>(dx, dy, argmax, d, (int)total, acc);
    } else {
        maxpool_backward_body<long long>(dx, dy, argmax, d, total, acc);
    }
}

// maxpool2d_backward_disjoint: the same result when windows do not overlap
// (KH <= SH and KW <= SW) and there is no padding (ceil mode is fine: the
// last window still starts inside the input). Every input element then
// lies in one stride cell: row h in cell row min(h/SH, OH-1), column w in
// min(w/SW, OW-1) (the last row and column of cells also own the input
// rows and columns beyond them that no window covers). One thread per
// (plane, input row h, cell column j) reads that cell's argmax and dy once
// and writes the cell's columns of row h: dy where the argmax points, 0
// elsewhere (when acc, only the argmax element is updated: dx + dy, the
// CPU's single addition). So a warp writes a contiguous run of dx, the
// pass's largest stream. Exact and deterministic, no atomics.
template <typename I>
__device__ __forceinline__ void maxpool_backward_cell_row(float* dx, const float* dy, const int* argmax,
                                                          const PoolDims d, I p, int h, int j, int acc) {
    const int i = ember_imin(h / d.SH, d.OH - 1);
    const I o = (p * d.OH + i) * d.OW + j;
    const int a = argmax[o];
    const float g = dy[o];
    float* row = dx + (p * d.H + h) * d.W;
    const int w0 = j * d.SW;
    const int w1 = (j == d.OW - 1) ? d.W : w0 + d.SW;
    const int at = a - h * d.W; // the argmax's column when it lies on row h
    if (acc) {
        if (at >= w0 && at < w1) row[at] += g;
        return;
    }
    for (int w = w0; w < w1; w++) row[w] = (w == at) ? g : 0.0f;
}

// items = planes·H·OW; xTotal, the dx length, picks the index type. Below
// 2^30 the item's plane and row come from dividers (ember_divide) by H·OW
// and OW: the kernel moves little data per item, so a dozen instructions
// per division would be a good part of its time.
extern "C" __global__ void ember_maxpool2d_backward_disjoint(float* dx, const float* dy, const int* argmax, int H,
                                                             int W, int KH, int KW, int SH, int SW, int OH, int OW,
                                                             long long items, long long xTotal, int acc, int rowMul,
                                                             int rowShift, int owMul, int owShift) {
    const PoolDims d = {H, W, KH, KW, SH, SW, 0, 0, OH, OW};
    if (EMBER_SMALL_INDEX(items) && EMBER_SMALL_INDEX(xTotal)) {
        const unsigned rowCells = (unsigned)H * OW;
        EMBER_LOOP(int, idx, items) {
            const unsigned p = ember_divide((unsigned)idx, (unsigned)rowMul, (unsigned)rowShift);
            const unsigned hj = (unsigned)idx - p * rowCells;
            const unsigned h = ember_divide(hj, (unsigned)owMul, (unsigned)owShift);
            maxpool_backward_cell_row<int>(dx, dy, argmax, d, (int)p, (int)h, (int)(hj - h * OW), acc);
        }
    } else {
        const long long rowCells = (long long)H * OW;
        EMBER_LOOP(long long, idx, items) {
            const long long p = idx / rowCells;
            const int hj = (int)(idx - p * rowCells);
            const int h = hj / OW;
            maxpool_backward_cell_row<long long>(dx, dy, argmax, d, p, h, hj - h * OW, acc);
        }
    }
}

// The filter gradient of a convolution with few taps (C*R*S at most
// EMBER_DWS_CRS, K at most EMBER_DWS_K, one group) under autocast: dw[k, t]
// += bfloat16(sum over positions q of bf16(dy[q, k]) * bf16(x patch value
// t at q)), dy masked where maskOrNull <= 0 (a fused ReLU's output). What
// Conv2dBackwardLowp asks for, where cuDNN's deterministic algorithms for
// such filters (a network's first layer on one or three input channels)
// run only a few blocks (98 for ResNet-9's 1->64 3x3 at batch 512).
//
// ember_conv_dw_small: 1-D grid, block b takes the positions [b*per,
// (b+1)*per) of the N*OH*OW (per a multiple of EMBER_DWS_TP), a tile of
// EMBER_DWS_TP at a time through shared memory: dy [K][TP] and the patch
// values [C*R*S][TP], rounded as they are stored. Thread i owns the pairs
// (k, t) = i, i + blockDim.x, ... (at most EMBER_DWS_PAIRS each) and sums
// their products over the block's positions in float32, in order; it
// writes partial[pair * gridDim.x + b]. ember_conv_dw_small_join adds a
// pair's partials in order (a warp each, a fixed tree) in double, rounds
// the sum to bfloat16 and adds it into dw.
// Cost: dy read once, x R*S times (from L1/L2), K*C*R*S*N*OH*OW products
// from shared memory; N*OH*OW must fit an int (the Go side checks).
#define EMBER_DWS_TP 96
#define EMBER_DWS_K 64
#define EMBER_DWS_CRS 16
#define EMBER_DWS_PAIRS 4  // pairs per thread: K*C*R*S <= EMBER_DWS_PAIRS*blockDim.x
extern "C" __global__ void ember_conv_dw_small(double* partial, const float* x, const float* dy, const float* maskOrNull,
                                               int N, int C, int H, int W, int K, int R, int S, int SH, int SW,
                                               int PH, int PW, int OH, int OW, int DH, int DW, int per) {
    __shared__ float sdy[EMBER_DWS_K][EMBER_DWS_TP + 1];
    __shared__ float sx[EMBER_DWS_CRS][EMBER_DWS_TP + 1];
    __shared__ int sn[EMBER_DWS_TP], sp[EMBER_DWS_TP];
    const int P = OH * OW, NP = N * P, RS = R * S, CRS = C * RS, pairs = K * CRS;
    const int lo = blockIdx.x * per, hi = lo + per < NP ? lo + per : NP;
    float acc[EMBER_DWS_PAIRS];
#pragma unroll
    for (int m = 0; m < EMBER_DWS_PAIRS; m++) acc[m] = 0.0f;
    for (int t0 = lo; t0 < hi; t0 += EMBER_DWS_TP) {
        const int tp = hi - t0 < EMBER_DWS_TP ? hi - t0 : EMBER_DWS_TP;
        __syncthreads();  // the last tile read
        for (int j = threadIdx.x; j < tp; j += blockDim.x) {
            const int q = t0 + j, n = q / P;
            sn[j] = n;
            sp[j] = q - n * P;
        }
        __syncthreads();
        for (int i = threadIdx.x; i < K * EMBER_DWS_TP; i += blockDim.x) {
            const int k = i / EMBER_DWS_TP, j = i - k * EMBER_DWS_TP;
            float v = 0.0f;
            if (j < tp) {
                const long long e = ((long long)sn[j] * K + k) * P + sp[j];
                v = dy[e];
                if (maskOrNull != 0 && maskOrNull[e] <= 0.0f) v = 0.0f;
                v = ember_bf16_round(v);
            }
            sdy[k][j] = v;
        }
        for (int i = threadIdx.x; i < CRS * EMBER_DWS_TP; i += blockDim.x) {
            const int t = i / EMBER_DWS_TP, j = i - t * EMBER_DWS_TP;
            float v = 0.0f;
            if (j < tp) {
                const int c = t / RS, rs = t - c * RS, r = rs / S, s = rs - r * S;
                const int oh = sp[j] / OW, ow = sp[j] - oh * OW;
                const int h = oh * SH - PH + r * DH, w = ow * SW - PW + s * DW;
                if (h >= 0 && h < H && w >= 0 && w < W) v = ember_bf16_round(x[(((long long)sn[j] * C + c) * H + h) * W + w]);
            }
            sx[t][j] = v;
        }
        __syncthreads();
#pragma unroll
        for (int m = 0; m < EMBER_DWS_PAIRS; m++) {
            const int i = threadIdx.x + m * blockDim.x;
            if (i < pairs) {
                const int k = i / CRS, t = i - k * CRS;
                float a = acc[m];
                for (int j = 0; j < tp; j++) a += sdy[k][j] * sx[t][j];
                acc[m] = a;
            }
        }
    }
#pragma unroll
    for (int m = 0; m < EMBER_DWS_PAIRS; m++) {
        const int i = threadIdx.x + m * blockDim.x;
        if (i < pairs) partial[(long long)i * gridDim.x + blockIdx.x] = (double)acc[m];
    }
}

// ember_conv_dw_small_join: dw[i] += bfloat16(the parts partial sums of
// pair i, in order by lane then a fixed xor tree), a warp per pair; 1-D
// blocks of a multiple of 32 threads.
extern "C" __global__ void ember_conv_dw_small_join(float* dw, const double* partial, int pairs, int parts) {
    const int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
    for (int i = blockIdx.x * wpb + (threadIdx.x >> 5); i < pairs; i += gridDim.x * wpb) {
        const double* p = partial + (long long)i * parts;
        double s = 0.0;
        for (int j = lane; j < parts; j += 32) s += p[j];
        s = ember_warp_sum_d(s);
        if (lane == 0) dw[i] += ember_bf16_round((float)s);
    }
}
