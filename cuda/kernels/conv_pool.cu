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

// load_padded_image copies the C x H x W image x into img as C x (H+2PH) x
// (W+2PW) with zeros around it. Each thread keeps one column and steps over
// rows (blockDim/WP rows per pass), so that the loop has no division: a
// division per element made the copy cost more than LeNet's conv1 itself,
// and a warp per row left most lanes idle on narrow images (conv2's 12).
__device__ __forceinline__ void load_padded_image(float* img, const float* x, int C, int H, int W, int PH, int PW) {
    const int HP = H + 2 * PH, WP = W + 2 * PW;
    const int rows = (int)blockDim.x / WP;
    if (rows == 0) {  // wider than the block: one element per thread
        for (int t = threadIdx.x; t < C * HP * WP; t += blockDim.x) {
            const int row = t / WP, w = t - row * WP - PW, c = row / HP, h = row - c * HP - PH;
            img[t] = (h >= 0 && h < H && w >= 0 && w < W) ? x[((long long)c * H + h) * W + w] : 0.0f;
        }
        return;
    }
    const int r0 = threadIdx.x / WP;
    if (r0 >= rows) return;
    const int col = threadIdx.x - r0 * WP, w = col - PW;
    const bool wIn = w >= 0 && w < W;
    int c = 0, h = r0;  // h within channel c, padded coordinates
    while (h >= HP) {
        h -= HP;
        c++;
    }
    for (int row = r0; row < C * HP; row += rows) {
        const int hh = h - PH;
        img[row * WP + col] = (wIn && hh >= 0 && hh < H) ? x[((long long)c * H + hh) * W + w] : 0.0f;
        h += rows;
        while (h >= HP) {
            h -= HP;
            c++;
        }
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

// The same with the image in shared memory: grid (N, ceil(K/kPerBlock)),
// 1-D blocks. Block (n, j) copies image n, zero-padded, and the weights of
// its kPerBlock channels to shared memory, then each thread computes pooled
// outputs of those channels with no bounds checks and no global loads in
// the inner loop. Used when the padded image and the weights fit in
// EMBER_TILE_FLOATS floats (LeNet conv1: 784 + 3*25).
#define EMBER_TILE_FLOATS 12288  // 48 KiB, the most static shared memory

// Cost at LeNet conv1, batch 64: 448 blocks of 432 pooled outputs.
extern "C" __global__ void ember_conv_relu_pool_tiled(float* y, int* argmax, const float* x, const float* w,
                                                      const float* bias, int N, int C, int H, int W, int K, int R,
                                                      int S, int SH, int SW, int PH, int PW, int OH, int OW, int KH,
                                                      int KW, int QH, int QW, int POH, int POW, int kPerBlock) {
    __shared__ float smem[EMBER_TILE_FLOATS];
    const int HP = H + 2 * PH, WP = W + 2 * PW;
    const int crs = C * R * S;
    const long long n = blockIdx.x;
    const int k0 = blockIdx.y * kPerBlock;
    const int kn = K - k0 < kPerBlock ? K - k0 : kPerBlock;
    float* img = smem;
    float* wk = smem + C * HP * WP;
    const float* xn = x + n * C * H * W;
    load_padded_image(img, xn, C, H, W, PH, PW);
    for (int t = threadIdx.x; t < kn * crs; t += blockDim.x) wk[t] = w[(long long)k0 * crs + t];
    __syncthreads();
    const int pp = POH * POW;
    for (int t = threadIdx.x; t < kn * pp; t += blockDim.x) {
        const int kk = t / pp, q = t - kk * pp, ph = q / POW, pw = q - ph * POW;
        const float* wt = wk + kk * crs;
        const int k = k0 + kk;
        float best = ember_neg_inf();
        int at = -1;
        for (int a = 0; a < KH; a++) {
            const int oh = ph * QH + a;
            for (int b = 0; b < KW; b++) {
                const int ow = pw * QW + b;
                float acc = 0.0f;
                for (int c = 0; c < C; c++) {
                    const float* ic = img + (c * HP + oh * SH) * WP + ow * SW;
                    const float* wc = wt + c * R * S;
                    for (int r = 0; r < R; r++) {
                        for (int s2 = 0; s2 < S; s2++) acc += wc[r * S + s2] * ic[r * WP + s2];
                    }
                }
                float v = acc;
                if (bias != 0) v = v + bias[k];
                relu_pool_step(v, oh * OW + ow, best, at);
            }
        }
        const long long i = (n * K + k) * pp + q;
        y[i] = best;
        argmax[i] = at;
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

// unpool_t with the bias gradient in the same pass: grid (parts, K), 1-D
// blocks of a multiple of 32; block (j, k) writes the dyt rows of channel k
// for images [j*rowsPerBlock, ...) and sums them (the sum of the pooled dy
// masked by y, which is db[k]). One part: db[k] += the sum; else
// partial[k*parts + j] (ember_bias_grad_finish adds them).
extern "C" __global__ void ember_unpool_t_bias(float* dyt, float* db, float* partial, const float* dy, const float* y,
                                               const int* argmax, int N, int K, int OH, int OW, int KH, int KW, int QH,
                                               int QW, int POH, int POW, int rowsPerBlock) {
    const int k = blockIdx.y;
    const int P = OH * OW, PP = POH * POW;
    const int n0 = blockIdx.x * rowsPerBlock;
    const int n1 = n0 + rowsPerBlock < N ? n0 + rowsPerBlock : N;
    const int m = (n1 - n0) * P;
    float s = 0.0f;
    for (int e = threadIdx.x; e < m; e += blockDim.x) {
        const int n = n0 + e / P;
        const int pos = e % P;
        const int oh = pos / OW, ow = pos - oh * OW;
        const int ph = oh / QH, pw = ow / QW;
        float v = 0.0f;
        if (ph < POH && pw < POW && oh - ph * QH < KH && ow - pw * QW < KW) {
            const long long q = ((long long)n * K + k) * PP + ph * POW + pw;
            if (argmax[q] == pos && y[q] > 0.0f) v = dy[q];
        }
        dyt[((long long)k * N + n) * P + pos] = v;
        s += v;
    }
    s = ember_block_sum_f(s);
    if (threadIdx.x == 0) {
        if (gridDim.x > 1) {
            partial[(long long)k * gridDim.x + blockIdx.x] = s;
        } else {
            db[k] += s;
        }
    }
}

// Backward, direct path (C*R*S <= EMBER_DIRECT_CRS, no input gradient):
// dw[k, c, r, s] and db[k] are sums over the pooled outputs (n, q) of
// channel k of g = dy (0 where the pooled value is not positive) times the
// input under tap (c, r, s) at the window's argmax, and of g. Grid (parts,
// K), 1-D blocks of a multiple of 32: the threads of the blocks of channel
// k take its pooled outputs in a grid-stride loop (one each at LeNet's
// sizes), keeping C*R*S+1 sums in registers; warps reduce them by xor trees and the
// block adds its warps in order (deterministic). It writes
// partial[row*parts + j] for rows k*C*R*S + t (dw) and K*C*R*S + k (db),
// which ember_conv_pool_dw_finish adds into dw and db.
// Cost at LeNet conv1, batch 64: 36 x 20 blocks of 256 outputs, 26 sums;
// replaces im2col, a split-K GEMM over 36,864 columns, the pooling's
// backward and the bias gradient.
#define EMBER_DIRECT_CRS 32

extern "C" __global__ void ember_conv_pool_dw_direct(float* partial, const float* dy, const float* y,
                                                     const int* argmax, const float* x, int N, int C, int H, int W,
                                                     int K, int R, int S, int SH, int SW, int PH, int PW, int OW,
                                                     int PP) {
    __shared__ float warpSums[32][EMBER_DIRECT_CRS + 1];
    const int crs = C * R * S;
    const int k = blockIdx.y;
    float acc[EMBER_DIRECT_CRS + 1];
#pragma unroll
    for (int t = 0; t <= EMBER_DIRECT_CRS; t++) acc[t] = 0.0f;
    const long long total = (long long)N * PP;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const long long n = e / PP;
        const long long q = (n * K + k) * PP + (e - n * PP);
        if (!(y[q] > 0.0f)) continue;
        const float g = dy[q];
        const int pos = argmax[q];
        const int oh = pos / OW, ow = pos - oh * OW;
        const int ih0 = oh * SH - PH, iw0 = ow * SW - PW;
        const float* xn = x + n * C * H * W;
        const bool inside = ih0 >= 0 && iw0 >= 0 && ih0 + R <= H && iw0 + S <= W;
        int c = 0, r = 0, s = 0;
#pragma unroll
        for (int t = 0; t < EMBER_DIRECT_CRS; t++) {
            if (t < crs) {
                const int ih = ih0 + r, iw = iw0 + s;
                if (inside || (ih >= 0 && ih < H && iw >= 0 && iw < W)) acc[t] += g * xn[(c * H + ih) * W + iw];
                if (++s == S) {
                    s = 0;
                    if (++r == R) {
                        r = 0;
                        c++;
                    }
                }
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
        partial[row * gridDim.x + blockIdx.x] = s;
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

// ---- LeNet-sized fast paths ----
//
// For a stride-1 convolution with an R x S kernel and pooling windows
// KH x KW moved by their size (LeNet: 5x5 and 2x2), the sizes are template
// parameters, so that a thread keeps the input patch of its window and the
// kernel in registers: (KH+R-1)*(KW+S-1) + R*S loads from shared memory for
// KH*KW*R*S products, which are fused multiply-adds (__fmaf_rn: the
// module's --fmad=false keeps elementwise kernels bitwise equal to the CPU,
// but a convolution's sums are in a different order from the CPU's GEMM
// anyway).

// Forward: grid (N, ceil(K/kPerBlock)), as ember_conv_relu_pool_tiled.
// SPLIT lanes share each pooled output, taking every SPLIT-th input channel
// (lane l works on output slot l % (32/SPLIT) and channels l / (32/SPLIT),
// l / (32/SPLIT) + SPLIT, ...) and adding their sums by xor shuffles: with
// many input channels (LeNet's conv2: 20) one thread per output leaves too
// few warps to hide latency (51,200 outputs are 12 warps per SM).
template <int R, int S, int KH, int KW, int SPLIT>
__device__ __forceinline__ void conv_relu_pool_fixed(float* y, int* argmax, const float* x, const float* w,
                                                     const float* bias, int C, int H, int W, int K, int PH, int PW,
                                                     int OW, int POH, int POW, int kPerBlock) {
    __shared__ float smem[EMBER_TILE_FLOATS];
    const int HP = H + 2 * PH, WP = W + 2 * PW;
    const int crs = C * R * S;
    const long long n = blockIdx.x;
    const int k0 = blockIdx.y * kPerBlock;
    const int kn = K - k0 < kPerBlock ? K - k0 : kPerBlock;
    float* img = smem;
    float* wk = smem + C * HP * WP;
    const float* xn = x + n * C * H * W;
    load_padded_image(img, xn, C, H, W, PH, PW);
    for (int t = threadIdx.x; t < kn * crs; t += blockDim.x) wk[t] = w[(long long)k0 * crs + t];
    __syncthreads();
    const int pp = POH * POW;
    const int slots = 32 / SPLIT;  // outputs per warp and round
    const int lane = threadIdx.x & 31, slot = lane % slots, part = lane / slots;
    const int warps = blockDim.x >> 5;
    // base is uniform across the warp, so every lane reaches the shuffles.
    for (int base = (threadIdx.x >> 5) * slots; base < kn * pp; base += warps * slots) {
        const int t = base + slot;
        const bool valid = t < kn * pp;
        const int tt = valid ? t : 0;
        const int kk = tt / pp, q = tt - kk * pp, ph = q / POW, pw = q - ph * POW;
        const int oh0 = ph * KH, ow0 = pw * KW;
        float acc[KH][KW];
#pragma unroll
        for (int a = 0; a < KH; a++)
#pragma unroll
            for (int b = 0; b < KW; b++) acc[a][b] = 0.0f;
        for (int c = part; c < C; c += SPLIT) {
            float patch[KH + R - 1][KW + S - 1];
            const float* ic = img + (c * HP + oh0) * WP + ow0;
#pragma unroll
            for (int i = 0; i < KH + R - 1; i++)
#pragma unroll
                for (int j = 0; j < KW + S - 1; j++) patch[i][j] = ic[i * WP + j];
            const float* wc = wk + kk * crs + c * R * S;
#pragma unroll
            for (int r = 0; r < R; r++) {
#pragma unroll
                for (int s = 0; s < S; s++) {
                    const float wv = wc[r * S + s];
#pragma unroll
                    for (int a = 0; a < KH; a++)
#pragma unroll
                        for (int b = 0; b < KW; b++) acc[a][b] = __fmaf_rn(wv, patch[a + r][b + s], acc[a][b]);
                }
            }
        }
#pragma unroll
        for (int o = 16; o >= slots; o >>= 1) {
#pragma unroll
            for (int a = 0; a < KH; a++)
#pragma unroll
                for (int b = 0; b < KW; b++) acc[a][b] += __shfl_xor_sync(0xffffffffu, acc[a][b], o);
        }
        if (!valid || part != 0) continue;
        const int k = k0 + kk;
        float best = ember_neg_inf();
        int at = -1;
#pragma unroll
        for (int a = 0; a < KH; a++) {
#pragma unroll
            for (int b = 0; b < KW; b++) {
                float v = acc[a][b];
                if (bias != 0) v = v + bias[k];
                relu_pool_step(v, (oh0 + a) * OW + ow0 + b, best, at);
            }
        }
        const long long i = (n * K + k) * pp + q;
        y[i] = best;
        argmax[i] = at;
    }
}

// One extern "C" entry per instantiation, spelled out (not by a macro) so
// that every kernel's C signature appears in the source, where the tests'
// launch recorder reads it.
extern "C" __global__ void ember_conv_relu_pool_5x5_2x2(float* y, int* argmax, const float* x, const float* w, const float* bias,
        int C, int H, int W, int K, int PH, int PW, int OW, int POH, int POW, int kPerBlock) {
    conv_relu_pool_fixed<5, 5, 2, 2, 1>(y, argmax, x, w, bias, C, H, W, K, PH, PW, OW, POH, POW, kPerBlock);
}

extern "C" __global__ void ember_conv_relu_pool_5x5_2x2_c2(float* y, int* argmax, const float* x, const float* w, const float* bias,
        int C, int H, int W, int K, int PH, int PW, int OW, int POH, int POW, int kPerBlock) {
    conv_relu_pool_fixed<5, 5, 2, 2, 2>(y, argmax, x, w, bias, C, H, W, K, PH, PW, OW, POH, POW, kPerBlock);
}

extern "C" __global__ void ember_conv_relu_pool_5x5_2x2_c4(float* y, int* argmax, const float* x, const float* w, const float* bias,
        int C, int H, int W, int K, int PH, int PW, int OW, int POH, int POW, int kPerBlock) {
    conv_relu_pool_fixed<5, 5, 2, 2, 4>(y, argmax, x, w, bias, C, H, W, K, PH, PW, OW, POH, POW, kPerBlock);
}

extern "C" __global__ void ember_conv_relu_pool_3x3_2x2(float* y, int* argmax, const float* x, const float* w, const float* bias,
        int C, int H, int W, int K, int PH, int PW, int OW, int POH, int POW, int kPerBlock) {
    conv_relu_pool_fixed<3, 3, 2, 2, 1>(y, argmax, x, w, bias, C, H, W, K, PH, PW, OW, POH, POW, kPerBlock);
}

extern "C" __global__ void ember_conv_relu_pool_3x3_2x2_c2(float* y, int* argmax, const float* x, const float* w, const float* bias,
        int C, int H, int W, int K, int PH, int PW, int OW, int POH, int POW, int kPerBlock) {
    conv_relu_pool_fixed<3, 3, 2, 2, 2>(y, argmax, x, w, bias, C, H, W, K, PH, PW, OW, POH, POW, kPerBlock);
}

extern "C" __global__ void ember_conv_relu_pool_3x3_2x2_c4(float* y, int* argmax, const float* x, const float* w, const float* bias,
        int C, int H, int W, int K, int PH, int PW, int OW, int POH, int POW, int kPerBlock) {
    conv_relu_pool_fixed<3, 3, 2, 2, 4>(y, argmax, x, w, bias, C, H, W, K, PH, PW, OW, POH, POW, kPerBlock);
}

// Backward for one input channel and a stride-1 R x S kernel: grid
// (ceil(N / imagesPerBlock), ceil(K / warps per block)), one warp per output
// channel. Per image of the block's group, the block copies the padded image
// to shared memory and lane l adds the pooled outputs l, l+32, ... of the
// channel into R*S+1 registers; after the group, the warp reduces them by
// xor trees into partial[row*parts + j] for group j (rows as in
// ember_conv_pool_dw_direct; ember_conv_pool_dw_finish adds the parts).
// Eight images per block at batch 1024: one image each made 1024 warp
// reductions of 26 sums per channel (66 us for 74 M multiply-adds; 53 us
// now; what bounds it is not known: neither faster image copies nor four
// times the blocks changed it).
#define EMBER_DW_IMAGE_FLOATS 4096  // 16 KiB: a padded image up to 64x64; more blocks per SM than 48 KiB

template <int R, int S>
__device__ __forceinline__ void conv_pool_dw_fixed(float* partial, const float* dy, const float* y, const int* argmax,
                                                   const float* x, int N, int H, int W, int K, int PH, int PW, int OW,
                                                   int PP, int imagesPerBlock) {
    __shared__ float img[EMBER_DW_IMAGE_FLOATS];
    const int WP = W + 2 * PW;
    const int lane = threadIdx.x & 31;
    const int k = blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (PH != 0 || PW != 0) {  // the padding, written once (copies fill the interior)
        ember_zero(img, (H + 2 * PH) * WP);
        __syncthreads();
    }
    float acc[R * S + 1];
#pragma unroll
    for (int t = 0; t <= R * S; t++) acc[t] = 0.0f;
    const int n0 = blockIdx.x * imagesPerBlock;
    const int n1 = n0 + imagesPerBlock < N ? n0 + imagesPerBlock : N;
    for (int n = n0; n < n1; n++) {
        __syncthreads();  // the previous image is no longer read
        ember_copy_image(img, x + (long long)n * H * W, 1, H, W, PH, PW, WP);
        __syncthreads();
        if (k >= K) continue;  // the whole warp
        const long long base = ((long long)n * K + k) * PP;
        // No branch on the mask, so that the loads of several iterations can
        // be in flight together; a masked output adds 0 times its input, as
        // the GEMM of the unfused backward does.
#pragma unroll 4
        for (int q = lane; q < PP; q += 32) {
            const float g = y[base + q] > 0.0f ? dy[base + q] : 0.0f;
            const int pos = argmax[base + q];
            const int oh = pos / OW, ow = pos - oh * OW;
            const float* ic = img + oh * WP + ow;
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int s = 0; s < S; s++) acc[r * S + s] = __fmaf_rn(g, ic[r * WP + s], acc[r * S + s]);
            acc[R * S] += g;
        }
    }
    if (k >= K) return;  // the whole warp: no shuffle is left half done
#pragma unroll
    for (int t = 0; t <= R * S; t++) {
        const float v = ember_warp_sum(acc[t]);
        if (lane == 0) {
            const long long row = t < R * S ? (long long)k * R * S + t : (long long)K * R * S + k;
            partial[row * gridDim.x + blockIdx.x] = v;
        }
    }
}

extern "C" __global__ void ember_conv_pool_dw_5x5(float* partial, const float* dy, const float* y, const int* argmax,
                                                  const float* x, int N, int H, int W, int K, int PH, int PW, int OW,
                                                  int PP, int imagesPerBlock) {
    conv_pool_dw_fixed<5, 5>(partial, dy, y, argmax, x, N, H, W, K, PH, PW, OW, PP, imagesPerBlock);
}

extern "C" __global__ void ember_conv_pool_dw_3x3(float* partial, const float* dy, const float* y, const int* argmax,
                                                  const float* x, int N, int H, int W, int K, int PH, int PW, int OW,
                                                  int PP, int imagesPerBlock) {
    conv_pool_dw_fixed<3, 3>(partial, dy, y, argmax, x, N, H, W, K, PH, PW, OW, PP, imagesPerBlock);
}
