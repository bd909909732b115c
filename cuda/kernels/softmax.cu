// softmax.cu: softmax and log-softmax over the middle axis of
// [outer, n, inner] and the class losses built on them, mirroring
// tensor/cpu_softmax.go.
//
// The steps are those of the CPU backend, in its order: the maximum m of a
// column (NaN propagates), s = Σ exp(x - m), then y = exp(x - m) / s, or
// x - m - log s for log-softmax. Rows (inner == 1) are in float, with the
// CPU's summation order (each lane's partial sum, then a fixed xor tree);
// columns sum in double, y = (float)(exp(x - m) / s). Both are
// deterministic and match the CPU to a few ulp.
//
// Two layouts of [outer, n, inner]:
//   - rows (inner == 1): a warp per row, lanes striding over the row (in
//     groups of four when they can), the warp's reductions by shuffles; the
//     grid loops over rows;
//   - columns (inner > 1): a thread per (outer, inner) column; consecutive
//     threads read consecutive addresses (inner is the fastest axis).

// Rows whose length is a multiple of 4 are laid out on the lanes in
// groups of four: group c (elements 4c..4c+3) belongs to lane c mod 32, so
// that a lane loads and stores 16 bytes at a time when the rows are
// 16-byte aligned; other rows element by element, element i to lane i mod
// 32. Each lane adds its exponentials in increasing index order, then the
// lanes are joined by the xor tree of ember_warp_sum; the CPU backend
// (softmaxRow in tensor/cpu_softmax.go) does these float operations in this
// order, so only expf and logf (within 2 ulp on the GPU) may round apart.

// ember_softmax_row4 is the softmax of a row of n <= 128*J elements, n a
// multiple of 4, of which the first kept are the row (the rest, causal
// masking, are 0 in y and not read), held in registers: each element is
// read once and its exponential taken once. vec: x and y are 16-byte
// aligned (float4 accesses), else the same layout by single floats.
template <int J>
__device__ __forceinline__ void ember_softmax_row4(float* yr, const float* xr, int n, int kept, int lane, int logOut,
                                                   bool vec) {
    float v[J][4];
    float m = ember_neg_inf();
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int e = 4 * (lane + 32 * j);
        if (vec && e + 4 <= kept) {
            const ember_f4 q = *reinterpret_cast<const ember_f4*>(xr + e);
            v[j][0] = q.x;
            v[j][1] = q.y;
            v[j][2] = q.z;
            v[j][3] = q.w;
        } else {
#pragma unroll
            for (int k = 0; k < 4; k++) v[j][k] = e + k < kept ? xr[e + k] : ember_neg_inf();
        }
#pragma unroll
        for (int k = 0; k < 4; k++) m = ember_nan_max(m, v[j][k]);
    }
    m = ember_warp_max(m);
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < J; j++) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            if (4 * (lane + 32 * j) + k < kept) {
                const float t = expf(v[j][k] - m);
                s += t;
                if (!logOut) v[j][k] = t;
            }
        }
    }
    s = ember_warp_sum(s);
    const float ls = logOut ? logf(s) : 0.0f, inv = logOut ? 0.0f : 1.0f / s;
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int e = 4 * (lane + 32 * j);
        if (e >= n) break;
        float o[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            o[k] = e + k >= kept ? 0.0f : logOut ? v[j][k] - m - ls : v[j][k] * inv;
        }
        if (vec) {
            const ember_f4 q = {o[0], o[1], o[2], o[3]};
            *reinterpret_cast<ember_f4*>(yr + e) = q;
        } else {
#pragma unroll
            for (int k = 0; k < 4; k++) yr[e + k] = o[k];
        }
    }
}

// ember_softmax_row1 is the softmax of a row of n <= 32*K elements laid
// out element by element, held in registers as ember_softmax_row4's.
template <int K>
__device__ __forceinline__ void ember_softmax_row1(float* yr, const float* xr, int n, int kept, int lane, int logOut) {
    float v[K];
    float m = ember_neg_inf();
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int i = lane + 32 * k;
        v[k] = i < kept ? xr[i] : ember_neg_inf();
        m = ember_nan_max(m, v[k]);
    }
    m = ember_warp_max(m);
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < K; k++) {
        if (lane + 32 * k < kept) {
            const float t = expf(v[k] - m);
            s += t;
            if (!logOut) v[k] = t;
        }
    }
    s = ember_warp_sum(s);
    const float ls = logOut ? logf(s) : 0.0f, inv = logOut ? 0.0f : 1.0f / s;
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int i = lane + 32 * k;
        if (i < n) yr[i] = i >= kept ? 0.0f : logOut ? v[k] - m - ls : v[k] * inv;
    }
}

// ember_softmax_row is the softmax of one row of n elements by the calling
// warp, in float, in the layout above, of which only the first kept count
// (kept == n but for causal masking: the rest are written as 0 and not
// read). vec: the row's groups of four are 16-byte aligned in x and y.
__device__ __forceinline__ void ember_softmax_row(float* yr, const float* xr, int n, int kept, int lane, int logOut,
                                                  bool vec) {
    if ((n & 3) == 0 && n <= 1024) {
        if (n <= 128) {
            ember_softmax_row4<1>(yr, xr, n, kept, lane, logOut, vec);
        } else if (n <= 256) {
            ember_softmax_row4<2>(yr, xr, n, kept, lane, logOut, vec);
        } else if (n <= 512) {
            ember_softmax_row4<4>(yr, xr, n, kept, lane, logOut, vec);
        } else {
            ember_softmax_row4<8>(yr, xr, n, kept, lane, logOut, vec);
        }
        return;
    }
    if ((n & 3) != 0 && n <= 512) {
        if (n <= 128) {
            ember_softmax_row1<4>(yr, xr, n, kept, lane, logOut);
        } else if (n <= 256) {
            ember_softmax_row1<8>(yr, xr, n, kept, lane, logOut);
        } else {
            ember_softmax_row1<16>(yr, xr, n, kept, lane, logOut);
        }
        return;
    }
    // Long rows: three passes over x (the later ones mostly from the cache).
    const bool four = (n & 3) == 0;
    float m = ember_neg_inf();
    for (int i = lane; i < kept; i += 32) m = ember_nan_max(m, xr[i]);
    m = ember_warp_max(m);
    float s = 0.0f;
    if (four) {
        for (int e = 4 * lane; e < kept; e += 128) {
            for (int k = 0; k < 4 && e + k < kept; k++) s += expf(xr[e + k] - m);
        }
    } else {
        for (int i = lane; i < kept; i += 32) s += expf(xr[i] - m);
    }
    s = ember_warp_sum(s);
    if (logOut) {
        const float ls = logf(s);
        for (int i = lane; i < n; i += 32) yr[i] = i >= kept ? 0.0f : xr[i] - m - ls;
    } else {
        const float inv = 1.0f / s;
        for (int i = lane; i < n; i += 32) yr[i] = i >= kept ? 0.0f : expf(xr[i] - m) * inv;
    }
}

// ember_softmax_vec says whether rows of n of x and y take 16-byte accesses.
__device__ __forceinline__ bool ember_softmax_vec(const float* y, const float* x, int n) {
    return (n & 3) == 0 && ((reinterpret_cast<unsigned long long>(x) | reinterpret_cast<unsigned long long>(y)) & 15) == 0;
}

// Rows (inner == 1), a warp each; the grid loops over rows.
extern "C" __global__ void ember_softmax_rows(float* y, const float* x, long long rows, int n, int logOut) {
    const int lane = threadIdx.x & 31;
    const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    const bool vec = ember_softmax_vec(y, x, n);
    for (long long r = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < rows; r += warps) {
        ember_softmax_row(y + r * n, x + r * n, n, n, lane, logOut, vec);
    }
}

// ember_softmax_rows4_body is ember_softmax_rows for rows of n <= 128*J,
// n a multiple of 4, x and y 16-byte aligned, in a kernel of its own per
// size class (J) so that short rows do not pay the registers of the long
// ones (the shared kernel's 1024-wide template limited the warps resident
// on an SM), R rows a warp at a time: every load of the R rows is issued
// before the first reduction waits on them. The operations and their order
// are ember_softmax_row4's, so the results are the same bits.
template <int J, int R>
__device__ __forceinline__ void ember_softmax_rows4_body(float* y, const float* x, long long rows, int n, int logOut) {
    const int lane = threadIdx.x & 31;
    const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long r0 = ((long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * R; r0 < rows; r0 += warps * R) {
        float v[R][J][4];
        float m[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            const float* xr = x + (r0 + r) * n;
            m[r] = ember_neg_inf();
#pragma unroll
            for (int j = 0; j < J; j++) {
                const int e = 4 * (lane + 32 * j);
                if (r0 + r < rows && e < n) {
                    const ember_f4 q = *reinterpret_cast<const ember_f4*>(xr + e);
                    v[r][j][0] = q.x;
                    v[r][j][1] = q.y;
                    v[r][j][2] = q.z;
                    v[r][j][3] = q.w;
                } else {
#pragma unroll
                    for (int k = 0; k < 4; k++) v[r][j][k] = ember_neg_inf();
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
#pragma unroll
            for (int j = 0; j < J; j++) {
#pragma unroll
                for (int k = 0; k < 4; k++) m[r] = ember_nan_max(m[r], v[r][j][k]);
            }
            m[r] = ember_warp_max(m[r]);
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            float s = 0.0f;
#pragma unroll
            for (int j = 0; j < J; j++) {
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    if (4 * (lane + 32 * j) + k < n) {
                        const float t = expf(v[r][j][k] - m[r]);
                        s += t;
                        if (!logOut) v[r][j][k] = t;
                    }
                }
            }
            s = ember_warp_sum(s);
            if (r0 + r >= rows) continue;
            const float ls = logOut ? logf(s) : 0.0f, inv = logOut ? 0.0f : 1.0f / s;
            float* yr = y + (r0 + r) * n;
#pragma unroll
            for (int j = 0; j < J; j++) {
                const int e = 4 * (lane + 32 * j);
                if (e >= n) break;
                float o[4];
#pragma unroll
                for (int k = 0; k < 4; k++) o[k] = logOut ? v[r][j][k] - m[r] - ls : v[r][j][k] * inv;
                const ember_f4 q = {o[0], o[1], o[2], o[3]};
                *reinterpret_cast<ember_f4*>(yr + e) = q;
            }
        }
    }
}

// The size classes, ember_softmax_rows4_JxR (written out: the Go side
// finds kernels by their extern "C" declarations).
extern "C" __global__ void ember_softmax_rows4_1x2(float* y, const float* x, long long rows, int n, int logOut) {
    ember_softmax_rows4_body<1, 2>(y, x, rows, n, logOut);
}
extern "C" __global__ void ember_softmax_rows4_2x1(float* y, const float* x, long long rows, int n, int logOut) {
    ember_softmax_rows4_body<2, 1>(y, x, rows, n, logOut);
}
extern "C" __global__ void ember_softmax_rows4_4x1(float* y, const float* x, long long rows, int n, int logOut) {
    ember_softmax_rows4_body<4, 1>(y, x, rows, n, logOut);
}
extern "C" __global__ void ember_softmax_rows4_8x1(float* y, const float* x, long long rows, int n, int logOut) {
    ember_softmax_rows4_body<8, 1>(y, x, rows, n, logOut);
}

// Causal attention scores [rows, n], rows = batch·t: row r is query
// q = r mod t, whose softmax is over its first min(q+1, n) scores; the
// rest are masked: never read, and their probabilities written as 0. This
// is the softmax of the scores plus a mask of -Inf after the diagonal,
// bit for bit (a masked score adds e^-Inf = 0 to a lane's sum).
extern "C" __global__ void ember_softmax_rows_causal(float* y, const float* x, long long rows, int n, long long t) {
    const int lane = threadIdx.x & 31;
    const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    const bool vec = ember_softmax_vec(y, x, n);
    for (long long r = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < rows; r += warps) {
        const long long q = r % t;
        const int kept = q + 1 < n ? (int)(q + 1) : n;
        ember_softmax_row(y + r * n, x + r * n, n, kept, lane, 0, vec);
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

// The backward pass: s = Σ dy (log-softmax) or Σ dy·y in double, then
// dx = dy - e^y·s or y·(dy - s) in double, rounded once to float. e^y is
// the float expf (within 2 ulp): the double exp, a long subroutine for
// every element, made log-softmax's backward pass bound by its
// instructions, 70 us behind softmax's on [64,6,256,256] and behind
// PyTorch's (docs/performance.md, round 36); the conformance suite's bound
// allows u·|y| of e^y's relative error.
__device__ __forceinline__ float ember_softmax_grad(float g, float y, double s, int logOut) {
    return logOut ? (float)((double)g - (double)expf(y) * s) : (float)((double)y * ((double)g - s));
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
