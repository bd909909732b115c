// softmax.cu: softmax and log-softmax over the middle axis of
// [outer, n, inner] and the class losses built on them, mirroring
// tensor/cpu_softmax.go.
//
// The steps are those of the CPU backend, in its order: the maximum m of a
// column (NaN propagates), s = Σ exp(x - m), then y = exp(x - m) / s, or
// x - m - log s for log-softmax. Rows (inner == 1) are in float, with the
// CPU's summation order (lane-strided partial sums, then a fixed xor tree);
// columns sum in double, y = (float)(exp(x - m) / s). Both are
// deterministic and match the CPU to a few ulp.
//
// Two layouts of [outer, n, inner]:
//   - rows (inner == 1): a warp per row, lanes striding over the row, the
//     warp's reductions by shuffles; the grid loops over rows;
//   - columns (inner > 1): a thread per (outer, inner) column; consecutive
//     threads read consecutive addresses (inner is the fastest axis).

// ember_softmax_row_regs is a row of at most 32*K elements held in
// registers: each element is loaded once and its exponential computed
// once. The arithmetic and its order are those of the generic loop below.
template <int K>
__device__ __forceinline__ void ember_softmax_row_regs(float* yr, const float* xr, int n, int lane, int logOut) {
    float v[K];
    float m = ember_neg_inf();
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int i = lane + 32 * k;
        v[k] = i < n ? xr[i] : ember_neg_inf();
        m = ember_nan_max(m, v[k]);
    }
    m = ember_warp_max(m);
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < K; k++) {
        if (lane + 32 * k < n) {
            v[k] = expf(v[k] - m);
            s += v[k];
        }
    }
    s = ember_warp_sum(s);
    if (logOut) {
        const float ls = logf(s);
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int i = lane + 32 * k;
            if (i < n) yr[i] = xr[i] - m - ls;
        }
    } else {
        const float inv = 1.0f / s;
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int i = lane + 32 * k;
            if (i < n) yr[i] = v[k] * inv;
        }
    }
}

// ember_softmax_row is the softmax of one row of n elements by the calling
// warp, in float: lane l adds the exponentials of elements l, l+32, l+64,
// ... in that order, the lanes' sums are joined by the xor tree of
// ember_warp_sum, then y = e^(x-m) * (1/s), or x - m - log s. The CPU
// backend (tensor/cpu_softmax.go) does these float operations in this
// order; only expf and logf (within 2 ulp on the GPU) may round apart.
__device__ __forceinline__ void ember_softmax_row(float* yr, const float* xr, int n, int lane, int logOut) {
    if (n <= 128) {
        ember_softmax_row_regs<4>(yr, xr, n, lane, logOut);
        return;
    }
    if (n <= 512) {
        ember_softmax_row_regs<16>(yr, xr, n, lane, logOut);
        return;
    }
    float m = ember_neg_inf();
    for (int i = lane; i < n; i += 32) m = ember_nan_max(m, xr[i]);
    m = ember_warp_max(m);
    float s = 0.0f;
    for (int i = lane; i < n; i += 32) s += expf(xr[i] - m);
    s = ember_warp_sum(s);
    if (logOut) {
        const float ls = logf(s);
        for (int i = lane; i < n; i += 32) yr[i] = xr[i] - m - ls;
    } else {
        const float inv = 1.0f / s;
        for (int i = lane; i < n; i += 32) yr[i] = expf(xr[i] - m) * inv;
    }
}

// Rows (inner == 1), a warp each; the grid loops over rows.
extern "C" __global__ void ember_softmax_rows(float* y, const float* x, long long rows, int n, int logOut) {
    const int lane = threadIdx.x & 31;
    const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long r = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < rows; r += warps) {
        ember_softmax_row(y + r * n, x + r * n, n, lane, logOut);
    }
}

// Causal attention scores [rows, n], rows = batch·t: row r is query
// q = r mod t, whose softmax is over its first min(q+1, n) scores; the
// rest are masked: never read, and their probabilities written as 0. This
// is the softmax of the scores plus a mask of -Inf after the diagonal,
// bit for bit (a masked score adds e^-Inf = 0 to a lane's sum).
extern "C" __global__ void ember_softmax_rows_causal(float* y, const float* x, long long rows, int n, long long t) {
    const int lane = threadIdx.x & 31;
    const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long r = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < rows; r += warps) {
        const long long q = r % t;
        const int kept = q + 1 < n ? (int)(q + 1) : n;
        float* yr = y + r * n;
        ember_softmax_row(yr, x + r * n, kept, lane, 0);
        for (int i = kept + lane; i < n; i += 32) yr[i] = 0.0f;
    }
}

extern "C" __global__ void ember_softmax_cols(float* y, const float* x, long long outer, int n, long long inner, int logOut) {
    EMBER_LOOP(long long, c, outer * inner) {
        const long long o = c / inner, r = c - o * inner;
        const float* xc = x + o * n * inner + r;
        float* yc = y + o * n * inner + r;
        float m = ember_neg_inf();
        for (int i = 0; i < n; i++) m = ember_nan_max(m, xc[i * inner]);
        double s = 0;
        for (int i = 0; i < n; i++) s += exp((double)(xc[i * inner] - m));
        if (logOut) {
            const float ls = (float)log(s);
            for (int i = 0; i < n; i++) yc[i * inner] = xc[i * inner] - m - ls;
        } else {
            const double inv = 1 / s;
            for (int i = 0; i < n; i++) yc[i * inner] = (float)(exp((double)(xc[i * inner] - m)) * inv);
        }
    }
}

// The backward pass, as the CPU's: s = Σ dy (log-softmax) or Σ dy·y in
// double, then dx = dy - exp(y)·s or y·(dy - s), rounded once to float.
__device__ __forceinline__ float ember_softmax_grad(float g, float y, double s, int logOut) {
    return logOut ? (float)((double)g - exp((double)y) * s) : (float)((double)y * ((double)g - s));
}

extern "C" __global__ void ember_softmax_backward_rows(float* dx, const float* dy, const float* y, long long rows, int n,
                                                       int logOut, int accumulate) {
    const int lane = threadIdx.x & 31;
    const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long r = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < rows; r += warps) {
        const float* gr = dy + r * n;
        const float* yr = y + r * n;
        float* dr = dx + r * n;
        double s = 0;
        for (int i = lane; i < n; i += 32) s += logOut ? (double)gr[i] : (double)gr[i] * (double)yr[i];
        s = ember_warp_sum_d(s);
        for (int i = lane; i < n; i += 32) {
            const float v = ember_softmax_grad(gr[i], yr[i], s, logOut);
            dr[i] = accumulate ? dr[i] + v : v;
        }
    }
}

extern "C" __global__ void ember_softmax_backward_cols(float* dx, const float* dy, const float* y, long long outer, int n,
                                                       long long inner, int logOut, int accumulate) {
    EMBER_LOOP(long long, c, outer * inner) {
        const long long o = c / inner, r = c - o * inner;
        const long long base = o * n * inner + r;
        double s = 0;
        for (int i = 0; i < n; i++) {
            const long long j = base + i * inner;
            s += logOut ? (double)dy[j] : (double)dy[j] * (double)y[j];
        }
        for (int i = 0; i < n; i++) {
            const long long j = base + i * inner;
            const float v = ember_softmax_grad(dy[j], y[j], s, logOut);
            dx[j] = accumulate ? dx[j] + v : v;
        }
    }
}
