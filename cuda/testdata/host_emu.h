// Host emulation of the CUDA built-ins that the attention kernels use, for
// TestAttentionKernelsOnHost: one pthread per CUDA thread, the blocks of a
// grid one after another, __shared__ variables static (one block's at a
// time), __syncthreads a barrier of the block and a warp shuffle a barrier
// of the warp around an exchange array. It checks the kernels' logic
// (indices, masks, tiles, the order of the barriers' phases), not their
// speed, and not races between threads (compute-sanitizer's racecheck on a
// GPU does).
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
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline void sincos(double x, double* s, double* c) { *s = sin(x); *c = cos(x); }
