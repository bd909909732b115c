// conv_pool.cu: convolution + bias + ReLU + max pooling over disjoint
// windows in one operation (tensor.Conv2dReLUMaxPool), and its backward
// pass. The pooled output y [N, K, POH, POW] and argmax (positions oh*OW+ow
// in the convolution's output plane) are all that is stored: neither the
// convolution's output nor the pooling's input exists in memory.
//
// Semantics are those of Conv2dReLU followed by MaxPool2d: ReLU keeps NaN
// and maps the rest of the non-positive values to +0, the pooling's first
// maximum wins and a NaN always wins. The gradient reaches a convolution
// output only at its window's argmax, and only when the pooled value is
// positive (the ReLU's mask at that position is the pooled value itself).

// The geometry: the convolution's (N, C, H, W, K, R, S, strides SH SW,
// paddings PH PW, output OH x OW) and the pooling's (window KH x KW, strides
// QH QW >= the window, output POH x POW).
struct ConvPoolDims {
    int N, C, H, W, K, R, S, SH, SW, PH, PW, OH, OW, KH, KW, QH, QW, POH, POW;
};

// Splits a pooled-output index i of [N, K, POH, POW].
template <typename I>
__device__ __forceinline__ void conv_pool_index(I i, const ConvPoolDims& d, I& n, int& k, int& ph, int& pw) {
    pw = (int)(i % d.POW);
    I t = i / d.POW;
    ph = (int)(t % d.POH);
    t /= d.POH;
    k = (int)(t % d.K);
    n = t / d.K;
}

// ReLU, then the pooling comparison (first maximum wins, NaN wins).
__device__ __forceinline__ void relu_pool_step(float v, int pos, float& best, int& at) {
    if (!(v > 0.0f) && v == v) v = 0.0f;
    if (at < 0 || v > best || v != v) {
        best = v;
        at = pos;
    }
}

// Direct convolution for small C*R*S (LeNet's first layer: 25 products per
// output): one thread per pooled output computes the KH*KW convolution
// outputs of its window from x and w (both cached, w broadcast across the
// warp) and keeps the maximum. Replaces im2col, a GEMM, the bias/ReLU
// epilogue and the pooling (4 launches, 3 intermediate buffers).
// Cost at LeNet conv1, batch 64: 184k threads x 100 multiply-adds; reads x
// (200 KB) and w, writes y and argmax (1.5 MB).
template <typename I>
__device__ __forceinline__ void conv_relu_pool_direct_body(float* y, int* argmax, const float* x, const float* w,
                                                           const float* bias, const ConvPoolDims d, I total) {
    const int crs = d.C * d.R * d.S;
    EMBER_LOOP(I, i, total) {
        I n;
        int k, ph, pw;
        conv_pool_index(i, d, n, k, ph, pw);
        const float* wk = w + (I)k * crs;
        const float* xn = x + n * ((I)d.C * d.H * d.W);
        float best = ember_neg_inf();
        int at = -1;
        for (int a = 0; a < d.KH; a++) {
            const int oh = ph * d.QH + a;
            for (int b = 0; b < d.KW; b++) {
                const int ow = pw * d.QW + b;
                float acc = 0.0f;
                for (int c = 0; c < d.C; c++) {
                    for (int r = 0; r < d.R; r++) {
                        const int ih = oh * d.SH - d.PH + r;
                        if (ih < 0 || ih >= d.H) continue;
                        const float* xr = xn + ((I)c * d.H + ih) * d.W;
                        const float* wr = wk + (c * d.R + r) * d.S;
                        for (int s = 0; s < d.S; s++) {
                            const int iw = ow * d.SW - d.PW + s;
                            if (iw >= 0 && iw < d.W) acc += wr[s] * xr[iw];
                        }
                    }
                }
                float v = acc;
                if (bias != 0) v = v + bias[k];
                relu_pool_step(v, oh * d.OW + ow, best, at);
            }
        }
        y[i] = best;
        argmax[i] = at;
    }
}

extern "C" __global__ void ember_conv_relu_pool_direct(float* y, int* argmax, const float* x, const float* w,
                                                       const float* bias, int N, int C, int H, int W, int K, int R,
                                                       int S, int SH, int SW, int PH, int PW, int OH, int OW, int KH,
                                                       int KW, int QH, int QW, int POH, int POW, long long total,
                                                       long long xTotal) {
    const ConvPoolDims d = {N, C, H, W, K, R, S, SH, SW, PH, PW, OH, OW, KH, KW, QH, QW, POH, POW};
    if (EMBER_SMALL_INDEX(total) && EMBER_SMALL_INDEX(xTotal)) {
        conv_relu_pool_direct_body<int>(y, argmax, x, w, bias, d, (int)total);
    } else {
        conv_relu_pool_direct_body<long long>(y, argmax, x, w, bias, d, total);
    }
}

// The epilogue of the GEMM path (LeNet's second layer): yt [K, N, OH*OW] is
// the GEMM's output; one thread per pooled output adds the bias, applies
// ReLU and pools its window into y [N, K, POH, POW]. Replaces swap01 and the
// pooling launch, and the y buffer between them.
template <typename I>
__device__ __forceinline__ void swap01_relu_pool_body(float* y, int* argmax, const float* yt, const float* bias,
                                                      const ConvPoolDims d, I total) {
    const I P = (I)d.OH * d.OW;
    EMBER_LOOP(I, i, total) {
        I n;
        int k, ph, pw;
        conv_pool_index(i, d, n, k, ph, pw);
        const float* src = yt + ((I)k * d.N + n) * P;
        float best = ember_neg_inf();
        int at = -1;
        for (int a = 0; a < d.KH; a++) {
            const int oh = ph * d.QH + a;
            for (int b = 0; b < d.KW; b++) {
                const int pos = oh * d.OW + pw * d.QW + b;
                float v = src[pos];
                if (bias != 0) v = v + bias[k];
                relu_pool_step(v, pos, best, at);
            }
        }
        y[i] = best;
        argmax[i] = at;
    }
}

extern "C" __global__ void ember_swap01_relu_pool(float* y, int* argmax, const float* yt, const float* bias, int N,
                                                  int K, int OH, int OW, int KH, int KW, int QH, int QW, int POH,
                                                  int POW, long long total, long long ytTotal) {
    const ConvPoolDims d = {N, 0, 0, 0, K, 0, 0, 0, 0, 0, 0, OH, OW, KH, KW, QH, QW, POH, POW};
    if (EMBER_SMALL_INDEX(total) && EMBER_SMALL_INDEX(ytTotal)) {
        swap01_relu_pool_body<int>(y, argmax, yt, bias, d, (int)total);
    } else {
        swap01_relu_pool_body<long long>(y, argmax, yt, bias, d, total);
    }
}

// Backward, GEMM path: dyt [K, N, OH*OW] = the convolution output's
// gradient, transposed for the GEMMs: dy of the window at its argmax when
// the pooled value is positive, 0 everywhere else (including positions no
// window covers). One thread per dyt element, contiguous writes.
template <typename I>
__device__ __forceinline__ void unpool_t_body(float* dyt, const float* dy, const float* y, const int* argmax,
                                              const ConvPoolDims d, I total) {
    const I P = (I)d.OH * d.OW;
    const I PP = (I)d.POH * d.POW;
    EMBER_LOOP(I, e, total) {
        const I row = e / P;  // k * N + n
        const int pos = (int)(e - row * P);
        const I k = row / d.N;
        const I n = row - k * d.N;
        const int oh = pos / d.OW;
        const int ow = pos - oh * d.OW;
        const int ph = oh / d.QH, pw = ow / d.QW;
        float v = 0.0f;
        if (ph < d.POH && pw < d.POW && oh - ph * d.QH < d.KH && ow - pw * d.QW < d.KW) {
            const I q = (n * d.K + k) * PP + ph * d.POW + pw;
            if (argmax[q] == pos && y[q] > 0.0f) v = dy[q];
        }
        dyt[e] = v;
    }
}

extern "C" __global__ void ember_unpool_t(float* dyt, const float* dy, const float* y, const int* argmax, int N, int K,
                                          int OH, int OW, int KH, int KW, int QH, int QW, int POH, int POW,
                                          long long total) {
    const ConvPoolDims d = {N, 0, 0, 0, K, 0, 0, 0, 0, 0, 0, OH, OW, KH, KW, QH, QW, POH, POW};
    if (EMBER_SMALL_INDEX(total)) {
        unpool_t_body<int>(dyt, dy, y, argmax, d, (int)total);
    } else {
        unpool_t_body<long long>(dyt, dy, y, argmax, d, total);
    }
}

// Backward, direct path (C*R*S <= EMBER_DIRECT_CRS, no input gradient):
// dw[k, c, r, s] and db[k] are sums over the pooled outputs (n, q) of
// channel k of g = dy (0 where the pooled value is not positive) times the
// input under tap (c, r, s) at the window's argmax, and of g. Grid (parts,
// K), 1-D blocks of a multiple of 32: block (j, k) takes the pooled outputs
// [j*chunk, (j+1)*chunk) of channel k, each thread keeps the C*R*S+1 sums in
// registers, warps reduce them by xor trees and the block adds its warps in
// order (deterministic). dw or db may be null (not wanted). With one part
// the block adds into dw and db directly; otherwise it writes partial[row*parts + j] for rows k*C*R*S + t
// (dw) and K*C*R*S + k (db), which ember_conv_pool_dw_finish adds.
// Cost at LeNet conv1, batch 64: 9216 pooled outputs per channel, 26 sums:
// replaces im2col, a split-K GEMM over 36864 columns, the pooling's backward
// and the bias gradient.
#define EMBER_DIRECT_CRS 32

extern "C" __global__ void ember_conv_pool_dw_direct(float* dw, float* db, float* partial, const float* dy,
                                                     const float* y, const int* argmax, const float* x, int N, int C,
                                                     int H, int W, int K, int R, int S, int SH, int SW, int PH,
                                                     int PW, int OW, int PP, int chunk) {
    __shared__ int tapOff[EMBER_DIRECT_CRS], tapR[EMBER_DIRECT_CRS], tapS[EMBER_DIRECT_CRS];
    __shared__ float warpSums[32][EMBER_DIRECT_CRS + 1];
    const int crs = C * R * S;
    const int k = blockIdx.y;
    for (int t = threadIdx.x; t < crs; t += blockDim.x) {
        const int c = t / (R * S), rs = t - c * (R * S), r = rs / S, s = rs - r * S;
        tapOff[t] = c * H * W;
        tapR[t] = r;
        tapS[t] = s;
    }
    __syncthreads();
    float acc[EMBER_DIRECT_CRS + 1];
#pragma unroll
    for (int t = 0; t <= EMBER_DIRECT_CRS; t++) acc[t] = 0.0f;
    const long long total = (long long)N * PP;
    const long long e0 = (long long)blockIdx.x * chunk;
    const long long e1 = e0 + chunk < total ? e0 + chunk : total;
    for (long long e = e0 + threadIdx.x; e < e1; e += blockDim.x) {
        const long long n = e / PP;
        const long long q = (n * K + k) * PP + (e - n * PP);
        if (!(y[q] > 0.0f)) continue;
        const float g = dy[q];
        const int pos = argmax[q];
        const int oh = pos / OW, ow = pos - oh * OW;
        const int ih0 = oh * SH - PH, iw0 = ow * SW - PW;
        const float* xn = x + n * C * H * W;
#pragma unroll
        for (int t = 0; t < EMBER_DIRECT_CRS; t++) {
            if (t < crs) {
                const int ih = ih0 + tapR[t], iw = iw0 + tapS[t];
                if (ih >= 0 && ih < H && iw >= 0 && iw < W) acc[t] += g * xn[tapOff[t] + ih * W + iw];
            }
        }
        acc[EMBER_DIRECT_CRS] += g;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int t = 0; t <= EMBER_DIRECT_CRS; t++) {
        if (t < crs || t == EMBER_DIRECT_CRS) {
            const float v = ember_warp_sum(acc[t]);
            if (lane == 0) warpSums[warp][t] = v;
        }
    }
    __syncthreads();
    const int nw = blockDim.x >> 5;
    for (int t = threadIdx.x; t <= crs; t += blockDim.x) {
        const int col = t < crs ? t : EMBER_DIRECT_CRS;
        float s = 0.0f;
        for (int v = 0; v < nw; v++) s += warpSums[v][col];
        const long long row = t < crs ? (long long)k * crs + t : (long long)K * crs + k;
        if (gridDim.x > 1) {
            partial[row * gridDim.x + blockIdx.x] = s;
        } else if (t < crs) {
            if (dw != 0) dw[row] += s;
        } else if (db != 0) {
            db[k] += s;
        }
    }
}

// dw[row] += the parts of row (rows < K*C*R*S), db[row - K*C*R*S] += those of
// the rest; one warp per row, lanes add parts l, l+32, ... then a xor tree.
extern "C" __global__ void ember_conv_pool_dw_finish(float* dw, float* db, const float* partial, long long wRows,
                                                     long long rows, int parts) {
    const int lane = threadIdx.x & 31;
    const long long wpb = blockDim.x >> 5;
    for (long long row = (long long)blockIdx.x * wpb + (threadIdx.x >> 5); row < rows; row += gridDim.x * wpb) {
        const float* p = partial + row * parts;
        float s = 0.0f;
        for (int j = lane; j < parts; j += 32) s += p[j];
        s = ember_warp_sum(s);
        if (lane == 0) {
            if (row < wRows) {
                if (dw != 0) dw[row] += s;
            } else if (db != 0) {
                db[row - wRows] += s;
            }
        }
    }
}
