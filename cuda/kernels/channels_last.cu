// channels_last.cu: autocast's activations held as bfloat16 [rows, C]
// (tensor/channels_last.go, cuda/channels_last.go): batch norm with its
// activation, the activations alone, sums and max pooling, each reading
// and writing the form directly. It is compiled in norm.cu's unit and
// computes the activations with norm.cu's functions (GELU's with a
// cheaper erfc), batch norm's normalised value with its constants folded
// per channel (ember_cl_fold): it differs from the CPU in the order of
// the statistics' sums and a few float32 roundings. C is a multiple of 8:
// a thread moves eight channels of one row (16 bytes) at a time.

// Eight bfloat16 values as one 16-byte access (as common.cu's ember_f4).
struct __attribute__((aligned(16))) ember_cl8 {
    unsigned int x, y, z, w;
};

// The eight bfloat16 values of u as float32 (a load kept packed, so that
// loads of several rows are in flight in four registers each).
__device__ __forceinline__ void ember_cl_unpack8(const ember_cl8 u, float v[8]) {
    const unsigned int w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        v[2 * k] = __uint_as_float(w[k] << 16);
        v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    }
}

// Eight bfloat16 values at p (16-byte aligned) as float32.
__device__ __forceinline__ void ember_cl_load8(const unsigned short* p, float v[8]) {
    ember_cl_unpack8(*reinterpret_cast<const ember_cl8*>(p), v);
}

// Eight float32 values rounded to bfloat16 at p.
__device__ __forceinline__ void ember_cl_store8(unsigned short* p, const float v[8]) {
    unsigned int w[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        w[k] = ember_bf16x2_from_f32(v[2 * k], v[2 * k + 1]);
    }
    ember_cl8 u;
    u.x = w[0];
    u.y = w[1];
    u.z = w[2];
    u.w = w[3];
    *reinterpret_cast<ember_cl8*>(p) = u;
}

// GELU for results rounded to bfloat16. With u = |x|/√2, Φ(x) =
// erfc(-x/√2)/2 is 1 - T for x >= 0 and T below, T = erfc(u)/2 =
// e^(-x²/2)·erfcx(u)/2, and erfcx(u)/2 is a polynomial of degree 7 in t =
// 1/(1 + u/2) (a minimax fit of relative error 4e-7 for u in [0, 10]).
// The exponential is φ(x)·√(2π) too, so the derivative Φ(x) + x·φ(x)
// takes the value's one exponential and one reciprocal, each a single
// instruction of the hardware (ember_ex2_ftz, ember_rcp_ftz): about 17
// instructions a value and 19 a derivative, where erff's 28 and 36 (two
// exponentials, each with its range fix) made batch norm's GELU passes
// compute-bound. Within (2 + x²/2)·1e-6 relative over [-12, 12] (the
// exponent's rounding); 0 below x = -13.2, where e^(-x²/2) is subnormal.
// The planar float32 kernels keep erff.
#define EMBER_CL_GELU_T 0.35355339059327376220f      // t = 1/(1 + |x|·this)
#define EMBER_CL_GELU_EXP2 -0.72134752044448170368f  // e^(-x²/2) = 2^(x·this·x)
struct ember_cl_gelu_parts {
    float cdf, e;  // Φ(x) and e^(-x²/2)
};
__device__ __forceinline__ ember_cl_gelu_parts ember_cl_gelu(float x) {
    const float t = ember_rcp_ftz(__fmaf_rn(fabsf(x), EMBER_CL_GELU_T, 1.0f));
    const float e = ember_ex2_ftz(x * EMBER_CL_GELU_EXP2 * x);
    float q = 0.048858870f;
    q = __fmaf_rn(q, t, -0.19620708f);
    q = __fmaf_rn(q, t, 0.22187498f);
    q = __fmaf_rn(q, t, -0.0029483244f);
    q = __fmaf_rn(q, t, 0.15067759f);
    q = __fmaf_rn(q, t, 0.13626142f);
    q = __fmaf_rn(q, t, 0.14150050f);
    q = __fmaf_rn(q, t, -1.7756602e-05f);
    const float tail = e * q;
    return {x >= 0.0f ? 1.0f - tail : tail, e};
}

__device__ __forceinline__ float ember_cl_act(int act, float x) {
    if (act != EMBER_BN_ACT_GELU) return ember_bn_act(act, x);
    return x * ember_cl_gelu(x).cdf;
}

__device__ __forceinline__ float ember_cl_act_grad(int act, float x, float dy) {
    if (act != EMBER_BN_ACT_GELU) return ember_bn_act_grad(act, x, dy);
    const ember_cl_gelu_parts p = ember_cl_gelu(x);
    return dy * __fmaf_rn(x * EMBER_BN_GELU_INV_SQRT2PI, p.e, p.cdf);
}

// Batch norm's z = (x - mean)·inv·w + b as z = x·a + c, a = inv·w and c
// = b - mean·a per channel (one multiply-add an element; a channel's
// constants in two registers). Every pass of the form computes z so,
// forward and backward, so the activation's gradient sees the forward
// pass's z; it differs from the planar kernels' ember_normalized by the
// rounding of a and c, a few float32 steps where |mean| is many standard
// deviations, far inside bfloat16's.
__device__ __forceinline__ void ember_cl_fold(float mean, float inv, float w, float b, float& a, float& c) {
    a = inv * w;
    c = __fmaf_rn(-mean, a, b);
}

// The sums of ember_cl_channel_sums.
#define EMBER_CL_STATS 0    // x - shift and its square (shift: row 0's value)
#define EMBER_CL_BN_GRAD 1  // g = dy·act'(z), and g·(x - mean)
#define EMBER_CL_SUM 2      // dy
#define EMBER_CL_EVAL 3     // none: ember_cl_bn_finalize's evaluation statistics

// ember_cl_accumulate adds row values xv (and gv) into the sums s1, s2
// of the mode; batch norm's gradient sums leave g in go.
__device__ __forceinline__ void ember_cl_accumulate(int mode, int act, const float xv[8], const float gv[8],
                                                    const float sub[8], const float a[8], const float c[8],
                                                    float s1[8], float s2[8], float go[8]) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        if (mode == EMBER_CL_STATS) {
            const float u = xv[j] - sub[j];
            s1[j] += u;
            s2[j] += u * u;
        } else if (mode == EMBER_CL_BN_GRAD) {
            const float gj = act ? ember_cl_act_grad(act, __fmaf_rn(xv[j], a[j], c[j]), gv[j]) : gv[j];
            go[j] = gj;
            s1[j] += gj;
            s2[j] += gj * (xv[j] - sub[j]);
        } else {
            s1[j] += gv[j];
        }
    }
}

// ember_cl_rows_load loads U rows of x and dy (those the mode reads),
// row, row + stride, ..., at channels c0..c0+7, kept packed.
template <int mode, int U>
__device__ __forceinline__ void ember_cl_rows_load(const unsigned short* x, const unsigned short* dy, long long row,
                                                   long long stride, int C, int c0, ember_cl8 xr[U], ember_cl8 gr[U]) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        const long long at = (row + u * stride) * C + c0;
        if (mode != EMBER_CL_SUM) xr[u] = *reinterpret_cast<const ember_cl8*>(x + at);
        if (mode != EMBER_CL_STATS) gr[u] = *reinterpret_cast<const ember_cl8*>(dy + at);
    }
}

// ember_cl_rows_sum adds the U rows ember_cl_rows_load loaded into the
// mode's sums, and writes their g to gout (batch norm's gradient sums,
// where gout is not null).
template <int mode, int U>
__device__ __forceinline__ void ember_cl_rows_sum(int act, const ember_cl8 xr[U], const ember_cl8 gr[U],
                                                  const float sub[8], const float a[8], const float c[8], float s1[8],
                                                  float s2[8], unsigned short* gout, long long row, long long stride,
                                                  int C, int c0) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        float xv[8], gv[8], go[8];
        if (mode != EMBER_CL_SUM) ember_cl_unpack8(xr[u], xv);
        if (mode != EMBER_CL_STATS) ember_cl_unpack8(gr[u], gv);
        ember_cl_accumulate(mode, act, xv, gv, sub, a, c, s1, s2, go);
        if (mode == EMBER_CL_BN_GRAD && gout) ember_cl_store8(gout + (row + u * stride) * C + c0, go);
    }
}

// ember_cl_block_partials adds the block's rows' sums s1, s2 of channels
// c0..c0+7 (thread (c0/8, r) of R rows; mine: r < R) in shared memory, in
// row order, and writes the block's two partial sums of each channel to
// part[b·C + c] and part[(gridDim.x + b)·C + c]. Every thread must call
// it; R·C <= 2048.
__device__ __forceinline__ void ember_cl_block_partials(float* part, bool mine, int R, int C, int c0, const float s1[8],
                                                        const float s2[8]) {
    __shared__ float sh[2][2048];
    if (mine) {
        const int r = threadIdx.x / (C >> 3);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            sh[0][r * C + c0 + j] = s1[j];
            sh[1][r * C + c0 + j] = s2[j];
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float t1 = 0.f, t2 = 0.f;
        for (int q = 0; q < R; q++) {
            t1 += sh[0][q * C + c];
            t2 += sh[1][q * C + c];
        }
        part[(long long)blockIdx.x * C + c] = t1;
        part[((long long)gridDim.x + blockIdx.x) * C + c] = t2;
    }
}

// ember_cl_channel_sums writes two partial sums per channel of [rows, C]
// (the mode's, fixed at compile time so that each kernel keeps only its
// own registers)
// for block b to part[b·C + c] and part[(gridDim.x + b)·C + c]; batch
// norm's gradient sums also write g = dy·act'(z) to gout (bfloat16,
// [rows, C]) when it is not null, so that the dx pass reads g instead of
// computing the activation's derivative again. A thread takes eight
// channels of every (gridDim.x·R)-th row, R = blockDim.x / (C/8) rows at
// a time per block, U rows' loads in flight at once (with P, the next U
// rows' loads issued before these U are summed: the gradient's sums,
// whose activation derivative left the loads' latency exposed), and the
// block adds its rows' sums in shared memory. C/8 <= blockDim.x,
// (C/8)·R·8 <= 2048.
template <int mode, int U, bool P>
__device__ __forceinline__ void ember_cl_channel_sums(float* part, unsigned short* gout, const unsigned short* x,
                                                      const unsigned short* dy, const float* mean, const float* inv,
                                                      const float* w, const float* b, int act, long long rows, int C) {
    const int G = C >> 3;
    const int R = blockDim.x / G;
    const int g = threadIdx.x % G;
    const int r = threadIdx.x / G;
    const int c0 = g * 8;
    const int readX = mode != EMBER_CL_SUM, readDY = mode != EMBER_CL_STATS;
    float s1[8], s2[8], sub[8], a[8], c[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        s1[j] = 0.f;
        s2[j] = 0.f;
        sub[j] = 0.f;
        a[j] = 1.f;
        c[j] = 0.f;
    }
    if (r < R) {
        if (mode == EMBER_CL_STATS) {
            ember_cl_load8(x + c0, sub);
        } else if (mode == EMBER_CL_BN_GRAD) {
#pragma unroll
            for (int j = 0; j < 8; j++) {
                sub[j] = mean[c0 + j];
                ember_cl_fold(mean[c0 + j], inv[c0 + j], w ? w[c0 + j] : 1.f, b ? b[c0 + j] : 0.f, a[j], c[j]);
            }
        }
        const long long stride = (long long)gridDim.x * R;
        long long row = (long long)blockIdx.x * R + r;
        if (P) {
            // The next U rows' loads in flight while these U are summed.
            ember_cl8 xr[U], gr[U];
            bool have = row + (U - 1) * stride < rows;
            if (have) ember_cl_rows_load<mode, U>(x, dy, row, stride, C, c0, xr, gr);
            while (have) {
                const long long next = row + U * stride;
                const bool more = next + (U - 1) * stride < rows;
                ember_cl8 xn[U], gn[U];
                if (more) ember_cl_rows_load<mode, U>(x, dy, next, stride, C, c0, xn, gn);
                ember_cl_rows_sum<mode, U>(act, xr, gr, sub, a, c, s1, s2, gout, row, stride, C, c0);
#pragma unroll
                for (int u = 0; u < U; u++) {
                    xr[u] = xn[u];
                    gr[u] = gn[u];
                }
                row = next;
                have = more;
            }
        } else {
            for (; row + (U - 1) * stride < rows; row += U * stride) {
                ember_cl8 xr[U], gr[U];
                ember_cl_rows_load<mode, U>(x, dy, row, stride, C, c0, xr, gr);
                ember_cl_rows_sum<mode, U>(act, xr, gr, sub, a, c, s1, s2, gout, row, stride, C, c0);
            }
        }
        for (; row < rows; row += stride) {
            float xv[8], gv[8], go[8];
            const long long at = row * C + c0;
            if (readX) ember_cl_load8(x + at, xv);
            if (readDY) ember_cl_load8(dy + at, gv);
            ember_cl_accumulate(mode, act, xv, gv, sub, a, c, s1, s2, go);
            if (mode == EMBER_CL_BN_GRAD && gout) ember_cl_store8(gout + at, go);
        }
    }
    ember_cl_block_partials(part, r < R, R, C, c0, s1, s2);
}

// The three sums of ember_cl_channel_sums, a kernel each.
extern "C" __global__ void ember_cl_stats(float* part, const unsigned short* x, long long rows, int C) {
    ember_cl_channel_sums<EMBER_CL_STATS, 4, false>(part, 0, x, 0, 0, 0, 0, 0, 0, rows, C);
}

extern "C" __global__ void ember_cl_grad_sums(float* part, unsigned short* gout, const unsigned short* x,
                                              const unsigned short* dy, const float* mean, const float* inv,
                                              const float* w, const float* b, int act, long long rows, int C) {
    ember_cl_channel_sums<EMBER_CL_BN_GRAD, 2, true>(part, gout, x, dy, mean, inv, w, b, act, rows, C);
}

extern "C" __global__ void ember_cl_dy_sums(float* part, const unsigned short* dy, long long rows, int C) {
    ember_cl_channel_sums<EMBER_CL_SUM, 4, false>(part, 0, 0, dy, 0, 0, 0, 0, 0, rows, C);
}

// ember_cl_bn_finalize adds the nb blocks' partial sums of each channel
// (in double, in a fixed order) and from them:
//   EMBER_CL_STATS: training batch norm's mean and 1/√(var+eps) into
//     saveMean and saveInvStd, the running statistics updated as torch
//     does (when runMean is not null);
//   EMBER_CL_BN_GRAD: dbias = Σg and dweight = Σg·x̂ (each written, or
//     added when its acc flag is set; null: skipped), and the means of g
//     and g·x̂ for the dx pass;
//   EMBER_CL_SUM: dbias += Σdy;
//   EMBER_CL_EVAL (no sums): saveMean and saveInvStd from the running
//     statistics, for batch norm out of training.
// Batch norm's modes also fill tab (16-byte aligned, [6][C]) with what
// ember_cl_apply reads of each channel: the mean, 1/std, weight (1 when
// w is null), bias (0 when b is null) and, for the gradient, the two
// means.
//
// A block of EMBER_CL_FIN_THREADS takes eight channels (C is a multiple of
// eight): thread (slot, j) adds channel 8·blockIdx.x + j's partials slot,
// slot + slots, ..., so that a warp reads four rows' 32 contiguous bytes a
// load and a thread's few loads are in flight together; the slots' sums
// are then added by halves. The last steps' operands (the shift, the
// running statistics, 1/std, the parameters, the gradients added to) are
// loaded before the sums, off the kernel's end. (A block a channel, its
// threads 4-byte loads C floats apart and its last steps a chain of
// dependent loads, took 5.4-7.0 µs a launch; docs/performance.md, round
// 30.)
#define EMBER_CL_FIN_THREADS 1024
extern "C" __global__ void ember_cl_bn_finalize(const float* part, int nb, int C, long long rows, int mode,
                                                const unsigned short* x, float* saveMean, float* saveInvStd,
                                                float* runMean, float* runVar, float momentum, float eps,
                                                const float* w, const float* b, float* dweight, float* dbias,
                                                int accW, int accB, float* tab) {
    __shared__ double red[2][EMBER_CL_FIN_THREADS];
    const int j = threadIdx.x & 7, slot = threadIdx.x >> 3, slots = blockDim.x >> 3;
    const int c = blockIdx.x * 8 + j;
    // The last steps' operands, by the threads that take them.
    double shift = 0.0, rm = 0.0, rv = 0.0, inv = 0.0, oldB = 0.0, oldW = 0.0;
    float wv = 1.f, bv = 0.f, mean = 0.f, invStd = 0.f;
    if (slot == 0) {
        if (mode == EMBER_CL_STATS) shift = (double)ember_f32_from_bf16(x[c]);
        if ((mode == EMBER_CL_STATS && runMean) || mode == EMBER_CL_EVAL) {
            rm = (double)runMean[c];
            rv = (double)runVar[c];
        }
        if (mode == EMBER_CL_BN_GRAD) {
            mean = saveMean[c];
            inv = (double)saveInvStd[c];
            if (dbias && accB) oldB = (double)dbias[c];
            if (dweight && accW) oldW = (double)dweight[c];
        }
        if (mode == EMBER_CL_SUM) oldB = (double)dbias[c];
        if (w) wv = w[c];
        if (b) bv = b[c];
    }
    double s1 = 0.0, s2 = 0.0;
    if (mode != EMBER_CL_EVAL) {
#pragma unroll 4
        for (int q = slot; q < nb; q += slots) {
            s1 += (double)part[(long long)q * C + c];
            if (mode != EMBER_CL_SUM) s2 += (double)part[((long long)nb + q) * C + c];
        }
    }
    red[0][threadIdx.x] = s1;
    red[1][threadIdx.x] = s2;
    __syncthreads();
    for (int half = slots >> 1; half > 0; half >>= 1) {
        if (slot < half) {
            red[0][threadIdx.x] += red[0][threadIdx.x + half * 8];
            red[1][threadIdx.x] += red[1][threadIdx.x + half * 8];
        }
        __syncthreads();
    }
    if (slot != 0) return;
    s1 = red[0][j];
    s2 = red[1][j];
    const double m = (double)rows;
    if (mode == EMBER_CL_STATS) {
        const double d = s1 / m;
        double var = s2 / m - d * d;
        if (var < 0.0) var = 0.0;
        const double mu = shift + d;
        mean = (float)mu;
        invStd = (float)(1.0 / sqrt(var + (double)eps));
        saveMean[c] = mean;
        saveInvStd[c] = invStd;
        if (runMean) {
            const double mom = (double)momentum;
            runMean[c] = (float)((1.0 - mom) * rm + mom * mu);
            runVar[c] = (float)((1.0 - mom) * rv + mom * var * m / (m - 1.0));
        }
    } else if (mode == EMBER_CL_BN_GRAD) {
        const double sx = s2 * inv; // Σ g·x̂
        if (dbias) dbias[c] = (float)(oldB + s1);
        if (dweight) dweight[c] = (float)(oldW + sx);
        tab[4 * C + c] = (float)(s1 / m);
        tab[5 * C + c] = (float)(sx / m);
        invStd = (float)inv;
    } else if (mode == EMBER_CL_SUM) {
        dbias[c] = (float)(oldB + s1);
        return;
    } else {
        mean = (float)rm;
        invStd = (float)(1.0 / sqrt(rv + (double)eps));
        saveMean[c] = mean;
        saveInvStd[c] = invStd;
    }
    tab[c] = mean;
    tab[C + c] = invStd;
    tab[2 * C + c] = wv;
    tab[3 * C + c] = bv;
}

// The elementwise passes of ember_cl_apply.
#define EMBER_CL_BN 0       // y = act(z), z batch norm's normalised x
#define EMBER_CL_ACT 1      // y = act(x)
#define EMBER_CL_BIAS 2     // y = x + bias, then ReLU when act
#define EMBER_CL_ACT_GRAD 3 // y = dy·act'(x)
#define EMBER_CL_BN_DX 4    // y = batch norm's dx (training: with the means of g and g·x̂)
#define EMBER_CL_ADD 5      // y = x + dy

// Eight floats of a row of ember_cl_bn_finalize's tab at p (32-byte
// aligned).
__device__ __forceinline__ void ember_cl_tab8(const float* p, float v[8]) {
    const ember_f4 a = reinterpret_cast<const ember_f4*>(p)[0];
    const ember_f4 b = reinterpret_cast<const ember_f4*>(p)[1];
    v[0] = a.x;
    v[1] = a.y;
    v[2] = a.z;
    v[3] = a.w;
    v[4] = b.x;
    v[5] = b.y;
    v[6] = b.z;
    v[7] = b.w;
}

// ember_cl_tab_consts folds channels c0..c0+7's constants from tab
// once: z = x·a + c (ember_cl_fold) and, with dx, dx = a·g + (e - d·x),
// d = a·inv·m2 and e = d·mean - a·m1 (0 out of training).
__device__ __forceinline__ void ember_cl_tab_consts(const float* tab, int C, int c0, bool dx, int training, float a[8],
                                                    float c[8], float d[8], float e[8]) {
    float mean[8], inv[8], wv[8], bv[8];
    ember_cl_tab8(tab + c0, mean);
    ember_cl_tab8(tab + C + c0, inv);
    ember_cl_tab8(tab + 2 * C + c0, wv);
    ember_cl_tab8(tab + 3 * C + c0, bv);
#pragma unroll
    for (int j = 0; j < 8; j++) ember_cl_fold(mean[j], inv[j], wv[j], bv[j], a[j], c[j]);
    if (!dx) return;
    float m1[8], m2[8];
    ember_cl_tab8(tab + 4 * C + c0, m1);
    ember_cl_tab8(tab + 5 * C + c0, m2);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        d[j] = training ? a[j] * inv[j] * m2[j] : 0.f;
        e[j] = training ? __fmaf_rn(d[j], mean[j], -(a[j] * m1[j])) : 0.f;
    }
}

// ember_cl_bn_rows runs batch norm's pass of the mode (EMBER_CL_BN: y =
// act(z); EMBER_CL_BN_DX: y = dx, training's with the means of g and
// g·x̂ from tab) over [rows, C]: thread (g, r) of a block of R =
// blockDim.x / (C/8) rows takes channels 8g..8g+7 of every
// (gridDim.x·R)-th row from row blockIdx.x·R + r, two rows' loads in
// flight. A thread's channels never change, so it folds its channels'
// constants from tab once (ember_cl_tab_consts). A
// thread a group of eight elements, reloading its channels' twelve
// tab values each time, kept three tenths of the SMs' warps busy on the
// H200 (docs/performance.md, round 22). (C/8) <= blockDim.x.
template <int mode>
__device__ __forceinline__ void ember_cl_bn_rows(unsigned short* y, const unsigned short* x, const unsigned short* dy,
                                                 const float* tab, int act, int training, long long rows, int C) {
    const int G = C >> 3, R = blockDim.x / G;
    const int r = threadIdx.x / G, c0 = (threadIdx.x % G) * 8;
    if (r >= R) return;
    float a[8], c[8], d[8], e[8];
    ember_cl_tab_consts(tab, C, c0, mode == EMBER_CL_BN_DX, training, a, c, d, e);
    const long long stride = (long long)gridDim.x * R;
    for (long long row = (long long)blockIdx.x * R + r; row < rows; row += 2 * stride) {
        const bool two = row + stride < rows;
        ember_cl8 xr[2], gr[2];
#pragma unroll
        for (int u = 0; u < 2; u++) {
            if (u == 0 || two) {
                const long long at = (row + u * stride) * C + c0;
                xr[u] = *reinterpret_cast<const ember_cl8*>(x + at);
                if (mode == EMBER_CL_BN_DX) gr[u] = *reinterpret_cast<const ember_cl8*>(dy + at);
            }
        }
#pragma unroll
        for (int u = 0; u < 2; u++) {
            if (u == 1 && !two) break;
            float xv[8], gv[8], out[8];
            ember_cl_unpack8(xr[u], xv);
            if (mode == EMBER_CL_BN_DX) ember_cl_unpack8(gr[u], gv);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float z = __fmaf_rn(xv[j], a[j], c[j]);
                if (mode == EMBER_CL_BN) {
                    out[j] = act ? ember_cl_act(act, z) : z;
                } else {
                    const float g = act ? ember_cl_act_grad(act, z, gv[j]) : gv[j];
                    out[j] = __fmaf_rn(a[j], g, __fmaf_rn(-d[j], xv[j], e[j]));
                }
            }
            ember_cl_store8(y + (row + u * stride) * C + c0, out);
        }
    }
}

// ember_cl_apply runs one of the other passes (by kind) over n8 groups of
// eight elements of [rows, C] (a thread per group, grid-stride; the
// channel of a thread's group advances by the grid's stride, without a
// division), rounding y to bfloat16. EMBER_CL_BIAS reads its bias from
// bias.
__device__ __forceinline__ void ember_cl_apply(unsigned short* y, const unsigned short* x, const unsigned short* dy,
                                               const float* bias, int act, int kind, long long n8, int C) {
    const long long step = (long long)blockDim.x * gridDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n8) return;
    int c0 = (int)((i * 8) % C);
    const int adv = (int)((step * 8) % C);
    for (; i < n8; i += step) {
        const long long at = i * 8;
        float xv[8], gv[8], out[8];
        ember_cl_load8(x + at, xv);
        if (kind >= EMBER_CL_ACT_GRAD) ember_cl_load8(dy + at, gv);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float v;
            switch (kind) {
            case EMBER_CL_ACT:
                v = ember_cl_act(act, xv[j]);
                break;
            case EMBER_CL_BIAS:
                v = xv[j] + (bias ? bias[c0 + j] : 0.f);
                if (act) v = ember_cl_act(act, v);
                break;
            case EMBER_CL_ACT_GRAD:
                v = ember_cl_act_grad(act, xv[j], gv[j]);
                break;
            default:
                v = xv[j] + gv[j];
            }
            out[j] = v;
        }
        ember_cl_store8(y + at, out);
        c0 += adv;
        if (c0 >= C) c0 -= C;
    }
}

// Batch norm's passes and the others (by kind), a kernel each.
extern "C" __global__ void ember_cl_bn_apply(unsigned short* y, const unsigned short* x, const float* tab, int act,
                                             long long rows, int C) {
    ember_cl_bn_rows<EMBER_CL_BN>(y, x, 0, tab, act, 0, rows, C);
}

extern "C" __global__ void ember_cl_bn_dx(unsigned short* dx, const unsigned short* x, const unsigned short* dy,
                                          const float* tab, int act, int training, long long rows, int C) {
    ember_cl_bn_rows<EMBER_CL_BN_DX>(dx, x, dy, tab, act, training, rows, C);
}

extern "C" __global__ void ember_cl_pointwise(unsigned short* y, const unsigned short* x, const unsigned short* dy,
                                              const float* bias, int act, int kind, long long n8, int C) {
    ember_cl_apply(y, x, dy, bias, act, kind, n8, C);
}

// GELU and its gradient over n8 groups of eight elements, the pass
// ember_cl_pointwise makes for them with the kind and activation fixed
// when compiled: no per-group channel or kind to carry (the whitening
// layer's GELU took 30 instructions an element in the general pass,
// docs/performance.md, round 35). The same arithmetic, the same bits.
template <bool Grad>
__device__ __forceinline__ void ember_cl_gelu_pass(unsigned short* y, const unsigned short* x, const unsigned short* dy,
                                                   long long n8) {
    EMBER_LOOP(long long, i, n8) {
        const long long at = i * 8;
        float xv[8], gv[8], out[8];
        ember_cl_load8(x + at, xv);
        if (Grad) ember_cl_load8(dy + at, gv);
#pragma unroll
        for (int j = 0; j < 8; j++)
            out[j] = Grad ? ember_cl_act_grad(EMBER_BN_ACT_GELU, xv[j], gv[j]) : ember_cl_act(EMBER_BN_ACT_GELU, xv[j]);
        ember_cl_store8(y + at, out);
    }
}

extern "C" __global__ void ember_cl_gelu_fwd(unsigned short* y, const unsigned short* x, long long n8) {
    ember_cl_gelu_pass<false>(y, x, 0, n8);
}

extern "C" __global__ void ember_cl_gelu_bwd(unsigned short* dx, const unsigned short* x, const unsigned short* dy,
                                             long long n8) {
    ember_cl_gelu_pass<true>(dx, x, dy, n8);
}

// Eight bytes as one 8-byte access.
struct __attribute__((aligned(8))) ember_cl8b {
    unsigned int lo, hi;
};

// ember_cl_window_load loads the in-bounds taps of a KT×KT window (KT >
// 0) at channels c0..c0+7, all issued before any is used.
template <int KT>
__device__ __forceinline__ void ember_cl_window_load(const unsigned short* x, long long img, int oy, int ox, int H, int W,
                                                     int C, int c0, ember_cl8 raw[KT * KT]) {
#pragma unroll
    for (int t = 0; t < KT * KT; t++) {
        const int h = oy * KT + t / KT, wc = ox * KT + t % KT;
        if (h < H && wc < W) raw[t] = *reinterpret_cast<const ember_cl8*>(x + ((img * H + h) * W + wc) * C + c0);
    }
}

// ember_cl_window_reduce takes the maxima of ember_cl_window_load's taps
// and their positions, in the order of ember_cl_window_max's loop.
template <int KT>
__device__ __forceinline__ void ember_cl_window_reduce(const ember_cl8 raw[KT * KT], int oy, int ox, int H, int W,
                                                       float best[8], unsigned int at[8]) {
    float v[8];
    int first = 1;
#pragma unroll
    for (int t = 0; t < KT * KT; t++) {
        const int h = oy * KT + t / KT, wc = ox * KT + t % KT;
        if (h >= H || wc >= W) continue;
        ember_cl_unpack8(raw[t], v);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            if (first || v[j] > best[j] || v[j] != v[j]) {
                best[j] = v[j];
                at[j] = (unsigned int)t;
            }
        }
        first = 0;
    }
}

// ember_cl_window_max takes the maxima of window (img, oy, ox) at
// channels c0..c0+7 and their positions in it, as ember_cl_maxpool says:
// for KT > 0 its taps loaded together, else one at a time.
template <int KT>
__device__ __forceinline__ void ember_cl_window_max(const unsigned short* x, long long img, int oy, int ox, int H, int W,
                                                    int C, int KHr, int KWr, int c0, float best[8], unsigned int at[8]) {
    if (KT) {
        // (KS: KT, kept positive for the runtime instance, which never
        // comes here.)
        constexpr int KS = KT > 0 ? KT : 1;
        ember_cl8 raw[KS * KS];
        ember_cl_window_load<KS>(x, img, oy, ox, H, W, C, c0, raw);
        ember_cl_window_reduce<KS>(raw, oy, ox, H, W, best, at);
        return;
    }
    const int KH = KHr, KW = KWr;
    float v[8];
    int first = 1;
    for (int r = 0; r < KH; r++) {
        const int h = oy * KH + r;
        if (h >= H) break;
        for (int s = 0; s < KW; s++) {
            const int wc = ox * KW + s;
            if (wc >= W) break;
            ember_cl_load8(x + ((img * H + h) * W + wc) * C + c0, v);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                if (first || v[j] > best[j] || v[j] != v[j]) {
                    best[j] = v[j];
                    at[j] = (unsigned int)(r * KW + s);
                }
            }
            first = 0;
        }
    }
}

// ember_cl_pool_store writes a pooled row's eight channels at o: the
// maxima (bfloat16 already: stored exactly) to y, their positions to idx.
__device__ __forceinline__ void ember_cl_pool_store(unsigned short* y, unsigned char* idx, long long o, const float best[8],
                                                    const unsigned int at[8]) {
    ember_cl_store8(y + o, best);
    ember_cl8b b;
    b.lo = at[0] | (at[1] << 8) | (at[2] << 16) | (at[3] << 24);
    b.hi = at[4] | (at[5] << 8) | (at[6] << 16) | (at[7] << 24);
    *reinterpret_cast<ember_cl8b*>(idx + o) = b;
}

// ember_cl_maxpool takes the maximum of each KH×KW window moved by its
// own size over x [N, H, W, C] into y [N, OH, OW, C], and its position in
// the window (row·KW + column, KH·KW <= 256) into idx, a thread per output
// position and eight channels: the windows' parts past the edge (ceil
// mode) are skipped, the first maximum wins and a NaN wins over numbers
// (the last NaN), as cpu.go's MaxPool2d. KT > 0 fixes KH = KW = KT when
// compiled: the window's loads are then issued together, where a loop of
// runtime length waits for each before the next (ember_cl_maxpool2, the
// 2x2 windows of most networks).
template <int KT>
__device__ __forceinline__ void ember_cl_maxpool_of(unsigned short* y, unsigned char* idx, const unsigned short* x,
                                                    int H, int W, int C, int OH, int OW, int KH, int KW, long long n8) {
    const int G = C >> 3;
    EMBER_LOOP(long long, i, n8) {
        const int g = (int)(i % G);
        const long long pos = i / G;
        const int ox = (int)(pos % OW);
        const int oy = (int)((pos / OW) % OH);
        const long long img = pos / ((long long)OW * OH);
        float best[8];
        unsigned int at[8];
        ember_cl_window_max<KT>(x, img, oy, ox, H, W, C, KH, KW, g * 8, best, at);
        ember_cl_pool_store(y, idx, pos * C + g * 8, best, at);
    }
}

extern "C" __global__ void ember_cl_maxpool(unsigned short* y, unsigned char* idx, const unsigned short* x, int H,
                                            int W, int C, int OH, int OW, int KH, int KW, long long n8) {
    ember_cl_maxpool_of<0>(y, idx, x, H, W, C, OH, OW, KH, KW, n8);
}

extern "C" __global__ void ember_cl_maxpool2(unsigned short* y, unsigned char* idx, const unsigned short* x, int H,
                                             int W, int C, int OH, int OW, int KH, int KW, long long n8) {
    ember_cl_maxpool_of<2>(y, idx, x, H, W, C, OH, OW, KH, KW, n8);
}

// A pooled row's window (img, oy, ox), moved by a fixed number of rows
// without a division (ember_cl_pos_add).
struct ember_cl_pos {
    long long img;
    int oy, ox;
};

__device__ __forceinline__ ember_cl_pos ember_cl_pos_of(long long row, int OH, int OW) {
    const long long t = row / OW;
    return ember_cl_pos{t / OH, (int)(t % OH), (int)(row % OW)};
}

// ember_cl_pos_add moves p by d (ember_cl_pos_of of a row count).
__device__ __forceinline__ void ember_cl_pos_add(ember_cl_pos& p, const ember_cl_pos d, int OH, int OW) {
    p.ox += d.ox;
    const int cx = p.ox >= OW;
    if (cx) p.ox -= OW;
    p.oy += d.oy + cx;
    const int cy = p.oy >= OH;
    if (cy) p.oy -= OH;
    p.img += d.img + cy;
}

// ember_cl_maxpool_stats_of is ember_cl_maxpool_of and ember_cl_stats
// over its output in one pass: batch norm's statistics of the pooled
// rows without reading them again. Threads as ember_cl_channel_sums's
// (thread (g, r) takes channels 8g..8g+7 of every (gridDim.x·R)-th
// pooled row), the same shift (pooled row 0), the same additions in the
// same order and the same partials, so that ember_cl_bn_finalize gives
// the bits it gives from ember_cl_stats over y with the same grid.
// For KT > 0 two rows' windows are loaded before either is reduced.
template <int KT>
__device__ __forceinline__ void ember_cl_maxpool_stats_of(float* part, unsigned short* y, unsigned char* idx,
                                                          const unsigned short* x, int H, int W, int C, int OH, int OW,
                                                          int KH, int KW, long long rows) {
    const int G = C >> 3, R = blockDim.x / G;
    const int r = threadIdx.x / G, c0 = (threadIdx.x % G) * 8;
    float s1[8], s2[8], sub[8], unused[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        s1[j] = 0.f;
        s2[j] = 0.f;
        unused[j] = 0.f;
    }
    if (r < R) {
        float best[8], go[8];
        unsigned int at[8];
        ember_cl_window_max<KT>(x, 0, 0, 0, H, W, C, KH, KW, c0, sub, at);
        const long long stride = (long long)gridDim.x * R;
        long long row = (long long)blockIdx.x * R + r;
        ember_cl_pos p = ember_cl_pos_of(row, OH, OW);
        const ember_cl_pos d = ember_cl_pos_of(stride, OH, OW);
        if (KT) {
            // Two rows' windows loaded before either is reduced.
            constexpr int KS = KT > 0 ? KT : 1;
            for (; row < rows; row += 2 * stride) {
                const bool two = row + stride < rows;
                ember_cl_pos q = p;
                ember_cl_pos_add(q, d, OH, OW);
                ember_cl8 r0[KS * KS], r1[KS * KS];
                ember_cl_window_load<KS>(x, p.img, p.oy, p.ox, H, W, C, c0, r0);
                if (two) ember_cl_window_load<KS>(x, q.img, q.oy, q.ox, H, W, C, c0, r1);
                ember_cl_window_reduce<KS>(r0, p.oy, p.ox, H, W, best, at);
                ember_cl_pool_store(y, idx, row * C + c0, best, at);
                ember_cl_accumulate(EMBER_CL_STATS, 0, best, unused, sub, unused, unused, s1, s2, go);
                if (two) {
                    ember_cl_window_reduce<KS>(r1, q.oy, q.ox, H, W, best, at);
                    ember_cl_pool_store(y, idx, (row + stride) * C + c0, best, at);
                    ember_cl_accumulate(EMBER_CL_STATS, 0, best, unused, sub, unused, unused, s1, s2, go);
                }
                p = q;
                ember_cl_pos_add(p, d, OH, OW);
            }
        } else {
            for (; row < rows; row += stride) {
                ember_cl_window_max<KT>(x, p.img, p.oy, p.ox, H, W, C, KH, KW, c0, best, at);
                ember_cl_pool_store(y, idx, row * C + c0, best, at);
                ember_cl_accumulate(EMBER_CL_STATS, 0, best, unused, sub, unused, unused, s1, s2, go);
                ember_cl_pos_add(p, d, OH, OW);
            }
        }
    }
    ember_cl_block_partials(part, r < R, R, C, c0, s1, s2);
}

extern "C" __global__ void ember_cl_maxpool_stats(float* part, unsigned short* y, unsigned char* idx,
                                                  const unsigned short* x, int H, int W, int C, int OH, int OW, int KH,
                                                  int KW, long long rows) {
    ember_cl_maxpool_stats_of<0>(part, y, idx, x, H, W, C, OH, OW, KH, KW, rows);
}

extern "C" __global__ void ember_cl_maxpool2_stats(float* part, unsigned short* y, unsigned char* idx,
                                                   const unsigned short* x, int H, int W, int C, int OH, int OW, int KH,
                                                   int KW, long long rows) {
    ember_cl_maxpool_stats_of<2>(part, y, idx, x, H, W, C, OH, OW, KH, KW, rows);
}

// ember_cl_window_grad writes the window of pooled position (img, oy, ox)
// in dx [N, H, W, C], channels c0..c0+7: gv where ember_cl_maxpool's
// positions b name the element and zero elsewhere; the last window of a
// row or column also zeroes the inputs past it (no window holds them).
__device__ __forceinline__ void ember_cl_window_grad(unsigned short* dx, const float gv[8], const ember_cl8b b, long long img,
                                                     int oy, int ox, int H, int W, int C, int OH, int OW, int KH, int KW,
                                                     int c0) {
    const int h0 = oy * KH, w0 = ox * KW;
    const int h1 = oy == OH - 1 ? H : ember_imin(h0 + KH, H);
    const int w1 = ox == OW - 1 ? W : ember_imin(w0 + KW, W);
    for (int h = h0; h < h1; h++) {
        for (int wc = w0; wc < w1; wc++) {
            const int r = h - h0, s = wc - w0;
            const unsigned int me = (r < KH && s < KW) ? (unsigned int)(r * KW + s) : 0x100u;
            float out[8];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const unsigned int a = ((j < 4 ? b.lo : b.hi) >> (8 * (j & 3))) & 0xffu;
                out[j] = a == me ? gv[j] : 0.f;
            }
            ember_cl_store8(dx + ((img * H + h) * W + wc) * C + c0, out);
        }
    }
}

// ember_cl_maxpool_backward sets dx [N, H, W, C]: a thread per window
// and eight channels writes its window's part of dx
// (ember_cl_window_grad).
extern "C" __global__ void ember_cl_maxpool_backward(unsigned short* dx, const unsigned short* dy,
                                                     const unsigned char* idx, int H, int W, int C, int OH, int OW,
                                                     int KH, int KW, long long n8) {
    const int G = C >> 3;
    EMBER_LOOP(long long, i, n8) {
        const int g = (int)(i % G);
        const long long pos = i / G;
        const int ox = (int)(pos % OW);
        const int oy = (int)((pos / OW) % OH);
        const long long img = pos / ((long long)OW * OH);
        const long long o = pos * C + g * 8;
        const ember_cl8b b = *reinterpret_cast<const ember_cl8b*>(idx + o);
        float gv[8];
        ember_cl_load8(dy + o, gv);
        ember_cl_window_grad(dx, gv, b, img, oy, ox, H, W, C, OH, OW, KH, KW, g * 8);
    }
}

// ember_cl_bn_dx_maxpool_backward is ember_cl_bn_dx over the pooled rows
// [N·OH·OW, C] (x, the pooled values; g, the gradient of batch norm's
// output, act's derivative already in it) followed by
// ember_cl_maxpool_backward of its result into dx [N, H, W, C], in one
// pass: the pooled gradient, rounded to bfloat16 as ember_cl_bn_dx
// stores it, goes straight to its window's position. Threads as
// ember_cl_bn_rows's (a thread's eight channels fixed, their constants
// folded from tab once, two pooled rows' loads in flight).
extern "C" __global__ void ember_cl_bn_dx_maxpool_backward(unsigned short* dx, const unsigned short* x,
                                                           const unsigned short* g, const unsigned char* idx,
                                                           const float* tab, int training, int H, int W, int C,
                                                           int OH, int OW, int KH, int KW, long long rows) {
    const int G = C >> 3, R = blockDim.x / G;
    const int r = threadIdx.x / G, c0 = (threadIdx.x % G) * 8;
    if (r >= R) return;
    float a[8], c[8], d[8], e[8];
    ember_cl_tab_consts(tab, C, c0, true, training, a, c, d, e);
    // Two rows' loads in flight at a time, as ember_cl_bn_rows's.
    const long long stride = (long long)gridDim.x * R;
    for (long long row = (long long)blockIdx.x * R + r; row < rows; row += 2 * stride) {
        const bool two = row + stride < rows;
        ember_cl8 xr[2], gr[2];
        ember_cl8b br[2];
#pragma unroll
        for (int u = 0; u < 2; u++) {
            if (u == 0 || two) {
                const long long o = (row + u * stride) * C + c0;
                xr[u] = *reinterpret_cast<const ember_cl8*>(x + o);
                gr[u] = *reinterpret_cast<const ember_cl8*>(g + o);
                br[u] = *reinterpret_cast<const ember_cl8b*>(idx + o);
            }
        }
#pragma unroll
        for (int u = 0; u < 2; u++) {
            if (u == 1 && !two) break;
            const long long q = row + u * stride;
            float xv[8], gv[8], gp[8];
            ember_cl_unpack8(xr[u], xv);
            ember_cl_unpack8(gr[u], gv);
            const ember_cl8b b = br[u];
#pragma unroll
            for (int j = 0; j < 8; j++)
                gp[j] = ember_f32_from_bf16(ember_bf16_from_f32(__fmaf_rn(a[j], gv[j], __fmaf_rn(-d[j], xv[j], e[j]))));
            const int ox = (int)(q % OW);
            const int oy = (int)((q / OW) % OH);
            ember_cl_window_grad(dx, gp, b, q / ((long long)OW * OH), oy, ox, H, W, C, OH, OW, KH, KW, c0);
        }
    }
}

// ember_cl_pad_channels widens rows of c channels to cp (both multiples
// of eight, c < cp): dst [rows, cp] from src [rows, c] (bfloat16), the
// channels from c on zero. A convolution's input and filter padded so, to
// a channel count cuDNN's tensor-core kernels take whole (airbench's 24 to
// 32: its forward pass in half the time), give the same sums. A thread per
// sixteen bytes of dst; cv and cpv count sixteen-byte pieces of a row.
template <typename T>
__device__ __forceinline__ void ember_cl_pad_rows(ember_f4* out, const ember_f4* in, T n, T cv, T cpv) {
    EMBER_LOOP(T, i, n) {
        const T r = i / cpv, j = i - r * cpv;
        out[i] = j < cv ? in[r * cv + j] : ember_f4{0.f, 0.f, 0.f, 0.f};
    }
}

extern "C" __global__ void ember_cl_pad_channels(unsigned short* dst, const unsigned short* src, long long rows, int cv,
                                                 int cpv) {
    const ember_f4* in = reinterpret_cast<const ember_f4*>(src);
    ember_f4* out = reinterpret_cast<ember_f4*>(dst);
    const long long n = rows * cpv;
    if (EMBER_SMALL_INDEX(n)) {
        ember_cl_pad_rows<unsigned>(out, in, (unsigned)n, (unsigned)cv, (unsigned)cpv);
    } else {
        ember_cl_pad_rows<long long>(out, in, n, (long long)cv, (long long)cpv);
    }
}

// ember_cl_filter_flip_bf16 writes wt [C][R][S][K] = bfloat16(w[k][c][R-1-r]
// [S-1-s]) from a float32 filter w [K][C][R][S]: the filter of the
// convolution whose forward pass is w's data gradient at stride 1
// (conv_dgrad.go), a thread per element of wt.
extern "C" __global__ void ember_cl_filter_flip_bf16(unsigned short* wt, const float* w, int K, int C, int R, int S,
                                                     long long n) {
    EMBER_LOOP(long long, o, n) {
        const int k = (int)(o % K);
        const long long q = o / K;
        const int s = (int)(q % S), r = (int)((q / S) % R), c = (int)(q / ((long long)S * R));
        wt[o] = ember_bf16_from_f32(w[(((long long)k * C + c) * R + (R - 1 - r)) * S + (S - 1 - s)]);
    }
}

// A convolution with few taps per output channel (C·R·S <= 32: a
// network's first layer on one or three input channels), where cuDNN's
// kernels leave most of the GPU idle, directly from and into the form.

// ember_cl_conv_small sets y [N, OH, OW, K] = bfloat16(act(bfloat16(Σ
// x·w) + bias)) for x [N, H, W, C] (bfloat16) and w [K, C·R·S] (float32,
// rounded to bfloat16 as it is read; K·C·R·S <= 4096), as
// Conv2dChannelsLast: a thread per output position and GB groups of eight
// output channels (the host's clSmallGroups: up to EMBER_CL_SMALL_GROUPS,
// so that a tap's load and its address serve GB·8 sums, not 8), the
// products exact and summed in float32 in (r, s, c) order (a product of
// two bfloat16 values is exact in float32, so the explicit fused
// multiply-adds round as separate ones would, in half the instructions of
// the module's --fmad=false).
// The weights sit in shared memory tap-major ([C·R·S][K]), so that a tap's
// eight weights of a thread are two 16-byte reads, which the threads of a
// warp at other positions share. Indices are 32-bit (the host checks the
// sizes), divided by ember_divide with the host's dividers of K/(8·GB),
// OW and OH: none per tap.
#define EMBER_CL_SMALL_GROUPS 4
// CT, RT, ST: C, R and S fixed when compiled (0: as passed), so that a
// common first layer's taps unroll and their loads are issued together.
template <int CT, int RT, int ST>
__device__ __forceinline__ void ember_cl_conv_small_of(unsigned short* y, const unsigned short* x, const float* w,
                                                       const float* bias, int relu, int Cr, int H, int W, int K, int Rr,
                                                       int Sr, int SH, int SW, int PH, int PW, int DH, int DW, int OH,
                                                       int OW, int items, int GB, unsigned int gMul, unsigned int gShift,
                                                       unsigned int owMul, unsigned int owShift, unsigned int ohMul,
                                                       unsigned int ohShift) {
    const int C = CT ? CT : Cr, R = RT ? RT : Rr, S = ST ? ST : Sr;
    __shared__ __attribute__((aligned(16))) float sw[4096];
    const int RS = R * S, CRS = C * RS, GI = (K >> 3) / GB;
    for (int i = threadIdx.x; i < K * CRS; i += blockDim.x) {
        const int k = i / CRS, t = i - k * CRS, c = t / RS, rs = t - c * RS;
        sw[(rs * C + c) * K + k] = ember_bf16_round(w[i]);
    }
    __syncthreads();
    EMBER_LOOP(int, i, items) {
        const int pos = (int)ember_divide((unsigned int)i, gMul, gShift), g0 = (i - pos * GI) * GB;
        const int q = (int)ember_divide((unsigned int)pos, owMul, owShift), ow = pos - q * OW;
        const int n = (int)ember_divide((unsigned int)q, ohMul, ohShift), oh = q - n * OH;
        const unsigned short* xn = x + (long long)n * H * W * C;
        float acc[EMBER_CL_SMALL_GROUPS][8];
#pragma unroll
        for (int b = 0; b < EMBER_CL_SMALL_GROUPS; b++)
#pragma unroll
            for (int j = 0; j < 8; j++) acc[b][j] = 0.f;
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int h = oh * SH - PH + r * DH;
            if (h < 0 || h >= H) continue;
#pragma unroll
            for (int s = 0; s < S; s++) {
                const int wc = ow * SW - PW + s * DW;
                if (wc < 0 || wc >= W) continue;
                const unsigned short* xp = xn + (h * W + wc) * C;
                const float* wk = sw + (r * S + s) * C * K + g0 * 8;
#pragma unroll
                for (int c = 0; c < C; c++, wk += K) {
                    const float xv = ember_f32_from_bf16(xp[c]);
#pragma unroll
                    for (int b = 0; b < EMBER_CL_SMALL_GROUPS; b++) {
                        if (b < GB) {
                            const ember_f4 w0 = reinterpret_cast<const ember_f4*>(wk + b * 8)[0];
                            const ember_f4 w1 = reinterpret_cast<const ember_f4*>(wk + b * 8)[1];
                            acc[b][0] = __fmaf_rn(xv, w0.x, acc[b][0]);
                            acc[b][1] = __fmaf_rn(xv, w0.y, acc[b][1]);
                            acc[b][2] = __fmaf_rn(xv, w0.z, acc[b][2]);
                            acc[b][3] = __fmaf_rn(xv, w0.w, acc[b][3]);
                            acc[b][4] = __fmaf_rn(xv, w1.x, acc[b][4]);
                            acc[b][5] = __fmaf_rn(xv, w1.y, acc[b][5]);
                            acc[b][6] = __fmaf_rn(xv, w1.z, acc[b][6]);
                            acc[b][7] = __fmaf_rn(xv, w1.w, acc[b][7]);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int b = 0; b < EMBER_CL_SMALL_GROUPS; b++) {
            if (b < GB) {
                const int g = g0 + b;
                float out[8];
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    float v = ember_bf16_round(acc[b][j]);
                    if (bias) v += bias[g * 8 + j];
                    if (relu && !(v > 0.f || v != v)) v = 0.f;
                    out[j] = v;
                }
                ember_cl_store8(y + (long long)pos * K + g * 8, out);
            }
        }
    }
}

#define EMBER_CL_CONV_SMALL_ARGS                                                                                         \
    y, x, w, bias, relu, C, H, W, K, R, S, SH, SW, PH, PW, DH, DW, OH, OW, items, GB, gMul, gShift, owMul, owShift,      \
        ohMul, ohShift

// The entry points: any geometry, and the first layers of airbench (3
// channels, 2x2), of a net on gray images (1, 3x3) and of one on colour
// images (3, 3x3), whose taps unroll (clSmallKernel picks).
extern "C" __global__ void ember_cl_conv_small(unsigned short* y, const unsigned short* x, const float* w, const float* bias, int relu,
        int C, int H, int W, int K, int R, int S, int SH, int SW, int PH, int PW, int DH, int DW, int OH, int OW,
        int items, int GB, unsigned int gMul, unsigned int gShift, unsigned int owMul, unsigned int owShift,
        unsigned int ohMul, unsigned int ohShift) {
    ember_cl_conv_small_of<0, 0, 0>(EMBER_CL_CONV_SMALL_ARGS);
}
extern "C" __global__ void ember_cl_conv_small_c3r2s2(unsigned short* y, const unsigned short* x, const float* w, const float* bias, int relu,
        int C, int H, int W, int K, int R, int S, int SH, int SW, int PH, int PW, int DH, int DW, int OH, int OW,
        int items, int GB, unsigned int gMul, unsigned int gShift, unsigned int owMul, unsigned int owShift,
        unsigned int ohMul, unsigned int ohShift) {
    ember_cl_conv_small_of<3, 2, 2>(EMBER_CL_CONV_SMALL_ARGS);
}
extern "C" __global__ void ember_cl_conv_small_c1r3s3(unsigned short* y, const unsigned short* x, const float* w, const float* bias, int relu,
        int C, int H, int W, int K, int R, int S, int SH, int SW, int PH, int PW, int DH, int DW, int OH, int OW,
        int items, int GB, unsigned int gMul, unsigned int gShift, unsigned int owMul, unsigned int owShift,
        unsigned int ohMul, unsigned int ohShift) {
    ember_cl_conv_small_of<1, 3, 3>(EMBER_CL_CONV_SMALL_ARGS);
}
extern "C" __global__ void ember_cl_conv_small_c3r3s3(unsigned short* y, const unsigned short* x, const float* w, const float* bias, int relu,
        int C, int H, int W, int K, int R, int S, int SH, int SW, int PH, int PW, int DH, int DW, int OH, int OW,
        int items, int GB, unsigned int gMul, unsigned int gShift, unsigned int owMul, unsigned int owShift,
        unsigned int ohMul, unsigned int ohShift) {
    ember_cl_conv_small_of<3, 3, 3>(EMBER_CL_CONV_SMALL_ARGS);
}

// ember_cl_conv_small_mma is ember_cl_conv_small on tensor cores, for K
// <= 64 output channels and C·R·S <= 16·KS taps (KS k-steps of 16): a
// warp takes 16 positions at a time as the rows of A [16][taps] (x's
// values gathered straight into the fragments, 0 past the taps and the
// image), the filter as B [taps][K] (rounded to bfloat16 and held in
// registers for the kernel's life), an m16n8k16 product per eight
// channels and k-step, and the epilogue of ember_cl_conv_small (rounded
// to bfloat16, then the bias and ReLU) on its float32 sums. Each lane's
// taps are fixed (A's columns 2t, 2t+1, 2t+8, 2t+9 of each k-step), so
// their offsets are worked out once. The sums' order is the tensor
// cores', not (r, s, c): within float32's rounding of the CUDA-core
// kernel's. The CUDA-core kernel spent its time on a thread's 288
// multiply-adds and 72 shared reads of weights a position (47 µs for
// airbench's first layer on the H200; docs/performance.md, round 35).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
// A position of a convolution's output as the tensor-core kernels gather
// its patch: the top-left tap's row and column in x, its image's offset,
// and whether it is one of the positions (pos < limit). n = pos / P and
// oh = (pos - n·P) / OW by the host's dividers.
struct ember_cl_pix {
    int h0, w0;
    long long base;
    bool in;
};
__device__ __forceinline__ ember_cl_pix ember_cl_mma_pix(int pos, int limit, int P, int H, int W, int C, int SH, int SW,
                                                         int PH, int PW, int OW, unsigned int pMul, unsigned int pShift,
                                                         unsigned int owMul, unsigned int owShift) {
    const int n = (int)ember_divide((unsigned int)pos, pMul, pShift), p = pos - n * P;
    const int oh = (int)ember_divide((unsigned int)p, owMul, owShift), ow = p - oh * OW;
    return {oh * SH - PH, ow * SW - PW, (long long)n * H * W * C, pos < limit};
}

// ember_cl_mma_tap is x at pixel px's tap (row offset dh, column offset
// dw, channel c; c < 0 past the taps) as bfloat16 bits, 0 outside.
__device__ __forceinline__ unsigned short ember_cl_mma_tap(const unsigned short* x, const ember_cl_pix& px, int dh,
                                                           int dw, int c, int H, int W, int C) {
    const int h = px.h0 + dh, w = px.w0 + dw;
    const bool in = px.in && c >= 0 && h >= 0 && h < H && w >= 0 && w < W;
    return in ? x[px.base + (h * W + w) * C + c] : (unsigned short)0;
}

// ember_cl_mma_tap_at sets tap kk's row and column offsets and its
// channel (-1 past the C·R·S taps), taps in the filter's order (c·R·S +
// r·S + s).
__device__ __forceinline__ void ember_cl_mma_tap_at(int kk, int C, int R, int S, int DH, int DW, int& dh, int& dw,
                                                    int& c) {
    const int RS = R * S, q = kk / RS, rs = kk - q * RS, r = rs / S;
    c = kk < C * RS ? q : -1;
    dh = r * DH;
    dw = (rs - r * S) * DW;
}

// ember_cl_mma_taps sets a lane's tap offsets for its 4·KS columns of a
// [positions][taps] A (j = 4·ks + {0: 2t, 1: 2t+1, 2: 2t+8, 3: 2t+9}).
template <int KS>
__device__ __forceinline__ void ember_cl_mma_taps(int t, int C, int R, int S, int DH, int DW, int tdh[4 * KS],
                                                  int tdw[4 * KS], int tc[4 * KS]) {
#pragma unroll
    for (int j = 0; j < 4 * KS; j++)
        ember_cl_mma_tap_at((j >> 2) * 16 + 2 * t + (j & 1) + ((j >> 1) & 1) * 8, C, R, S, DH, DW, tdh[j], tdw[j], tc[j]);
}

// ember_cl_mma_gather loads the A values of a lane for the tile's rows g
// and g + 8 (positions pos0 + g and pos0 + g + 8): its 4·KS taps each.
template <int KS>
__device__ __forceinline__ void ember_cl_mma_gather(unsigned short v[2][4 * KS], const unsigned short* x, int pos0,
                                                    int g, int NP, int P, int C, int H, int W, int SH, int SW, int PH,
                                                    int PW, int OW, const int tdh[4 * KS], const int tdw[4 * KS],
                                                    const int tc[4 * KS], unsigned int pMul, unsigned int pShift,
                                                    unsigned int owMul, unsigned int owShift) {
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const ember_cl_pix px =
            ember_cl_mma_pix(pos0 + g + 8 * half, NP, P, H, W, C, SH, SW, PH, PW, OW, pMul, pShift, owMul, owShift);
#pragma unroll
        for (int j = 0; j < 4 * KS; j++) v[half][j] = ember_cl_mma_tap(x, px, tdh[j], tdw[j], tc[j], H, W, C);
    }
}

// KS k-steps of 16 taps, NT tiles of eight output channels (NT·8 >= K;
// those past K skipped), so that the fragments' arrays hold no more
// registers than the layer needs. A warp gathers its next tile's values
// before the products and stores of this one.
template <int KS, int NT>
__device__ __forceinline__ void ember_cl_conv_small_mma_of(unsigned short* y, const unsigned short* x, const float* w,
                                                           const float* bias, int relu, int C, int H, int W, int K,
                                                           int R, int S, int SH, int SW, int PH, int PW, int DH, int DW,
                                                           int OH, int OW, int NP, unsigned int pMul,
                                                           unsigned int pShift, unsigned int owMul,
                                                           unsigned int owShift) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int NTK = K >> 3, CRS = C * R * S, P = OH * OW;
    int tdh[4 * KS], tdw[4 * KS], tc[4 * KS];
    ember_cl_mma_taps<KS>(t, C, R, S, DH, DW, tdh, tdw, tc);
    unsigned int bw[KS][NT][2];
    float bb[NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const int k = nt * 8 + g;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int kk = ks * 16 + 2 * t + h * 8;
                const float w0 = nt < NTK && kk < CRS ? w[k * CRS + kk] : 0.f;
                const float w1 = nt < NTK && kk + 1 < CRS ? w[k * CRS + kk + 1] : 0.f;
                bw[ks][nt][h] = ember_bf16x2_from_f32(w0, w1);
            }
        }
        const int ch = nt * 8 + 2 * t;
        bb[nt][0] = bias && nt < NTK ? bias[ch] : 0.f;
        bb[nt][1] = bias && nt < NTK ? bias[ch + 1] : 0.f;
    }
    const int warps = (gridDim.x * blockDim.x) >> 5;
    int tile = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    unsigned short v[2][4 * KS];
    if (tile * 16 < NP)
        ember_cl_mma_gather<KS>(v, x, tile * 16, g, NP, P, C, H, W, SH, SW, PH, PW, OW, tdh, tdw, tc, pMul, pShift,
                                owMul, owShift);
    for (; tile * 16 < NP; tile += warps) {
        unsigned int a[KS][4];
#pragma unroll
        for (int ks = 0; ks < KS; ks++)
#pragma unroll
            for (int q = 0; q < 4; q++) {  // a[q]: row g + 8·(q & 1), columns 2t (+8 for q >= 2)
                const int j = 4 * ks + 2 * (q >> 1);
                a[ks][q] = (unsigned int)v[q & 1][j] | ((unsigned int)v[q & 1][j + 1] << 16);
            }
        const int next = tile + warps;
        if (next * 16 < NP)
            ember_cl_mma_gather<KS>(v, x, next * 16, g, NP, P, C, H, W, SH, SW, PH, PW, OW, tdh, tdw, tc, pMul,
                                    pShift, owMul, owShift);
        float acc[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) acc[nt][e] = 0.f;
            if (nt < NTK)
#pragma unroll
                for (int ks = 0; ks < KS; ks++) ember_mma_bf16(acc[nt], a[ks], bw[ks][nt][0], bw[ks][nt][1]);
        }
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int pos = tile * 16 + g + 8 * half;
            if (pos >= NP) continue;
            unsigned short* yp = y + (long long)pos * K + 2 * t;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                if (nt >= NTK) break;
                // The pair rounded at once (a NaN stays one through the
                // bias and ReLU, and the store's rounding makes it 0x7FC0).
                const unsigned int r = ember_bf16x2_rn(acc[nt][2 * half], acc[nt][2 * half + 1]);
                float u0 = __uint_as_float(r << 16) + bb[nt][0], u1 = __uint_as_float(r & 0xffff0000u) + bb[nt][1];
                if (relu) {
                    if (!(u0 > 0.f || u0 != u0)) u0 = 0.f;
                    if (!(u1 > 0.f || u1 != u1)) u1 = 0.f;
                }
                *reinterpret_cast<unsigned int*>(yp + nt * 8) = ember_bf16x2_from_f32(u0, u1);
            }
        }
    }
}

#define EMBER_CL_CONV_SMALL_MMA_ARGS \
    y, x, w, bias, relu, C, H, W, K, R, S, SH, SW, PH, PW, DH, DW, OH, OW, NP, pMul, pShift, owMul, owShift

// The entry points, _mma{16·KS}_n{NT} (clSmallMMA picks): up to 16 or 32
// taps; up to 16, 24, 32 or 64 output channels.
extern "C" __global__ void ember_cl_conv_small_mma16_n2(unsigned short* y, const unsigned short* x, const float* w, const float* bias, int relu,
        int C, int H, int W, int K, int R, int S, int SH, int SW, int PH, int PW, int DH, int DW, int OH, int OW, int NP,
        unsigned int pMul, unsigned int pShift, unsigned int owMul, unsigned int owShift) {
    ember_cl_conv_small_mma_of<1, 2>(EMBER_CL_CONV_SMALL_MMA_ARGS);
}
extern "C" __global__ void ember_cl_conv_small_mma16_n3(unsigned short* y, const unsigned short* x, const float* w, const float* bias, int relu,
        int C, int H, int W, int K, int R, int S, int SH, int SW, int PH, int PW, int DH, int DW, int OH, int OW, int NP,
        unsigned int pMul, unsigned int pShift, unsigned int owMul, unsigned int owShift) {
    ember_cl_conv_small_mma_of<1, 3>(EMBER_CL_CONV_SMALL_MMA_ARGS);
}
extern "C" __global__ void ember_cl_conv_small_mma16_n4(unsigned short* y, const unsigned short* x, const float* w, const float* bias, int relu,
        int C, int H, int W, int K, int R, int S, int SH, int SW, int PH, int PW, int DH, int DW, int OH, int OW, int NP,
        unsigned int pMul, unsigned int pShift, unsigned int owMul, unsigned int owShift) {
    ember_cl_conv_small_mma_of<1, 4>(EMBER_CL_CONV_SMALL_MMA_ARGS);
}
extern "C" __global__ void ember_cl_conv_small_mma16_n8(unsigned short* y, const unsigned short* x, const float* w, const float* bias, int relu,
        int C, int H, int W, int K, int R, int S, int SH, int SW, int PH, int PW, int DH, int DW, int OH, int OW, int NP,
        unsigned int pMul, unsigned int pShift, unsigned int owMul, unsigned int owShift) {
    ember_cl_conv_small_mma_of<1, 8>(EMBER_CL_CONV_SMALL_MMA_ARGS);
}
extern "C" __global__ void ember_cl_conv_small_mma32_n2(unsigned short* y, const unsigned short* x, const float* w, const float* bias, int relu,
        int C, int H, int W, int K, int R, int S, int SH, int SW, int PH, int PW, int DH, int DW, int OH, int OW, int NP,
        unsigned int pMul, unsigned int pShift, unsigned int owMul, unsigned int owShift) {
    ember_cl_conv_small_mma_of<2, 2>(EMBER_CL_CONV_SMALL_MMA_ARGS);
}
extern "C" __global__ void ember_cl_conv_small_mma32_n3(unsigned short* y, const unsigned short* x, const float* w, const float* bias, int relu,
        int C, int H, int W, int K, int R, int S, int SH, int SW, int PH, int PW, int DH, int DW, int OH, int OW, int NP,
        unsigned int pMul, unsigned int pShift, unsigned int owMul, unsigned int owShift) {
    ember_cl_conv_small_mma_of<2, 3>(EMBER_CL_CONV_SMALL_MMA_ARGS);
}
extern "C" __global__ void ember_cl_conv_small_mma32_n4(unsigned short* y, const unsigned short* x, const float* w, const float* bias, int relu,
        int C, int H, int W, int K, int R, int S, int SH, int SW, int PH, int PW, int DH, int DW, int OH, int OW, int NP,
        unsigned int pMul, unsigned int pShift, unsigned int owMul, unsigned int owShift) {
    ember_cl_conv_small_mma_of<2, 4>(EMBER_CL_CONV_SMALL_MMA_ARGS);
}
extern "C" __global__ void ember_cl_conv_small_mma32_n8(unsigned short* y, const unsigned short* x, const float* w, const float* bias, int relu,
        int C, int H, int W, int K, int R, int S, int SH, int SW, int PH, int PW, int DH, int DW, int OH, int OW, int NP,
        unsigned int pMul, unsigned int pShift, unsigned int owMul, unsigned int owShift) {
    ember_cl_conv_small_mma_of<2, 8>(EMBER_CL_CONV_SMALL_MMA_ARGS);
}
// ember_cl_conv_dw_small_mma is ember_cl_conv_dw_small (the filter
// gradient of up to 16 taps and 64 output channels, partial sums per block
// of positions as ember_conv_dw_small_join adds them) on tensor cores: C
// [taps][K] = A [taps][positions] · B [positions][K] over the block's
// positions, 16 a product, the block's eight warps taking every eighth
// group of 16. A lane gathers x at its two taps (g, g + 8) and four
// positions (2t, 2t + 1, 2t + 8, 2t + 9) and reads dy at those positions
// and its channel g of each eight; the warps' sums are added in warp
// order in shared memory. No tile goes through shared memory and there is
// no barrier until the end (the CUDA-core kernel's three a tile of 256
// positions and 16 products for two 16-byte shared reads took 53 µs for
// airbench's first layer on the H200; docs/performance.md, round 35).
template <int NT>
__device__ __forceinline__ void ember_cl_conv_dw_small_mma_of(double* partial, const unsigned short* x,
                                                              const unsigned short* dy, int N, int C, int H, int W,
                                                              int K, int R, int S, int SH, int SW, int PH, int PW,
                                                              int OH, int OW, int DH, int DW, int per,
                                                              unsigned int pMul, unsigned int pShift,
                                                              unsigned int owMul, unsigned int owShift) {
    __shared__ float red[8 * 16 * 64];  // [warp][tap][k], K <= 64
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int NTK = K >> 3, CRS = C * R * S, P = OH * OW, NP = N * P;
    const int lo = blockIdx.x * per, hi = lo + per < NP ? lo + per : NP;
    // This lane's two taps, A's rows g and g + 8.
    int tdh[2], tdw[2], tc[2];
#pragma unroll
    for (int i = 0; i < 2; i++) ember_cl_mma_tap_at(g + 8 * i, C, R, S, DH, DW, tdh[i], tdw[i], tc[i]);
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[nt][e] = 0.f;
    for (int p0 = lo + warp * 16; p0 < hi; p0 += nw * 16) {
        // Positions p0 + {2t, 2t+1, 2t+8, 2t+9}: A's columns and B's rows.
        unsigned short xv[2][4], dv[NT][4];
#pragma unroll
        for (int m = 0; m < 4; m++) {
            const int pos = p0 + 2 * t + (m & 1) + 8 * (m >> 1);
            const ember_cl_pix px =
                ember_cl_mma_pix(pos, hi, P, H, W, C, SH, SW, PH, PW, OW, pMul, pShift, owMul, owShift);
#pragma unroll
            for (int i = 0; i < 2; i++) xv[i][m] = ember_cl_mma_tap(x, px, tdh[i], tdw[i], tc[i], H, W, C);
            const unsigned short* dp = dy + (long long)pos * K + g;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) dv[nt][m] = px.in && nt < NTK ? dp[nt * 8] : (unsigned short)0;
        }
        const unsigned int a[4] = {(unsigned int)xv[0][0] | ((unsigned int)xv[0][1] << 16),
                                   (unsigned int)xv[1][0] | ((unsigned int)xv[1][1] << 16),
                                   (unsigned int)xv[0][2] | ((unsigned int)xv[0][3] << 16),
                                   (unsigned int)xv[1][2] | ((unsigned int)xv[1][3] << 16)};
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            if (nt < NTK)
                ember_mma_bf16(acc[nt], a, (unsigned int)dv[nt][0] | ((unsigned int)dv[nt][1] << 16),
                               (unsigned int)dv[nt][2] | ((unsigned int)dv[nt][3] << 16));
    }
    // acc[nt][e]: tap g + 8·(e >> 1), channel nt·8 + 2t + (e & 1).
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) red[(warp * 16 + g + 8 * (e >> 1)) * 64 + nt * 8 + 2 * t + (e & 1)] = acc[nt][e];
    __syncthreads();
    for (int e = threadIdx.x; e < K * CRS; e += blockDim.x) {
        const int k = e / CRS, tap = e - k * CRS;
        float sum = 0.f;
        for (int wi = 0; wi < nw; wi++) sum += red[(wi * 16 + tap) * 64 + k];
        partial[(long long)e * gridDim.x + blockIdx.x] = (double)sum;
    }
}

// The entry points, _n{NT} (conv_dw_small.go picks), with
// ember_cl_conv_dw_small's parameters (the last three unused); blocks of
// 256 threads.
extern "C" __global__ void ember_cl_conv_dw_small_mma_n2(double* partial, const unsigned short* x, const unsigned short* dy, int N,
        int C, int H, int W, int K, int R, int S, int SH, int SW, int PH, int PW, int OH, int OW, int DH, int DW,
        int per, unsigned int pMul, unsigned int pShift, unsigned int owMul, unsigned int owShift, unsigned int cMul,
        unsigned int cShift, int TP) {
    ember_cl_conv_dw_small_mma_of<2>(partial, x, dy, N, C, H, W, K, R, S, SH, SW, PH, PW, OH, OW, DH, DW, per, pMul, pShift,
                                     owMul, owShift);
}
extern "C" __global__ void ember_cl_conv_dw_small_mma_n3(double* partial, const unsigned short* x, const unsigned short* dy, int N,
        int C, int H, int W, int K, int R, int S, int SH, int SW, int PH, int PW, int OH, int OW, int DH, int DW,
        int per, unsigned int pMul, unsigned int pShift, unsigned int owMul, unsigned int owShift, unsigned int cMul,
        unsigned int cShift, int TP) {
    ember_cl_conv_dw_small_mma_of<3>(partial, x, dy, N, C, H, W, K, R, S, SH, SW, PH, PW, OH, OW, DH, DW, per, pMul, pShift,
                                     owMul, owShift);
}
extern "C" __global__ void ember_cl_conv_dw_small_mma_n4(double* partial, const unsigned short* x, const unsigned short* dy, int N,
        int C, int H, int W, int K, int R, int S, int SH, int SW, int PH, int PW, int OH, int OW, int DH, int DW,
        int per, unsigned int pMul, unsigned int pShift, unsigned int owMul, unsigned int owShift, unsigned int cMul,
        unsigned int cShift, int TP) {
    ember_cl_conv_dw_small_mma_of<4>(partial, x, dy, N, C, H, W, K, R, S, SH, SW, PH, PW, OH, OW, DH, DW, per, pMul, pShift,
                                     owMul, owShift);
}
extern "C" __global__ void ember_cl_conv_dw_small_mma_n8(double* partial, const unsigned short* x, const unsigned short* dy, int N,
        int C, int H, int W, int K, int R, int S, int SH, int SW, int PH, int PW, int OH, int OW, int DH, int DW,
        int per, unsigned int pMul, unsigned int pShift, unsigned int owMul, unsigned int owShift, unsigned int cMul,
        unsigned int cShift, int TP) {
    ember_cl_conv_dw_small_mma_of<8>(partial, x, dy, N, C, H, W, K, R, S, SH, SW, PH, PW, OH, OW, DH, DW, per, pMul, pShift,
                                     owMul, owShift);
}
#endif

// ember_cl_conv_dw_small is conv.cu's ember_conv_dw_small (the filter
// gradient of such a convolution: partial sums per block of positions,
// which ember_conv_dw_small_join adds into dw) reading x [N, H, W, C] and
// dy [N, OH, OW, K] in the form (bfloat16 already) instead of float32
// planes. A tile of EMBER_CL_DWS_TP positions of dy ([TP][K]) and of the
// patch values ([TP][C·R·S, padded to 4]) goes through shared memory; a
// thread sums a 4 x 4 tile of (k, tap) pairs over one slice of the
// positions (two 16-byte shared reads for sixteen products), and the
// slices are added in a fixed order at the end (deterministic).
// A tile holds TP positions (conv_dw_small.go's clDwsTile): as many as
// dy's shared tile holds for K channels, at most EMBER_CL_DWS_TP_MAX, so
// that a block of few channels passes its phases and barriers fewer times.
#define EMBER_CL_DWS_TP 96
#define EMBER_CL_DWS_TP_MAX 256
#define EMBER_CL_DWS_K 64
#define EMBER_CL_DWS_CRS 16
template <int CT, int RT, int ST>
__device__ __forceinline__ void ember_cl_conv_dw_small_of(double* partial, const unsigned short* x,
                                                          const unsigned short* dy, int N, int Cr, int H, int W, int K,
                                                          int Rr, int Sr, int SH, int SW, int PH, int PW, int OH, int OW,
                                                          int DH, int DW, int per, unsigned int pMul, unsigned int pShift,
                                                          unsigned int owMul, unsigned int owShift, unsigned int cMul,
                                                          unsigned int cShift, int TP) {
    const int C = CT ? CT : Cr, R = RT ? RT : Rr, S = ST ? ST : Sr;
    __shared__ __attribute__((aligned(16))) float sdy[EMBER_CL_DWS_TP * EMBER_CL_DWS_K];
    __shared__ __attribute__((aligned(16))) float sx[EMBER_CL_DWS_TP_MAX * EMBER_CL_DWS_CRS];
    const int P = OH * OW, NP = N * P, RS = R * S, CRS = C * RS, CRS4 = (CRS + 3) & ~3;
    const int KG = K >> 2, TG = CRS4 >> 2, tiles = KG * TG, slices = blockDim.x / tiles;
    const int tile = threadIdx.x % tiles, slice = threadIdx.x / tiles;
    const int kg = tile / TG, tg = tile - kg * TG;
    const int lo = blockIdx.x * per, hi = lo + per < NP ? lo + per : NP;
    float acc[16];
#pragma unroll
    for (int m = 0; m < 16; m++) acc[m] = 0.0f;
    for (int t0 = lo; t0 < hi; t0 += TP) {
        const int tp = hi - t0 < TP ? hi - t0 : TP;
        __syncthreads(); // the last tile read
        // dy's tile: [tp][K] bfloat16 is contiguous (K a multiple of 8), so
        // eight values a thread, 16 bytes at a time.
        const unsigned short* dyt = dy + (long long)t0 * K;
        for (int e = threadIdx.x * 8; e < TP * K; e += blockDim.x * 8) {
            float v[8];
            if (e < tp * K) {
                ember_cl_load8(dyt + e, v);
            } else {
#pragma unroll
                for (int m = 0; m < 8; m++) v[m] = 0.0f;
            }
            reinterpret_cast<ember_f4*>(sdy + e)[0] = {v[0], v[1], v[2], v[3]};
            reinterpret_cast<ember_f4*>(sdy + e)[1] = {v[4], v[5], v[6], v[7]};
        }
        // The patches: a thread per (position, input channel), its R·S taps
        // (the host's dividers of C, OH·OW and OW).
        for (int e = threadIdx.x; e < TP * C; e += blockDim.x) {
            const int j = (int)ember_divide((unsigned int)e, cMul, cShift), c = e - j * C;
            float* row = sx + j * CRS4 + c * RS;
            const int q = t0 + j, n = (int)ember_divide((unsigned int)q, pMul, pShift), p = q - n * P;
            const int oh = (int)ember_divide((unsigned int)p, owMul, owShift), ow = p - oh * OW;
#pragma unroll
            for (int r = 0; r < R; r++) {
                const int h = oh * SH - PH + r * DH;
#pragma unroll
                for (int s = 0; s < S; s++) {
                    const int wc = ow * SW - PW + s * DW;
                    const bool in = j < tp && h >= 0 && h < H && wc >= 0 && wc < W;
                    row[r * S + s] = in ? ember_f32_from_bf16(x[((long long)(n * H + h) * W + wc) * C + c]) : 0.0f;
                }
            }
        }
        const int pad = CRS4 - CRS, padOr1 = pad ? pad : 1; // (a divisor when compiled as 0)
        for (int e = threadIdx.x; e < TP * pad; e += blockDim.x) {
            const int j = e / padOr1;
            sx[j * CRS4 + CRS + (e - j * pad)] = 0.0f; // the padding taps
        }
        __syncthreads();
        if (slice < slices) {
            for (int j = slice; j < tp; j += slices) {
                const ember_f4 d = reinterpret_cast<const ember_f4*>(sdy + j * K)[kg];
                const ember_f4 v = reinterpret_cast<const ember_f4*>(sx + j * CRS4)[tg];
                const float dv[4] = {d.x, d.y, d.z, d.w}, xv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int a = 0; a < 4; a++)
#pragma unroll
                    for (int b = 0; b < 4; b++) acc[a * 4 + b] = __fmaf_rn(dv[a], xv[b], acc[a * 4 + b]); // exact products
            }
        }
    }
    // The slices' sums, added in slice order.
    __syncthreads();
    float* red = sdy; // slices * tiles * 16 <= blockDim.x * 16 floats
    if (slice < slices)
#pragma unroll
        for (int m = 0; m < 16; m++) red[(slice * tiles + tile) * 16 + m] = acc[m];
    __syncthreads();
    for (int e = threadIdx.x; e < tiles * 16; e += blockDim.x) {
        float sum = 0.0f;
        for (int sl = 0; sl < slices; sl++) sum += red[sl * tiles * 16 + e];
        const int tl = e >> 4, m = e & 15, k = (tl / TG) * 4 + (m >> 2), t = (tl % TG) * 4 + (m & 3);
        if (t < CRS) partial[(long long)(k * CRS + t) * gridDim.x + blockIdx.x] = (double)sum;
    }
}

// The entry points, as ember_cl_conv_small's (clSmallKernel picks).
extern "C" __global__ void ember_cl_conv_dw_small(double* partial, const unsigned short* x, const unsigned short* dy, int N,
        int C, int H, int W, int K, int R, int S, int SH, int SW, int PH, int PW, int OH, int OW, int DH, int DW,
        int per, unsigned int pMul, unsigned int pShift, unsigned int owMul, unsigned int owShift, unsigned int cMul,
        unsigned int cShift, int TP) {
    ember_cl_conv_dw_small_of<0, 0, 0>(partial, x, dy, N, C, H, W, K, R, S, SH, SW, PH, PW, OH, OW, DH, DW, per, pMul, pShift, owMul, owShift, cMul, cShift, TP);
}
extern "C" __global__ void ember_cl_conv_dw_small_c3r2s2(double* partial, const unsigned short* x, const unsigned short* dy, int N,
        int C, int H, int W, int K, int R, int S, int SH, int SW, int PH, int PW, int OH, int OW, int DH, int DW,
        int per, unsigned int pMul, unsigned int pShift, unsigned int owMul, unsigned int owShift, unsigned int cMul,
        unsigned int cShift, int TP) {
    ember_cl_conv_dw_small_of<3, 2, 2>(partial, x, dy, N, C, H, W, K, R, S, SH, SW, PH, PW, OH, OW, DH, DW, per, pMul, pShift, owMul, owShift, cMul, cShift, TP);
}
extern "C" __global__ void ember_cl_conv_dw_small_c1r3s3(double* partial, const unsigned short* x, const unsigned short* dy, int N,
        int C, int H, int W, int K, int R, int S, int SH, int SW, int PH, int PW, int OH, int OW, int DH, int DW,
        int per, unsigned int pMul, unsigned int pShift, unsigned int owMul, unsigned int owShift, unsigned int cMul,
        unsigned int cShift, int TP) {
    ember_cl_conv_dw_small_of<1, 3, 3>(partial, x, dy, N, C, H, W, K, R, S, SH, SW, PH, PW, OH, OW, DH, DW, per, pMul, pShift, owMul, owShift, cMul, cShift, TP);
}
extern "C" __global__ void ember_cl_conv_dw_small_c3r3s3(double* partial, const unsigned short* x, const unsigned short* dy, int N,
        int C, int H, int W, int K, int R, int S, int SH, int SW, int PH, int PW, int OH, int OW, int DH, int DW,
        int per, unsigned int pMul, unsigned int pShift, unsigned int owMul, unsigned int owShift, unsigned int cMul,
        unsigned int cShift, int TP) {
    ember_cl_conv_dw_small_of<3, 3, 3>(partial, x, dy, N, C, H, W, K, R, S, SH, SW, PH, PW, OH, OW, DH, DW, per, pMul, pShift, owMul, owShift, cMul, cShift, TP);
}
