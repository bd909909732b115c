// cast.cu: conversions between float32 and bfloat16 (stored as its 16-bit
// pattern, unsigned short), for mixed precision (cuda/cast.go). The
// rounding is done on the integer bits, not with the CUDA headers'
// intrinsics, so that it is the CPU backend's (tensor.BFloat16Bits) and
// torch's bit for bit: to nearest, ties to even, subnormals kept, and every
// NaN the quiet NaN 0x7FC0 (the intrinsics give another NaN pattern).

__device__ __forceinline__ unsigned short ember_bf16_from_f32(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (unsigned short)0x7fc0u;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

__device__ __forceinline__ float ember_f32_from_bf16(unsigned short h) {
    return __uint_as_float(((unsigned int)h) << 16);
}

// dst[i] = bfloat16(src[i]) for i < n.
extern "C" __global__ void ember_cast_f32_bf16(unsigned short* dst, const float* src, long long n) {
    EMBER_LOOP(long long, i, n) { dst[i] = ember_bf16_from_f32(src[i]); }
}

// dst[i] = float32(src[i]) for i < n (exact).
extern "C" __global__ void ember_cast_bf16_f32(float* dst, const unsigned short* src, long long n) {
    EMBER_LOOP(long long, i, n) { dst[i] = ember_f32_from_bf16(src[i]); }
}
