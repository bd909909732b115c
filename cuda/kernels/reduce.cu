// reduce.cu: deterministic reductions. Sum is one launch (per-block double
// partials, which the last block to finish adds in a fixed order); the
// number of blocks depends only on n (chosen in Go), never on the device, so
// a sum is reproducible bit for bit. Sum accumulates in double (each group
// of four floats added in float first); the bias gradients (below) in float
// trees, within the suite's 1e-5 of the sum of |terms|.

// Sum, one launch: block b sums its share of x, stores it in partial[b],
// and the last block to finish (ember_last_arrival on *counter) adds the
// partials in order into dst[0]; a single block writes dst directly. A
// 16-byte aligned x is read in segments of 128 float4, a warp's at a
// time, grid-stride over the segments: each lane issues its four loads
// before it adds them (ember_ld_read), each float4 added in float and the
// four sums in double. Other x are read one float at a time, and the last
// n % 4 elements go to block 0's first threads. The order of the
// additions depends on n, the grid (a function of n, sumBlocks) and x's
// alignment only, so a sum is reproducible bit for bit. Measured on the
// H200 (102.8 MB): 26.6-26.9 us against 29.7 for the two launches before
// (docs/performance.md, round 20). At most 256 threads a block.
extern "C" __global__ void __launch_bounds__(256, 8) ember_sum(float* dst, double* partial, unsigned* counter, const float* x,
                                                                long long n, int once) {
    double s = 0.0;
    if ((reinterpret_cast<unsigned long long>(x) & 15) == 0) {
        const ember_f4* x4 = reinterpret_cast<const ember_f4*>(x);
        const long long n4 = n >> 2;
        const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
        const int lane = threadIdx.x & 31;
        for (long long q0 = (((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5) * 128 + lane; q0 < n4;
             q0 += warps * 128) {
            ember_f4 v[4];
#pragma unroll
            for (int j = 0; j < 4; j++) v[j] = q0 + 32 * j < n4 ? ember_ld_read(x4 + q0 + 32 * j, once) : ember_f4{0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int j = 0; j < 4; j++) s += (double)((v[j].x + v[j].y) + (v[j].z + v[j].w));
        }
        if (blockIdx.x == 0 && threadIdx.x < (n & 3)) s += (double)x[4 * n4 + threadIdx.x];
    } else {
        EMBER_LOOP(long long, i, n) s += (double)x[i];
    }
    s = ember_block_sum_d(s);
    if (gridDim.x == 1) {
        if (threadIdx.x == 0) dst[0] = (float)s;
        return;
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
    if (!ember_last_arrival(counter, gridDim.x)) return;
    // The partials, every load in flight before the adds (a loop of
    // dependent L2 round trips would be the kernel's tail).
    double p[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const unsigned b = threadIdx.x + j * blockDim.x;
        p[j] = b < gridDim.x ? __ldcg(partial + b) : 0.0;
    }
    double t = (p[0] + p[1]) + (p[2] + p[3]);
    for (unsigned b = threadIdx.x + 4 * blockDim.x; b < gridDim.x; b += blockDim.x) t += __ldcg(partial + b);
    t = ember_block_sum_d(t);
    if (threadIdx.x == 0) dst[0] = (float)t;
}

// The join of per-block partials (one block): dst[0] = (sum of
// partial[0..m)) / div, div the row count for the mean of CrossEntropy.
extern "C" __global__ void ember_sum_final(float* dst, const double* partial, int m, long long div) {
    double s = 0.0;
    for (int i = threadIdx.x; i < m; i += blockDim.x) s += partial[i];
    s = ember_block_sum_d(s);
    if (threadIdx.x == 0) dst[0] = (float)(s / (double)div);
}

// Bias gradients, db[c] (+)= sum of dy[o, c, i] over o and i, dy viewed as
// [outer, channels, inner]. Float accumulation in fixed trees (error well
// inside 1e-5 of the sum of |terms|), no atomics, and a partition of the
// work that depends on the shape alone, so results are reproducible bit for
// bit. Two forms:
//   - inner == 1 (Linear): ember_bias_grad_cols, coalesced along channels;
//   - otherwise (Conv2d): ember_bias_grad_rows, which can also write the
//     transposed copy dyt [channels, outer, inner] that Conv2dBackward
//     needs for its GEMMs, so the bias gradient costs no extra pass.
// When a channel is split over several blocks, they write partial sums and
// ember_bias_grad_finish adds them in order.

// bias_grad_cols: dy [outer, channels]. Block (32, 8): threadIdx.x is the
// channel within a group of 32 (blockIdx.x), threadIdx.y strides over rows
// [o0, o1) of chunk blockIdx.y; a shared-memory tree over threadIdx.y
// (fixed). With one chunk (gridDim.y == 1) thread y == 0 writes db, else
// partial[c*gridDim.y + blockIdx.y] (finished by ember_bias_grad_finish).
// Cost: reads outer*channels*4 bytes once (fc1: 64 x 500 = 128 KB): launch
// bound, ~2 us (was 10 us: one thread per channel adding 64 rows in double).
// With reluY not null, dy passes only where reluY > 0 (a ReLU's backward,
// as ember_relu_backward: a NaN passes dy), and gOut, when not null,
// receives the masked dy (LinearReLU's backward: one pass for the mask and
// the bias).
// db may be null (no bias gradient wanted) when gridDim.y == 1.
extern "C" __global__ void ember_bias_grad_cols(float* db, float* partial, float* gOut, const float* dy, const float* reluY,
                                                long long outer, long long channels, int rowsPerBlock, int acc) {
    __shared__ float sh[8][32];
    const long long c = (long long)blockIdx.x * 32 + threadIdx.x;
    const long long o0 = (long long)blockIdx.y * rowsPerBlock;
    const long long o1 = o0 + rowsPerBlock < outer ? o0 + rowsPerBlock : outer;
    float s = 0.0f;
    if (c < channels) {
        for (long long o = o0 + threadIdx.y; o < o1; o += 8) {
            const long long e = o * channels + c;
            float v = dy[e];
            if (reluY != 0 && reluY[e] <= 0.0f) v = 0.0f;
            if (gOut != 0) gOut[e] = v;
            s += v;
        }
    }
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    for (int h = 4; h > 0; h >>= 1) {
        if ((int)threadIdx.y < h) sh[threadIdx.y][threadIdx.x] += sh[threadIdx.y + h][threadIdx.x];
        __syncthreads();
    }
    if (threadIdx.y == 0 && c < channels) {
        const float r = sh[0][threadIdx.x];
        if (gridDim.y > 1) {
            partial[c * gridDim.y + blockIdx.y] = r;
        } else if (db == 0) {
        } else if (acc) {
            db[c] += r;
        } else {
            db[c] = r;
        }
    }
}

// The sum of dy[o, k, i] over the n rows o in [o0, o0+n) of channel k,
// written on the way to dst[(o-o0)*inner + i] when dst is not null. The
// element e = (o-o0)*inner + i of thread t runs t, t+blockDim.x, ...; (o, i)
// is carried along without dividing (one division pair per thread).
template <typename I>
__device__ __forceinline__ float bias_rows_sum(float* dst, const float* src, const float* mask, I rowStride, I inner,
                                               I n) {
    const I m = n * inner;
    const I step = blockDim.x;
    const I dO = step / inner, dI = step - dO * inner;
    I o = (I)threadIdx.x / inner, i = (I)threadIdx.x - o * inner;
    float s = 0.0f;
    for (I e = threadIdx.x; e < m; e += step) {
        float v = src[o * rowStride + i];
        // Through a fused ReLU: no gradient where the output was not positive.
        if (mask != 0 && !(mask[o * rowStride + i] > 0.0f)) v = 0.0f;
        if (dst != 0) dst[e] = v;
        s += v;
        o += dO;
        i += dI;
        if (i >= inner) {
            i -= inner;
            o++;
        }
    }
    return s;
}

// bias_grad_rows: grid (ceil(outer/rowsPerBlock), min(channels, 65535)),
// 1-D blocks (a multiple of 32). Block (j, k) sums channel k over rows
// [j*rowsPerBlock, ...) and all of inner (about 1024 elements: a few per
// thread, coalesced along inner), and copies them to dyt [channels, outer,
// inner] when dyt is not null. gridDim.x == 1: writes db[k]; else
// partial[k*gridDim.x + j]. When mask (same layout as dy) is not null, dy
// counts as 0 where mask is not positive: the gradient through the ReLU fused
// into the convolution, at the cost of reading the mask.
// Cost: reads (and with dyt writes) outer*channels*inner*4 bytes: LeNet
// conv1 (dy 2.9 MB) ~2 us read+transpose at 3 TB/s, conv2 (0.8 MB) ~0.6 us;
// replaces swap01 (3.9-7.4 us) + bias_grad_block (5.2 / 21.6 us).
extern "C" __global__ void ember_bias_grad_rows(float* db, float* partial, float* dyt, const float* dy,
                                                const float* mask, long long outer,
                                                long long channels, long long inner, int rowsPerBlock, int acc) {
    const long long o0 = (long long)blockIdx.x * rowsPerBlock;
    const long long n = outer - o0 < rowsPerBlock ? outer - o0 : rowsPerBlock;
    const bool small = EMBER_SMALL_INDEX(outer * channels * inner);
    for (long long k = blockIdx.y; k < channels; k += gridDim.y) {
        const float* src = dy + (o0 * channels + k) * inner;
        const float* msk = mask != 0 ? mask + (o0 * channels + k) * inner : (const float*)0;
        float* dst = dyt != 0 ? dyt + (k * outer + o0) * inner : (float*)0;
        float s;
        if (small) {
            s = bias_rows_sum<int>(dst, src, msk, (int)(channels * inner), (int)inner, (int)n);
        } else {
            s = bias_rows_sum<long long>(dst, src, msk, channels * inner, inner, n);
        }
        s = ember_block_sum_f(s);
        if (threadIdx.x == 0) {
            if (gridDim.x > 1) {
                partial[k * gridDim.x + blockIdx.x] = s;
            } else if (acc) {
                db[k] += s;
            } else {
                db[k] = s;
            }
        }
    }
}

// bias_grad_finish: db[k] (+)= the sum of partial[k*parts .. k*parts+parts)
// (in order within each lane: lane l adds l, l+32, ...; then a xor tree).
// One warp per channel, 1-D blocks of a multiple of 32 threads.
// Cost: channels*parts*4 bytes (LeNet conv1: 20 x 64 floats): launch bound.
extern "C" __global__ void ember_bias_grad_finish(float* db, const float* partial, long long channels, int parts,
                                                  int acc) {
    const int lane = threadIdx.x & 31;
    const long long wpb = blockDim.x >> 5;
    for (long long k = (long long)blockIdx.x * wpb + (threadIdx.x >> 5); k < channels; k += gridDim.x * wpb) {
        const float* p = partial + k * parts;
        float s = 0.0f;
        for (int j = lane; j < parts; j += 32) s += p[j];
        s = ember_warp_sum(s);
        if (lane == 0) {
            if (acc) {
                db[k] += s;
            } else {
                db[k] = s;
            }
        }
    }
}

// gemm_small: c[i, j] = alpha * sum_p A(i, p) B(p, j) (+ beta * c[i, j]) in
// row-major storage, A(i, p) = transA ? a[p*m + i] : a[i*k + p] and
// B(p, j) = transB ? b[j*k + p] : b[p*n + j]; with beta == 0, c is not read
// (it may hold NaN); bias, when not null, is added to every row (a linear
// layer's bias, as AddBias does after the product). One warp per output:
// lanes take p = lane, lane+32, ...
// and a xor tree adds them (deterministic). For products too small to fill
// the GPU, where cuBLAS's split-K kernel and its reduction cost two launches
// (LeNet's fc2: 64 x 10 x 500 took 11 us, this one launch about 2 us).
extern "C" __global__ void ember_gemm_small(float* c, const float* a, const float* b, int m, int n, int k, int transA,
                                            int transB, float alpha, float beta, const float* bias) {
    const int lane = threadIdx.x & 31;
    const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
    const long long total = (long long)m * n;
    for (long long o = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; o < total; o += warps) {
        const int i = (int)(o / n), j = (int)(o - (long long)i * n);
        float s = 0.0f;
        for (int p = lane; p < k; p += 32) {
            const float av = transA ? a[(long long)p * m + i] : a[(long long)i * k + p];
            const float bv = transB ? b[(long long)j * k + p] : b[(long long)p * n + j];
            s = __fmaf_rn(av, bv, s);
        }
        s = ember_warp_sum(s);
        if (lane == 0) {
            float v = alpha * s;
            if (beta != 0.0f) v = v + beta * c[o];
            if (bias != 0) v = v + bias[j];  // after the product, as AddBias
            c[o] = v;
        }
    }
}

// gemm_small_t: the product of ember_gemm_small for short sums (k <= 128:
// LeNet's fc2 backward, k = 10 and 64), where a warp per output would leave
// most lanes idle. Blocks of (32, 8) threads take 32 consecutive outputs
// (consecutive columns j, so B's rows are read coalesced and A's element is
// the same across most of a warp); the 8 rows of threads split the sum over
// p and add their parts through shared memory in a fixed order.
// gemm_small_t_body runs ember_gemm_small_t's product on the blocks
// [first, first+count) of the grid (a of null means A(i, p) = 1: sums of B's
// columns).
__device__ __forceinline__ void gemm_small_t_body(float* c, const float* a, const float* b, int m, int n, int k,
                                                  int transA, int transB, float alpha, float beta, int first,
                                                  int count) {
    __shared__ float part[8][32];
    const long long total = (long long)m * n;
    for (long long o0 = (long long)(blockIdx.x - first) * 32; o0 < total; o0 += (long long)count * 32) {
        const long long o = o0 + threadIdx.x;
        float s = 0.0f;
        if (o < total) {
            const int i = (int)(o / n), j = (int)(o - (long long)i * n);
            for (int p = threadIdx.y; p < k; p += 8) {
                const float av = a == 0 ? 1.0f : transA ? a[(long long)p * m + i] : a[(long long)i * k + p];
                const float bv = transB ? b[(long long)j * k + p] : b[(long long)p * n + j];
                s = __fmaf_rn(av, bv, s);
            }
        }
        part[threadIdx.y][threadIdx.x] = s;
        __syncthreads();
        if (threadIdx.y == 0 && o < total) {
            float t = part[0][threadIdx.x];
            for (int r = 1; r < 8; r++) t += part[r][threadIdx.x];
            float v = alpha * t;
            if (beta != 0.0f) v = v + beta * c[o];
            c[o] = v;
        }
        __syncthreads();
    }
}

extern "C" __global__ void ember_gemm_small_t(float* c, const float* a, const float* b, int m, int n, int k,
                                              int transA, int transB, float alpha, float beta) {
    gemm_small_t_body(c, a, b, m, n, k, transA, transB, alpha, beta, 0, gridDim.x);
}

// linear_grads_small: the three gradients of a small linear layer y = x·wᵀ
// + bias (x [n, in], w [out, in], g = dy [n, out]) in one launch, as three
// gemm_small_t products on consecutive ranges of blocks: dx = g·w on the
// first blocksX, dw = gᵀ·x on the next blocksW, db = the column sums of g on
// the rest; each is skipped when its pointer is null, and added to when its
// beta is 1. LeNet's fc2 backward: one launch instead of three.
extern "C" __global__ void ember_linear_grads_small(float* dxOrNull, float* dwOrNull, float* dbOrNull, const float* g,
                                                    const float* x, const float* w, int n, int in, int out, float betaX,
                                                    float betaW, float betaB, int blocksX, int blocksW) {
    const int bid = blockIdx.x;
    if (bid < blocksX) {
        gemm_small_t_body(dxOrNull, g, w, n, in, out, 0, 0, 1.0f, betaX, 0, blocksX);
    } else if (bid < blocksX + blocksW) {
        gemm_small_t_body(dwOrNull, g, x, out, in, n, 1, 0, 1.0f, betaW, blocksX, blocksW);
    } else {
        gemm_small_t_body(dbOrNull, 0, g, 1, out, n, 0, 0, 1.0f, betaB, blocksX + blocksW, gridDim.x - blocksX - blocksW);
    }
}
