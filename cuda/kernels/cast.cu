// cast.cu: conversions between float32 and bfloat16 (stored as its 16-bit
// pattern, unsigned short), for mixed precision (cuda/cast.go), through
// common.cu's ember_bf16_from_f32 and ember_f32_from_bf16.

// dst[i] = bfloat16(src[i]) for i < n.
extern "C" __global__ void ember_cast_f32_bf16(unsigned short* dst, const float* src, long long n) {
    EMBER_LOOP(long long, i, n) { dst[i] = ember_bf16_from_f32(src[i]); }
}

// dst[i] = float32(src[i]) for i < n (exact).
extern "C" __global__ void ember_cast_bf16_f32(float* dst, const unsigned short* src, long long n) {
    EMBER_LOOP(long long, i, n) { dst[i] = ember_f32_from_bf16(src[i]); }
}

// The casts around autocast's bfloat16 convolutions (cuda/conv_cudnn.go),
// each fused with what the float32 side does next so that a cast costs no
// extra pass.

// y[i] = float32(h[i]) + bias[channel of i] (bias may be null), then
// max(., 0) when relu: a bfloat16 convolution's output [N, K, P] back to
// float32 with conv2d's epilogue.
extern "C" __global__ void ember_conv_out_bf16(float* y, const unsigned short* h, const float* bias,
                                               long long n, long long K, long long P, int relu) {
    EMBER_LOOP(long long, i, n) {
        float v = ember_f32_from_bf16(h[i]);
        if (bias) v += bias[(i / P) % K];
        if (relu && !(v > 0.f || v != v)) v = 0.f; // NaN propagates, as ember_relu
        y[i] = v;
    }
}

// h[i] = bfloat16(mask[i] <= 0 ? 0 : dy[i]), or bfloat16(dy[i]) when mask is
// null: the incoming gradient of a bfloat16 convolution, masked by its fused
// ReLU's output as relu_backward does.
extern "C" __global__ void ember_conv_grad_bf16(unsigned short* h, const float* dy, const float* mask, long long n) {
    EMBER_LOOP(long long, i, n) {
        float g = dy[i];
        if (mask && mask[i] <= 0.f) g = 0.f; // a NaN mask passes dy, as ember_relu_backward
        h[i] = ember_bf16_from_f32(g);
    }
}

// dst[i] = float32(src[i]) (+ dst[i] when accumulate): a bfloat16 gradient
// into a float32 one (dx overwritten, dw accumulated).
extern "C" __global__ void ember_add_bf16_f32(float* dst, const unsigned short* src, long long n, int accumulate) {
    EMBER_LOOP(long long, i, n) {
        float v = ember_f32_from_bf16(src[i]);
        dst[i] = accumulate ? dst[i] + v : v;
    }
}

// The same casts between float32 [N, C, P] (NCHW, or a KCRS filter with
// N = K, P = R·S) and bfloat16 [N, P, C] (NHWC, KRSC), the layout cuDNN's
// tensor-core convolutions read without a transpose of their own. A 32x32
// tile of (c, p) goes through shared memory so that both sides are read and
// written along their contiguous axis; grid (ceil(P/32), ceil(C/32), N),
// block (32, 8).

// h[n][p][c] = bfloat16(x[n][c][p]), zero where mask (may be null) is not
// positive (a NaN mask passes, as ember_relu_backward).
extern "C" __global__ void ember_to_nhwc_bf16(unsigned short* h, const float* x, const float* mask, int C, int P) {
    __shared__ float tile[32][33];
    const long long base = (long long)blockIdx.z * C * P;
    const int p0 = blockIdx.x * 32, c0 = blockIdx.y * 32;
    for (int j = threadIdx.y; j < 32; j += 8) {
        const int c = c0 + j, p = p0 + threadIdx.x;
        float v = 0.f;
        if (c < C && p < P) {
            const long long i = base + (long long)c * P + p;
            v = x[i];
            if (mask && mask[i] <= 0.f) v = 0.f;
        }
        tile[j][threadIdx.x] = v;
    }
    __syncthreads();
    for (int j = threadIdx.y; j < 32; j += 8) {
        const int p = p0 + j, c = c0 + threadIdx.x;
        if (c < C && p < P) h[base + (long long)p * C + c] = ember_bf16_from_f32(tile[threadIdx.x][j]);
    }
}

// y[n][c][p] = float32(h[n][p][c]) + bias[c] (bias may be null), then
// max(., 0) when relu; or, when accumulate, y[n][c][p] += float32(h[n][p][c]).
extern "C" __global__ void ember_from_nhwc_bf16(float* y, const unsigned short* h, const float* bias, int C, int P,
                                                int relu, int accumulate) {
    __shared__ float tile[32][33];
    const long long base = (long long)blockIdx.z * C * P;
    const int p0 = blockIdx.x * 32, c0 = blockIdx.y * 32;
    for (int j = threadIdx.y; j < 32; j += 8) {
        const int p = p0 + j, c = c0 + threadIdx.x;
        if (c < C && p < P) tile[j][threadIdx.x] = ember_f32_from_bf16(h[base + (long long)p * C + c]);
    }
    __syncthreads();
    for (int j = threadIdx.y; j < 32; j += 8) {
        const int c = c0 + j, p = p0 + threadIdx.x;
        if (c < C && p < P) {
            const long long i = base + (long long)c * P + p;
            float v = tile[threadIdx.x][j];
            if (accumulate) {
                v += y[i];
            } else {
                if (bias) v += bias[c];
                if (relu && !(v > 0.f || v != v)) v = 0.f;
            }
            y[i] = v;
        }
    }
}
