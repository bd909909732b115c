// conv_rt.cu: register-tiled direct convolution, stride 1, for layers whose
// image (or output gradient) and weights fit in shared memory together
// (LeNet's conv2: 20 -> 50 channels, 5x5, 12x12 input). Each thread keeps a
// tile of outputs in registers (several output channels times a strip of
// four columns), so that every value loaded from shared memory feeds 4-16
// fused multiply-adds; the loads are 16 bytes wide (rows are padded to multiples of
// four floats). Lanes that share a tile take every SPLIT-th channel of the
// sum and add their partial sums by xor shuffles, which gives enough warps
// per SM at small batches.
//
// Three kernels, one per product of a convolution layer:
//
//	forward  conv_relu_pool_rt  x, w (+bias) -> y, argmax (2x2 max pool, as
//	                            conv_pool.cu's fixed kernels)
//	backward conv_dw_rt         dyt, x -> partial dw per image group
//	         add_parts          partials -> dw +=  (in order: deterministic)
//	         conv_dx_rt         dyt, w -> dx (overwrite)
//
// dyt is the output gradient laid out [K, N, OH*OW] (what unpool_t and
// bias_grad_rows write for the GEMM path). Against im2col + GEMMs + col2im
// they need no column buffer ([C*R*S, N*OH*OW] floats: 8 MB at LeNet's conv2,
// batch 64) and no split-K reductions.

#define EMBER_RT_SMEM 12288  // floats: 48 KiB, the most static shared memory

// The backend compiles this file twice (kernels.go): with EMBER_RT_SIZE 5
// for the 5x5 kernels (and ember_add_parts), with 3 for the 3x3 ones, so that
// NVRTC compiles the two halves on two threads.
#ifndef EMBER_RT_SIZE
#define EMBER_RT_SIZE 5
#endif

__device__ __forceinline__ int ember_round4(int v) { return (v + 3) & ~3; }
__device__ __forceinline__ int ember_imax(int a, int b) { return a > b ? a : b; }

// Loads 8 consecutive floats from 16-byte aligned shared memory.
__device__ __forceinline__ void ember_load8(float* d, const float* p) {
    const ember_f4 a = reinterpret_cast<const ember_f4*>(p)[0];
    const ember_f4 b = reinterpret_cast<const ember_f4*>(p)[1];
    d[0] = a.x; d[1] = a.y; d[2] = a.z; d[3] = a.w;
    d[4] = b.x; d[5] = b.y; d[6] = b.z; d[7] = b.w;
}

// Where the backward kernels read the convolution output's gradient: dyt
// [K, N, OH*OW] (dense), or, from a fused convolution + ReLU + pooling, the
// pooled gradient dy [N, K, PP] with the pooled output y and argmax
// (positions oh*OW+ow), scattered into the zeroed shared rows: the gradient
// reaches a position only as its window's argmax, and only where the pooled
// value is positive (unpool_t's rule). Reading the pooled arrays (3 of N*K*PP)
// instead of the unpooled one saves writing and reading it twice (13 MB at
// LeNet's conv2, batch 1024).
struct ember_dy_source {
    const float* dyt;     // dense, or null
    const float* dy;      // pooled
    const float* y;
    const int* argmax;
    int PP;
};

// ember_fill_dy fills rows (o-o0)*ostride + oh*stride of dys (columns from
// `off`) for channels [o0, o1) of image n. The pooled form zeroes the rows
// first and synchronises the block (every thread must call it).
__device__ __forceinline__ void ember_fill_dy(float* dys, int stride, int ostride, int off, const ember_dy_source& src,
                                              long long n, int N, int K, int o0, int o1, int OH, int OW) {
    const int P = OH * OW;
    if (src.dyt != 0) {
        ember_copy_rows((o1 - o0) * OH, OW, [&](int i) {
            const int ol = i / OH;
            return dys + ol * ostride + (i - ol * OH) * stride + off;
        }, [&](int i) {
            const int o = o0 + i / OH;
            return src.dyt + ((long long)o * N + n) * P + (i - (o - o0) * OH) * OW;
        });
        return;
    }
    ember_zero(dys, (o1 - o0) * ostride);
    __syncthreads();
    const int m = (o1 - o0) * src.PP;
    const long long base = (n * K + o0) * src.PP;
    for (int e0 = threadIdx.x; e0 < m; e0 += EMBER_RT_LOADS * blockDim.x) {
        float v[EMBER_RT_LOADS];
        int at[EMBER_RT_LOADS];
#pragma unroll
        for (int j = 0; j < EMBER_RT_LOADS; j++) {
            const int e = e0 + j * blockDim.x;
            v[j] = 0.0f;
            at[j] = 0;
            if (e < m) {
                at[j] = src.argmax[base + e];
                if (src.y[base + e] > 0.0f) v[j] = src.dy[base + e];
            }
        }
#pragma unroll
        for (int j = 0; j < EMBER_RT_LOADS; j++) {
            const int e = e0 + j * blockDim.x;
            if (e < m && v[j] != 0.0f) {
                const int ol = e / src.PP, oh = at[j] / OW;
                dys[ol * ostride + oh * stride + off + at[j] - oh * OW] = v[j];
            }
        }
    }
}

// Row stride of the forward's image: the padded width, and room for the
// 8-float loads of the last strip of four columns.
__device__ __forceinline__ int ember_rt_fwd_stride(int WP, int POW) { return ember_round4(ember_imax(WP, 2 * POW + 6)); }

// Forward: grid (images, ceil(K/kpb)), blockDim 32*max(1, SPLIT/4) per 4
// output channels of the block's kpb. The block copies the weights of its
// kpb output channels (as they are: one contiguous copy),
// then, per image n = blockIdx.x, blockIdx.x + gridDim.x, ..., the padded
// image. SPLIT/4 warps take each group g of 4 channels k0+4g .. k0+4g+3 and
// share its pairs of horizontally adjacent pooled outputs (a 2x4 tile of the
// convolution's output each); lane = part*(32/SPLIT) + slot, where slot
// picks the pair and part the input channels part, part+SPLIT, ... SPLIT 8
// has twice the warps, for small grids (LeNet's conv2 at batch 64: 17.5 us
// against 18.8); SPLIT 4 adds fewer partial sums (batch 1024: 157 us
// against 171); SPLIT 1 is for one input channel (LeNet's conv1), each warp
// taking 32 pairs. Per
// input channel a thread loads R+1 patch rows of 8 floats (16-byte loads)
// and 4*R*S weights (one address per part across the warp) for 4*2*4*R*S
// multiply-adds.
template <int R, int S, int SPLIT>
__device__ __forceinline__ void conv_relu_pool_rt(float* y, int* argmax, const float* x, const float* w,
                                                  const float* bias, int N, int C, int H, int W, int K, int PH,
                                                  int PW, int OW, int POH, int POW) {
    __shared__ ember_f4 smem4[EMBER_RT_SMEM / 4];
    float* smem = reinterpret_cast<float*>(smem4);
    const int HP = H + 2 * PH, WP = W + 2 * PW;
    const int XS = ember_rt_fwd_stride(WP, POW);
    const int crs = C * R * S;
    // pairs per warp, warps per group of 4 channels, channels per block
    constexpr int SLOTS = 32 / SPLIT, WPG = SPLIT >= 4 ? SPLIT / 4 : 1;
    const int kpb = 4 * ((int)blockDim.x >> 5) / WPG;
    float* ws = smem;               // [kpb][crs]: w of channels k0 .. k0+kpb-1, zeros beyond K
    float* img = smem + kpb * crs;  // [C][HP][XS]
    const int k0 = blockIdx.y * kpb;
    const int kn = K - k0 < kpb ? K - k0 : kpb;
    // Zeros where no copy writes: the rows of channels beyond K, and the
    // image's padding and columns beyond it (LeNet's conv2: 4 columns).
    ember_zero(ws + kn * crs, (kpb - kn) * crs);
    if (PH != 0 || PW != 0 || XS != W) ember_zero(img, C * HP * XS);
    __syncthreads();
    ember_copy(ws, w + (long long)k0 * crs, kn * crs);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int part = lane / SLOTS, slot = lane % SLOTS;
    const int kg = warp / WPG, kw = k0 + 4 * kg;
    const int pairsW = (POW + 1) >> 1, pairs = POH * pairsW;
    for (long long n = blockIdx.x; n < N; n += gridDim.x) {
        __syncthreads();  // the previous image is no longer read
        ember_copy_image(img, x + n * C * H * W, C, H, W, PH, PW, XS);
        __syncthreads();
        if (kw >= K) continue;  // the whole warp: channels of the padding only
        for (int base = (warp % WPG) * SLOTS; base < pairs; base += WPG * SLOTS) {  // uniform across the warp
            const int pr = base + slot;
            const bool valid = pr < pairs;
            const int ph = valid ? pr / pairsW : 0, pj = valid ? pr - ph * pairsW : 0;
            const int oh0 = 2 * ph, ow0 = 4 * pj;
            float acc[4][2][4];
#pragma unroll
            for (int k = 0; k < 4; k++)
#pragma unroll
                for (int a = 0; a < 2; a++)
#pragma unroll
                    for (int b = 0; b < 4; b++) acc[k][a][b] = 0.0f;
            for (int c = part; c < C; c += SPLIT) {
                const float* ic = img + (c * HP + oh0) * XS + ow0;
                const float* wc = ws + 4 * kg * crs + c * R * S;
                float lo[8], hi[8];  // patch rows r and r+1
                ember_load8(lo, ic);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    ember_load8(hi, ic + (r + 1) * XS);
#pragma unroll
                    for (int s = 0; s < S; s++) {
                        float wk[4];
#pragma unroll
                        for (int k = 0; k < 4; k++) wk[k] = wc[k * crs + r * S + s];
#pragma unroll
                        for (int k = 0; k < 4; k++)
#pragma unroll
                            for (int b = 0; b < 4; b++) {
                                acc[k][0][b] = __fmaf_rn(wk[k], lo[b + s], acc[k][0][b]);
                                acc[k][1][b] = __fmaf_rn(wk[k], hi[b + s], acc[k][1][b]);
                            }
                    }
#pragma unroll
                    for (int j = 0; j < 8; j++) lo[j] = hi[j];
                }
            }
#pragma unroll
            for (int o = SLOTS; o <= 16; o <<= 1)
#pragma unroll
                for (int k = 0; k < 4; k++)
#pragma unroll
                    for (int a = 0; a < 2; a++)
#pragma unroll
                        for (int b = 0; b < 4; b++) acc[k][a][b] += __shfl_xor_sync(0xffffffffu, acc[k][a][b], o);
            if (!valid || part != 0) continue;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int kk = kw + k;
                if (kk >= K) continue;
#pragma unroll
                for (int q = 0; q < 2; q++) {
                    const int pw = 2 * pj + q;
                    if (pw >= POW) continue;
                    float best = ember_neg_inf();
                    int at = -1;
#pragma unroll
                    for (int a = 0; a < 2; a++)
#pragma unroll
                        for (int b = 0; b < 2; b++) {
                            float v = acc[k][a][2 * q + b];
                            if (bias != 0) v = v + bias[kk];
                            relu_pool_step(v, (oh0 + a) * OW + ow0 + 2 * q + b, best, at);
                        }
                    const long long i = ((n * K + kk) * POH + ph) * POW + pw;
                    y[i] = best;
                    argmax[i] = at;
                }
            }
        }
    }
}

#if EMBER_RT_SIZE == 5
extern "C" __global__ void ember_conv_relu_pool_rt_5x5_s1(float* y, int* argmax, const float* x, const float* w,
                                                          const float* bias, int N, int C, int H, int W, int K, int PH,
                                                          int PW, int OW, int POH, int POW) {
    conv_relu_pool_rt<5, 5, 1>(y, argmax, x, w, bias, N, C, H, W, K, PH, PW, OW, POH, POW);
}
#endif

#if EMBER_RT_SIZE == 5
extern "C" __global__ void ember_conv_relu_pool_rt_5x5(float* y, int* argmax, const float* x, const float* w,
                                                       const float* bias, int N, int C, int H, int W, int K, int PH,
                                                       int PW, int OW, int POH, int POW) {
    conv_relu_pool_rt<5, 5, 4>(y, argmax, x, w, bias, N, C, H, W, K, PH, PW, OW, POH, POW);
}
#endif

#if EMBER_RT_SIZE == 5
extern "C" __global__ void ember_conv_relu_pool_rt_5x5_s8(float* y, int* argmax, const float* x, const float* w,
                                                          const float* bias, int N, int C, int H, int W, int K, int PH,
                                                          int PW, int OW, int POH, int POW) {
    conv_relu_pool_rt<5, 5, 8>(y, argmax, x, w, bias, N, C, H, W, K, PH, PW, OW, POH, POW);
}
#endif

#if EMBER_RT_SIZE == 3
extern "C" __global__ void ember_conv_relu_pool_rt_3x3_s1(float* y, int* argmax, const float* x, const float* w,
                                                          const float* bias, int N, int C, int H, int W, int K, int PH,
                                                          int PW, int OW, int POH, int POW) {
    conv_relu_pool_rt<3, 3, 1>(y, argmax, x, w, bias, N, C, H, W, K, PH, PW, OW, POH, POW);
}
#endif

#if EMBER_RT_SIZE == 3
extern "C" __global__ void ember_conv_relu_pool_rt_3x3(float* y, int* argmax, const float* x, const float* w,
                                                       const float* bias, int N, int C, int H, int W, int K, int PH,
                                                       int PW, int OW, int POH, int POW) {
    conv_relu_pool_rt<3, 3, 4>(y, argmax, x, w, bias, N, C, H, W, K, PH, PW, OW, POH, POW);
}
#endif

#if EMBER_RT_SIZE == 3
extern "C" __global__ void ember_conv_relu_pool_rt_3x3_s8(float* y, int* argmax, const float* x, const float* w,
                                                          const float* bias, int N, int C, int H, int W, int K, int PH,
                                                          int PW, int OW, int POH, int POW) {
    conv_relu_pool_rt<3, 3, 8>(y, argmax, x, w, bias, N, C, H, W, K, PH, PW, OW, POH, POW);
}
#endif

// Weight gradient: grid (groups, ceil(tasks/blockDim)), tasks (og, c, r) =
// ceil(K/KT) * C * R with KT = EMBER_RT_DW_KT output channels per task.
// Task (og, c, r) sums dw[og*KT+k][c][r][s] for k < KT and s < S over the
// images [g*imagesPerGroup, ...) of group g = blockIdx.x: per image and
// output row, KT 16-byte loads of dy per 4 columns and 2 of x feed KT*S*4
// multiply-adds. The block copies each image (padded) and the dy rows its
// tasks need ([KT*og0, ...)[OH][roundup(OW,4)], zeros beyond) to shared
// memory. It writes partial[g*K*C*R*S + row]; ember_add_parts adds the
// groups in order. (KT = 2 took as long at batch 64, 15.4 us, and 23% longer
// at batch 1024.)
#define EMBER_RT_DW_KT 4
__device__ __forceinline__ int ember_rt_dw_stride(int WP, int OW) { return ember_round4(ember_imax(WP, ember_round4(OW) + 4)); }

template <int R, int S>
__device__ __forceinline__ void conv_dw_rt(float* partial, const ember_dy_source src, const float* x, int N, int C,
                                           int H, int W, int K, int PH, int PW, int OH, int OW, int imagesPerGroup) {
    __shared__ ember_f4 smem4[EMBER_RT_SMEM / 4];
    float* smem = reinterpret_cast<float*>(smem4);
    const int HP = H + 2 * PH, WP = W + 2 * PW;
    const int XS = ember_rt_dw_stride(WP, OW), OWS = ember_round4(OW);
    const int KT = EMBER_RT_DW_KT, KP = (K + KT - 1) / KT * KT;
    float* img = smem;                 // [C][HP][XS]
    float* dys = smem + C * HP * XS;   // [o1-o0][OH][OWS]
    const int tasks = KP / KT * C * R;
    const int t = blockIdx.y * blockDim.x + threadIdx.x;
    const bool valid = t < tasks;
    const int og = valid ? t / (C * R) : 0;
    const int cr = valid ? t - og * C * R : 0;
    const int c = cr / R, r = cr - c * R;
    float acc[EMBER_RT_DW_KT][S];
#pragma unroll
    for (int k = 0; k < EMBER_RT_DW_KT; k++)
#pragma unroll
        for (int s = 0; s < S; s++) acc[k][s] = 0.0f;
    // The block's tasks need the dy rows of output channels [o0, o1) only.
    const int t0 = blockIdx.y * blockDim.x;
    const int o0 = KT * (t0 / (C * R));
    const int lastOG = (t0 + (int)blockDim.x - 1) / (C * R);
    const int o1 = KT * (lastOG + 1) < KP ? KT * (lastOG + 1) : KP;
    const int n0 = blockIdx.x * imagesPerGroup;
    const int n1 = n0 + imagesPerGroup < N ? n0 + imagesPerGroup : N;
    // Zeros where no copy writes (LeNet's conv2: the rows of channels 50
    // and 51 in the last block).
    if (PH != 0 || PW != 0 || XS != W) ember_zero(img, C * HP * XS);
    if (OWS != OW || o1 > K) ember_zero(dys, (o1 - o0) * OH * OWS);
    __syncthreads();
    const int oReal = o1 < K ? o1 : K;  // channels beyond K stay zero
    for (int n = n0; n < n1; n++) {
        __syncthreads();
        ember_copy_image(img, x + (long long)n * C * H * W, C, H, W, PH, PW, XS);
        ember_fill_dy(dys, OWS, OH * OWS, 0, src, n, N, K, o0, oReal, OH, OW);
        __syncthreads();
        if (!valid) continue;
        for (int oh = 0; oh < OH; oh++) {
            const float* xr = img + (c * HP + oh + r) * XS;
            const float* dr = dys + ((og * KT - o0) * OH + oh) * OWS;
            for (int x0 = 0; x0 < OWS; x0 += 4) {
                float xv[8];
                ember_load8(xv, xr + x0);
#pragma unroll
                for (int k = 0; k < EMBER_RT_DW_KT; k++) {
                    const ember_f4 d4 = *reinterpret_cast<const ember_f4*>(dr + k * OH * OWS + x0);
                    const float dv[4] = {d4.x, d4.y, d4.z, d4.w};
#pragma unroll
                    for (int s = 0; s < S; s++)
#pragma unroll
                        for (int b = 0; b < 4; b++) acc[k][s] = __fmaf_rn(dv[b], xv[b + s], acc[k][s]);
                }
            }
        }
    }
    if (!valid) return;
    const long long rows = (long long)K * C * R * S;
#pragma unroll
    for (int k = 0; k < EMBER_RT_DW_KT; k++) {
        const int o = og * KT + k;
        if (o >= K) continue;
#pragma unroll
        for (int s = 0; s < S; s++)
            partial[blockIdx.x * rows + ((long long)(o * C + c) * R + r) * S + s] = acc[k][s];
    }
}

#if EMBER_RT_SIZE == 5
extern "C" __global__ void ember_conv_dw_rt_5x5(float* partial, const float* dyt, const float* x, int N, int C, int H,
                                                int W, int K, int PH, int PW, int OH, int OW, int imagesPerGroup) {
    conv_dw_rt<5, 5>(partial, {dyt, 0, 0, 0, 0}, x, N, C, H, W, K, PH, PW, OH, OW, imagesPerGroup);
}
#endif

#if EMBER_RT_SIZE == 3
extern "C" __global__ void ember_conv_dw_rt_3x3(float* partial, const float* dyt, const float* x, int N, int C, int H,
                                                int W, int K, int PH, int PW, int OH, int OW, int imagesPerGroup) {
    conv_dw_rt<3, 3>(partial, {dyt, 0, 0, 0, 0}, x, N, C, H, W, K, PH, PW, OH, OW, imagesPerGroup);
}
#endif

#if EMBER_RT_SIZE == 5
extern "C" __global__ void ember_conv_dw_rt_pooled_5x5(float* partial, const float* dy, const float* y,
                                                       const int* argmax, int PP, const float* x, int N, int C, int H,
                                                       int W, int K, int PH, int PW, int OH, int OW,
                                                       int imagesPerGroup) {
    conv_dw_rt<5, 5>(partial, {0, dy, y, argmax, PP}, x, N, C, H, W, K, PH, PW, OH, OW, imagesPerGroup);
}
#endif

#if EMBER_RT_SIZE == 3
extern "C" __global__ void ember_conv_dw_rt_pooled_3x3(float* partial, const float* dy, const float* y,
                                                       const int* argmax, int PP, const float* x, int N, int C, int H,
                                                       int W, int K, int PH, int PW, int OH, int OW,
                                                       int imagesPerGroup) {
    conv_dw_rt<3, 3>(partial, {0, dy, y, argmax, PP}, x, N, C, H, W, K, PH, PW, OH, OW, imagesPerGroup);
}
#endif

// dst[i] += partial[i] + partial[rows + i] + ... (parts of them, in order),
// one thread per element.
#if EMBER_RT_SIZE == 5
extern "C" __global__ void ember_add_parts(float* dst, const float* partial, long long rows, int parts) {
    EMBER_LOOP(long long, i, rows) {
        float s = 0.0f;
        for (int j = 0; j < parts; j++) s += partial[j * rows + i];
        dst[i] += s;
    }
}
#endif

// Input gradient: dx[n][c][ih][iw] = sum over (o, r, s) of w[o][c][r][s] *
// dy[n][o][ih+PH-r][iw+PW-s] (terms outside dy are 0), overwriting dx. Grid
// (images, ceil(C/4)), blockDim a multiple of 32, at most
// EMBER_RT_DX_THREADS; with fewer blocks than images, countersOrNull
// (ceil(C/4) + 1 ints) deals the images out (ember_image_queue). The block
// copies w[:, c0..c0+3] transposed to [K][R][S][4] and, per image, dy with
// S-1-PW zero columns in front of each row ([K][OH][DS], channels DOS floats
// apart), in EMBER_RT_SMEM floats less the queue's 4. A thread takes 4 input
// channels times 4 columns of one row; lane = slot*8 + part, where part
// takes output channels part, part+8, ... (16 lanes per sum, with 2 columns
// per warp, took 32 us instead of 22 at LeNet's conv2, batch 64: one block
// per SM by registers): per output channel and kernel row 2 16-byte loads
// of dy and S of w feed 4*4*S multiply-adds. A quarter-warp (the lanes of
// one 16-byte shared load) is one slot's 8 parts, on 8 channels whose dy and
// w words lie in 8 different bank groups (with lane = part*4 + slot, two
// parts' dy rows shared their banks). Rows of dy outside [0, OH) are
// skipped. Needs PH <= R-1 and PW <= S-1.
//
// EMBER_RT_DX_THREADS: 9 warps (LeNet's conv2 needs 9), so that 4 blocks fit
// an SM's registers (3 with up to 16 warps: at batch 1024, 215 us against
// 209 with 4).
#define EMBER_RT_DX_THREADS 288

__device__ __forceinline__ int ember_rt_dx_stride(int OW, int W, int S, int PW) {
    return ember_round4(ember_imax(S - 1 - PW + OW, 4 * ((W + 3) >> 2) + 4));
}

// Floats from one output channel's rows of dy to the next: an odd number of
// 16-byte words, so that the 8 lanes of a quarter-warp, on 8 consecutive
// channels, read 16-byte words in 8 different bank groups.
__device__ __forceinline__ int ember_rt_dx_ostride(int OH, int DS) { return OH * DS + ((OH * DS / 4) % 2 == 0 ? 4 : 0); }

// ember_image_queue hands a block's images out: blockIdx.x first, then, with
// counters, the next one not yet taken by any block of its grid row (one
// counter per blockIdx.y), so that blocks that finish early take more
// (another kernel on the side stream shares the SMs, and a fixed share of
// N/gridDim.x images each left a last, partly empty wave: at batch 1024,
// 1280 blocks of 4 images for 396 places). Without counters, every
// gridDim.x-th image. Every thread of the block must call next; done, after
// the last, counts the block out, and the grid's last block resets the
// counters (gridDim.y of them, then the count) for the next launch. taken
// is an int of the block's shared memory: the last 16 bytes of the kernel's
// static array, which the kernel leaves to it (the array is as large as
// static shared memory may be).
struct ember_image_queue {
    int* countersOrNull;
    int* taken;
    __device__ __forceinline__ long long first() const { return blockIdx.x; }
    __device__ __forceinline__ long long next(long long n) const {
        if (countersOrNull == 0) return n + gridDim.x;
        __syncthreads();
        if (threadIdx.x == 0) *taken = atomicAdd(countersOrNull + blockIdx.y, 1);
        __syncthreads();
        return (long long)gridDim.x + *taken;
    }
    __device__ __forceinline__ void done() const {
        if (countersOrNull == 0 || threadIdx.x != 0) return;
        int* count = countersOrNull + gridDim.y;
        ember_fence_acq_rel();
        if (atomicAdd(count, 1) == (int)(gridDim.x * gridDim.y) - 1) {
            ember_fence_acq_rel();  // after every block's last take
            for (int y = 0; y < (int)gridDim.y; y++) countersOrNull[y] = 0;
            *count = 0;
        }
    }
};

template <int R, int S>
__device__ __forceinline__ void conv_dx_rt(float* dx, const ember_dy_source src, const float* w, int N, int C, int H,
                                           int W, int K, int PH, int PW, int OH, int OW, int* countersOrNull) {
    __shared__ ember_f4 smem4[EMBER_RT_SMEM / 4];
    float* smem = reinterpret_cast<float*>(smem4);
    // The last 16 bytes hold the queue's shared int.
    const ember_image_queue queue{countersOrNull, reinterpret_cast<int*>(smem4 + EMBER_RT_SMEM / 4 - 1)};
    const int off = S - 1 - PW;
    const int DS = ember_rt_dx_stride(OW, W, S, PW), DOS = ember_rt_dx_ostride(OH, DS);
    const int c0 = blockIdx.y * 4;
    float* wt = smem;                 // [K][R][S][4]
    float* dys = smem + K * R * S * 4;  // [K][DOS]: [OH][DS] and padding
    ember_zero(smem, K * R * S * 4 + K * DOS);
    __syncthreads();
    // wt[((o*R + r)*S + s)*4 + cl] = w[o][c0+cl][r][s]: consecutive threads
    // take consecutive (o, c) rows of R*S taps, read in w's order.
    const int cn = C - c0 < 4 ? C - c0 : 4;
    for (int i = threadIdx.x; i < K * cn; i += blockDim.x) {
        const int o = i / cn, cl = i - o * cn;
        const float* src = w + ((long long)o * C + c0 + cl) * R * S;
        float v[R * S];
#pragma unroll
        for (int t = 0; t < R * S; t++) v[t] = src[t];
#pragma unroll
        for (int t = 0; t < R * S; t++) wt[(o * R * S + t) * 4 + cl] = v[t];
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int part = lane & 7, slot = lane >> 3;
    const int strips = (W + 3) >> 2, positions = H * strips;
    for (long long n = queue.first(); n < N; n = queue.next(n)) {
        __syncthreads();
        ember_fill_dy(dys, DS, DOS, off, src, n, N, K, 0, K, OH, OW);
        __syncthreads();
        for (int base = warp * 4; base < positions; base += warps * 4) {  // uniform across the warp
            const int p = base + slot;
            const bool valid = p < positions;
            const int ih = valid ? p / strips : 0, iw0 = valid ? 4 * (p - ih * strips) : 0;
            float acc[4][4];
#pragma unroll
            for (int c = 0; c < 4; c++)
#pragma unroll
                for (int b = 0; b < 4; b++) acc[c][b] = 0.0f;
            for (int o = part; o < K; o += 8) {
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const int oh = ih + PH - r;
                    if (oh < 0 || oh >= OH) continue;
                    float dv[8];
                    ember_load8(dv, dys + o * DOS + oh * DS + iw0);
                    const float* wr = wt + (o * R + r) * S * 4;
#pragma unroll
                    for (int s = 0; s < S; s++) {
                        const ember_f4 w4 = *reinterpret_cast<const ember_f4*>(wr + s * 4);
                        const float wc[4] = {w4.x, w4.y, w4.z, w4.w};
#pragma unroll
                        for (int c = 0; c < 4; c++)
#pragma unroll
                            for (int b = 0; b < 4; b++) acc[c][b] = __fmaf_rn(wc[c], dv[b + S - 1 - s], acc[c][b]);
                    }
                }
            }
#pragma unroll
            for (int o = 1; o <= 4; o <<= 1)
#pragma unroll
                for (int c = 0; c < 4; c++)
#pragma unroll
                    for (int b = 0; b < 4; b++) acc[c][b] += __shfl_xor_sync(0xffffffffu, acc[c][b], o);
            if (!valid || part != 0) continue;
#pragma unroll
            for (int c = 0; c < 4; c++) {
                if (c0 + c >= C) continue;
                float* dr = dx + ((n * C + c0 + c) * H + ih) * W;
#pragma unroll
                for (int b = 0; b < 4; b++)
                    if (iw0 + b < W) dr[iw0 + b] = acc[c][b];
            }
        }
    }
    queue.done();
}

#if EMBER_RT_SIZE == 5
extern "C" __global__ void __launch_bounds__(EMBER_RT_DX_THREADS, 4) ember_conv_dx_rt_5x5(float* dx, const float* dyt, const float* w, int N, int C, int H,
                                                int W, int K, int PH, int PW, int OH, int OW, int* countersOrNull) {
    conv_dx_rt<5, 5>(dx, {dyt, 0, 0, 0, 0}, w, N, C, H, W, K, PH, PW, OH, OW, countersOrNull);
}
#endif

#if EMBER_RT_SIZE == 3
extern "C" __global__ void __launch_bounds__(EMBER_RT_DX_THREADS, 4) ember_conv_dx_rt_3x3(float* dx, const float* dyt, const float* w, int N, int C, int H,
                                                int W, int K, int PH, int PW, int OH, int OW, int* countersOrNull) {
    conv_dx_rt<3, 3>(dx, {dyt, 0, 0, 0, 0}, w, N, C, H, W, K, PH, PW, OH, OW, countersOrNull);
}
#endif

#if EMBER_RT_SIZE == 5
extern "C" __global__ void __launch_bounds__(EMBER_RT_DX_THREADS, 4) ember_conv_dx_rt_pooled_5x5(float* dx, const float* dy, const float* y, const int* argmax,
                                                       int PP, const float* w, int N, int C, int H, int W, int K, int PH,
                                                       int PW, int OH, int OW, int* countersOrNull) {
    conv_dx_rt<5, 5>(dx, {0, dy, y, argmax, PP}, w, N, C, H, W, K, PH, PW, OH, OW, countersOrNull);
}
#endif

#if EMBER_RT_SIZE == 3
extern "C" __global__ void __launch_bounds__(EMBER_RT_DX_THREADS, 4) ember_conv_dx_rt_pooled_3x3(float* dx, const float* dy, const float* y, const int* argmax,
                                                       int PP, const float* w, int N, int C, int H, int W, int K, int PH,
                                                       int PW, int OH, int OW, int* countersOrNull) {
    conv_dx_rt<3, 3>(dx, {0, dy, y, argmax, PP}, w, N, C, H, W, K, PH, PW, OH, OW, countersOrNull);
}
#endif
