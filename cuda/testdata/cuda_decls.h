// Declarations of the CUDA built-ins that the backend's kernels use, so that
// clang can check the kernels' syntax and types without a CUDA toolkit
// (TestKernelsParseWithClang). Only what the kernels call is declared.
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __shared__ __attribute__((shared))
#define __forceinline__ __attribute__((always_inline))
#define __launch_bounds__(...) __attribute__((launch_bounds(__VA_ARGS__)))
struct uint3 {
    unsigned x, y, z;
};
extern const __device__ uint3 threadIdx, blockIdx, blockDim, gridDim;
__device__ void __syncthreads();
__device__ float __int_as_float(int);
__device__ float __uint_as_float(unsigned int);
__device__ unsigned int __float_as_uint(float);
__device__ float __fmaf_rn(float, float, float);
__device__ double __fma_rn(double, double, double);
__device__ double fmax(double, double);
__device__ float __fadd_rn(float, float);
__device__ float __shfl_xor_sync(unsigned, float, int);
__device__ double __shfl_xor_sync(unsigned, double, int);
__device__ int __shfl_xor_sync(unsigned, int, int);
__device__ float __shfl_down_sync(unsigned, float, int);
__device__ float __shfl_sync(unsigned, float, int);
__device__ unsigned __shfl_xor_sync(unsigned, unsigned, int);
__device__ unsigned __shfl_sync(unsigned, unsigned, int);
__device__ float expf(float);
__device__ float __expf(float);
__device__ float __fdividef(float, float);
__device__ float logf(float);
__device__ float exp2f(float);
__device__ float log2f(float);
__device__ float sqrtf(float);
__device__ double exp(double);
__device__ double log(double);
__device__ double sqrt(double);
__device__ void __threadfence();
__device__ int atomicAdd(int*, int);
__device__ float atomicAdd(float*, float);
__device__ unsigned atomicAdd(unsigned*, unsigned);
__device__ void __trap();
__device__ float __ldcg(const float*);
__device__ double __ldcg(const double*);
__device__ void sincos(double, double*, double*);
__device__ unsigned __umulhi(unsigned, unsigned);
__device__ int __ffs(int);
__device__ long long __shfl_xor_sync(unsigned, long long, int);
__device__ float fabsf(float);
__device__ float tanhf(float);
__device__ float erff(float);
__device__ float powf(float, float);
__device__ float sinf(float);
__device__ float cosf(float);
