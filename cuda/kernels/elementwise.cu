// elementwise.cu: the memory-bound one-pass kernels of the CUDA backend:
// arithmetic (add, mul, axpy, scale, scale_by, broadcast), activations
// (relu, relu_backward), add_bias, the strided gather behind
// Tensor.Contiguous (copy_strided_*), batch assembly from a uint8 dataset
// (gather_normalize) and the optimiser update (sgd). Each mirrors the loop
// of the same name in tensor/cpu.go operation for operation, so that with
// --fmad=false the results are identical to the CPU backend's.

// ember_each4 runs the float4 groups of a dense operation through
// ember_stream when vec (ld4(q) loads the operands of the group of
// 4q..4q+3, st4(q, v) computes and stores it), the tail (and everything
// when not vec) by f(i) one index at a time. The kernels below pass vec
// when their pointers are 16-byte aligned; the Go side launches them with
// launch4. (One float at a time, a thread has one load in flight:
// gradient accumulation ran at half the copy rate.)
template <typename V, typename Ld, typename St, typename F>
__device__ __forceinline__ void ember_each4(long long n, bool vec, Ld ld4, St st4, F f) {
    if (vec) {
        const long long n4 = n >> 2;
        ember_stream<V>(n4, ld4, st4);
        EMBER_LOOP(long long, i, n - 4 * n4) f(4 * n4 + i);
        return;
    }
    EMBER_LOOP(long long, i, n) f(i);
}

// ember_al16 says whether every pointer or-ed into p is 16-byte aligned.
__device__ __forceinline__ bool ember_al16(unsigned long long p) { return (p & 15) == 0; }

#define EMBER_F4_LD(p, q) (reinterpret_cast<const ember_f4*>(p)[q])
#define EMBER_F4_ST(p, q, v) (reinterpret_cast<ember_f4*>(p)[q] = (v))

extern "C" __global__ void ember_add(float* dst, const float* a, const float* b, long long n) {
    ember_each4<ember_f4x2>(
        n, ember_al16((unsigned long long)dst | (unsigned long long)a | (unsigned long long)b),
        [&](long long q) { return ember_f4x2{EMBER_F4_LD(a, q), EMBER_F4_LD(b, q)}; },
        [&](long long q, ember_f4x2 v) {
            EMBER_F4_ST(dst, q, (ember_f4{v.a.x + v.b.x, v.a.y + v.b.y, v.a.z + v.b.z, v.a.w + v.b.w}));
        },
        [&](long long i) { dst[i] = a[i] + b[i]; });
}

extern "C" __global__ void ember_mul(float* dst, const float* a, const float* b, long long n) {
    ember_each4<ember_f4x2>(
        n, ember_al16((unsigned long long)dst | (unsigned long long)a | (unsigned long long)b),
        [&](long long q) { return ember_f4x2{EMBER_F4_LD(a, q), EMBER_F4_LD(b, q)}; },
        [&](long long q, ember_f4x2 v) {
            EMBER_F4_ST(dst, q, (ember_f4{v.a.x * v.b.x, v.a.y * v.b.y, v.a.z * v.b.z, v.a.w * v.b.w}));
        },
        [&](long long i) { dst[i] = a[i] * b[i]; });
}

// ember_copy16 copies n16 groups of 16 bytes (Backend.Copy of aligned
// buffers: 4.2 TB/s on the H200 where cuMemcpyDtoDAsync gave 3.6-3.9 in
// our processes). The words are moved, never computed on.
struct __attribute__((aligned(16))) ember_u4 {
    unsigned int x, y, z, w;
};
extern "C" __global__ void ember_copy16(ember_u4* dst, const ember_u4* src, long long n16) {
    ember_stream<ember_u4>(n16, [&](long long q) { return src[q]; }, [&](long long q, ember_u4 v) { dst[q] = v; });
}

// dst += alpha * x
extern "C" __global__ void ember_axpy(float* dst, float alpha, const float* x, long long n) {
    ember_each4<ember_f4x2>(
        n, ember_al16((unsigned long long)dst | (unsigned long long)x),
        [&](long long q) { return ember_f4x2{EMBER_F4_LD(dst, q), EMBER_F4_LD(x, q)}; },
        [&](long long q, ember_f4x2 v) {
            ember_f4 d = v.a;
            d.x += alpha * v.b.x;
            d.y += alpha * v.b.y;
            d.z += alpha * v.b.z;
            d.w += alpha * v.b.w;
            EMBER_F4_ST(dst, q, d);
        },
        [&](long long i) { dst[i] += alpha * x[i]; });
}

// dst *= s (MatMul with k == 0: c = beta*c)
extern "C" __global__ void ember_scale(float* dst, float s, long long n) {
    EMBER_LOOP(long long, i, n) dst[i] *= s;
}

// dst = x * s[0] (+ dst); s stays on the device.
extern "C" __global__ void ember_scale_by(float* dst, const float* x, const float* s, long long n, int acc) {
    const float k = s[0];
    const ember_f4 zero = {0.0f, 0.0f, 0.0f, 0.0f};
    ember_each4<ember_f4x2>(
        n, ember_al16((unsigned long long)dst | (unsigned long long)x),
        [&](long long q) { return ember_f4x2{EMBER_F4_LD(x, q), acc ? EMBER_F4_LD(dst, q) : zero}; },
        [&](long long q, ember_f4x2 v) {
            ember_f4 r = {v.a.x * k, v.a.y * k, v.a.z * k, v.a.w * k};
            if (acc) {
                r.x = v.b.x + r.x;
                r.y = v.b.y + r.y;
                r.z = v.b.z + r.z;
                r.w = v.b.w + r.w;
            }
            EMBER_F4_ST(dst, q, r);
        },
        [&](long long i) { dst[i] = acc ? dst[i] + x[i] * k : x[i] * k; });
}

// dst = s[0] (+ dst)
extern "C" __global__ void ember_broadcast(float* dst, const float* s, long long n, int acc) {
    const float v = s[0];
    const ember_f4 zero = {0.0f, 0.0f, 0.0f, 0.0f};
    ember_each4<ember_f4>(
        n, ember_al16((unsigned long long)dst), [&](long long q) { return acc ? EMBER_F4_LD(dst, q) : zero; },
        [&](long long q, ember_f4 d) {
            ember_f4 r = {v, v, v, v};
            if (acc) {
                r.x = d.x + v;
                r.y = d.y + v;
                r.z = d.z + v;
                r.w = d.w + v;
            }
            EMBER_F4_ST(dst, q, r);
        },
        [&](long long i) { dst[i] = acc ? dst[i] + v : v; });
}

// y = max(x, 0) with Go's max semantics: NaN propagates, -0 becomes +0.
__device__ __forceinline__ float ember_relu1(float v) { return (v > 0.0f || v != v) ? v : 0.0f; }

// 16-byte loads and stores where both pointers allow them (four elements a
// group, the tail one by one): the same operation on each element.
extern "C" __global__ void ember_relu(float* y, const float* x, long long n) {
    ember_each4<ember_f4>(
        n, ember_al16((unsigned long long)y | (unsigned long long)x), [&](long long q) { return EMBER_F4_LD(x, q); },
        [&](long long q, ember_f4 v) {
            v.x = ember_relu1(v.x);
            v.y = ember_relu1(v.y);
            v.z = ember_relu1(v.z);
            v.w = ember_relu1(v.w);
            EMBER_F4_ST(y, q, v);
        },
        [&](long long i) { y[i] = ember_relu1(x[i]); });
}

// dx = dy where y > 0 else 0 (+ dx). A NaN y passes dy, as on the CPU.
extern "C" __global__ void ember_relu_backward(float* dx, const float* dy, const float* y, long long n, int acc) {
    auto g = [](float yv, float d) { return (yv <= 0.0f) ? 0.0f : d; };
    const ember_f4 zero = {0.0f, 0.0f, 0.0f, 0.0f};
    ember_each4<ember_f4x3>(
        n, ember_al16((unsigned long long)dx | (unsigned long long)dy | (unsigned long long)y),
        [&](long long q) { return ember_f4x3{EMBER_F4_LD(y, q), EMBER_F4_LD(dy, q), acc ? EMBER_F4_LD(dx, q) : zero}; },
        [&](long long q, ember_f4x3 v) {
            ember_f4 r = {g(v.a.x, v.b.x), g(v.a.y, v.b.y), g(v.a.z, v.b.z), g(v.a.w, v.b.w)};
            if (acc) {
                r.x = v.c.x + r.x;
                r.y = v.c.y + r.y;
                r.z = v.c.z + r.z;
                r.w = v.c.w + r.w;
            }
            EMBER_F4_ST(dx, q, r);
        },
        [&](long long i) {
            const float v = g(y[i], dy[i]);
            dx[i] = acc ? dx[i] + v : v;
        });
}

// y[o, c, i] += bias[c] for y viewed as [outer, channels, inner].
template <typename I>
__device__ __forceinline__ void add_bias_body(float* y, const float* bias, I total, I channels, I inner) {
    EMBER_LOOP(I, i, total) y[i] += bias[(i / inner) % channels];
}

extern "C" __global__ void ember_add_bias(float* y, const float* bias, long long total, long long channels, long long inner) {
    if (EMBER_SMALL_INDEX(total)) {
        add_bias_body<int>(y, bias, (int)total, (int)channels, (int)inner);
    } else {
        add_bias_body<long long>(y, bias, total, channels, inner);
    }
}

// y[o, c] = ReLU(y[o, c] + bias[c]) (NaN stays, the rest of the
// non-positive values become +0, as ember_relu): LinearReLU's epilogue.
extern "C" __global__ void ember_add_bias_relu(float* y, const float* bias, long long total, long long channels) {
    EMBER_LOOP(long long, i, total) {
        const float v = y[i] + bias[i % channels];
        y[i] = (v > 0.0f || v != v) ? v : 0.0f;
    }
}

// copy_strided: dense dst[i] = src[sum_k idx_k * stride_k], where idx is the
// row-major multi-index of i in shape (s0..s5). The Go side merges
// contiguous dimensions and pads the shape on the left with (1, stride 0)
// to exactly six. Strides may be any sign; offsets are 64-bit.
#define EMBER_STRIDED_OFFSET(i)                             \
    long long r = (i), off = 0, q;                          \
    q = r / s5; off += (r - q * s5) * t5; r = q;            \
    q = r / s4; off += (r - q * s4) * t4; r = q;            \
    q = r / s3; off += (r - q * s3) * t3; r = q;            \
    q = r / s2; off += (r - q * s2) * t2; r = q;            \
    q = r / s1; off += (r - q * s1) * t1; r = q;            \
    off += r * t0;

extern "C" __global__ void ember_copy_strided_u32(unsigned int* dst, const unsigned int* src, long long n,
                                                  long long s0, long long s1, long long s2, long long s3, long long s4, long long s5,
                                                  long long t0, long long t1, long long t2, long long t3, long long t4, long long t5) {
    EMBER_LOOP(long long, i, n) {
        EMBER_STRIDED_OFFSET(i)
        dst[i] = src[off];
    }
}

extern "C" __global__ void ember_copy_strided_u8(unsigned char* dst, const unsigned char* src, long long n,
                                                 long long s0, long long s1, long long s2, long long s3, long long s4, long long s5,
                                                 long long t0, long long t1, long long t2, long long t3, long long t4, long long t5) {
    EMBER_LOOP(long long, i, n) {
        EMBER_STRIDED_OFFSET(i)
        dst[i] = src[off];
    }
}

// dst row i = src row idx[i] (uint8, rowLen wide) * scale + shift. An index
// outside [0, srcRows) yields a row of NaN (the CPU backend panics; a kernel
// cannot, and NaN cannot go unnoticed).
template <typename I>
__device__ __forceinline__ void gather_body(float* dst, const unsigned char* src, const int* idx, I total, I rowLen,
                                            long long srcRows, float scale, float shift) {
    EMBER_LOOP(I, i, total) {
        const I r = i / rowLen;
        const I j = i - r * rowLen;
        const long long k = idx[r];
        if (k < 0 || k >= srcRows) {
            dst[i] = ember_nan();
        } else {
            dst[i] = (float)src[k * (long long)rowLen + (long long)j] * scale + shift;
        }
    }
}

extern "C" __global__ void ember_gather_normalize(float* dst, const unsigned char* src, const int* idx, long long rows,
                                                  long long rowLen, long long srcRows, float scale, float shift) {
    const long long total = rows * rowLen;
    if (EMBER_SMALL_INDEX(total)) {
        gather_body<int>(dst, src, idx, (int)total, (int)rowLen, srcRows, scale, shift);
    } else {
        gather_body<long long>(dst, src, idx, total, rowLen, srcRows, scale, shift);
    }
}

// One torch.optim.SGD step (tensor/cpu.go SGD, operation for operation):
//   d = g + wd*p                               (when wd != 0)
//   v = d (first step) | momentum*v + (1-dampening)*d   (when momentum != 0)
//   d = d + momentum*v (nesterov) | v                   (when momentum != 0)
//   p = p - lr*d
//   g = 0                                               (when zeroGrad)
// v is not touched (and may be null) when momentum == 0.
__device__ __forceinline__ void sgd_one(float& p, float& g, float* v, float lr, float momentum, float keep, float wd,
                                        int nesterov, int first, int zeroGrad) {
    float d = g;
    if (wd != 0.0f) d += wd * p;
    if (momentum != 0.0f) {
        const float vi = first ? d : momentum * *v + keep * d;
        *v = vi;
        if (nesterov) {
            d += momentum * vi;
        } else {
            d = vi;
        }
    }
    p = p - lr * d;
    if (zeroGrad) g = 0.0f;
}

extern "C" __global__ void ember_sgd(float* p, float* g, float* v, long long n, float lr, float momentum,
                                     float dampening, float wd, int nesterov, int first, int zeroGrad) {
    const float keep = 1.0f - dampening;
    EMBER_LOOP(long long, i, n) {
        float pi = p[i], gi = g[i], vi = v != 0 ? v[i] : 0.0f;
        sgd_one(pi, gi, &vi, lr, momentum, keep, wd, nesterov, first, zeroGrad);
        p[i] = pi;
        if (zeroGrad) g[i] = gi;
        if (momentum != 0.0f) v[i] = vi;
    }
}

// ember_sgd4 is ember_sgd on four elements at a time, each array 16-byte
// aligned: the same operations, a quarter of the loads and stores (431,080
// parameters: 4.0 us as single elements); the last n % 4 elements go to
// the grid's first threads, one each (an MLP's 1,863,690 parameters took
// 9.6 us as single elements).
extern "C" __global__ void ember_sgd4(float* p, float* g, float* v, long long n, float lr, float momentum,
                                      float dampening, float wd, int nesterov, int first, int zeroGrad) {
    const float keep = 1.0f - dampening;
    const long long n4 = n >> 2;
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < (n & 3)) {
        const long long i = 4 * n4 + t;
        float pi = p[i], gi = g[i], vi = momentum != 0.0f ? v[i] : 0.0f;
        sgd_one(pi, gi, &vi, lr, momentum, keep, wd, nesterov, first, zeroGrad);
        p[i] = pi;
        if (zeroGrad) g[i] = gi;
        if (momentum != 0.0f) v[i] = vi;
    }
    EMBER_LOOP(long long, i, n4) {
        ember_f4 pq = reinterpret_cast<ember_f4*>(p)[i], gq = reinterpret_cast<ember_f4*>(g)[i], vq = {0, 0, 0, 0};
        if (momentum != 0.0f) vq = reinterpret_cast<ember_f4*>(v)[i];
        sgd_one(pq.x, gq.x, &vq.x, lr, momentum, keep, wd, nesterov, first, zeroGrad);
        sgd_one(pq.y, gq.y, &vq.y, lr, momentum, keep, wd, nesterov, first, zeroGrad);
        sgd_one(pq.z, gq.z, &vq.z, lr, momentum, keep, wd, nesterov, first, zeroGrad);
        sgd_one(pq.w, gq.w, &vq.w, lr, momentum, keep, wd, nesterov, first, zeroGrad);
        reinterpret_cast<ember_f4*>(p)[i] = pq;
        if (zeroGrad) reinterpret_cast<ember_f4*>(g)[i] = gq;
        if (momentum != 0.0f) reinterpret_cast<ember_f4*>(v)[i] = vq;
    }
}

