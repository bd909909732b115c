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

struct ConvDims {
    int N, C, H, W, R, S, SH, SW, PH, PW, OH, OW;
};

template <typename I>
__device__ __forceinline__ void im2col_body(float* col, const float* x, const ConvDims d, I total) {
    const I P = (I)d.OH * d.OW;
    const I NP = (I)d.N * P;
    EMBER_LOOP(I, idx, total) {
        const I row = idx / NP;  // (c, r, s)
        const I q = idx - row * NP;  // (n, i, j)
        const I n = q / P;
        const I pq = q - n * P;
        const int i = (int)(pq / d.OW);
        const int j = (int)(pq - (I)i * d.OW);
        const int s = (int)(row % d.S);
        const I cr = row / d.S;
        const int r = (int)(cr % d.R);
        const I c = cr / d.R;
        const int h = i * d.SH + r - d.PH;
        const int w = j * d.SW + s - d.PW;
        float v = 0.0f;
        if (h >= 0 && h < d.H && w >= 0 && w < d.W) v = x[((n * d.C + c) * d.H + h) * d.W + w];
        col[idx] = v;
    }
}

extern "C" __global__ void ember_im2col(float* col, const float* x, int N, int C, int H, int W, int R, int S, int SH,
                                        int SW, int PH, int PW, int OH, int OW, long long total, long long xTotal) {
    const ConvDims d = {N, C, H, W, R, S, SH, SW, PH, PW, OH, OW};
    if (EMBER_SMALL_INDEX(total) && EMBER_SMALL_INDEX(xTotal)) {
        im2col_body<int>(col, x, d, (int)total);
    } else {
        im2col_body<long long>(col, x, d, total);
    }
}

// dx[n, c, h, w] = sum over (r, s) of col[(c, r, s), (n, i, j)] where
// h = i*SH + r - PH and w = j*SW + s - PW (overwrites dx).
template <typename I>
__device__ __forceinline__ void col2im_body(float* dx, const float* col, const ConvDims d, I total) {
    const I P = (I)d.OH * d.OW;
    const I NP = (I)d.N * P;
    EMBER_LOOP(I, idx, total) {
        const int w = (int)(idx % d.W);
        I t = idx / d.W;
        const int h = (int)(t % d.H);
        t /= d.H;
        const I c = t % d.C;
        const I n = t / d.C;
        const float* base = col + c * (I)d.R * d.S * NP + n * P;
        float sum = 0.0f;
        for (int r = 0; r < d.R; r++) {
            const int hh = h + d.PH - r;
            if (hh < 0) break;  // hh only decreases with r
            if (hh % d.SH != 0) continue;
            const int i = hh / d.SH;
            if (i >= d.OH) continue;
            for (int s = 0; s < d.S; s++) {
                const int ww = w + d.PW - s;
                if (ww < 0) break;
                if (ww % d.SW != 0) continue;
                const int j = ww / d.SW;
                if (j >= d.OW) continue;
                sum += base[(I)(r * d.S + s) * NP + (I)i * d.OW + j];
            }
        }
        dx[idx] = sum;
    }
}

extern "C" __global__ void ember_col2im(float* dx, const float* col, int N, int C, int H, int W, int R, int S, int SH,
                                        int SW, int PH, int PW, int OH, int OW, long long total, long long colTotal) {
    const ConvDims d = {N, C, H, W, R, S, SH, SW, PH, PW, OH, OW};
    if (EMBER_SMALL_INDEX(total) && EMBER_SMALL_INDEX(colTotal)) {
        col2im_body<int>(dx, col, d, (int)total);
    } else {
        col2im_body<long long>(dx, col, d, total);
    }
}

// swap01: out [B, A, P] = in [A, B, P] with the first two axes swapped, plus
// bias[a] when bias is not null. Conv2d: in = yt [K, N, P] (A = K),
// out = y, bias = conv bias. Conv2dBackward: in = dy [N, K, P] (A = N),
// out = dyt, no bias. One thread per output element: writes are coalesced,
// reads are coalesced along P.
template <typename I>
__device__ __forceinline__ void swap01_body(float* out, const float* in, const float* bias, I A, I B, I P) {
    const I total = A * B * P;
    EMBER_LOOP(I, idx, total) {
        const I p = idx % P;
        const I t = idx / P;
        const I a = t % A;
        const I b = t / A;
        float v = in[(a * B + b) * P + p];
        if (bias != 0) v = v + bias[a];
        out[idx] = v;
    }
}

extern "C" __global__ void ember_swap01(float* out, const float* in, const float* bias, long long A, long long B, long long P) {
    if (EMBER_SMALL_INDEX(A * B * P)) {
        swap01_body<int>(out, in, bias, (int)A, (int)B, (int)P);
    } else {
        swap01_body<long long>(out, in, bias, A, B, P);
    }
}

struct PoolDims {
    int H, W, KH, KW, SH, SW, OH, OW;
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
            const int h = i * d.SH + r;
            for (int s = 0; s < d.KW; s++) {
                const int hw = h * d.W + j * d.SW + s;
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
                                           int SW, int OH, int OW, long long total, long long xTotal) {
    const PoolDims d = {H, W, KH, KW, SH, SW, OH, OW};
    if (EMBER_SMALL_INDEX(total) && EMBER_SMALL_INDEX(xTotal)) {
        maxpool_body<int>(y, argmax, x, d, (int)total);
    } else {
        maxpool_body<long long>(y, argmax, x, d, total);
    }
}

// dx[p, h, w] = sum of dy[p, i, j] over the windows (i, j) covering (h, w)
// whose argmax is h*W + w (+ dx when acc). Windows covering row h are
// i in [ceil((h-KH+1)/SH), floor(h/SH)] intersected with [0, OH).
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
        const int i0 = h < d.KH ? 0 : (h - d.KH) / d.SH + 1;
        const int i1 = ember_imin(h / d.SH, d.OH - 1);
        const int j0 = w < d.KW ? 0 : (w - d.KW) / d.SW + 1;
        const int j1 = ember_imin(w / d.SW, d.OW - 1);
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
                                                    int KW, int SH, int SW, int OH, int OW, long long total,
                                                    long long yTotal, int acc) {
    const PoolDims d = {H, W, KH, KW, SH, SW, OH, OW};
    if (EMBER_SMALL_INDEX(total) && EMBER_SMALL_INDEX(yTotal)) {
        maxpool_backward_body<int>(dx, dy, argmax, d, (int)total, acc);
    } else {
        maxpool_backward_body<long long>(dx, dy, argmax, d, total, acc);
    }
}
