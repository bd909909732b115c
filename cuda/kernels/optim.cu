// optim.cu: the optimisers' fused updates (Adam, AdamW, SGD with device
// hyper-parameters) and gradient-norm clipping, reading their per-step scalars
// from device memory so that a captured step replays with the values the
// optimiser wrote before the replay. Each update mirrors the loop of
// tensor/cpu_optim.go operation for operation (--fmad=false, IEEE sqrt and
// division), so that the results equal the CPU backend's bit for bit.

// One Adam/AdamW element; s = [step_size, sqrt(bias_correction2), decay,
// 1 - beta1] (tensor.AdamStepSize, ...). w is 1 - beta1, b2 and omb2 are beta2 and
// 1 - beta2; vmax is read only when amsgrad.
__device__ __forceinline__ void adam_one(float& p, float& g, float& m, float& v, float* vmax, float stepSize,
                                         float bc2Sqrt, float decay, float w, float b2, float omb2, float eps,
                                         float wd, int amsgrad) {
    const float pi = p * decay;
    float d = g;
    if (wd != 0.0f) d += wd * pi;
    float mi = m;
    if (w < 0.5f && w > -0.5f) {
        mi = mi + w * (d - mi);
    } else {
        mi = d - (d - mi) * (1.0f - w);
    }
    float vi = v * b2 + (omb2 * d) * d;
    m = mi;
    v = vi;
    if (amsgrad) {
        vi = ember_nan_max(*vmax, vi);
        *vmax = vi;
    }
    const float denom = sqrtf(vi) / bc2Sqrt + eps;
    p = pi + (-stepSize * mi) / denom;
}

// p, g, m, v (and vmax with amsgrad) hold n elements; s four scalars.
extern "C" __global__ void ember_adam(float* p, float* g, float* m, float* v, float* vmaxOrNull, const float* s,
                                      long long n, float b2, float omb2, float eps, float wd, int amsgrad,
                                      int zeroGrad) {
    const float stepSize = s[0], bc2Sqrt = s[1], decay = s[2], w = s[3];
    EMBER_LOOP(long long, i, n) {
        float pi = p[i], gi = g[i], mi = m[i], vi = v[i], xi = amsgrad ? vmaxOrNull[i] : 0.0f;
        adam_one(pi, gi, mi, vi, &xi, stepSize, bc2Sqrt, decay, w, b2, omb2, eps, wd, amsgrad);
        p[i] = pi;
        m[i] = mi;
        v[i] = vi;
        if (amsgrad) vmaxOrNull[i] = xi;
        if (zeroGrad) g[i] = 0.0f;
    }
}

// ember_sgd_device is ember_sgd (elementwise.cu) with the learning rate,
// momentum, dampening and weight decay read from s = [lr, momentum,
// dampening, weight_decay] (tensor.SGDLR, ...): the same operations in the
// same order (torch.optim.SGD's rule; see tensor/cpu.go), v untouched (and
// possibly null) while the momentum is 0. The branches on the scalars are
// uniform over the grid.
extern "C" __global__ void ember_sgd_device(float* p, float* g, float* v, const float* s, long long n, int nesterov,
                                            int first, int zeroGrad) {
    const float rate = s[0], momentum = s[1], dampening = s[2], wd = s[3];
    const float keep = 1.0f - dampening;
    EMBER_LOOP(long long, i, n) {
        float d = g[i];
        const float pi = p[i];
        if (wd != 0.0f) d += wd * pi;
        if (momentum != 0.0f) {
            const float vi = first ? d : momentum * v[i] + keep * d;
            v[i] = vi;
            if (nesterov) {
                d += momentum * vi;
            } else {
                d = vi;
            }
        }
        p[i] = pi - rate * d;
        if (zeroGrad) g[i] = 0.0f;
    }
}

// Pass 1 of the gradient norm: block b writes the sum of the squares of its
// grid-stride share of x, in double, to partial[b]. The number of blocks
// depends only on n (chosen in Go), so the norm is reproducible.
extern "C" __global__ void ember_sumsq_partial(const float* x, long long n, double* partial) {
    double s = 0.0;
    EMBER_LOOP(long long, i, n) {
        const double xi = (double)x[i];
        s += xi * xi;
    }
    s = ember_block_sum_d(s);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// Pass 2 (one block): norm[0] = sqrt(sum of partial[0..m)) (in double, so
// that squares beyond float's range do not overflow) and coef[0] =
// min(maxNorm / (norm + 1e-6), 1), a NaN norm giving a NaN coefficient, as
// torch.nn.utils.clip_grad_norm_ (and tensor/cpu_optim.go's ClipCoef).
extern "C" __global__ void ember_clip_coef(float* norm, float* coef, const double* partial, int m, float maxNorm) {
    double s = 0.0;
    for (int i = threadIdx.x; i < m; i += blockDim.x) s += partial[i];
    s = ember_block_sum_d(s);
    if (threadIdx.x == 0) {
        const float nv = (float)sqrt(s);
        float c = maxNorm / (nv + 1e-6f);
        if (c > 1.0f) c = 1.0f;
        norm[0] = nv;
        coef[0] = c;
    }
}
