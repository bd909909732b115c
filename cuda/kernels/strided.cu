// strided.cu: the elementwise core over strided views (unary, binary and
// where by op code, strided copies), mirroring tensor/cpu_elementwise.go
// operation for operation (with --fmad=false single IEEE operations give
// the CPU's bits; expf, tanhf, erff, powf, sinf and cosf err by up to 2
// ulp where Go's math rounds correctly).
//
// Views reach the kernels as a shape of exactly six dimensions and six
// strides per operand, as scalar parameters: the Go side
// (cuda/ops_elementwise.go) drops size-1 dimensions, merges dimensions that
// are contiguous in every operand, and pads on the left; rank is the number
// of real (right-aligned) dimensions. small says that n and every offset
// are below 2^30, so that 32-bit division suffices.
//
// Op codes are tensor.UnaryOp and tensor.BinaryOp; the numbers must stay
// in step with tensor/backend_elementwise.go (TestStridedOpCodes checks).

#define EMBER_OP_IDENTITY 0
#define EMBER_OP_NEG 1
#define EMBER_OP_ABS 2
#define EMBER_OP_EXP 3
#define EMBER_OP_LOG 4
#define EMBER_OP_SQRT 5
#define EMBER_OP_RSQRT 6
#define EMBER_OP_RECIP 7
#define EMBER_OP_SQUARE 8
#define EMBER_OP_TANH 9
#define EMBER_OP_SIGMOID 10
#define EMBER_OP_RELU 11
#define EMBER_OP_LEAKY_RELU 12
#define EMBER_OP_GELU 13
#define EMBER_OP_GELU_TANH 14
#define EMBER_OP_SILU 15
#define EMBER_OP_CLAMP 16
#define EMBER_OP_POW_SCALAR 17
#define EMBER_OP_ADD_SCALAR 18
#define EMBER_OP_MUL_SCALAR 19
#define EMBER_OP_AFFINE 20
#define EMBER_OP_SIN 21
#define EMBER_OP_COS 22

#define EMBER_OP_ADD 0
#define EMBER_OP_SUB 1
#define EMBER_OP_MUL 2
#define EMBER_OP_DIV 3
#define EMBER_OP_POW 4
#define EMBER_OP_MAXIMUM 5
#define EMBER_OP_MINIMUM 6
#define EMBER_OP_EQ 7
#define EMBER_OP_NE 8
#define EMBER_OP_LT 9
#define EMBER_OP_LE 10
#define EMBER_OP_GT 11
#define EMBER_OP_GE 12

#define EMBER_GELU_INV_SQRT2 0.70710678118654752440f
#define EMBER_GELU_INV_SQRT2PI 0.39894228040143267794f
#define EMBER_GELU_TANH_K 0.79788456080286535588f
#define EMBER_GELU_TANH_C 0.044715f

__device__ __forceinline__ float ember_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float ember_unary(int op, float x, float a, float b) {
    switch (op) {
    case EMBER_OP_IDENTITY: return x;
    case EMBER_OP_NEG: return -x;
    case EMBER_OP_ABS: return fabsf(x);
    case EMBER_OP_EXP: return expf(x);
    case EMBER_OP_LOG: return logf(x);
    case EMBER_OP_SQRT: return sqrtf(x);
    case EMBER_OP_RSQRT: return 1.0f / sqrtf(x);  // not rsqrtf (approximate): the CPU's bits
    case EMBER_OP_RECIP: return 1.0f / x;
    case EMBER_OP_SQUARE: return x * x;
    case EMBER_OP_TANH: return tanhf(x);
    case EMBER_OP_SIGMOID: return ember_sigmoid(x);
    case EMBER_OP_RELU: return (x > 0.0f || x != x) ? x : 0.0f;
    case EMBER_OP_LEAKY_RELU: return x > 0.0f ? x : a * x;
    case EMBER_OP_GELU: {
        const float cdf = 0.5f * (1.0f + erff(x * EMBER_GELU_INV_SQRT2));
        return x * cdf;
    }
    case EMBER_OP_GELU_TANH: {
        const float u = EMBER_GELU_TANH_K * (x + EMBER_GELU_TANH_C * (x * x * x));
        return 0.5f * x * (1.0f + tanhf(u));
    }
    case EMBER_OP_SILU: return x * ember_sigmoid(x);
    case EMBER_OP_CLAMP:
        if (x != x) return x;
        if (x < a) return a;
        if (x > b) return b;
        return x;
    case EMBER_OP_POW_SCALAR: return powf(x, a);
    case EMBER_OP_ADD_SCALAR: return x + a;
    case EMBER_OP_MUL_SCALAR: return x * a;
    case EMBER_OP_AFFINE: return x * a + b;
    case EMBER_OP_SIN: return sinf(x);
    case EMBER_OP_COS: return cosf(x);
    }
    return ember_nan();
}

// dy * f'(x), as tensor/cpu_elementwise.go's unaryGrad32.
__device__ __forceinline__ float ember_unary_grad(int op, float x, float dy, float a, float b) {
    switch (op) {
    case EMBER_OP_IDENTITY:
    case EMBER_OP_ADD_SCALAR: return dy;
    case EMBER_OP_NEG: return -dy;
    case EMBER_OP_ABS:
        if (x > 0.0f) return dy;
        if (x < 0.0f) return -dy;
        if (x == 0.0f) return 0.0f;
        return x;
    case EMBER_OP_EXP: return dy * expf(x);
    case EMBER_OP_LOG: return dy / x;
    case EMBER_OP_SQRT: return dy / (2.0f * sqrtf(x));
    case EMBER_OP_RSQRT: {
        const float r = 1.0f / sqrtf(x);
        return dy * (-0.5f * (r * r * r));
    }
    case EMBER_OP_RECIP: {
        const float r = 1.0f / x;
        return -dy * (r * r);
    }
    case EMBER_OP_SQUARE: return dy * (2.0f * x);
    case EMBER_OP_TANH: {
        const float t = tanhf(x);
        return dy * (1.0f - t * t);
    }
    case EMBER_OP_SIGMOID: {
        const float s = ember_sigmoid(x);
        return dy * (s * (1.0f - s));
    }
    case EMBER_OP_RELU: return x <= 0.0f ? 0.0f : dy;
    case EMBER_OP_LEAKY_RELU: return x > 0.0f ? dy : dy * a;
    case EMBER_OP_GELU: {
        const float cdf = 0.5f * (1.0f + erff(x * EMBER_GELU_INV_SQRT2));
        const float pdf = EMBER_GELU_INV_SQRT2PI * expf(-0.5f * (x * x));
        return dy * (cdf + x * pdf);
    }
    case EMBER_OP_GELU_TANH: {
        const float u = EMBER_GELU_TANH_K * (x + EMBER_GELU_TANH_C * (x * x * x));
        const float t = tanhf(u);
        const float du = EMBER_GELU_TANH_K * (1.0f + 3.0f * EMBER_GELU_TANH_C * (x * x));
        return dy * (0.5f * (1.0f + t) + 0.5f * x * ((1.0f - t * t) * du));
    }
    case EMBER_OP_SILU: {
        const float s = ember_sigmoid(x);
        return dy * (s * (1.0f + x * (1.0f - s)));
    }
    case EMBER_OP_CLAMP: return (x >= a && x <= b) ? dy : 0.0f;
    case EMBER_OP_POW_SCALAR:
        if (a == 0.0f) return 0.0f;
        return dy * (a * powf(x, a - 1.0f));
    case EMBER_OP_MUL_SCALAR:
    case EMBER_OP_AFFINE: return dy * a;
    case EMBER_OP_SIN: return dy * cosf(x);
    case EMBER_OP_COS: return -dy * sinf(x);
    }
    return ember_nan();
}

__device__ __forceinline__ float ember_binary(int op, float x, float y) {
    switch (op) {
    case EMBER_OP_ADD: return x + y;
    case EMBER_OP_SUB: return x - y;
    case EMBER_OP_MUL: return x * y;
    case EMBER_OP_DIV: return x / y;
    case EMBER_OP_POW: return powf(x, y);
    case EMBER_OP_MAXIMUM:
        if (x != x || y != y) return x + y;
        return x >= y ? x : y;
    case EMBER_OP_MINIMUM:
        if (x != x || y != y) return x + y;
        return x <= y ? x : y;
    case EMBER_OP_EQ: return x == y ? 1.0f : 0.0f;
    case EMBER_OP_NE: return x != y ? 1.0f : 0.0f;
    case EMBER_OP_LT: return x < y ? 1.0f : 0.0f;
    case EMBER_OP_LE: return x <= y ? 1.0f : 0.0f;
    case EMBER_OP_GT: return x > y ? 1.0f : 0.0f;
    case EMBER_OP_GE: return x >= y ? 1.0f : 0.0f;
    }
    return ember_nan();
}

// ember_aligned4 says whether a device address is 16-byte aligned.
__device__ __forceinline__ bool ember_aligned4(const void* p) { return ((unsigned long long)p & 15ull) == 0; }

// The dense kernels are instantiated per op code (OP a template
// constant, dispatched once per launch), so that the per-element switch
// folds away and the loop is only loads, the function and stores.
#define EMBER_UNARY_OPS(X) \
    X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15) X(16) X(17) X(18) X(19) X(20) X(21) X(22)
#define EMBER_BINARY_OPS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12)

template <int OP>
__device__ __forceinline__ void unary_dense_body(float* dst, const float* x, long long n, float a, float b) {
    if (ember_aligned4(dst) && ember_aligned4(x)) {
        // ember_stream: a thread's loads are in flight before its first
        // function (GELU's erf) is evaluated.
        const long long n4 = n >> 2;
        ember_stream<ember_f4>(
            n4, [&](long long q) { return reinterpret_cast<const ember_f4*>(x)[q]; },
            [&](long long q, ember_f4 v) {
                v.x = ember_unary(OP, v.x, a, b);
                v.y = ember_unary(OP, v.y, a, b);
                v.z = ember_unary(OP, v.z, a, b);
                v.w = ember_unary(OP, v.w, a, b);
                reinterpret_cast<ember_f4*>(dst)[q] = v;
            });
        EMBER_LOOP(long long, i, n - 4 * n4) dst[4 * n4 + i] = ember_unary(OP, x[4 * n4 + i], a, b);
        return;
    }
    EMBER_LOOP(long long, i, n) dst[i] = ember_unary(OP, x[i], a, b);
}

// Dense unary: dst[i] = f(x[i]), four at a time where both are aligned.
// At most 40 registers a thread (six blocks of 256 an SM): with the switch
// over every op the kernel took 50, which held occupancy at half, and GELU
// (erff) at 85% of the copy rate.
extern "C" __global__ void __launch_bounds__(256, 6)
ember_unary_dense(float* dst, const float* x, long long n, int op, float a, float b) {
    switch (op) {
#define EMBER_UNARY_CASE(K) \
    case K: unary_dense_body<K>(dst, x, n, a, b); break;
        EMBER_UNARY_OPS(EMBER_UNARY_CASE)
#undef EMBER_UNARY_CASE
    }
}

// Dense unary into bfloat16: dst[i] = f(x[i]) as ember_unary_dense gives
// it, rounded as ember_cast_f32_bf16 rounds, in one pass: the bfloat16
// copy an autocast product reads of a unary function's output, made again
// in the backward pass from the function's input (tensor's
// UnaryCastBackend) instead of being kept.
template <int OP>
__device__ __forceinline__ void unary_cast_body(unsigned short* dst, const float* x, long long n, float a, float b) {
    if (ember_aligned4(x) && ((unsigned long long)dst & 7ull) == 0) {
        const long long n4 = n >> 2;
        ember_stream<ember_f4>(
            n4, [&](long long q) { return reinterpret_cast<const ember_f4*>(x)[q]; },
            [&](long long q, ember_f4 v) {
                unsigned int* d = reinterpret_cast<unsigned int*>(dst + 4 * q);
                d[0] = ember_bf16x2_from_f32(ember_unary(OP, v.x, a, b), ember_unary(OP, v.y, a, b));
                d[1] = ember_bf16x2_from_f32(ember_unary(OP, v.z, a, b), ember_unary(OP, v.w, a, b));
            });
        EMBER_LOOP(long long, i, n - 4 * n4) dst[4 * n4 + i] = ember_bf16_from_f32(ember_unary(OP, x[4 * n4 + i], a, b));
        return;
    }
    EMBER_LOOP(long long, i, n) dst[i] = ember_bf16_from_f32(ember_unary(OP, x[i], a, b));
}

extern "C" __global__ void __launch_bounds__(256, 6)
ember_unary_cast_bf16(unsigned short* dst, const float* x, long long n, int op, float a, float b) {
    switch (op) {
#define EMBER_UNARY_CASE(K) \
    case K: unary_cast_body<K>(dst, x, n, a, b); break;
        EMBER_UNARY_OPS(EMBER_UNARY_CASE)
#undef EMBER_UNARY_CASE
    }
}

template <int OP>
__device__ __forceinline__ void unary_backward_body(float* dx, const float* dy, const float* x, long long n, float a, float b,
                                                    int acc) {
    if (ember_aligned4(dx) && ember_aligned4(dy) && ember_aligned4(x)) { // four at a time: 16-byte accesses
        const long long n4 = n >> 2;
        ember_stream<ember_f4x3>(
            n4,
            [&](long long q) {
                ember_f4x3 v;
                v.a = reinterpret_cast<const ember_f4*>(x)[q];
                v.b = reinterpret_cast<const ember_f4*>(dy)[q];
                if (acc) v.c = reinterpret_cast<const ember_f4*>(dx)[q];
                return v;
            },
            [&](long long q, ember_f4x3 v) {
                ember_f4 r = {ember_unary_grad(OP, v.a.x, v.b.x, a, b), ember_unary_grad(OP, v.a.y, v.b.y, a, b),
                              ember_unary_grad(OP, v.a.z, v.b.z, a, b), ember_unary_grad(OP, v.a.w, v.b.w, a, b)};
                if (acc) {
                    r.x = v.c.x + r.x;
                    r.y = v.c.y + r.y;
                    r.z = v.c.z + r.z;
                    r.w = v.c.w + r.w;
                }
                reinterpret_cast<ember_f4*>(dx)[q] = r;
            });
        EMBER_LOOP(long long, i, n - 4 * n4) {
            const long long j = 4 * n4 + i;
            const float v = ember_unary_grad(OP, x[j], dy[j], a, b);
            dx[j] = acc ? dx[j] + v : v;
        }
        return;
    }
    EMBER_LOOP(long long, i, n) {
        const float v = ember_unary_grad(OP, x[i], dy[i], a, b);
        if (acc) {
            dx[i] += v;
        } else {
            dx[i] = v;
        }
    }
}

// dx = dy * f'(x) (+ dx), dense; a kernel body per op, as ember_unary_dense.
extern "C" __global__ void ember_unary_backward(float* dx, const float* dy, const float* x, long long n, int op, float a,
                                                float b, int acc) {
    switch (op) {
#define EMBER_UNARY_CASE(K) \
    case K: unary_backward_body<K>(dx, dy, x, n, a, b, acc); break;
        EMBER_UNARY_OPS(EMBER_UNARY_CASE)
#undef EMBER_UNARY_CASE
    }
}

template <int OP>
__device__ __forceinline__ void binary_dense_body(float* dst, const float* x, const float* y, long long n, int xs,
                                                  int ys) {
    if (ember_aligned4(dst) && (xs == 0 || ember_aligned4(x)) && (ys == 0 || ember_aligned4(y))) {
        const long long n4 = n >> 2;
        const float x0 = x[0], y0 = y[0];
        ember_stream<ember_f4x2>(
            n4,
            [&](long long q) {
                ember_f4x2 v = {{x0, x0, x0, x0}, {y0, y0, y0, y0}};
                if (xs) v.a = reinterpret_cast<const ember_f4*>(x)[q];
                if (ys) v.b = reinterpret_cast<const ember_f4*>(y)[q];
                return v;
            },
            [&](long long q, ember_f4x2 v) {
                ember_f4 u = v.a;
                u.x = ember_binary(OP, u.x, v.b.x);
                u.y = ember_binary(OP, u.y, v.b.y);
                u.z = ember_binary(OP, u.z, v.b.z);
                u.w = ember_binary(OP, u.w, v.b.w);
                reinterpret_cast<ember_f4*>(dst)[q] = u;
            });
        EMBER_LOOP(long long, i, n - 4 * n4) {
            const long long j = 4 * n4 + i;
            dst[j] = ember_binary(OP, x[j * xs], y[j * ys]);
        }
        return;
    }
    EMBER_LOOP(long long, i, n) dst[i] = ember_binary(OP, x[i * xs], y[i * ys]);
}

// Dense binary with optional scalar operands: x[i*xs], y[i*ys], xs and ys
// 0 (a broadcast scalar) or 1. Four at a time where every array read with
// stride 1 and dst are aligned.
extern "C" __global__ void ember_binary_dense(float* dst, const float* x, const float* y, long long n, int op, int xs,
                                              int ys) {
    switch (op) {
#define EMBER_BINARY_CASE(K) \
    case K: binary_dense_body<K>(dst, x, y, n, xs, ys); break;
        EMBER_BINARY_OPS(EMBER_BINARY_CASE)
#undef EMBER_BINARY_CASE
    }
}

// Binary with one operand dense and the other one value per channel, as a
// bias x[n, c, h, w] + b[c] is once merged to [outer, C, inner]: the
// channel operand's element for flat index i is ch[(i / inner) % C], two
// ember_divide in place of the strided kernels' six 64-bit divisions (the
// host's dividers are of inner, or of inner / 4 with vec, and of C). vec
// (inner a multiple of 4, dst and d aligned) takes four elements of one
// channel a group, through ember_stream. chIsY says the channel operand
// is y.
__device__ __forceinline__ unsigned int ember_channel_of(unsigned int i, unsigned int innerMul, unsigned int innerShift,
                                                         unsigned int cMul, unsigned int cShift, unsigned int C) {
    const unsigned int q = ember_divide(i, innerMul, innerShift);
    return q - ember_divide(q, cMul, cShift) * C;
}

template <int OP>
__device__ __forceinline__ void binary_channel_body(float* dst, const float* d, const float* ch, int n, int C,
                                                    unsigned int innerMul, unsigned int innerShift, unsigned int cMul,
                                                    unsigned int cShift, int chIsY, int vec) {
    if (vec) {
        ember_stream<ember_f4x2>(
            n >> 2,
            [&](long long q) {
                const float c = ch[ember_channel_of((unsigned int)q, innerMul, innerShift, cMul, cShift, C)];
                ember_f4x2 v = {reinterpret_cast<const ember_f4*>(d)[q], {c, c, c, c}};
                return v;
            },
            [&](long long q, ember_f4x2 v) {
                ember_f4 u = v.a;
                if (chIsY) {
                    u.x = ember_binary(OP, u.x, v.b.x);
                    u.y = ember_binary(OP, u.y, v.b.x);
                    u.z = ember_binary(OP, u.z, v.b.x);
                    u.w = ember_binary(OP, u.w, v.b.x);
                } else {
                    u.x = ember_binary(OP, v.b.x, u.x);
                    u.y = ember_binary(OP, v.b.x, u.y);
                    u.z = ember_binary(OP, v.b.x, u.z);
                    u.w = ember_binary(OP, v.b.x, u.w);
                }
                reinterpret_cast<ember_f4*>(dst)[q] = u;
            });
        return;
    }
    EMBER_LOOP(int, i, n) {
        const float c = ch[ember_channel_of((unsigned int)i, innerMul, innerShift, cMul, cShift, C)];
        dst[i] = chIsY ? ember_binary(OP, d[i], c) : ember_binary(OP, c, d[i]);
    }
}

extern "C" __global__ void ember_binary_channel(float* dst, const float* d, const float* ch, int n, int op, int C,
                                                unsigned int innerMul, unsigned int innerShift, unsigned int cMul,
                                                unsigned int cShift, int chIsY, int vec) {
    switch (op) {
#define EMBER_BINARY_CASE(K) \
    case K: binary_channel_body<K>(dst, d, ch, n, C, innerMul, innerShift, cMul, cShift, chIsY, vec); break;
        EMBER_BINARY_OPS(EMBER_BINARY_CASE)
#undef EMBER_BINARY_CASE
    }
}

// dst (dense) = ch[(i / inner) % C] (+= when acc): a per-channel value
// broadcast over [outer, C, inner], as the gradient of a sum over the
// other axes is; the index math of binary_channel_body.
extern "C" __global__ void ember_copy_channel(float* dst, const float* ch, int n, int C, int inner, int acc, int vec) {
    if (vec) {
        const int inner4 = inner >> 2;
        EMBER_LOOP(int, i, n >> 2) {
            const float c = ch[(i / inner4) % C];
            ember_f4 v = {c, c, c, c};
            if (acc) {
                const ember_f4 d = reinterpret_cast<const ember_f4*>(dst)[i];
                v.x = d.x + c;
                v.y = d.y + c;
                v.z = d.z + c;
                v.w = d.w + c;
            }
            reinterpret_cast<ember_f4*>(dst)[i] = v;
        }
        return;
    }
    EMBER_LOOP(int, i, n) {
        const float c = ch[(i / inner) % C];
        dst[i] = acc ? dst[i] + c : c;
    }
}

// ember_offsets turns the flat index i of the (padded, six-dimensional)
// shape sh into the offsets of K views with strides st[k][0..5]: the
// rightmost rank dimensions are real, the others have size 1.
template <typename I, int K>
__device__ __forceinline__ void ember_offsets(I i, int rank, const long long* sh, const long long (*st)[6], I* off) {
#pragma unroll
    for (int k = 0; k < K; k++) off[k] = 0;
    I r = i;
#pragma unroll
    for (int d = 5; d >= 0; d--) {
        if (d < 6 - rank) break;
        const I s = (I)sh[d];
        const I q = r / s;
        const I c = r - q * s;
#pragma unroll
        for (int k = 0; k < K; k++) off[k] += c * (I)st[k][d];
        r = q;
    }
}

template <typename I>
__device__ __forceinline__ void unary_strided_body(float* dst, const float* x, I n, int op, float a, float b, int rank,
                                                   const long long* sh, const long long (*st)[6]) {
    EMBER_LOOP(I, i, n) {
        I off[1];
        ember_offsets<I, 1>(i, rank, sh, st, off);
        dst[i] = ember_unary(op, x[off[0]], a, b);
    }
}

extern "C" __global__ void ember_unary_strided(float* dst, const float* x, long long n, int op, float a, float b, int rank,
                                               int small, long long s0, long long s1, long long s2, long long s3,
                                               long long s4, long long s5, long long t0, long long t1, long long t2,
                                               long long t3, long long t4, long long t5) {
    const long long sh[6] = {s0, s1, s2, s3, s4, s5};
    const long long st[1][6] = {{t0, t1, t2, t3, t4, t5}};
    if (small) {
        unary_strided_body<int>(dst, x, (int)n, op, a, b, rank, sh, st);
    } else {
        unary_strided_body<long long>(dst, x, n, op, a, b, rank, sh, st);
    }
}

template <typename I>
__device__ __forceinline__ void binary_strided_body(float* dst, const float* x, const float* y, I n, int op, int rank,
                                                    const long long* sh, const long long (*st)[6]) {
    EMBER_LOOP(I, i, n) {
        I off[2];
        ember_offsets<I, 2>(i, rank, sh, st, off);
        dst[i] = ember_binary(op, x[off[0]], y[off[1]]);
    }
}

extern "C" __global__ void ember_binary_strided(float* dst, const float* x, const float* y, long long n, int op, int rank,
                                                int small, long long s0, long long s1, long long s2, long long s3,
                                                long long s4, long long s5, long long xt0, long long xt1, long long xt2,
                                                long long xt3, long long xt4, long long xt5, long long yt0,
                                                long long yt1, long long yt2, long long yt3, long long yt4,
                                                long long yt5) {
    const long long sh[6] = {s0, s1, s2, s3, s4, s5};
    const long long st[2][6] = {{xt0, xt1, xt2, xt3, xt4, xt5}, {yt0, yt1, yt2, yt3, yt4, yt5}};
    if (small) {
        binary_strided_body<int>(dst, x, y, (int)n, op, rank, sh, st);
    } else {
        binary_strided_body<long long>(dst, x, y, n, op, rank, sh, st);
    }
}

template <typename I>
__device__ __forceinline__ void where_body(float* dst, const float* c, const float* x, const float* y, I n, int rank,
                                           const long long* sh, const long long (*st)[6]) {
    EMBER_LOOP(I, i, n) {
        I off[3];
        ember_offsets<I, 3>(i, rank, sh, st, off);
        dst[i] = c[off[0]] != 0.0f ? x[off[1]] : y[off[2]];
    }
}

extern "C" __global__ void ember_where_strided(float* dst, const float* c, const float* x, const float* y, long long n,
                                               int rank, int small, long long s0, long long s1, long long s2,
                                               long long s3, long long s4, long long s5, long long ct0, long long ct1,
                                               long long ct2, long long ct3, long long ct4, long long ct5,
                                               long long xt0, long long xt1, long long xt2, long long xt3,
                                               long long xt4, long long xt5, long long yt0, long long yt1,
                                               long long yt2, long long yt3, long long yt4, long long yt5) {
    const long long sh[6] = {s0, s1, s2, s3, s4, s5};
    const long long st[3][6] = {
        {ct0, ct1, ct2, ct3, ct4, ct5}, {xt0, xt1, xt2, xt3, xt4, xt5}, {yt0, yt1, yt2, yt3, yt4, yt5}};
    if (small) {
        where_body<int>(dst, c, x, y, (int)n, rank, sh, st);
    } else {
        where_body<long long>(dst, c, x, y, n, rank, sh, st);
    }
}

template <typename I>
__device__ __forceinline__ void copy_view_body(float* dst, const float* src, I n, int acc, int rank, const long long* sh,
                                               const long long (*st)[6]) {
    EMBER_LOOP(I, i, n) {
        I off[2];
        ember_offsets<I, 2>(i, rank, sh, st, off);
        if (acc) {
            dst[off[0]] += src[off[1]];
        } else {
            dst[off[0]] = src[off[1]];
        }
    }
}

// dst view = src view (+= when acc); dst's view must not alias itself, so
// that every element is written by one thread.
extern "C" __global__ void ember_copy_view(float* dst, const float* src, long long n, int acc, int rank, int small,
                                           long long s0, long long s1, long long s2, long long s3, long long s4,
                                           long long s5, long long dt0, long long dt1, long long dt2, long long dt3,
                                           long long dt4, long long dt5, long long st0, long long st1, long long st2,
                                           long long st3, long long st4, long long st5) {
    const long long sh[6] = {s0, s1, s2, s3, s4, s5};
    const long long st[2][6] = {{dt0, dt1, dt2, dt3, dt4, dt5}, {st0, st1, st2, st3, st4, st5}};
    if (small) {
        copy_view_body<int>(dst, src, (int)n, acc, rank, sh, st);
    } else {
        copy_view_body<long long>(dst, src, n, acc, rank, sh, st);
    }
}
