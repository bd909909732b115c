// pool.cu: average and adaptive pooling (NCHW float32; tensor.PoolBackend,
// Go side cuda/pool.go). Max pooling with padding is in conv.cu.
//
// Forward: one thread per output, the window summed in row-major order and
// divided once, as tensor/cpu_pool.go. Backward: atomic-free gathers, one
// thread per input element over the windows that cover it in row-major
// window order, adding dy/divisor: the CPU scatters the same quotients in
// the same order, so with --fmad=false the results equal the CPU's bit for
// bit.

// The divisor of average window (i, j) (AvgPoolGeom.WindowDivisor): the
// override, else the window's extent clipped to the padded input (torch's
// count_include_pad) or to the input (excludePad).
__device__ __forceinline__ int ember_avg_divisor(int i, int j, int H, int W, int KH, int KW, int SH, int SW, int PH,
                                                 int PW, int excludePad, int divisor) {
    if (divisor > 0) return divisor;
    int h0 = i * SH - PH, w0 = j * SW - PW;
    int h1 = ember_imin(h0 + KH, H + PH), w1 = ember_imin(w0 + KW, W + PW);
    if (excludePad) {
        h0 = h0 > 0 ? h0 : 0;
        w0 = w0 > 0 ? w0 : 0;
        h1 = ember_imin(h1, H);
        w1 = ember_imin(w1, W);
    }
    return (h1 - h0) * (w1 - w0);
}

template <typename I>
__device__ __forceinline__ void avgpool_body(float* y, const float* x, int H, int W, int KH, int KW, int SH, int SW,
                                             int PH, int PW, int OH, int OW, int excludePad, int divisor, I total) {
    const I OP = (I)OH * OW;
    const I IP = (I)H * W;
    EMBER_LOOP(I, idx, total) {
        const I p = idx / OP;
        const int o = (int)(idx - p * OP);
        const int i = o / OW;
        const int j = o - i * OW;
        const float* plane = x + p * IP;
        const int hs = i * SH - PH, ws = j * SW - PW;
        const int h0 = hs > 0 ? hs : 0, h1 = ember_imin(hs + KH, H);
        const int w0 = ws > 0 ? ws : 0, w1 = ember_imin(ws + KW, W);
        float s = 0.0f;
        for (int h = h0; h < h1; h++) {
            for (int w = w0; w < w1; w++) s += plane[h * W + w];
        }
        y[idx] = s / (float)ember_avg_divisor(i, j, H, W, KH, KW, SH, SW, PH, PW, excludePad, divisor);
    }
}

extern "C" __global__ void ember_avgpool2d(float* y, const float* x, int H, int W, int KH, int KW, int SH, int SW,
                                           int PH, int PW, int OH, int OW, int excludePad, int divisor,
                                           long long total, long long xTotal) {
    if (EMBER_SMALL_INDEX(total) && EMBER_SMALL_INDEX(xTotal)) {
        avgpool_body<int>(y, x, H, W, KH, KW, SH, SW, PH, PW, OH, OW, excludePad, divisor, (int)total);
    } else {
        avgpool_body<long long>(y, x, H, W, KH, KW, SH, SW, PH, PW, OH, OW, excludePad, divisor, total);
    }
}

// dx[p, h, w] (+= when acc) = sum of dy[p, i, j] / divisor(i, j) over the
// windows covering (h, w): i in [ceil((h+PH-KH+1)/SH), floor((h+PH)/SH)]
// intersected with [0, OH), j likewise.
template <typename I>
__device__ __forceinline__ void avgpool_backward_body(float* dx, const float* dy, int H, int W, int KH, int KW, int SH,
                                                      int SW, int PH, int PW, int OH, int OW, int excludePad,
                                                      int divisor, I total, int acc) {
    const I OP = (I)OH * OW;
    const I IP = (I)H * W;
    EMBER_LOOP(I, idx, total) {
        const I p = idx / IP;
        const int hw = (int)(idx - p * IP);
        const int h = hw / W;
        const int w = hw - h * W;
        const int hp = h + PH, wp = w + PW;
        const int i0 = hp < KH ? 0 : (hp - KH) / SH + 1;
        const int i1 = ember_imin(hp / SH, OH - 1);
        const int j0 = wp < KW ? 0 : (wp - KW) / SW + 1;
        const int j1 = ember_imin(wp / SW, OW - 1);
        const float* g = dy + p * OP;
        float sum = acc ? dx[idx] : 0.0f;
        for (int i = i0; i <= i1; i++) {
            for (int j = j0; j <= j1; j++) {
                sum += g[i * OW + j] /
                       (float)ember_avg_divisor(i, j, H, W, KH, KW, SH, SW, PH, PW, excludePad, divisor);
            }
        }
        dx[idx] = sum;
    }
}

extern "C" __global__ void ember_avgpool2d_backward(float* dx, const float* dy, int H, int W, int KH, int KW, int SH,
                                                    int SW, int PH, int PW, int OH, int OW, int excludePad,
                                                    int divisor, long long total, long long yTotal, int acc) {
    if (EMBER_SMALL_INDEX(total) && EMBER_SMALL_INDEX(yTotal)) {
        avgpool_backward_body<int>(dx, dy, H, W, KH, KW, SH, SW, PH, PW, OH, OW, excludePad, divisor, (int)total, acc);
    } else {
        avgpool_backward_body<long long>(dx, dy, H, W, KH, KW, SH, SW, PH, PW, OH, OW, excludePad, divisor, total,
                                         acc);
    }
}

// Adaptive windows (AdaptivePoolGeom.Rows): output i of out covers
// [floor(i*in/out), ceil((i+1)*in/out)). ember_adaptive_div forms the
// products: i*in can pass 2^31 for large planes, but below
// EMBER_ADAPTIVE_NARROW in and out they fit 31 bits, and a 32-bit division
// costs a fraction of the 64-bit routine (ResNet-9's global max pool's
// backward, eight divisions an element, took 53 us in 64 bits).
#define EMBER_ADAPTIVE_NARROW 46340u

// (a·b + c) / d for a, c <= max(b, d), all non-negative.
__device__ __forceinline__ int ember_adaptive_div(int a, int b, int c, int d) {
    if (((unsigned)b | (unsigned)d) <= EMBER_ADAPTIVE_NARROW) {
        return (int)(((unsigned)a * (unsigned)b + (unsigned)c) / (unsigned)d);
    }
    return (int)(((long long)a * b + c) / d);
}

__device__ __forceinline__ int ember_adaptive_lo(int i, int in, int out) { return ember_adaptive_div(i, in, 0, out); }
__device__ __forceinline__ int ember_adaptive_hi(int i, int in, int out) {
    return ember_adaptive_div(i + 1, in, out - 1, out);
}

// The outputs whose windows may cover input position h: from
// floor(h*out/in) to ceil((h+1)*out/in) - 1, clamped to [0, out); the
// callers test each window's bounds as well.
__device__ __forceinline__ int ember_adaptive_first(int h, int in, int out) { return ember_adaptive_div(h, out, 0, in); }
__device__ __forceinline__ int ember_adaptive_last(int h, int in, int out) {
    return ember_imin(ember_adaptive_div(h + 1, out, in - 1, in) - 1, out - 1);
}

// Shared by the adaptive forward kernels: the window of output idx.
template <typename I>
__device__ __forceinline__ void ember_adaptive_window(I idx, int H, int W, int OH, int OW, I& p, int& h0, int& h1,
                                                      int& w0, int& w1) {
    const I OP = (I)OH * OW;
    p = idx / OP;
    const int o = (int)(idx - p * OP);
    const int i = o / OW;
    const int j = o - i * OW;
    h0 = ember_adaptive_lo(i, H, OH);
    h1 = ember_adaptive_hi(i, H, OH);
    w0 = ember_adaptive_lo(j, W, OW);
    w1 = ember_adaptive_hi(j, W, OW);
}

template <typename I>
__device__ __forceinline__ void adaptive_avgpool_body(float* y, const float* x, int H, int W, int OH, int OW, I total) {
    EMBER_LOOP(I, idx, total) {
        I p;
        int h0, h1, w0, w1;
        ember_adaptive_window<I>(idx, H, W, OH, OW, p, h0, h1, w0, w1);
        const float* plane = x + p * ((I)H * W);
        float s = 0.0f;
        for (int h = h0; h < h1; h++) {
            for (int w = w0; w < w1; w++) s += plane[h * W + w];
        }
        y[idx] = s / (float)((h1 - h0) * (w1 - w0));
    }
}

extern "C" __global__ void ember_adaptive_avgpool2d(float* y, const float* x, int H, int W, int OH, int OW,
                                                    long long total, long long xTotal) {
    if (EMBER_SMALL_INDEX(total) && EMBER_SMALL_INDEX(xTotal)) {
        adaptive_avgpool_body<int>(y, x, H, W, OH, OW, (int)total);
    } else {
        adaptive_avgpool_body<long long>(y, x, H, W, OH, OW, total);
    }
}

template <typename I>
__device__ __forceinline__ void adaptive_maxpool_body(float* y, int* argmax, const float* x, int H, int W, int OH,
                                                      int OW, I total) {
    EMBER_LOOP(I, idx, total) {
        I p;
        int h0, h1, w0, w1;
        ember_adaptive_window<I>(idx, H, W, OH, OW, p, h0, h1, w0, w1);
        const float* plane = x + p * ((I)H * W);
        float best = ember_neg_inf();
        int at = -1;
        for (int h = h0; h < h1; h++) {
            for (int w = w0; w < w1; w++) {
                const float v = plane[h * W + w];
                // First maximum wins; a NaN always wins, so that it propagates.
                if (at < 0 || v > best || v != v) {
                    best = v;
                    at = h * W + w;
                }
            }
        }
        y[idx] = best;
        argmax[idx] = at;
    }
}

extern "C" __global__ void ember_adaptive_maxpool2d(float* y, int* argmax, const float* x, int H, int W, int OH, int OW,
                                                    long long total, long long xTotal) {
    if (EMBER_SMALL_INDEX(total) && EMBER_SMALL_INDEX(xTotal)) {
        adaptive_maxpool_body<int>(y, argmax, x, H, W, OH, OW, (int)total);
    } else {
        adaptive_maxpool_body<long long>(y, argmax, x, H, W, OH, OW, total);
    }
}

// Adaptive backward, average (argmax null) or max (argmax not null): dx[p,
// h, w] (+= when acc) = the sum over the windows covering (h, w), in
// row-major window order, of dy / window size, or of dy where the window's
// argmax is (h, w).
template <typename I>
__device__ __forceinline__ void adaptive_backward_body(float* dx, const float* dy, const int* argmax, int H, int W,
                                                       int OH, int OW, I total, int acc) {
    const I OP = (I)OH * OW;
    const I IP = (I)H * W;
    if (OP == 1) {
        // Global pooling (a classifier's head): one window, the plane; the
        // same sums as below, without the window arithmetic, and the two
        // loads issued together.
        const float area = (float)IP;
        EMBER_LOOP(I, idx, total) {
            const I p = idx / IP;
            const int hw = (int)(idx - p * IP);
            const float g = dy[p];
            const bool hit = argmax == 0 || argmax[p] == hw;
            float sum = acc ? dx[idx] : 0.0f;
            if (hit) sum += argmax != 0 ? g : g / area;
            dx[idx] = sum;
        }
        return;
    }
    EMBER_LOOP(I, idx, total) {
        const I p = idx / IP;
        const int hw = (int)(idx - p * IP);
        const int h = hw / W;
        const int w = hw - h * W;
        const int i0 = ember_adaptive_first(h, H, OH), i1 = ember_adaptive_last(h, H, OH);
        const int j0 = ember_adaptive_first(w, W, OW), j1 = ember_adaptive_last(w, W, OW);
        const float* g = dy + p * OP;
        const int* am = argmax != 0 ? argmax + p * OP : 0;
        float sum = acc ? dx[idx] : 0.0f;
        for (int i = i0; i <= i1; i++) {
            const int h0 = ember_adaptive_lo(i, H, OH), h1 = ember_adaptive_hi(i, H, OH);
            if (h < h0 || h >= h1) continue;
            for (int j = j0; j <= j1; j++) {
                const int w0 = ember_adaptive_lo(j, W, OW), w1 = ember_adaptive_hi(j, W, OW);
                if (w < w0 || w >= w1) continue;
                const int o = i * OW + j;
                if (am != 0) {
                    if (am[o] == hw) sum += g[o];
                } else {
                    sum += g[o] / (float)((h1 - h0) * (w1 - w0));
                }
            }
        }
        dx[idx] = sum;
    }
}

extern "C" __global__ void ember_adaptive_pool2d_backward(float* dx, const float* dy, const int* argmaxOrNull, int H,
                                                          int W, int OH, int OW, long long total, long long yTotal,
                                                          int acc) {
    if (EMBER_SMALL_INDEX(total) && EMBER_SMALL_INDEX(yTotal)) {
        adaptive_backward_body<int>(dx, dy, argmaxOrNull, H, W, OH, OW, (int)total, acc);
    } else {
        adaptive_backward_body<long long>(dx, dy, argmaxOrNull, H, W, OH, OW, total, acc);
    }
}
