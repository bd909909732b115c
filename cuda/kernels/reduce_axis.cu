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
#define EMBER_R_MEAN 5

// ember_r_sum says whether op adds (a sum, or a mean: the sum divided by n
// when it is stored).
__device__ __forceinline__ bool ember_r_sum(int op) { return op == EMBER_R_SUM || op == EMBER_R_MEAN; }

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

// ember_reduce_store writes output r: a sum (added to it when acc), a mean
// (the double sum divided by the axis's n, then rounded once), an extreme
// or its index.
__device__ __forceinline__ void ember_reduce_store(float* dstf, int* dsti, long long r, int op, int acc, double sum,
                                                   ember_best best, long long n) {
    switch (op) {
    case EMBER_R_MEAN: dstf[r] = (float)(sum / (double)n); break;
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

// ember_scaled_store writes output r of a sum or a mean: the double sum
// times scale (1 for a sum, 1/n computed by the host for a mean of n),
// rounded once, added to dst[r] when acc. A division here (a call of the
// double division's subroutine) cost the rows' kernel 9% of its speed on
// the H200, even for sums, which never take it.
__device__ __forceinline__ void ember_scaled_store(float* dst, long long r, double sum, double scale, int acc) {
    const float v = (float)(sum * scale);
    if (acc) {
        dst[r] = dst[r] + v;
    } else {
        dst[r] = v;
    }
}

// Sums and means of rows of n floats, n a multiple of 4, from a 16-byte
// aligned x: a warp per row (warps stride over the rows), each lane
// issuing its four float4 loads of the row's next 128 (lane, lane + 32,
// ...) before it adds them (ember_ld_read). A kernel of sums alone: ember_reduce_rows_warp
// serves every op and holds more registers. Measured on the H200: rows of
// 784 ([32768,784]) 26.2-26.6 us against its 30.1, rows of 384 5.5-5.9
// against 6.6 (docs/performance.md, round 20). At most 256 threads a block.
// ember_reduce_rows_sum4 reads through ember_ld_once (inputs larger than
// half the L2 cache), ember_reduce_rows_sum4_l2 with plain loads.
template <bool Once>
__device__ __forceinline__ void ember_rows_sum4(float* dst, const float* x, long long rows, long long n, double scale, int acc) {
    const int lane = threadIdx.x & 31;
    const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
    const long long n4 = n >> 2;
    for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows; r += warps) {
        const ember_f4* row = reinterpret_cast<const ember_f4*>(x) + r * n4;
        double s = 0.0;
        for (long long q0 = lane; q0 < n4; q0 += 128) {
            ember_f4 v[4];
#pragma unroll
            for (int j = 0; j < 4; j++) v[j] = q0 + 32 * j < n4 ? ember_ld_read(row + q0 + 32 * j, Once) : ember_f4{0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int j = 0; j < 4; j++) s += ((double)v[j].x + (double)v[j].y) + ((double)v[j].z + (double)v[j].w);
        }
        s = ember_warp_sum_d(s);
        if (lane == 0) ember_scaled_store(dst, r, s, scale, acc);
    }
}

// Two entry points, the load chosen when compiled: a flag read at run
// time, as the other reductions take it, cost the rows of a 103 MB input
// 8% on the H200 (28.6 us against 26.5).
extern "C" __global__ void __launch_bounds__(256, 8) ember_reduce_rows_sum4(float* dst, const float* x, long long rows,
                                                                             long long n, double scale, int acc) {
    ember_rows_sum4<true>(dst, x, rows, n, scale, acc);
}
extern "C" __global__ void __launch_bounds__(256, 8) ember_reduce_rows_sum4_l2(float* dst, const float* x, long long rows,
                                                                                long long n, double scale, int acc) {
    ember_rows_sum4<false>(dst, x, rows, n, scale, acc);
}

// ember_lanes_reduce combines row[k] for k = k0, k0 + step, ... below hi
// over a warp (every lane calling it): the double sum of a sum or mean op,
// else the extreme (ember_better) with its index. Both are valid in every
// lane.
__device__ __forceinline__ void ember_lanes_reduce(const float* row, long long k0, long long hi, long long step, int op,
                                                   float sign, double& sumOut, ember_best& bestOut) {
    double sum = 0.0;
    ember_best best = {0.0f, -1};
    for (long long k = k0; k < hi; k += step) {
        const float v = row[k];
        if (ember_r_sum(op)) {
            sum += (double)v;
        } else {
            const ember_best c = {sign * v, k};
            if (ember_better(c, best)) best = c;
        }
    }
    if (ember_r_sum(op)) {
        sumOut = ember_warp_sum_d(sum);
    } else {
        bestOut = ember_warp_best(best);
    }
}

// Rows of length n, a warp each (blockDim.x a multiple of 32; warps stride
// over the rows), for every op (sums of float4 rows go to
// ember_reduce_rows_sum4).
extern "C" __global__ void ember_reduce_rows_warp(float* dstfOrNull, int* dstiOrNull, const float* x, long long rows, long long n,
                                                  int op, int acc) {
    const int lane = threadIdx.x & 31;
    const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
    const float sign = (op == EMBER_R_MIN || op == EMBER_R_ARGMIN) ? -1.0f : 1.0f;
    for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows; r += warps) {
        double sum = 0.0;
        ember_best best = {0.0f, -1};
        ember_lanes_reduce(x + r * n, lane, n, 32, op, sign, sum, best);
        if (lane == 0) ember_reduce_store(dstfOrNull, dstiOrNull, r, op, acc, sum, best, n);
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
    ember_lanes_reduce(row, lo + threadIdx.x, hi, blockDim.x, op, sign, sum, best);
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
        if (ember_r_sum(op)) {
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
        if (threadIdx.x == 0) ember_reduce_store(dstfOrNull, dstiOrNull, r, op, acc, s, b, n);
    }
}

// Columns: block (32, R); threadIdx.x picks one of 32 adjacent columns
// j = o*inner + i of the outer*inner outputs, threadIdx.y one of R
// interleaved parts of the axis. Blocks stride over column groups.
template <int R>
__device__ __forceinline__ void ember_reduce_cols_body(float* dstfOrNull, int* dstiOrNull, const float* x,
                                                       long long outer, long long n, long long inner, int op,
                                                       int acc) {
    __shared__ double psum[R][32];
    __shared__ float pv[R][32];
    __shared__ long long pat[R][32];
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
            for (long long k = ty; k < n; k += R) {
                const float v = col[k * inner];
                if (ember_r_sum(op)) {
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
            for (int p = 1; p < R; p++) {
                sum += psum[p][tx];
                const ember_best c = {pv[p][tx], pat[p][tx]};
                if (ember_better(c, best)) best = c;
            }
            ember_reduce_store(dstfOrNull, dstiOrNull, j, op, acc, sum, best, n);
        }
        __syncthreads();
    }
}

// Block (32, 8): the many column groups of a wide reduction.
extern "C" __global__ void ember_reduce_cols(float* dstfOrNull, int* dstiOrNull, const float* x, long long outer, long long n,
                                             long long inner, int op, int acc) {
    ember_reduce_cols_body<8>(dstfOrNull, dstiOrNull, x, outer, n, inner, op, acc);
}

// Block (32, 32): few column groups along a short axis (a block of 1024
// threads each, so that one launch reads them with 32 loads in flight per
// column: the second stage of a sum over axes 0, 2, 3, [512, 64] over 512,
// in one pass instead of a split and its join).
extern "C" __global__ void ember_reduce_cols32(float* dstfOrNull, int* dstiOrNull, const float* x, long long outer,
                                               long long n, long long inner, int op, int acc) {
    ember_reduce_cols_body<32>(dstfOrNull, dstiOrNull, x, outer, n, inner, op, acc);
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
                                                  const long long* pat, long long rows, long long n, int chunks, int op,
                                                  int acc) {
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
        if (ember_r_sum(op)) {
            sum = ember_warp_sum_d(sum);
        } else {
            best = ember_warp_best(best);
        }
        if (lane == 0) ember_reduce_store(dstfOrNull, dstiOrNull, r, op, acc, sum, best, n);
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
            if (ember_r_sum(op)) {
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
                                                  const long long* pat, long long cols, long long n, int chunks, int op,
                                                  int acc) {
    EMBER_LOOP(long long, j, cols) {
        double sum = 0.0;
        ember_best best = {0.0f, -1};
        for (int c = 0; c < chunks; c++) {
            const long long q = (long long)c * cols + j;
            sum += psum[q];
            const ember_best u = {pv[q], pat[q]};
            if (ember_better(u, best)) best = u;
        }
        ember_reduce_store(dstfOrNull, dstiOrNull, j, op, acc, sum, best, n);
    }
}

// Per-channel sums and means: dst[c] (+)= the sum (or mean) of x[n, c, q]
// over n < outer and q < inner, x viewed as [outer, channels, inner] (a
// SumAxes over (0, 2, 3) of NCHW, a convolution's bias gradient). One pass
// instead of two Reduce stages (rows of inner, then the outer column of
// their sums), whose first stage on short rows (784) reached 77% of the
// copy rate and whose second was a launch of its own.
//
// Grid (channels, splits): block (c, s) reads the chunk [s*chunk,
// (s+1)*chunk) of channel c's outer*inner elements as one flat run (flat
// index k -> (n, q) by one division), so that a channel is split however
// few its rows (outer may be 1) and the blocks fill the GPU several times.
// When inner is a multiple of 4 and x is 16-byte aligned the run is read
// as float4 (each group of 4 added in float32, then to the thread's
// double); else one float at a time. Every thread keeps four loads in
// flight. A block adds its threads in a fixed tree (ember_block_sum_d);
// with several splits it writes partial[c*splits + s] and
// ember_reduce_channels_join adds them in order. The partition depends on
// the shape alone (chunk is a multiple of 4 elements, so both paths split
// alike), so results are the same bits run to run.

// ember_chan_val is the sum of the floats of one load.
__device__ __forceinline__ float ember_chan_val(const float* p, long long a) { return p[a]; }
__device__ __forceinline__ float ember_chan_val(const ember_f4* p, long long a) {
    const ember_f4 v = p[a];
    return (v.x + v.y) + (v.z + v.w);
}

// ember_chan_at is the offset of flat index k = n*innerV + q of a channel
// whose rows lie strideV apart.
template <typename I>
__device__ __forceinline__ long long ember_chan_at(I k, I innerV, long long strideV) {
    const I n = k / innerV;
    return (long long)n * strideV + (long long)(k - n * innerV);
}

// ember_chan_sum is this thread's double sum of the flat indices [lo, hi)
// of a channel starting at p (units of T: float or float4), threads
// striding by blockDim.x, four loads issued before they are added.
template <typename I, typename T>
__device__ __forceinline__ double ember_chan_sum(const T* p, I lo, I hi, I innerV, long long strideV) {
    const I step = blockDim.x;
    double s = 0.0;
    I k = lo + threadIdx.x;
    for (; k + 3 * step < hi; k += 4 * step) {
        const float a = ember_chan_val(p, ember_chan_at(k, innerV, strideV));
        const float b = ember_chan_val(p, ember_chan_at(k + step, innerV, strideV));
        const float c = ember_chan_val(p, ember_chan_at(k + 2 * step, innerV, strideV));
        const float d = ember_chan_val(p, ember_chan_at(k + 3 * step, innerV, strideV));
        s += (double)a;
        s += (double)b;
        s += (double)c;
        s += (double)d;
    }
    for (; k < hi; k += step) s += (double)ember_chan_val(p, ember_chan_at(k, innerV, strideV));
    return s;
}

// ember_chan_store writes channel c's result: the mean (the double sum
// divided by count, rounded once) or the sum (added to dst[c] when acc).
__device__ __forceinline__ void ember_chan_store(float* dst, long long c, double s, int op, int acc, long long count) {
    if (op == EMBER_R_MEAN) {
        dst[c] = (float)(s / (double)count);
    } else if (acc) {
        dst[c] = dst[c] + (float)s;
    } else {
        dst[c] = (float)s;
    }
}

// ember_reduce_channels: grid (channels, splits), 1-D blocks of a multiple
// of 32 threads; chunk is the elements of a channel per block (a multiple
// of 4); op is EMBER_R_SUM or EMBER_R_MEAN. partialOrNull is read only
// when gridDim.y > 1.
// Cost: reads outer*channels*inner*4 bytes once (ResNet's [512,64,28,28]:
// 103 MB, 24.5 us at the 4187 GB/s of the copy).
extern "C" __global__ void ember_reduce_channels(float* dst, double* partialOrNull, const float* x, long long outer,
                                                 long long channels, long long inner, long long chunk, int op,
                                                 int acc) {
    const long long c = blockIdx.x;
    const bool vec = (inner & 3) == 0 && (reinterpret_cast<unsigned long long>(x) & 15) == 0;
    const long long innerV = vec ? inner >> 2 : inner, chunkV = vec ? chunk >> 2 : chunk;
    const long long total = outer * innerV;
    const long long lo = (long long)blockIdx.y * chunkV;
    const long long hi = lo + chunkV < total ? lo + chunkV : total;
    // 32-bit division while every index this block forms fits.
    const bool small = hi + 4LL * blockDim.x < (1LL << 32);
    double s;
    if (vec) {
        const ember_f4* p = reinterpret_cast<const ember_f4*>(x) + c * innerV;
        if (small) {
            s = ember_chan_sum<unsigned>(p, (unsigned)lo, (unsigned)hi, (unsigned)innerV, channels * innerV);
        } else {
            s = ember_chan_sum<unsigned long long>(p, lo, hi, innerV, channels * innerV);
        }
    } else {
        const float* p = x + c * inner;
        if (small) {
            s = ember_chan_sum<unsigned>(p, (unsigned)lo, (unsigned)hi, (unsigned)inner, channels * inner);
        } else {
            s = ember_chan_sum<unsigned long long>(p, lo, hi, inner, channels * inner);
        }
    }
    s = ember_block_sum_d(s);
    if (threadIdx.x == 0) {
        if (gridDim.y > 1) {
            partialOrNull[c * gridDim.y + blockIdx.y] = s;
        } else {
            ember_chan_store(dst, c, s, op, acc, outer * inner);
        }
    }
}

// ember_reduce_channels_join: dst[c] from the parts partial sums of channel
// c (lane l adds l, l+32, ... in order, then a xor tree): one warp per
// channel, 1-D blocks of a multiple of 32 threads. count is outer*inner.
// Cost: channels*parts*8 bytes (64 x 49 doubles for ResNet's row): launch
// bound.
extern "C" __global__ void ember_reduce_channels_join(float* dst, const double* partial, long long channels, int parts,
                                                      long long count, int op, int acc) {
    const int lane = threadIdx.x & 31;
    const long long wpb = blockDim.x >> 5;
    for (long long c = (long long)blockIdx.x * wpb + (threadIdx.x >> 5); c < channels; c += gridDim.x * wpb) {
        const double* p = partial + c * parts;
        double s = 0.0;
        for (int j = lane; j < parts; j += 32) s += p[j];
        s = ember_warp_sum_d(s);
        if (lane == 0) ember_chan_store(dst, c, s, op, acc, count);
    }
}

// ember_reduce_channel_whole_*: the sums (scale 1, added to dst when acc)
// or means (scale 1/(outer*inner)) of each channel of x [outer, channels,
// inner], block c summing channel c alone: no partial sums, no counter, no
// join. A warp takes U rows at a time, each lane issuing V loads a row
// (float4 for the _4 entry points: inner a multiple of 4, x 16-byte
// aligned; floats for the _1 ones) before it adds them, in float within a
// float4 and in double across; the block adds its warps in a fixed order,
// so the bits depend on the shape alone. As for the rows' sums, the load
// is chosen when compiled: ember_ld_once without _l2, a plain load with
// it. The host takes these where there are channels enough to fill the GPU
// with blocks of up to 1,024 threads (chanWholeMin): on the H200 they read
// [512,128,14,14] in 14.7-14.8 us where 8 blocks a channel and the join of
// the last to arrive took 16.2 (docs/performance.md, round 36). Any
// multiple of 32 threads up to 1,024; the entry points declare one block
// an SM, so that the compiler keeps every load of a batch in flight (53
// registers) instead of adding each load's values before the next loads
// to fit two blocks in 32 registers, which cost 7-15% (round 36).
template <typename T>
__device__ __forceinline__ float ember_lanes_value(const T& v) {
    return (v.x + v.y) + (v.z + v.w);
}
template <>
__device__ __forceinline__ float ember_lanes_value<float>(const float& v) {
    return v;
}

template <typename T, int U, int V, bool Once>
__device__ __forceinline__ void ember_channel_whole(float* dst, const T* x, long long outer, long long channels,
                                                    long long innerV, double scale, int acc) {
    const long long c = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const long long rowStride = channels * innerV;
    const T* base = x + c * innerV;
    double s = 0.0;
    for (long long o0 = (long long)warp * U; o0 < outer; o0 += (long long)nw * U) {
        for (long long q0 = lane; q0 < innerV; q0 += 32 * V) {
            T v[U][V];
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int j = 0; j < V; j++)
                    v[u][j] = o0 + u < outer && q0 + 32 * j < innerV ? ember_ld_read(base + (o0 + u) * rowStride + q0 + 32 * j, Once) : T{};
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int j = 0; j < V; j++) s += (double)ember_lanes_value(v[u][j]);
        }
    }
    s = ember_block_sum_d(s);
    if (threadIdx.x == 0) ember_scaled_store(dst, c, s, scale, acc);
}

// The entry points, by row length (chanWholeKernel); the kernel table needs
// each declared literally.
// rows of at most 64 float4
extern "C" __global__ void __launch_bounds__(1024, 1)
    ember_reduce_channel_whole4_u2v2(float* dst, const float* x, long long outer, long long channels, long long innerV,
        double scale, int acc) {
    ember_channel_whole<ember_f4, 2, 2, true>(dst, reinterpret_cast<const ember_f4*>(x), outer, channels, innerV, scale, acc);
}
extern "C" __global__ void __launch_bounds__(1024, 1)
    ember_reduce_channel_whole4_u2v2_l2(float* dst, const float* x, long long outer, long long channels, long long innerV,
        double scale, int acc) {
    ember_channel_whole<ember_f4, 2, 2, false>(dst, reinterpret_cast<const ember_f4*>(x), outer, channels, innerV, scale, acc);
}
// 65 to 128 float4, and more than 224
extern "C" __global__ void __launch_bounds__(1024, 1)
    ember_reduce_channel_whole4_u1v4(float* dst, const float* x, long long outer, long long channels, long long innerV,
        double scale, int acc) {
    ember_channel_whole<ember_f4, 1, 4, true>(dst, reinterpret_cast<const ember_f4*>(x), outer, channels, innerV, scale, acc);
}
extern "C" __global__ void __launch_bounds__(1024, 1)
    ember_reduce_channel_whole4_u1v4_l2(float* dst, const float* x, long long outer, long long channels, long long innerV,
        double scale, int acc) {
    ember_channel_whole<ember_f4, 1, 4, false>(dst, reinterpret_cast<const ember_f4*>(x), outer, channels, innerV, scale, acc);
}
// 129 to 224 float4 (a 28x28 image: one batch a row)
extern "C" __global__ void __launch_bounds__(1024, 1)
    ember_reduce_channel_whole4_u1v7(float* dst, const float* x, long long outer, long long channels, long long innerV,
        double scale, int acc) {
    ember_channel_whole<ember_f4, 1, 7, true>(dst, reinterpret_cast<const ember_f4*>(x), outer, channels, innerV, scale, acc);
}
extern "C" __global__ void __launch_bounds__(1024, 1)
    ember_reduce_channel_whole4_u1v7_l2(float* dst, const float* x, long long outer, long long channels, long long innerV,
        double scale, int acc) {
    ember_channel_whole<ember_f4, 1, 7, false>(dst, reinterpret_cast<const ember_f4*>(x), outer, channels, innerV, scale, acc);
}
// rows of floats: at most 64
extern "C" __global__ void __launch_bounds__(1024, 1)
    ember_reduce_channel_whole1_u4v2(float* dst, const float* x, long long outer, long long channels, long long innerV,
        double scale, int acc) {
    ember_channel_whole<float, 4, 2, true>(dst, x, outer, channels, innerV, scale, acc);
}
extern "C" __global__ void __launch_bounds__(1024, 1)
    ember_reduce_channel_whole1_u4v2_l2(float* dst, const float* x, long long outer, long long channels, long long innerV,
        double scale, int acc) {
    ember_channel_whole<float, 4, 2, false>(dst, x, outer, channels, innerV, scale, acc);
}
// 65 to 128 floats
extern "C" __global__ void __launch_bounds__(1024, 1)
    ember_reduce_channel_whole1_u2v4(float* dst, const float* x, long long outer, long long channels, long long innerV,
        double scale, int acc) {
    ember_channel_whole<float, 2, 4, true>(dst, x, outer, channels, innerV, scale, acc);
}
extern "C" __global__ void __launch_bounds__(1024, 1)
    ember_reduce_channel_whole1_u2v4_l2(float* dst, const float* x, long long outer, long long channels, long long innerV,
        double scale, int acc) {
    ember_channel_whole<float, 2, 4, false>(dst, x, outer, channels, innerV, scale, acc);
}
// more than 128 floats
extern "C" __global__ void __launch_bounds__(1024, 1)
    ember_reduce_channel_whole1_u1v8(float* dst, const float* x, long long outer, long long channels, long long innerV,
        double scale, int acc) {
    ember_channel_whole<float, 1, 8, true>(dst, x, outer, channels, innerV, scale, acc);
}
extern "C" __global__ void __launch_bounds__(1024, 1)
    ember_reduce_channel_whole1_u1v8_l2(float* dst, const float* x, long long outer, long long channels, long long innerV,
        double scale, int acc) {
    ember_channel_whole<float, 1, 8, false>(dst, x, outer, channels, innerV, scale, acc);
}

// ember_reduce_channel_rows / _l2: the sums (scale 1, added to dst when
// acc) or means (scale 1/(outer*inner)) of each channel of x [outer,
// channels, inner], for inner a multiple of 4 from a 16-byte aligned x
// (ember_scaled_store). Grid (channels, splits): block
// (c, s) takes rows [s * rowsPer, s * rowsPer + rowsPer) of channel c, a
// warp a row at a time, each lane issuing its V float4 loads of the
// row's next 32·V before it adds them (in float within a float4, in double
// across). A channel split over several blocks is joined by the last of
// them to finish (ember_last_arrival on countersOrNull[c]), in a fixed
// order. One launch instead of ember_reduce_channels and its join, whose
// chunks cut across rows at a division per load (docs/performance.md,
// rounds 20 and 21). As the rows' sums, two entry points: the load is
// chosen when compiled (ember_ld_once without _l2). At most 256 threads a
// block.
template <bool Once, int V>
__device__ __forceinline__ void ember_channel_rows(float* dst, double* partialOrNull, unsigned* countersOrNull, const float* x,
                                                   long long outer, long long channels, long long inner, long long rowsPer,
                                                   double scale, int acc) {
    const long long c = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const long long innerV = inner >> 2, rowStride = channels * innerV;
    const ember_f4* base = reinterpret_cast<const ember_f4*>(x) + c * innerV;
    const long long o0 = (long long)blockIdx.y * rowsPer;
    const long long o1 = o0 + rowsPer < outer ? o0 + rowsPer : outer;
    double s = 0.0;
    for (long long o = o0 + warp; o < o1; o += nw) {
        const ember_f4* row = base + o * rowStride;
        for (long long q0 = lane; q0 < innerV; q0 += 32 * V) {
            ember_f4 v[V];
#pragma unroll
            for (int j = 0; j < V; j++) v[j] = q0 + 32 * j < innerV ? ember_ld_read(row + q0 + 32 * j, Once) : ember_f4{0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int j = 0; j < V; j++) s += (double)((v[j].x + v[j].y) + (v[j].z + v[j].w));
        }
    }
    s = ember_block_sum_d(s);
    if (gridDim.y == 1) {
        if (threadIdx.x == 0) ember_scaled_store(dst, c, s, scale, acc);
        return;
    }
    const double* part = partialOrNull + c * gridDim.y;
    if (threadIdx.x == 0) partialOrNull[c * gridDim.y + blockIdx.y] = s;
    if (!ember_last_arrival(countersOrNull + c, gridDim.y) || threadIdx.x >= 32) return;
    double t = 0.0;
    for (unsigned j = threadIdx.x; j < gridDim.y; j += 32) t += __ldcg(part + j);
    t = ember_warp_sum_d(t);
    if (threadIdx.x == 0) ember_scaled_store(dst, c, t, scale, acc);
}

extern "C" __global__ void __launch_bounds__(256, 8)
    ember_reduce_channel_rows(float* dst, double* partialOrNull, unsigned* countersOrNull, const float* x, long long outer,
                              long long channels, long long inner, long long rowsPer, double scale, int acc) {
    ember_channel_rows<true, 4>(dst, partialOrNull, countersOrNull, x, outer, channels, inner, rowsPer, scale, acc);
}
extern "C" __global__ void __launch_bounds__(256, 8)
    ember_reduce_channel_rows_l2(float* dst, double* partialOrNull, unsigned* countersOrNull, const float* x, long long outer,
                                 long long channels, long long inner, long long rowsPer, double scale, int acc) {
    ember_channel_rows<false, 4>(dst, partialOrNull, countersOrNull, x, outer, channels, inner, rowsPer, scale, acc);
}

// _long: seven float4 a lane, for rows of 129 to 224 float4 (a 28x28
// image's 196: one batch of loads a row where four float4 a lane take
// two, the second three lanes in eight idle). Rows of at most 128 float4
// keep four: seven left more lanes idle there (docs/performance.md,
// rounds 21 and 34).
extern "C" __global__ void __launch_bounds__(256, 8)
    ember_reduce_channel_rows_long(float* dst, double* partialOrNull, unsigned* countersOrNull, const float* x,
                                   long long outer, long long channels, long long inner, long long rowsPer, double scale,
                                   int acc) {
    ember_channel_rows<true, 7>(dst, partialOrNull, countersOrNull, x, outer, channels, inner, rowsPer, scale, acc);
}
extern "C" __global__ void __launch_bounds__(256, 8)
    ember_reduce_channel_rows_long_l2(float* dst, double* partialOrNull, unsigned* countersOrNull, const float* x,
                                      long long outer, long long channels, long long inner, long long rowsPer,
                                      double scale, int acc) {
    ember_channel_rows<false, 7>(dst, partialOrNull, countersOrNull, x, outer, channels, inner, rowsPer, scale, acc);
}
