// norm.cu: batch and layer normalisation, forward and backward, mirroring
// tensor/cpu_norm.go: statistics and gradient sums in double over two
// passes (trees of fixed shape, no atomics: deterministic), the normalised
// values in float (each operation rounded, --fmad=false), so that results
// differ from the CPU's only by the order of the double sums. Sums over
// many elements go in two stages (blocks write partial sums to a
// workspace, a second kernel adds them by a fixed tree) so that the grid
// fills the GPU whatever the number of channels; the per-element passes are
// grid-stride elementwise kernels. Any grid is correct (kernels loop over
// their work by blockIdx.x); blockDim.x must be a multiple of 32.

// ember_block_sum_all is ember_block_sum_d with the result in every thread.
__device__ __forceinline__ double ember_block_sum_all(double v) {
    __shared__ double total;
    const double s = ember_block_sum_d(v);
    if (threadIdx.x == 0) total = s;
    __syncthreads();
    const double r = total;
    __syncthreads();
    return r;
}

// ember_bn_channel is the channel of flat index i of [n, c, inner]: 32-bit
// dividers when the tensor has fewer than 2^31 elements (wide is 0), else
// 64-bit divisions.
__device__ __forceinline__ long long ember_bn_channel(long long i, long long c, long long inner, int wide,
                                                      unsigned int innerMul, unsigned int innerShift,
                                                      unsigned int cMul, unsigned int cShift) {
    if (wide) return (i / inner) % c;
    const unsigned int q = ember_divide((unsigned int)i, innerMul, innerShift);
    return (long long)(q - ember_divide(q, cMul, cShift) * (unsigned int)c);
}

// ember_bn_chunk calls f(at) for the flat index of this thread's share of
// elements k0 <= k < k1 of channel ch of [n, c, inner] (k counts the
// channel's n·inner elements in order): the block's threads take
// consecutive k (coalesced along the rows of inner elements). The index
// advances by additions only, four at a time, so that four loads are in
// flight per thread.
template <typename F>
__device__ __forceinline__ void ember_bn_chunk(long long c, long long inner, long long ch, long long k0,
                                               long long k1, F f) {
    const long long step = blockDim.x;
    long long k = k0 + threadIdx.x;
    if (k >= k1) return;
    long long count = (k1 - k - 1) / step + 1;
    long long o = k / inner, i = k - o * inner;
    long long at = (o * c + ch) * inner + i;
    const long long dq = step / inner, dr = step - dq * inner;
    const long long jump = dr + dq * c * inner, wrap = (c - 1) * inner;
    auto next = [&]() {
        i += dr;
        at += jump;
        if (i >= inner) {
            i -= inner;
            at += wrap;
        }
    };
    for (; count >= 4; count -= 4) {
        const long long a0 = at;
        next();
        const long long a1 = at;
        next();
        const long long a2 = at;
        next();
        const long long a3 = at;
        next();
        f(a0);
        f(a1);
        f(a2);
        f(a3);
    }
    for (; count > 0; count--) {
        f(at);
        next();
    }
}

// The block's part of a channel split in parts: elements [k0, k1) of its m.
__device__ __forceinline__ void ember_bn_part(long long m, long long parts, long long p, long long* k0,
                                              long long* k1) {
    const long long chunk = (m + parts - 1) / parts;
    *k0 = p * chunk;
    *k1 = *k0 + chunk < m ? *k0 + chunk : m;
}

// ember_warp_sum_parts is Σ p[q·stride] over q < parts: lane l adds q = l,
// l + 32, ..., then the lanes add by a xor butterfly (a fixed tree; every
// lane gets the total). All 32 lanes of the warp must call it.
__device__ __forceinline__ double ember_warp_sum_parts(const double* p, long long parts, long long stride) {
    double s = 0.0;
    for (long long q = threadIdx.x & 31; q < parts; q += 32) s += p[q * stride];
    return ember_warp_sum_d(s);
}

// ember_warp_index is this thread's warp's number in the grid, and
// ember_warp_count the grid's warps: the per-channel finish kernels take
// one warp per channel.
__device__ __forceinline__ long long ember_warp_index() {
    return ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
}
__device__ __forceinline__ long long ember_warp_count() { return ((long long)gridDim.x * blockDim.x) >> 5; }

// x̂ = (x - mean)·inv, then x̂·w + b, each rounded, as normalized in cpu_norm.go.
__device__ __forceinline__ float ember_normalized(float x, float mean, float inv, float w, float b) {
    const float xh = (x - mean) * inv;
    return xh * w + b;
}

// The activations of BatchNormAct by their tensor.UnaryOp codes (0 for
// none), each computed as strided.cu's ember_unary and ember_unary_grad
// compute it (this unit does not hold strided.cu; the GPU tests compare
// the fused and the unfused layers bit for bit), so that batch norm with
// its activation gives the bits of the two operations one after the
// other.
#define EMBER_BN_ACT_RELU 11
#define EMBER_BN_ACT_GELU 13
#define EMBER_BN_ACT_GELU_TANH 14
#define EMBER_BN_GELU_INV_SQRT2 0.70710678118654752440f
#define EMBER_BN_GELU_INV_SQRT2PI 0.39894228040143267794f
#define EMBER_BN_GELU_TANH_K 0.79788456080286535588f
#define EMBER_BN_GELU_TANH_C 0.044715f

__device__ __forceinline__ float ember_bn_act(int act, float x) {
    switch (act) {
    case EMBER_BN_ACT_RELU: return (x > 0.0f || x != x) ? x : 0.0f;
    case EMBER_BN_ACT_GELU: {
        const float cdf = 0.5f * (1.0f + erff(x * EMBER_BN_GELU_INV_SQRT2));
        return x * cdf;
    }
    case EMBER_BN_ACT_GELU_TANH: {
        const float u = EMBER_BN_GELU_TANH_K * (x + EMBER_BN_GELU_TANH_C * (x * x * x));
        return 0.5f * x * (1.0f + tanhf(u));
    }
    }
    return x;
}

// dy·act'(x), as ember_unary_grad (ReLU: 0 where x <= 0, dy elsewhere,
// NaN included, as relu_backward's mask of the output).
__device__ __forceinline__ float ember_bn_act_grad(int act, float x, float dy) {
    switch (act) {
    case EMBER_BN_ACT_RELU: return x <= 0.0f ? 0.0f : dy;
    case EMBER_BN_ACT_GELU: {
        const float cdf = 0.5f * (1.0f + erff(x * EMBER_BN_GELU_INV_SQRT2));
        const float pdf = EMBER_BN_GELU_INV_SQRT2PI * expf(-0.5f * (x * x));
        return dy * (cdf + x * pdf);
    }
    case EMBER_BN_ACT_GELU_TANH: {
        const float u = EMBER_BN_GELU_TANH_K * (x + EMBER_BN_GELU_TANH_C * (x * x * x));
        const float t = tanhf(u);
        const float du = EMBER_BN_GELU_TANH_K * (1.0f + 3.0f * EMBER_BN_GELU_TANH_C * (x * x));
        return dy * (0.5f * (1.0f + t) + 0.5f * x * ((1.0f - t * t) * du));
    }
    }
    return dy;
}

// ember_bn_grad is the gradient of batch norm's output z at x: dy without
// an activation, else dy·act'(z) for z recomputed as the forward pass
// rounded it.
__device__ __forceinline__ float ember_bn_grad(int act, float dy, float x, float mean, float inv, float w, float b) {
    if (act == 0) return dy;
    return ember_bn_act_grad(act, ember_normalized(x, mean, inv, w, b), dy);
}

// Batch norm splits each channel's m = n·inner elements into parts of a
// few thousand (block p of channel ch is block ch·parts + p of the grid),
// so that a few channels still fill the GPU. A block sums its part about
// the part's own mean in two passes, the second from the cache, so that x
// is read from memory once; the finish kernel combines the parts exactly,
// Σ(x - mean)² = Σ_p [M2_p + n_p·(mean_p - mean)²] (Chan, Golub and
// LeVeque, "Updating formulae and a pairwise algorithm for computing
// sample variances", 1979), each term non-negative. A warp adds a
// channel's parts by a fixed tree (two stages, no atomics: deterministic).

// Stage 1 of the statistics: partial[2(ch·parts + p)] = Σ x and
// partial[2(ch·parts + p) + 1] = Σ (x - mean_p)² over the block's part p,
// mean_p its mean. A thread holds its share of the part (at most
// EMBER_BN_HELD elements: parts are at most bnPart = 4096 elements and
// blocks 256 threads) in registers, so that x is read once and all of a
// thread's loads are in flight together.
#define EMBER_BN_HELD 16
extern "C" __global__ void ember_batch_norm_stats_partial(double* partial, const float* x, long long n, long long c,
                                                          long long inner, long long parts) {
    const long long m = n * inner;
    for (long long blk = blockIdx.x; blk < c * parts; blk += gridDim.x) {
        const long long ch = blk / parts;
        long long k0, k1;
        ember_bn_part(m, parts, blk - ch * parts, &k0, &k1);
        float v[EMBER_BN_HELD];
        int held = 0;
        const long long k = k0 + threadIdx.x;
        if (k < k1) {
            const long long step = blockDim.x;
            held = (int)((k1 - k - 1) / step + 1);
            long long o = k / inner, i = k - o * inner;
            long long at = (o * c + ch) * inner + i;
            const long long dq = step / inner, dr = step - dq * inner;
            const long long jump = dr + dq * c * inner, wrap = (c - 1) * inner;
#pragma unroll
            for (int j = 0; j < EMBER_BN_HELD; j++) {
                if (j < held) v[j] = x[at];
                i += dr;
                at += jump;
                if (i >= inner) {
                    i -= inner;
                    at += wrap;
                }
            }
        }
        double s = 0.0;
#pragma unroll
        for (int j = 0; j < EMBER_BN_HELD; j++) {
            if (j < held) s += (double)v[j];
        }
        s = ember_block_sum_all(s);
        const double mean = k1 > k0 ? s / (double)(k1 - k0) : 0.0;
        double q = 0.0;
#pragma unroll
        for (int j = 0; j < EMBER_BN_HELD; j++) {
            if (j < held) {
                const double d = (double)v[j] - mean;
                q += d * d;
            }
        }
        q = ember_block_sum_d(q);
        if (threadIdx.x == 0) {
            partial[2 * blk] = s;
            partial[2 * blk + 1] = q;
        }
    }
}

// Per channel (one warp each): the statistics into saveMean and
// saveInvStd from the parts' sums (training: the batch's, and the running
// statistics updated as torch does; else the running ones, partial
// unused).
extern "C" __global__ void ember_batch_norm_finish(float* saveMean, float* saveInvStd, float* runMeanOrNull,
                                                   float* runVarOrNull, const double* partialOrNull, long long n,
                                                   long long c, long long inner, long long parts, int training,
                                                   float momentum, float eps) {
    const long long m = n * inner;
    const bool lead = (threadIdx.x & 31) == 0;
    for (long long ch = ember_warp_index(); ch < c; ch += ember_warp_count()) {
        if (!training) {
            if (lead) {
                saveMean[ch] = runMeanOrNull[ch];
                saveInvStd[ch] = (float)(1.0 / sqrt((double)runVarOrNull[ch] + (double)eps));
            }
            continue;
        }
        const double* pc = partialOrNull + 2 * ch * parts;
        const double mean = ember_warp_sum_parts(pc, parts, 2) / (double)m;
        double t = 0.0;
        for (long long q = threadIdx.x & 31; q < parts; q += 32) {
            long long k0, k1;
            ember_bn_part(m, parts, q, &k0, &k1);
            if (k1 > k0) {
                const double d = pc[2 * q] / (double)(k1 - k0) - mean;
                t += pc[2 * q + 1] + (double)(k1 - k0) * d * d;
            }
        }
        const double var = ember_warp_sum_d(t) / (double)m;
        if (lead) {
            saveMean[ch] = (float)mean;
            saveInvStd[ch] = (float)(1.0 / sqrt(var + (double)eps));
            if (runMeanOrNull != 0) {
                const double mom = (double)momentum;
                runMeanOrNull[ch] = (float)((1.0 - mom) * (double)runMeanOrNull[ch] + mom * mean);
                runVarOrNull[ch] =
                    (float)((1.0 - mom) * (double)runVarOrNull[ch] + mom * var * (double)m / (double)(m - 1));
            }
        }
    }
}

// y = act(x̂·w + b) elementwise over [n, c, inner] (the channel of an index
// by ember_bn_channel; act 0 for none).
extern "C" __global__ void ember_batch_norm_apply(float* y, const float* x, const float* saveMean,
                                                  const float* saveInvStd, const float* weightOrNull,
                                                  const float* biasOrNull, long long total, long long c,
                                                  long long inner, int wide, int innerMul, int innerShift, int cMul,
                                                  int cShift, int act) {
    EMBER_LOOP(long long, i, total) {
        const long long ch = ember_bn_channel(i, c, inner, wide, (unsigned int)innerMul, (unsigned int)innerShift,
                                              (unsigned int)cMul, (unsigned int)cShift);
        const float w = weightOrNull != 0 ? weightOrNull[ch] : 1.0f;
        const float b = biasOrNull != 0 ? biasOrNull[ch] : 0.0f;
        y[i] = ember_bn_act(act, ember_normalized(x[i], saveMean[ch], saveInvStd[ch], w, b));
    }
}

// ember_batch_norm_apply4 is ember_batch_norm_apply four elements at a
// time, for tensors of fewer than 2^31 elements whose x and y are 16-byte
// aligned: 16-byte loads and stores, and where the four lie in one plane
// of inner elements (all but about 3 in inner of them) one lookup of its
// channel's parameters. The last total mod 4 elements go one by one.
extern "C" __global__ void ember_batch_norm_apply4(float* y, const float* x, const float* saveMean,
                                                   const float* saveInvStd, const float* weightOrNull,
                                                   const float* biasOrNull, int total, int c, int innerMul,
                                                   int innerShift, int cMul, int cShift, int act) {
    const unsigned int im = (unsigned int)innerMul, is = (unsigned int)innerShift, cm = (unsigned int)cMul,
                       cs = (unsigned int)cShift, uc = (unsigned int)c;
    // The plane (n, c) of index i is i / inner; its channel is the plane
    // mod c. Four elements share a channel where their first and last share
    // a plane (equal channels alone would not do: with inner < 4 the four
    // can wrap around all c channels).
    auto plane = [&](unsigned int i) { return ember_divide(i, im, is); };
    auto ofPlane = [&](unsigned int q) { return q - ember_divide(q, cm, cs) * uc; };
    auto channel = [&](unsigned int i) { return ofPlane(plane(i)); };
    auto one = [&](unsigned int ch, float v) {
        const float w = weightOrNull != 0 ? weightOrNull[ch] : 1.0f;
        const float b = biasOrNull != 0 ? biasOrNull[ch] : 0.0f;
        return ember_bn_act(act, ember_normalized(v, saveMean[ch], saveInvStd[ch], w, b));
    };
    const int groups = total >> 2;
    EMBER_LOOP(int, g, groups) {
        const unsigned int i = (unsigned int)g << 2;
        const ember_f4 v = reinterpret_cast<const ember_f4*>(x)[g];
        const unsigned int p0 = plane(i), p3 = plane(i + 3), c0 = ofPlane(p0);
        ember_f4 r;
        if (p0 == p3) {
            const float w = weightOrNull != 0 ? weightOrNull[c0] : 1.0f;
            const float b = biasOrNull != 0 ? biasOrNull[c0] : 0.0f;
            const float mean = saveMean[c0], inv = saveInvStd[c0];
            r.x = ember_bn_act(act, ember_normalized(v.x, mean, inv, w, b));
            r.y = ember_bn_act(act, ember_normalized(v.y, mean, inv, w, b));
            r.z = ember_bn_act(act, ember_normalized(v.z, mean, inv, w, b));
            r.w = ember_bn_act(act, ember_normalized(v.w, mean, inv, w, b));
        } else {
            r.x = one(c0, v.x);
            r.y = one(channel(i + 1), v.y);
            r.z = one(channel(i + 2), v.z);
            r.w = one(ofPlane(p3), v.w);
        }
        reinterpret_cast<ember_f4*>(y)[g] = r;
    }
    if (blockIdx.x == 0 && (int)threadIdx.x < (total & 3)) {
        const unsigned int i = ((unsigned int)groups << 2) + threadIdx.x;
        y[i] = one(channel(i), x[i]);
    }
}

// ember_bn_walk calls f(k - k0, a, count) for this thread's elements k =
// k0 + threadIdx.x, k0 + threadIdx.x + blockDim.x, ... < k1 of channel ch
// of [n, c, inner] (k counts the channel's n·inner elements in order), U
// at a time (count of them, at the flat indices a): the U indices first
// (additions only), then one call, so that their loads are in flight
// together.
template <int U, typename F>
__device__ __forceinline__ void ember_bn_walk(int c, int inner, int ch, int k0, int k1, F f) {
    const int step = blockDim.x;
    int k = k0 + threadIdx.x;
    if (k >= k1) return;
    int o = k / inner, i = k - o * inner;
    int at = (o * c + ch) * inner + i;
    const int dq = step / inner, dr = step - dq * inner;
    const int jump = dr + dq * c * inner, wrap = (c - 1) * inner;
    auto next = [&]() {
        i += dr;
        at += jump;
        if (i >= inner) {
            i -= inner;
            at += wrap;
        }
    };
    for (; k + (U - 1) * step < k1; k += U * step) {
        int a[U];
#pragma unroll
        for (int j = 0; j < U; j++) {
            a[j] = at;
            next();
        }
        f(k - k0, a, U);
    }
    for (; k < k1; k += step) {
        int a[1] = {at};
        next();
        f(k - k0, a, 1);
    }
}

// The one-pass kernels' steps over elements [k0, k1) of channel ch of
// [n, c, inner], held in shared memory from the k0-th on.
//
// Their statistics come from one pass, as the elements are loaded: the
// sums of d = x - x0 and of d² in double, x0 the channel's first element
// (a shift every block of a channel shares). Then mean = x0 + Σd/m and
// var = Σd²/m - (Σd/m)². Each d is exact in double, and each d² is
// rounded once (a fused multiply-add), so the variance carries a relative
// error of about m·2^-53·(1 + (mean - x0)²/var) against the two exact
// passes of cpu_norm.go: 1e-12 where x0 lies within a few deviations of
// the mean. The double units are idle while the loads are in flight; a
// second pass over shared memory for the squared deviations was not.

// ember_bn_shift is x0: the first element of channel ch (0 for none).
__device__ __forceinline__ double ember_bn_shift(const float* x, int n, int inner, int ch) {
    return n > 0 && inner > 0 ? (double)x[(long long)ch * inner] : 0.0;
}

// ember_bn_hold loads the run into held, U loads in flight a thread, and
// returns this thread's sums of d = x - x0 (*s1) and d² (*s2).
template <int U>
__device__ __forceinline__ void ember_bn_hold(float* held, const float* x, int c, int inner, int ch, int k0, int k1,
                                              double x0, double* s1, double* s2) {
    double s = 0.0, q = 0.0;
    ember_bn_walk<U>(c, inner, ch, k0, k1, [&](int k, const int* a, int count) {
        float v[U];
#pragma unroll
        for (int j = 0; j < U; j++) {
            if (j < count) v[j] = x[a[j]];
        }
#pragma unroll
        for (int j = 0; j < U; j++) {
            if (j < count) {
                held[k + j * (int)blockDim.x] = v[j];
                const double d = (double)v[j] - x0;
                s += d;
                q = __fma_rn(d, d, q);
            }
        }
    });
    *s1 = s;
    *s2 = q;
}

// ember_bn_moments turns the channel's sums of d and d² over its m
// elements into its mean and biased variance.
__device__ __forceinline__ void ember_bn_moments(double x0, double s1, double s2, int m, double* mean, double* var) {
    const double md = s1 / (double)m;
    *mean = x0 + md;
    *var = fmax(s2 / (double)m - md * md, 0.0);
}

// ember_block_sum2_all sums two doubles a thread over the block, with the
// totals in every thread: ember_block_sum_d's fixed order, both at once.
__device__ __forceinline__ void ember_block_sum2_all(double* a, double* b) {
    __shared__ double part[2][32], total[2];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const double wa = ember_warp_sum_d(*a), wb = ember_warp_sum_d(*b);
    if (lane == 0) {
        part[0][warp] = wa;
        part[1][warp] = wb;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double sa = 0.0, sb = 0.0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) {
            sa += part[0][w];
            sb += part[1][w];
        }
        total[0] = sa;
        total[1] = sb;
    }
    __syncthreads();
    *a = total[0];
    *b = total[1];
    __syncthreads();
}

// ember_bn_save writes channel ch's statistics and updates the running ones
// (as ember_batch_norm_finish does): var is the biased variance over m.
__device__ __forceinline__ void ember_bn_save(float* saveMean, float* saveInvStd, float* runMeanOrNull,
                                              float* runVarOrNull, int ch, double mean, double var, int m,
                                              float momentum, float mean32, float inv32) {
    saveMean[ch] = mean32;
    saveInvStd[ch] = inv32;
    if (runMeanOrNull != 0) {
        const double mom = (double)momentum;
        runMeanOrNull[ch] = (float)((1.0 - mom) * (double)runMeanOrNull[ch] + mom * mean);
        runVarOrNull[ch] = (float)((1.0 - mom) * (double)runVarOrNull[ch] + mom * var * (double)m / (double)(m - 1));
    }
}

// ember_bn_emit writes y = act(x̂·w + b) from held.
template <int U>
__device__ __forceinline__ void ember_bn_emit(float* y, const float* held, const float* weightOrNull,
                                              const float* biasOrNull, int c, int inner, int ch, int k0, int k1,
                                              float mean32, float inv32, int act) {
    const float w = weightOrNull != 0 ? weightOrNull[ch] : 1.0f;
    const float b = biasOrNull != 0 ? biasOrNull[ch] : 0.0f;
    ember_bn_walk<U>(c, inner, ch, k0, k1, [&](int k, const int* a, int count) {
#pragma unroll
        for (int j = 0; j < U; j++) {
            if (j < count) y[a[j]] = ember_bn_act(act, ember_normalized(held[k + j * (int)blockDim.x], mean32, inv32, w, b));
        }
    });
}

// ember_batch_norm_onepass is batch norm in training in one launch, for
// channels that fit in a block's shared memory (tensors of fewer than 2^31
// elements; norm.go decides): one block per channel reads its m elements
// once into shared memory, adding the shifted sums of its statistics as
// it goes (ember_bn_hold; in a fixed order: deterministic), writes the
// statistics and updates the running ones as ember_batch_norm_finish
// does, and writes y = act(x̂·w + b) from shared memory. One read and one
// write of x's size instead of the three launches' two reads (the second
// from the L2 where it still holds it). Dynamic shared memory: m floats.
template <int U>
__device__ __forceinline__ void ember_batch_norm_onepass_body(float* y, float* saveMean, float* saveInvStd,
                                                              float* runMeanOrNull, float* runVarOrNull,
                                                              const float* x, const float* weightOrNull,
                                                              const float* biasOrNull, int n, int c, int inner,
                                                              float momentum, float eps, int act) {
    extern __shared__ float held[];
    const int m = n * inner;
    for (int ch = blockIdx.x; ch < c; ch += gridDim.x) {
        const double x0 = ember_bn_shift(x, n, inner, ch);
        double s1, s2, mean, var;
        ember_bn_hold<U>(held, x, c, inner, ch, 0, m, x0, &s1, &s2);
        ember_block_sum2_all(&s1, &s2);
        ember_bn_moments(x0, s1, s2, m, &mean, &var);
        const float mean32 = (float)mean, inv32 = (float)(1.0 / sqrt(var + (double)eps));
        if (threadIdx.x == 0) ember_bn_save(saveMean, saveInvStd, runMeanOrNull, runVarOrNull, ch, mean, var, m, momentum, mean32, inv32);
        ember_bn_emit<U>(y, held, weightOrNull, biasOrNull, c, inner, ch, 0, m, mean32, inv32, act);
        // The next channel overwrites held.
        __syncthreads();
    }
}

// The one-pass kernel with eight loads in flight per thread, and with 16.
extern "C" __global__ void __launch_bounds__(1024) ember_batch_norm_onepass(
    float* y, float* saveMean, float* saveInvStd, float* runMeanOrNull, float* runVarOrNull, const float* x,
    const float* weightOrNull, const float* biasOrNull, int n, int c, int inner, float momentum, float eps, int act) {
    ember_batch_norm_onepass_body<8>(y, saveMean, saveInvStd, runMeanOrNull, runVarOrNull, x, weightOrNull,
                                     biasOrNull, n, c, inner, momentum, eps, act);
}
extern "C" __global__ void __launch_bounds__(1024) ember_batch_norm_onepass16(
    float* y, float* saveMean, float* saveInvStd, float* runMeanOrNull, float* runVarOrNull, const float* x,
    const float* weightOrNull, const float* biasOrNull, int n, int c, int inner, float momentum, float eps, int act) {
    ember_batch_norm_onepass_body<16>(y, saveMean, saveInvStd, runMeanOrNull, runVarOrNull, x, weightOrNull,
                                      biasOrNull, n, c, inner, momentum, eps, act);
}

#if __CUDA_ARCH__ >= 900
// ember_batch_norm_cluster is the one-pass batch norm with a thread block
// cluster of K blocks a channel (sm_90; norm.go's bnCluster decides): block
// rank r holds the r-th of K runs of the channel's m elements in shared
// memory. Each block sums its run's shifted values and their squares
// (ember_bn_hold); every block adds the K pairs of sums in rank order
// through distributed shared memory, so all hold the same statistics, and
// they are the same bits run to run. Where the one-pass kernel's channel
// takes a block of 1024 threads an SM, K times as many blocks of a K-th of
// the memory keep more loads in flight on each SM. Dynamic shared memory:
// ceil(m / K) floats.
template <int K, int U>
__device__ __forceinline__ void ember_batch_norm_cluster_body(float* y, float* saveMean, float* saveInvStd,
                                                              float* runMeanOrNull, float* runVarOrNull,
                                                              const float* x, const float* weightOrNull,
                                                              const float* biasOrNull, int n, int c, int inner,
                                                              float momentum, float eps, int act) {
    extern __shared__ float held[];
    __shared__ double part[2];  // this block's sums of d and d²
    const int m = n * inner, per = (m + K - 1) / K, ch = blockIdx.x / K;
    const unsigned rank = ember_cluster_rank();
    const int k0 = ember_imin(m, (int)rank * per), k1 = ember_imin(m, k0 + per);
    const double x0 = ember_bn_shift(x, n, inner, ch);
    double s1, s2;
    ember_bn_hold<U>(held, x, c, inner, ch, k0, k1, x0, &s1, &s2);
    ember_block_sum2_all(&s1, &s2);
    if (threadIdx.x == 0) {
        part[0] = s1;
        part[1] = s2;
    }
    ember_cluster_sync();
    double t1 = 0.0, t2 = 0.0;
    for (unsigned r = 0; r < K; r++) {
        t1 += ember_cluster_ld_f64(&part[0], r);
        t2 += ember_cluster_ld_f64(&part[1], r);
    }
    double mean, var;
    ember_bn_moments(x0, t1, t2, m, &mean, &var);
    const float mean32 = (float)mean, inv32 = (float)(1.0 / sqrt(var + (double)eps));
    if (rank == 0 && threadIdx.x == 0) ember_bn_save(saveMean, saveInvStd, runMeanOrNull, runVarOrNull, ch, mean, var, m, momentum, mean32, inv32);
    ember_bn_emit<U>(y, held, weightOrNull, biasOrNull, c, inner, ch, k0, k1, mean32, inv32, act);
    // No block leaves while another may still read its part.
    ember_cluster_sync();
}

extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(512) ember_batch_norm_cluster2(
    float* y, float* saveMean, float* saveInvStd, float* runMeanOrNull, float* runVarOrNull, const float* x,
    const float* weightOrNull, const float* biasOrNull, int n, int c, int inner, float momentum, float eps, int act) {
    ember_batch_norm_cluster_body<2, 8>(y, saveMean, saveInvStd, runMeanOrNull, runVarOrNull, x, weightOrNull,
                                        biasOrNull, n, c, inner, momentum, eps, act);
}
extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(512) ember_batch_norm_cluster4(
    float* y, float* saveMean, float* saveInvStd, float* runMeanOrNull, float* runVarOrNull, const float* x,
    const float* weightOrNull, const float* biasOrNull, int n, int c, int inner, float momentum, float eps, int act) {
    ember_batch_norm_cluster_body<4, 8>(y, saveMean, saveInvStd, runMeanOrNull, runVarOrNull, x, weightOrNull,
                                        biasOrNull, n, c, inner, momentum, eps, act);
}
extern "C" __global__ void __cluster_dims__(8, 1, 1) __launch_bounds__(512) ember_batch_norm_cluster8(
    float* y, float* saveMean, float* saveInvStd, float* runMeanOrNull, float* runVarOrNull, const float* x,
    const float* weightOrNull, const float* biasOrNull, int n, int c, int inner, float momentum, float eps, int act) {
    ember_batch_norm_cluster_body<8, 8>(y, saveMean, saveInvStd, runMeanOrNull, runVarOrNull, x, weightOrNull,
                                        biasOrNull, n, c, inner, momentum, eps, act);
}
#endif

// d = v, or d + v when acc, in double rounded once (store in cpu_norm.go).
__device__ __forceinline__ void ember_store(float* d, double v, int acc) {
    if (acc) v += (double)*d;
    *d = (float)v;
}

// Stage 1 of the backward sums: partial[2(ch·parts + p)] = Σ g and
// partial[2(ch·parts + p) + 1] = Σ g·x̂ over the block's part, g the
// gradient of z (ember_bn_grad: dy, or dy·act'(z)), also stored in gOut
// when not null (so that the dx pass does not evaluate a GELU's
// derivative again: erff and expf cost more than the memory traffic).
extern "C" __global__ void ember_batch_norm_backward_partial(double* partial, const float* dy, const float* x,
                                                             const float* saveMean, const float* saveInvStd,
                                                             const float* weightOrNull, const float* biasOrNull,
                                                             float* gOutOrNull, long long n, long long c,
                                                             long long inner, long long parts, int act) {
    const long long m = n * inner;
    for (long long blk = blockIdx.x; blk < c * parts; blk += gridDim.x) {
        const long long ch = blk / parts;
        const float mean32 = saveMean[ch], inv32 = saveInvStd[ch];
        const float w = weightOrNull != 0 ? weightOrNull[ch] : 1.0f;
        const float b = biasOrNull != 0 ? biasOrNull[ch] : 0.0f;
        const double mean = (double)mean32, inv = (double)inv32;
        long long k0, k1;
        ember_bn_part(m, parts, blk - ch * parts, &k0, &k1);
        double sdy = 0.0, sdyx = 0.0;
        ember_bn_chunk(c, inner, ch, k0, k1, [&](long long at) {
            const float xv = x[at];
            const float g32 = ember_bn_grad(act, dy[at], xv, mean32, inv32, w, b);
            if (gOutOrNull != 0) gOutOrNull[at] = g32;
            const double g = (double)g32;
            sdy += g;
            sdyx += g * (((double)xv - mean) * inv);
        });
        sdy = ember_block_sum_d(sdy);
        sdyx = ember_block_sum_d(sdyx);
        if (threadIdx.x == 0) {
            partial[2 * blk] = sdy;
            partial[2 * blk + 1] = sdyx;
        }
    }
}

// Per channel (one warp each): Σ dy and Σ dy·x̂ from the partial sums, the
// parameters' gradients, and coef[2ch] = Σdy/m, coef[2ch+1] = Σdy·x̂/m for
// the dx pass (when not null).
extern "C" __global__ void ember_batch_norm_backward_finish(double* coefOrNull, float* dweightOrNull,
                                                            float* dbiasOrNull, const double* partial, long long n,
                                                            long long c, long long inner, long long parts, int accW,
                                                            int accB) {
    const double m = (double)(n * inner);
    for (long long ch = ember_warp_index(); ch < c; ch += ember_warp_count()) {
        const double sdy = ember_warp_sum_parts(partial + 2 * ch * parts, parts, 2);
        const double sdyx = ember_warp_sum_parts(partial + 2 * ch * parts + 1, parts, 2);
        if ((threadIdx.x & 31) == 0) {
            if (coefOrNull != 0) {
                coefOrNull[2 * ch] = sdy / m;
                coefOrNull[2 * ch + 1] = sdyx / m;
            }
            if (dweightOrNull != 0) ember_store(&dweightOrNull[ch], sdyx, accW);
            if (dbiasOrNull != 0) ember_store(&dbiasOrNull[ch], sdy, accB);
        }
    }
}

// dx elementwise: w·inv·(g - Σg/m - x̂·Σg·x̂/m) in training (coef from
// the finish kernel), else w·inv·g, for g = ember_bn_grad (dy without an
// activation).
extern "C" __global__ void ember_batch_norm_backward_dx(float* dx, const float* dy, const float* x,
                                                        const float* weightOrNull, const float* saveMean,
                                                        const float* saveInvStd, const double* coefOrNull,
                                                        const float* biasOrNull, long long total, long long c,
                                                        long long inner, int wide, int innerMul, int innerShift,
                                                        int cMul, int cShift, int training, int acc, int act) {
    EMBER_LOOP(long long, i, total) {
        const long long ch = ember_bn_channel(i, c, inner, wide, (unsigned int)innerMul, (unsigned int)innerShift,
                                              (unsigned int)cMul, (unsigned int)cShift);
        const float mean32 = saveMean[ch], inv32 = saveInvStd[ch];
        const float w = weightOrNull != 0 ? weightOrNull[ch] : 1.0f;
        const float b = biasOrNull != 0 ? biasOrNull[ch] : 0.0f;
        const double mean = (double)mean32, inv = (double)inv32;
        double k = inv;
        if (weightOrNull != 0) k *= (double)w;
        double g = (double)ember_bn_grad(act, dy[i], x[i], mean32, inv32, w, b);
        if (training) {
            const double xh = ((double)x[i] - mean) * inv;
            g = g - coefOrNull[2 * ch] - xh * coefOrNull[2 * ch + 1];
        }
        ember_store(&dx[i], k * g, acc);
    }
}

// ember_batch_norm_backward_dx4 is ember_batch_norm_backward_dx four
// elements at a time (fewer than 2^31 elements; dx, dy and x 16-byte
// aligned), the channel's coefficients looked up once per four where they
// share it, as ember_batch_norm_apply4.
extern "C" __global__ void ember_batch_norm_backward_dx4(float* dx, const float* dy, const float* x,
                                                         const float* weightOrNull, const float* saveMean,
                                                         const float* saveInvStd, const double* coefOrNull,
                                                         const float* biasOrNull, int total, int c, int innerMul,
                                                         int innerShift, int cMul, int cShift, int training, int acc,
                                                         int act) {
    const unsigned int im = (unsigned int)innerMul, is = (unsigned int)innerShift, cm = (unsigned int)cMul,
                       cs = (unsigned int)cShift, uc = (unsigned int)c;
    // The plane (n, c) of index i is i / inner; its channel is the plane
    // mod c. Four elements share a channel where their first and last share
    // a plane (equal channels alone would not do: with inner < 4 the four
    // can wrap around all c channels).
    auto plane = [&](unsigned int i) { return ember_divide(i, im, is); };
    auto ofPlane = [&](unsigned int q) { return q - ember_divide(q, cm, cs) * uc; };
    auto channel = [&](unsigned int i) { return ofPlane(plane(i)); };
    // The per-channel terms: mean, inv, k = inv·w, and the two coefficients.
    struct terms {
        double mean, inv, k, c0, c1;
        float mean32, inv32, w, b;
    };
    auto load = [&](unsigned int ch) {
        terms t;
        t.mean32 = saveMean[ch];
        t.inv32 = saveInvStd[ch];
        t.w = weightOrNull != 0 ? weightOrNull[ch] : 1.0f;
        t.b = biasOrNull != 0 ? biasOrNull[ch] : 0.0f;
        t.mean = (double)t.mean32;
        t.inv = (double)t.inv32;
        t.k = t.inv;
        if (weightOrNull != 0) t.k *= (double)t.w;
        t.c0 = training ? coefOrNull[2 * ch] : 0.0;
        t.c1 = training ? coefOrNull[2 * ch + 1] : 0.0;
        return t;
    };
    auto one = [&](const terms& t, float gy, float xv, float old) {
        double g = (double)ember_bn_grad(act, gy, xv, t.mean32, t.inv32, t.w, t.b);
        if (training) {
            const double xh = ((double)xv - t.mean) * t.inv;
            g = g - t.c0 - xh * t.c1;
        }
        double v = t.k * g;
        if (acc) v += (double)old;
        return (float)v;
    };
    const int groups = total >> 2;
    EMBER_LOOP(int, q, groups) {
        const unsigned int i = (unsigned int)q << 2;
        const ember_f4 g = reinterpret_cast<const ember_f4*>(dy)[q];
        ember_f4 xv = {0.0f, 0.0f, 0.0f, 0.0f}, o = {0.0f, 0.0f, 0.0f, 0.0f};
        if (training || act != 0) xv = reinterpret_cast<const ember_f4*>(x)[q];
        if (acc) o = reinterpret_cast<const ember_f4*>(dx)[q];
        const unsigned int p0 = plane(i), p3 = plane(i + 3), c0 = ofPlane(p0);
        ember_f4 r;
        if (p0 == p3) {
            const terms t = load(c0);
            r.x = one(t, g.x, xv.x, o.x);
            r.y = one(t, g.y, xv.y, o.y);
            r.z = one(t, g.z, xv.z, o.z);
            r.w = one(t, g.w, xv.w, o.w);
        } else {
            r.x = one(load(c0), g.x, xv.x, o.x);
            r.y = one(load(channel(i + 1)), g.y, xv.y, o.y);
            r.z = one(load(channel(i + 2)), g.z, xv.z, o.z);
            r.w = one(load(ofPlane(p3)), g.w, xv.w, o.w);
        }
        reinterpret_cast<ember_f4*>(dx)[q] = r;
    }
    if (blockIdx.x == 0 && (int)threadIdx.x < (total & 3)) {
        const unsigned int i = ((unsigned int)groups << 2) + threadIdx.x;
        dx[i] = one(load(channel(i)), dy[i], training || act != 0 ? x[i] : 0.0f, acc ? dx[i] : 0.0f);
    }
}

// ember_ln_store writes a layer norm's output element: float32, or
// rounded to bfloat16 as ember_cast_f32_bf16 rounds (the _bf16 kernels,
// whose output only autocast's products read).
__device__ __forceinline__ void ember_ln_store(float* p, float v) { *p = v; }
__device__ __forceinline__ void ember_ln_store(unsigned short* p, float v) { *p = ember_bf16_from_f32(v); }

// Per row of x [rows, cols]: statistics into saveMean, saveInvStd, and y.
template <typename T>
__device__ __forceinline__ void ember_layer_norm_rows(T* y, float* saveMean, float* saveInvStd, const float* x,
                                                      const float* weightOrNull, const float* biasOrNull,
                                                      long long rows, long long cols, float eps) {
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * cols;
        double s = 0.0;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) s += (double)xr[j];
        const double mean = ember_block_sum_all(s) / (double)cols;
        double q = 0.0;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            const double d = (double)xr[j] - mean;
            q += d * d;
        }
        const double var = ember_block_sum_all(q) / (double)cols;
        const float mean32 = (float)mean, inv32 = (float)(1.0 / sqrt(var + (double)eps));
        if (threadIdx.x == 0) {
            saveMean[r] = mean32;
            saveInvStd[r] = inv32;
        }
        T* yr = y + r * cols;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            const float w = weightOrNull != 0 ? weightOrNull[j] : 1.0f;
            const float b = biasOrNull != 0 ? biasOrNull[j] : 0.0f;
            ember_ln_store(&yr[j], ember_normalized(xr[j], mean32, inv32, w, b));
        }
    }
}

extern "C" __global__ void ember_layer_norm(float* y, float* saveMean, float* saveInvStd, const float* x,
                                            const float* weightOrNull, const float* biasOrNull, long long rows,
                                            long long cols, float eps) {
    ember_layer_norm_rows(y, saveMean, saveInvStd, x, weightOrNull, biasOrNull, rows, cols, eps);
}

extern "C" __global__ void ember_layer_norm_bf16(unsigned short* y, float* saveMean, float* saveInvStd,
                                                 const float* x, const float* weightOrNull, const float* biasOrNull,
                                                 long long rows, long long cols, float eps) {
    ember_layer_norm_rows(y, saveMean, saveInvStd, x, weightOrNull, biasOrNull, rows, cols, eps);
}

// Per row: dx = inv·(g - mean(g) - x̂·mean(g·x̂)), g = dy·w.
extern "C" __global__ void ember_layer_norm_backward_dx(float* dx, const float* dy, const float* x,
                                                        const float* weightOrNull, const float* saveMean,
                                                        const float* saveInvStd, long long rows, long long cols,
                                                        int acc) {
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * cols, *gr = dy + r * cols;
        const double mean = (double)saveMean[r], inv = (double)saveInvStd[r];
        double sg = 0.0, sgx = 0.0;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            double d = (double)gr[j];
            if (weightOrNull != 0) d *= (double)weightOrNull[j];
            sg += d;
            sgx += d * (((double)xr[j] - mean) * inv);
        }
        sg = ember_block_sum_all(sg);
        sgx = ember_block_sum_all(sgx);
        const double nc = (double)cols;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            const double xh = ((double)xr[j] - mean) * inv;
            double d = (double)gr[j];
            if (weightOrNull != 0) d *= (double)weightOrNull[j];
            ember_store(&dx[r * cols + j], inv * (d - sg / nc - xh * (sgx / nc)), acc);
        }
    }
}

// Layer norm of short rows (cols up to lnWarpCols in norm.go): one warp
// per row, blockDim.x/32 rows per block, so that a block is not mostly idle
// on a 384-element row and the sums need no barrier (a xor butterfly leaves
// the same total in every lane). The rows are read three times; the later
// passes hit the cache.

// ember_warp_row_sum sums f(j) over the row's columns, this lane's share.
template <typename F>
__device__ __forceinline__ double ember_warp_row_sum(long long cols, F f) {
    const int lane = threadIdx.x & 31;
    double s = 0.0;
    for (long long j = lane; j < cols; j += 32) s += f(j);
    return ember_warp_sum_d(s);
}

// ember_layer_norm with one warp per row.
template <typename T>
__device__ __forceinline__ void ember_layer_norm_warp_rows(T* y, float* saveMean, float* saveInvStd, const float* x,
                                                           const float* weightOrNull, const float* biasOrNull,
                                                           long long rows, long long cols, float eps) {
    const long long perBlock = blockDim.x >> 5, warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    for (long long r = blockIdx.x * perBlock + warp; r < rows; r += gridDim.x * perBlock) {
        const float* xr = x + r * cols;
        const double mean = ember_warp_row_sum(cols, [&](long long j) { return (double)xr[j]; }) / (double)cols;
        const double var = ember_warp_row_sum(cols, [&](long long j) {
                               const double d = (double)xr[j] - mean;
                               return d * d;
                           }) /
                           (double)cols;
        const float mean32 = (float)mean, inv32 = (float)(1.0 / sqrt(var + (double)eps));
        if (lane == 0) {
            saveMean[r] = mean32;
            saveInvStd[r] = inv32;
        }
        T* yr = y + r * cols;
        for (long long j = lane; j < cols; j += 32) {
            const float w = weightOrNull != 0 ? weightOrNull[j] : 1.0f;
            const float b = biasOrNull != 0 ? biasOrNull[j] : 0.0f;
            ember_ln_store(&yr[j], ember_normalized(xr[j], mean32, inv32, w, b));
        }
    }
}

extern "C" __global__ void ember_layer_norm_warp(float* y, float* saveMean, float* saveInvStd, const float* x,
                                                 const float* weightOrNull, const float* biasOrNull, long long rows,
                                                 long long cols, float eps) {
    ember_layer_norm_warp_rows(y, saveMean, saveInvStd, x, weightOrNull, biasOrNull, rows, cols, eps);
}

extern "C" __global__ void ember_layer_norm_warp_bf16(unsigned short* y, float* saveMean, float* saveInvStd,
                                                      const float* x, const float* weightOrNull,
                                                      const float* biasOrNull, long long rows, long long cols,
                                                      float eps) {
    ember_layer_norm_warp_rows(y, saveMean, saveInvStd, x, weightOrNull, biasOrNull, rows, cols, eps);
}

// ember_layer_norm_backward_dx with one warp per row.
extern "C" __global__ void ember_layer_norm_backward_dx_warp(float* dx, const float* dy, const float* x,
                                                             const float* weightOrNull, const float* saveMean,
                                                             const float* saveInvStd, long long rows, long long cols,
                                                             int acc) {
    const long long perBlock = blockDim.x >> 5, warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    for (long long r = blockIdx.x * perBlock + warp; r < rows; r += gridDim.x * perBlock) {
        const float *xr = x + r * cols, *gr = dy + r * cols;
        const double mean = (double)saveMean[r], inv = (double)saveInvStd[r];
        double sg = 0.0, sgx = 0.0;
        for (long long j = lane; j < cols; j += 32) {
            double d = (double)gr[j];
            if (weightOrNull != 0) d *= (double)weightOrNull[j];
            sg += d;
            sgx += d * (((double)xr[j] - mean) * inv);
        }
        const double nc = (double)cols;
        const double meanG = ember_warp_sum_d(sg) / nc, meanGX = ember_warp_sum_d(sgx) / nc;
        for (long long j = lane; j < cols; j += 32) {
            const double xh = ((double)xr[j] - mean) * inv;
            double d = (double)gr[j];
            if (weightOrNull != 0) d *= (double)weightOrNull[j];
            ember_store(&dx[r * cols + j], inv * (d - meanG - xh * meanGX), acc);
        }
    }
}

// The parameters' gradients dweight[j] = Σ_rows dy·x̂ and dbias[j] = Σ_rows
// dy in two stages: blocks of 32 columns by blockDim.x/32 row lanes, over
// tiles of 32 columns and chunks of rowsPerChunk rows (block b: tile b %
// tiles, chunk b / tiles), write partial sums; a second pass adds a
// column's partial sums. Each lane and the combination of lanes go in a
// fixed order: deterministic. A warp reads 32 consecutive columns of a row.

// ember_lane_combine adds the values of the blockDim.x/32 row lanes of
// each column in lane order (shared sh[lanes][32]); the result is valid in
// lane 0 (threadIdx.x < 32).
__device__ __forceinline__ double ember_lane_combine(double* sh, double v) {
    sh[threadIdx.x] = v;
    __syncthreads();
    double s = 0.0;
    if (threadIdx.x < 32) {
        for (int l = 0; l < (int)(blockDim.x >> 5); l++) s += sh[l * 32 + threadIdx.x];
    }
    __syncthreads();
    return s;
}

// Stage 1: partial[(2·chunk)·cols + j] = Σ dy·x̂ and partial[(2·chunk+1)·cols
// + j] = Σ dy over the chunk's rows.
extern "C" __global__ void ember_layer_norm_params_partial(double* partial, const float* dy, const float* x,
                                                           const float* saveMean, const float* saveInvStd,
                                                           long long rows, long long cols, long long rowsPerChunk) {
    __shared__ double sh[1024];
    const long long tiles = (cols + 31) / 32, chunks = (rows + rowsPerChunk - 1) / rowsPerChunk;
    const long long lanes = blockDim.x >> 5, lane = threadIdx.x >> 5;
    for (long long blk = blockIdx.x; blk < tiles * chunks; blk += gridDim.x) {
        const long long chunk = blk / tiles, j = (blk - chunk * tiles) * 32 + (threadIdx.x & 31);
        const long long r1 = (chunk + 1) * rowsPerChunk < rows ? (chunk + 1) * rowsPerChunk : rows;
        double sw = 0.0, sb = 0.0;
        if (j < cols) {
            for (long long r = chunk * rowsPerChunk + lane; r < r1; r += lanes) {
                const double d = (double)dy[r * cols + j];
                sw += d * (((double)x[r * cols + j] - (double)saveMean[r]) * (double)saveInvStd[r]);
                sb += d;
            }
        }
        sw = ember_lane_combine(sh, sw);
        sb = ember_lane_combine(sh, sb);
        if (threadIdx.x < 32 && j < cols) {
            partial[2 * chunk * cols + j] = sw;
            partial[(2 * chunk + 1) * cols + j] = sb;
        }
    }
}

// Stage 2: per column, the chunks' partial sums added (lane l takes chunks
// l, l + lanes, ..., then the lanes in order), into dweight and dbias.
extern "C" __global__ void ember_layer_norm_params_finish(float* dweightOrNull, float* dbiasOrNull,
                                                          const double* partial, long long cols, long long chunks,
                                                          int accW, int accB) {
    __shared__ double sh[1024];
    const long long tiles = (cols + 31) / 32;
    const long long lanes = blockDim.x >> 5, lane = threadIdx.x >> 5;
    for (long long t = blockIdx.x; t < tiles; t += gridDim.x) {
        const long long j = t * 32 + (threadIdx.x & 31);
        double sw = 0.0, sb = 0.0;
        if (j < cols) {
            // Four chunks' loads in flight, added in chunk order.
            for (long long q0 = lane; q0 < chunks; q0 += 4 * lanes) {
                double w[4], b[4];
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const long long q = q0 + u * lanes;
                    w[u] = q < chunks ? partial[2 * q * cols + j] : 0.0;
                    b[u] = q < chunks ? partial[(2 * q + 1) * cols + j] : 0.0;
                }
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    if (q0 + u * lanes < chunks) {
                        sw += w[u];
                        sb += b[u];
                    }
                }
            }
        }
        sw = ember_lane_combine(sh, sw);
        sb = ember_lane_combine(sh, sb);
        if (threadIdx.x < 32 && j < cols) {
            if (dweightOrNull != 0) ember_store(&dweightOrNull[j], sw, accW);
            if (dbiasOrNull != 0) ember_store(&dbiasOrNull[j], sb, accB);
        }
    }
}
