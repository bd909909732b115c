// bn_act.cu: batch norm's normalised value and its activations, shared by
// norm.cu (float32 planes) and channels_last.cu (bfloat16 channels-last),
// so that both compute them as the CPU does.

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
