// Host emulation of the CUDA built-ins that the attention and reduction
// kernels use, for TestAttentionKernelsOnHost and
// TestReduceKernelsOnHost: one pthread per CUDA thread, the blocks of a
// grid one after another, __shared__ variables static (one block's at a
// time), __syncthreads a barrier of the block and a warp shuffle a barrier
// of the warp around an exchange array. It checks the kernels' logic
// (indices, masks, tiles, the order of the barriers' phases), not their
// speed, and not races between threads (compute-sanitizer's racecheck on a
// GPU does). The tensor-core kernels' mma.sync and bfloat16 conversion
// (attention_bf16.cu, which leaves them to this header under
// EMBER_HOST_EMU) are emulated from the PTX ISA's fragment layouts.
#include <pthread.h>
#include <cmath>
#include <cstring>
#include <cstdio>
struct uint3 { unsigned x, y, z; };
extern thread_local uint3 threadIdx, blockIdx;
extern uint3 blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
extern pthread_barrier_t g_bar;
extern pthread_barrier_t g_warp_bar[32];
extern float g_shfl[1024];
inline void __syncthreads() { pthread_barrier_wait(&g_bar); }
// __trap counts in g_traps and returns (a driver checks the count; the
// kernels never use a trapped index as an address); atomicAdd is one
// thread's, for kernels that are compiled here but not run.
inline int g_traps;
inline void __trap() { __atomic_fetch_add(&g_traps, 1, __ATOMIC_SEQ_CST); }
inline float atomicAdd(float* p, float v) {
    float o = *p;
    *p = o + v;
    return o;
}
// The blocks run one after another, so a counter of arrivals needs no
// atomicity here, and the last block to arrive is the grid's last.
inline unsigned atomicAdd(unsigned* p, unsigned v) {
    unsigned o = *p;
    *p = o + v;
    return o;
}
inline double __ldcg(const double* p) { return *p; }
inline float __shfl_xor_sync(unsigned, float v, int o) {
    int t = threadIdx.x, w = t / 32, l = t % 32;
    g_shfl[t] = v;
    pthread_barrier_wait(&g_warp_bar[w]);
    float r = g_shfl[w * 32 + (l ^ o)];
    pthread_barrier_wait(&g_warp_bar[w]);
    return r;
}
inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned i) { float f; memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned i; memcpy(&i, &f, 4); return i; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __expf(float x) { return expf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline int __ffs(int v) { return __builtin_ffs(v); }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline void sincos(double x, double* s, double* c) { *s = sin(x); *c = cos(x); }

extern unsigned g_shflu[1024];
inline unsigned __shfl_sync(unsigned, unsigned v, int src) {
    int t = threadIdx.x, w = t / 32;
    g_shflu[t] = v;
    pthread_barrier_wait(&g_warp_bar[w]);
    unsigned r = g_shflu[w * 32 + (src & 31)];
    pthread_barrier_wait(&g_warp_bar[w]);
    return r;
}
inline unsigned __shfl_xor_sync(unsigned m, unsigned v, int o) { return __shfl_sync(m, v, (threadIdx.x % 32) ^ o); }
inline double __shfl_xor_sync(unsigned m, double v, int o) {  // common.cu's double sums; unused by the attention
    unsigned long long u;
    memcpy(&u, &v, 8);
    unsigned lo = __shfl_xor_sync(m, (unsigned)u, o), hi = __shfl_xor_sync(m, (unsigned)(u >> 32), o);
    u = (unsigned long long)hi << 32 | lo;
    memcpy(&v, &u, 8);
    return v;
}
inline long long __shfl_xor_sync(unsigned m, long long v, int o) {  // reduce_axis.cu's indices
    unsigned long long u = (unsigned long long)v;
    unsigned lo = __shfl_xor_sync(m, (unsigned)u, o), hi = __shfl_xor_sync(m, (unsigned)(u >> 32), o);
    return (long long)((unsigned long long)hi << 32 | lo);
}

// mma.sync.m16n8k16.row.col.f32.bf16.bf16.f32: each lane posts its
// fragments, then computes its four C elements from the warp's (the
// products are exact in float32, the sum in double: the hardware's
// accumulation order is not specified).
#define EMBER_HOST_EMU 1
struct ember_mma_frag { unsigned a[4], b[2]; };
extern ember_mma_frag g_mma[1024];
inline float ember_bf16_bits(unsigned w, int hi) { return __uint_as_float(hi ? (w & 0xffff0000u) : (w << 16)); }
inline void ember_mma_bf16(float c[4], const unsigned a[4], unsigned b0, unsigned b1) {
    int t = threadIdx.x, w = t / 32, l = t % 32, g = l >> 2, tt = l & 3;
    memcpy(g_mma[t].a, a, sizeof g_mma[t].a);
    g_mma[t].b[0] = b0;
    g_mma[t].b[1] = b1;
    pthread_barrier_wait(&g_warp_bar[w]);
    const ember_mma_frag* f = &g_mma[w * 32];
    for (int e = 0; e < 4; e++) {
        int row = g + 8 * (e >> 1), col = 2 * tt + (e & 1);
        double s = 0;
        for (int k = 0; k < 16; k++) {
            float x = ember_bf16_bits(f[(row % 8) * 4 + (k % 8) / 2].a[(row >= 8) + 2 * (k >= 8)], k & 1);
            float y = ember_bf16_bits(f[col * 4 + (k % 8) / 2].b[k >= 8], k & 1);
            s += (double)x * y;
        }
        c[e] = (float)((double)c[e] + s);
    }
    pthread_barrier_wait(&g_warp_bar[w]);
}
// cvt.rn.bf16x2.f32: to nearest, ties to even (NaN as cast.cu's).
inline unsigned ember_host_bf16(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
    u += 0x7fffu + ((u >> 16) & 1u);
    return u >> 16;
}
inline unsigned ember_attb_pack(float lo, float hi) { return ember_host_bf16(lo) | (ember_host_bf16(hi) << 16); }

// cp.async of 16 bytes (zeros where !in): copied at once, so committing
// and waiting are nothing.
inline void ember_attb_cp16(unsigned short* dst, const unsigned short* src, bool in) {
    if (in)
        memcpy(dst, src, 16);
    else
        memset(dst, 0, 16);
}
inline void ember_attb_commit() {}
template <int pending>
inline void ember_attb_wait() {}

// ldmatrix.sync.m8n8.x4.trans.b16: lanes 8m..8m+7 post the rows of tile m;
// lane 4g + t then holds elements (2t, g) and (2t+1, g) of each tile.
extern const unsigned short* g_ldsm[1024];
inline void ember_attb_ldsm_t4(unsigned r[4], const unsigned short* X, int ld, int k0, int n0) {
    int t = threadIdx.x, w = t / 32, l = t % 32, m = l >> 3, i = l & 7, g = l >> 2, tt = l & 3;
    g_ldsm[t] = X + (k0 + 8 * (m & 1) + i) * ld + n0 + 8 * (m >> 1);
    pthread_barrier_wait(&g_warp_bar[w]);
    for (int mm = 0; mm < 4; mm++) {
        const unsigned short *r0 = g_ldsm[w * 32 + 8 * mm + 2 * tt], *r1 = g_ldsm[w * 32 + 8 * mm + 2 * tt + 1];
        r[mm] = (unsigned)r0[g] | ((unsigned)r1[g] << 16);
    }
    pthread_barrier_wait(&g_warp_bar[w]);
}
