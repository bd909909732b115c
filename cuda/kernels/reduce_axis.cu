// reduce_axis.cu: reductions over the middle axis of [outer, n, inner]
// (tensor.Backend's Reduce), mirroring tensor/cpu_reduce.go. Sums are in
// double, extremes pick the first NaN or else the extreme with the lowest
// index; every combination is a fixed tree, so results are deterministic
// (no atomics). Op codes are tensor.ReduceOp.
//
// Two layouts: rows (inner == 1), a warp per row, or a block per row for
// long rows, with shuffles; columns (inner > 1), 32 adjacent columns per
// block row so that loads are coalesced, the axis split over the block's 8
// rows of threads and the 8 partials combined in order in shared memory.

#define EMBER_R_SUM 0
#define EMBER_R_MAX 1
#define EMBER_R_MIN 2
#define EMBER_R_ARGMAX 3
#define EMBER_R_ARGMIN 4

// An extreme so far: value (negated for min ops, an exact operation that
// keeps NaN) and index; at < 0 means none yet.
struct ember_best {
    float v;
    long long at;
};

// ember_better says whether b beats a: a NaN beats a number, a larger value
// beats a smaller, and between equals (or two NaNs) the lower index wins.
// This is a total order, so combining in any tree gives the same winner.
__device__ __forceinline__ bool ember_better(ember_best b, ember_best a) {
    if (b.at < 0) return false;
    if (a.at < 0) return true;
    const bool bn = b.v != b.v, an = a.v != a.v;
    if (bn != an) return bn;
    if (!bn && b.v != a.v) return b.v > a.v;
    return b.at < a.at;
}

__device__ __forceinline__ ember_best ember_warp_best(ember_best v) {
    for (int o = 16; o > 0; o >>= 1) {
        ember_best u;
        u.v = __shfl_xor_sync(0xffffffffu, v.v, o);
        u.at = __shfl_xor_sync(0xffffffffu, v.at, o);
        if (ember_better(u, v)) v = u;
    }
    return v;
}

__device__ __forceinline__ void ember_reduce_store(float* dstf, int* dsti, long long r, int op, int acc, double sum,
                                                   ember_best best) {
    switch (op) {
    case EMBER_R_SUM:
        if (acc) {
            dstf[r] = dstf[r] + (float)sum;
        } else {
            dstf[r] = (float)sum;
        }
        break;
    case EMBER_R_MAX: dstf[r] = best.v; break;
    case EMBER_R_MIN: dstf[r] = -best.v; break;
    default: dsti[r] = (int)best.at; break;
    }
}

// Rows of length n, a warp each (blockDim.x a multiple of 32; warps stride
// over the rows).
extern "C" __global__ void ember_reduce_rows_warp(float* dstfOrNull, int* dstiOrNull, const float* x, long long rows, long long n,
                                                  int op, int acc) {
    const int lane = threadIdx.x & 31;
    const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
    const float sign = (op == EMBER_R_MIN || op == EMBER_R_ARGMIN) ? -1.0f : 1.0f;
    for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows; r += warps) {
        const float* row = x + r * n;
        double sum = 0.0;
        ember_best best = {0.0f, -1};
        for (long long k = lane; k < n; k += 32) {
            const float v = row[k];
            if (op == EMBER_R_SUM) {
                sum += (double)v;
            } else {
                const ember_best c = {sign * v, k};
                if (ember_better(c, best)) best = c;
            }
        }
        if (op == EMBER_R_SUM) {
            sum = ember_warp_sum_d(sum);
        } else {
            best = ember_warp_best(best);
        }
        if (lane == 0) ember_reduce_store(dstfOrNull, dstiOrNull, r, op, acc, sum, best);
    }
}

// ember_block_reduce reduces row[lo, hi) over the block (blockDim.x a
// multiple of 32, at most 1024; every thread must call it): each thread
// strides over the range, warps combine by shuffles, warp 0 combines the
// warps in order. The result is valid in thread 0.
__device__ __forceinline__ void ember_block_reduce(const float* row, long long lo, long long hi, int op, float sign,
                                                   double& sumOut, ember_best& bestOut) {
    __shared__ double bsum[32];
    __shared__ float bv[32];
    __shared__ long long bat[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    double sum = 0.0;
    ember_best best = {0.0f, -1};
    for (long long k = lo + threadIdx.x; k < hi; k += blockDim.x) {
        const float v = row[k];
        if (op == EMBER_R_SUM) {
            sum += (double)v;
        } else {
            const ember_best c = {sign * v, k};
            if (ember_better(c, best)) best = c;
        }
    }
    if (op == EMBER_R_SUM) {
        sum = ember_warp_sum_d(sum);
    } else {
        best = ember_warp_best(best);
    }
    if (lane == 0) {
        bsum[warp] = sum;
        bv[warp] = best.v;
        bat[warp] = best.at;
    }
    __syncthreads();
    if (warp == 0) {
        double s = lane < nw ? bsum[lane] : 0.0;
        ember_best b = {0.0f, -1};
        if (lane < nw) {
            b.v = bv[lane];
            b.at = bat[lane];
        }
        if (op == EMBER_R_SUM) {
            s = ember_warp_sum_d(s);
        } else {
            b = ember_warp_best(b);
        }
        sumOut = s;
        bestOut = b;
    }
    __syncthreads();
}

// Long rows, a block each (blockDim.x a multiple of 32, at most 1024):
// ember_block_reduce over the whole row.
extern "C" __global__ void ember_reduce_rows_block(float* dstfOrNull, int* dstiOrNull, const float* x, long long rows, long long n,
                                                   int op, int acc) {
    const float sign = (op == EMBER_R_MIN || op == EMBER_R_ARGMIN) ? -1.0f : 1.0f;
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        double s = 0.0;
        ember_best b = {0.0f, -1};
        ember_block_reduce(x + r * n, 0, n, op, sign, s, b);
        if (threadIdx.x == 0) ember_reduce_store(dstfOrNull, dstiOrNull, r, op, acc, s, b);
    }
}

// Columns: block (32, 8); threadIdx.x picks one of 32 adjacent columns
// j = o*inner + i of the outer*inner outputs, threadIdx.y one of 8
// interleaved parts of the axis. Blocks stride over column groups.
extern "C" __global__ void ember_reduce_cols(float* dstfOrNull, int* dstiOrNull, const float* x, long long outer, long long n,
                                             long long inner, int op, int acc) {
    __shared__ double psum[8][32];
    __shared__ float pv[8][32];
    __shared__ long long pat[8][32];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const long long cols = outer * inner;
    const float sign = (op == EMBER_R_MIN || op == EMBER_R_ARGMIN) ? -1.0f : 1.0f;
    for (long long j0 = (long long)blockIdx.x * 32; j0 < cols; j0 += (long long)gridDim.x * 32) {
        const long long j = j0 + tx;
        double sum = 0.0;
        ember_best best = {0.0f, -1};
        if (j < cols) {
            const long long o = j / inner, i = j - o * inner;
            const float* col = x + o * n * inner + i;
            for (long long k = ty; k < n; k += 8) {
                const float v = col[k * inner];
                if (op == EMBER_R_SUM) {
                    sum += (double)v;
                } else {
                    const ember_best c = {sign * v, k};
                    if (ember_better(c, best)) best = c;
                }
            }
        }
        psum[ty][tx] = sum;
        pv[ty][tx] = best.v;
        pat[ty][tx] = best.at;
        __syncthreads();
        if (ty == 0 && j < cols) {
            for (int p = 1; p < 8; p++) {
                sum += psum[p][tx];
                const ember_best c = {pv[p][tx], pat[p][tx]};
                if (ember_better(c, best)) best = c;
            }
            ember_reduce_store(dstfOrNull, dstiOrNull, j, op, acc, sum, best);
        }
        __syncthreads();
    }
}

// Few long rows, pass 1: block (c, r) reduces chunk c (chunk elements) of
// row r into partial r*gridDim.x + c, so that a handful of rows still
// fills the GPU.
extern "C" __global__ void ember_reduce_rows_part(double* psum, float* pv, long long* pat, const float* x, long long n,
                                                  long long chunk, int op) {
    const float sign = (op == EMBER_R_MIN || op == EMBER_R_ARGMIN) ? -1.0f : 1.0f;
    const long long r = blockIdx.y, c = blockIdx.x;
    const long long lo = c * chunk;
    const long long hi = lo + chunk < n ? lo + chunk : n;
    double s = 0.0;
    ember_best b = {0.0f, -1};
    ember_block_reduce(x + r * n, lo, hi, op, sign, s, b);
    if (threadIdx.x == 0) {
        const long long p = r * gridDim.x + c;
        psum[p] = s;
        pv[p] = b.v;
        pat[p] = b.at;
    }
}

// Pass 2: a warp per row combines the row's chunks partials (lanes stride
// over them, then a butterfly: a fixed tree).
extern "C" __global__ void ember_reduce_rows_join(float* dstfOrNull, int* dstiOrNull, const double* psum, const float* pv,
                                                  const long long* pat, long long rows, int chunks, int op, int acc) {
    const int lane = threadIdx.x & 31;
    const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows; r += warps) {
        double sum = 0.0;
        ember_best best = {0.0f, -1};
        for (int c = lane; c < chunks; c += 32) {
            const long long p = r * chunks + c;
            sum += psum[p];
            const ember_best u = {pv[p], pat[p]};
            if (ember_better(u, best)) best = u;
        }
        if (op == EMBER_R_SUM) {
            sum = ember_warp_sum_d(sum);
        } else {
            best = ember_warp_best(best);
        }
        if (lane == 0) ember_reduce_store(dstfOrNull, dstiOrNull, r, op, acc, sum, best);
    }
}

// Few columns along a long axis, pass 1: block (g, c) of (32, 8) threads
// reduces chunk c (chunk elements of the axis) of the 32 columns of group
// g, as ember_reduce_cols does a whole axis, into partial c*cols + j.
extern "C" __global__ void ember_reduce_cols_part(double* psum, float* pv, long long* pat, const float* x,
                                                  long long outer, long long n, long long inner, long long chunk,
                                                  int op) {
    __shared__ double ssum[8][32];
    __shared__ float sv[8][32];
    __shared__ long long sat[8][32];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const long long cols = outer * inner;
    const float sign = (op == EMBER_R_MIN || op == EMBER_R_ARGMIN) ? -1.0f : 1.0f;
    const long long j = (long long)blockIdx.x * 32 + tx, c = blockIdx.y;
    const long long lo = c * chunk;
    const long long hi = lo + chunk < n ? lo + chunk : n;
    double sum = 0.0;
    ember_best best = {0.0f, -1};
    if (j < cols) {
        const long long o = j / inner, i = j - o * inner;
        const float* col = x + o * n * inner + i;
        for (long long k = lo + ty; k < hi; k += 8) {
            const float v = col[k * inner];
            if (op == EMBER_R_SUM) {
                sum += (double)v;
            } else {
                const ember_best u = {sign * v, k};
                if (ember_better(u, best)) best = u;
            }
        }
    }
    ssum[ty][tx] = sum;
    sv[ty][tx] = best.v;
    sat[ty][tx] = best.at;
    __syncthreads();
    if (ty == 0 && j < cols) {
        for (int p = 1; p < 8; p++) {
            sum += ssum[p][tx];
            const ember_best u = {sv[p][tx], sat[p][tx]};
            if (ember_better(u, best)) best = u;
        }
        const long long q = c * cols + j;
        psum[q] = sum;
        pv[q] = best.v;
        pat[q] = best.at;
    }
}

// Pass 2: a thread per column adds its chunks' partials in order.
extern "C" __global__ void ember_reduce_cols_join(float* dstfOrNull, int* dstiOrNull, const double* psum, const float* pv,
                                                  const long long* pat, long long cols, int chunks, int op, int acc) {
    EMBER_LOOP(long long, j, cols) {
        double sum = 0.0;
        ember_best best = {0.0f, -1};
        for (int c = 0; c < chunks; c++) {
            const long long q = (long long)c * cols + j;
            sum += psum[q];
            const ember_best u = {pv[q], pat[q]};
            if (ember_better(u, best)) best = u;
        }
        ember_reduce_store(dstfOrNull, dstiOrNull, j, op, acc, sum, best);
    }
}
