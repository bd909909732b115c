// norm.cu: batch and layer normalisation, forward and backward, mirroring
// tensor/cpu_norm.go: statistics and gradient sums in double over two
// passes (block trees of fixed shape, no atomics: deterministic), the
// normalised values in float (each operation rounded, --fmad=false), so
// that results differ from the CPU's only by the order of the double sums.
// Per-group kernels (a channel, a row) take one block per group and loop
// over groups by blockIdx.x, so that any grid is correct; blockDim.x must
// be a multiple of 32.

// ember_block_sum_all is ember_block_sum_d with the result in every thread.
__device__ __forceinline__ double ember_block_sum_all(double v) {
    __shared__ double total;
    const double s = ember_block_sum_d(v);
    if (threadIdx.x == 0) total = s;
    __syncthreads();
    const double r = total;
    __syncthreads();
    return r;
}

// Element k of channel ch of x viewed as [n, c, inner] (k < n*inner).
__device__ __forceinline__ long long ember_bn_at(long long k, long long ch, long long c, long long inner) {
    const long long o = k / inner;
    return (o * c + ch) * inner + (k - o * inner);
}

// ember_bn_each calls f(at) for the flat index of every element of channel
// ch of [n, c, inner], this thread's share of them: along the rows of inner
// elements when they are at least a block wide (coalesced, no division),
// else over the channel's elements flattened (so that [N, C] inputs keep
// every thread busy).
template <typename F>
__device__ __forceinline__ void ember_bn_each(long long n, long long c, long long inner, long long ch, F f) {
    if (inner >= (long long)blockDim.x) {
        for (long long o = 0; o < n; o++) {
            const long long base = (o * c + ch) * inner;
            for (long long i = threadIdx.x; i < inner; i += blockDim.x) f(base + i);
        }
        return;
    }
    for (long long k = threadIdx.x; k < n * inner; k += blockDim.x) f(ember_bn_at(k, ch, c, inner));
}

// x̂ = (x - mean)·inv, then x̂·w + b, each rounded, as normalized in cpu_norm.go.
__device__ __forceinline__ float ember_normalized(float x, float mean, float inv, float w, float b) {
    const float xh = (x - mean) * inv;
    return xh * w + b;
}

// Per channel: the statistics (training: of the batch, and the running
// statistics updated as torch does; else the running ones) into saveMean and
// saveInvStd.
extern "C" __global__ void ember_batch_norm_stats(float* saveMean, float* saveInvStd, float* runMeanOrNull,
                                                  float* runVarOrNull, const float* x, long long n, long long c,
                                                  long long inner, int training, float momentum, float eps) {
    const long long m = n * inner;
    for (long long ch = blockIdx.x; ch < c; ch += gridDim.x) {
        if (!training) {
            if (threadIdx.x == 0) {
                saveMean[ch] = runMeanOrNull[ch];
                saveInvStd[ch] = (float)(1.0 / sqrt((double)runVarOrNull[ch] + (double)eps));
            }
            continue;
        }
        double s = 0.0;
        ember_bn_each(n, c, inner, ch, [&](long long at) { s += (double)x[at]; });
        const double mean = ember_block_sum_all(s) / (double)m;
        double q = 0.0;
        ember_bn_each(n, c, inner, ch, [&](long long at) {
            const double d = (double)x[at] - mean;
            q += d * d;
        });
        const double var = ember_block_sum_all(q) / (double)m;
        if (threadIdx.x == 0) {
            saveMean[ch] = (float)mean;
            saveInvStd[ch] = (float)(1.0 / sqrt(var + (double)eps));
            if (runMeanOrNull != 0) {
                const double mom = (double)momentum;
                runMeanOrNull[ch] = (float)((1.0 - mom) * (double)runMeanOrNull[ch] + mom * mean);
                runVarOrNull[ch] =
                    (float)((1.0 - mom) * (double)runVarOrNull[ch] + mom * var * (double)m / (double)(m - 1));
            }
        }
    }
}

// y = x̂·w + b elementwise over [n, c, inner].
extern "C" __global__ void ember_batch_norm_apply(float* y, const float* x, const float* saveMean,
                                                  const float* saveInvStd, const float* weightOrNull,
                                                  const float* biasOrNull, long long total, long long c,
                                                  long long inner) {
    EMBER_LOOP(long long, i, total) {
        const long long ch = (i / inner) % c;
        const float w = weightOrNull != 0 ? weightOrNull[ch] : 1.0f;
        const float b = biasOrNull != 0 ? biasOrNull[ch] : 0.0f;
        y[i] = ember_normalized(x[i], saveMean[ch], saveInvStd[ch], w, b);
    }
}

// d = v, or d + v when acc, in double rounded once (store in cpu_norm.go).
__device__ __forceinline__ void ember_store(float* d, double v, int acc) {
    if (acc) v += (double)*d;
    *d = (float)v;
}

// Per channel: Σ dy and Σ dy·x̂ into sums[2ch], sums[2ch+1] (when not null),
// and the parameters' gradients.
extern "C" __global__ void ember_batch_norm_backward_reduce(double* sumsOrNull, float* dweightOrNull,
                                                            float* dbiasOrNull, const float* dy, const float* x,
                                                            const float* saveMean, const float* saveInvStd,
                                                            long long n, long long c, long long inner, int accW,
                                                            int accB) {
    for (long long ch = blockIdx.x; ch < c; ch += gridDim.x) {
        const double mean = (double)saveMean[ch], inv = (double)saveInvStd[ch];
        double sdy = 0.0, sdyx = 0.0;
        ember_bn_each(n, c, inner, ch, [&](long long at) {
            const double g = (double)dy[at];
            sdy += g;
            sdyx += g * (((double)x[at] - mean) * inv);
        });
        sdy = ember_block_sum_d(sdy);
        sdyx = ember_block_sum_d(sdyx);
        if (threadIdx.x == 0) {
            if (sumsOrNull != 0) {
                sumsOrNull[2 * ch] = sdy;
                sumsOrNull[2 * ch + 1] = sdyx;
            }
            if (dweightOrNull != 0) ember_store(&dweightOrNull[ch], sdyx, accW);
            if (dbiasOrNull != 0) ember_store(&dbiasOrNull[ch], sdy, accB);
        }
    }
}

// dx elementwise: w·inv·(dy - Σdy/m - x̂·Σdy·x̂/m) in training (sums from
// the reduce kernel), else w·inv·dy.
extern "C" __global__ void ember_batch_norm_backward_dx(float* dx, const float* dy, const float* x,
                                                        const float* weightOrNull, const float* saveMean,
                                                        const float* saveInvStd, const double* sumsOrNull,
                                                        long long total, long long c, long long inner, int training,
                                                        int acc) {
    const double m = (double)(total / c);
    EMBER_LOOP(long long, i, total) {
        const long long ch = (i / inner) % c;
        const double mean = (double)saveMean[ch], inv = (double)saveInvStd[ch];
        double k = inv;
        if (weightOrNull != 0) k *= (double)weightOrNull[ch];
        double g = (double)dy[i];
        if (training) {
            const double xh = ((double)x[i] - mean) * inv;
            g = g - sumsOrNull[2 * ch] / m - xh * (sumsOrNull[2 * ch + 1] / m);
        }
        ember_store(&dx[i], k * g, acc);
    }
}

// Per row of x [rows, cols]: statistics into saveMean, saveInvStd, and y.
extern "C" __global__ void ember_layer_norm(float* y, float* saveMean, float* saveInvStd, const float* x,
                                            const float* weightOrNull, const float* biasOrNull, long long rows,
                                            long long cols, float eps) {
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * cols;
        double s = 0.0;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) s += (double)xr[j];
        const double mean = ember_block_sum_all(s) / (double)cols;
        double q = 0.0;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            const double d = (double)xr[j] - mean;
            q += d * d;
        }
        const double var = ember_block_sum_all(q) / (double)cols;
        const float mean32 = (float)mean, inv32 = (float)(1.0 / sqrt(var + (double)eps));
        if (threadIdx.x == 0) {
            saveMean[r] = mean32;
            saveInvStd[r] = inv32;
        }
        float* yr = y + r * cols;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            const float w = weightOrNull != 0 ? weightOrNull[j] : 1.0f;
            const float b = biasOrNull != 0 ? biasOrNull[j] : 0.0f;
            yr[j] = ember_normalized(xr[j], mean32, inv32, w, b);
        }
    }
}

// Per row: dx = inv·(g - mean(g) - x̂·mean(g·x̂)), g = dy·w.
extern "C" __global__ void ember_layer_norm_backward_dx(float* dx, const float* dy, const float* x,
                                                        const float* weightOrNull, const float* saveMean,
                                                        const float* saveInvStd, long long rows, long long cols,
                                                        int acc) {
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * cols, *gr = dy + r * cols;
        const double mean = (double)saveMean[r], inv = (double)saveInvStd[r];
        double sg = 0.0, sgx = 0.0;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            double d = (double)gr[j];
            if (weightOrNull != 0) d *= (double)weightOrNull[j];
            sg += d;
            sgx += d * (((double)xr[j] - mean) * inv);
        }
        sg = ember_block_sum_all(sg);
        sgx = ember_block_sum_all(sgx);
        const double nc = (double)cols;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            const double xh = ((double)xr[j] - mean) * inv;
            double d = (double)gr[j];
            if (weightOrNull != 0) d *= (double)weightOrNull[j];
            ember_store(&dx[r * cols + j], inv * (d - sg / nc - xh * (sgx / nc)), acc);
        }
    }
}

// Per column: dweight = Σ_rows dy·x̂, dbias = Σ_rows dy, rows in order (as
// the CPU adds them, so the results are the CPU's bit for bit).
extern "C" __global__ void ember_layer_norm_backward_params(float* dweightOrNull, float* dbiasOrNull,
                                                            const float* dy, const float* x, const float* saveMean,
                                                            const float* saveInvStd, long long rows, long long cols,
                                                            int accW, int accB) {
    EMBER_LOOP(long long, j, cols) {
        double sw = 0.0, sb = 0.0;
        for (long long r = 0; r < rows; r++) {
            const double d = (double)dy[r * cols + j];
            const double xh = ((double)x[r * cols + j] - (double)saveMean[r]) * (double)saveInvStd[r];
            sw += d * xh;
            sb += d;
        }
        if (dweightOrNull != 0) ember_store(&dweightOrNull[j], sw, accW);
        if (dbiasOrNull != 0) ember_store(&dbiasOrNull[j], sb, accB);
    }
}
