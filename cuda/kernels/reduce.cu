// reduce.cu: deterministic reductions. Sum is two passes (per-block double
// partials, then one block adding the partials in a fixed order); the number
// of blocks depends only on n (chosen in Go), never on the device, so a sum is
// reproducible bit for bit. bias_grad reduces each channel of a
// [outer, channels, inner] tensor: one thread per channel when inner == 1
// (Linear layers; coalesced, and summed in exactly the CPU's order), else one
// block per channel. Everything accumulates in double, as the CPU does.

// Pass 1 of Sum: block b sums its grid-stride share of x into partial[b];
// with a single block it writes the float result to dst directly.
extern "C" __global__ void ember_sum_partial(const float* x, long long n, double* partial, float* dst) {
    double s = 0.0;
    EMBER_LOOP(long long, i, n) s += (double)x[i];
    s = ember_block_sum_d(s);
    if (threadIdx.x == 0) {
        if (gridDim.x == 1) {
            dst[0] = (float)s;
        } else {
            partial[blockIdx.x] = s;
        }
    }
}

// Pass 2 (one block): dst[0] = (sum of partial[0..m)) / div. div is 1 for
// Sum and the row count for the mean of CrossEntropy.
extern "C" __global__ void ember_sum_final(float* dst, const double* partial, int m, long long div) {
    double s = 0.0;
    for (int i = threadIdx.x; i < m; i += blockDim.x) s += partial[i];
    s = ember_block_sum_d(s);
    if (threadIdx.x == 0) dst[0] = (float)(s / (double)div);
}

// db[c] = sum over o of dy[o*channels + c] (+ db[c]): one thread per
// channel, o ascending, as the CPU loop (inner == 1).
extern "C" __global__ void ember_bias_grad_cols(float* db, const float* dy, long long outer, long long channels, int acc) {
    EMBER_LOOP(long long, c, channels) {
        double s = 0.0;
        for (long long o = 0; o < outer; o++) s += (double)dy[o * channels + c];
        const float r = (float)s;
        if (acc) {
            db[c] += r;
        } else {
            db[c] = r;
        }
    }
}

template <typename I>
__device__ __forceinline__ double bias_grad_channel(const float* dy, I c, I outer, I channels, I inner) {
    double s = 0.0;
    const I m = outer * inner;
    for (I j = (I)threadIdx.x; j < m; j += (I)blockDim.x) {
        const I o = j / inner;
        const I i = j - o * inner;
        s += (double)dy[(o * channels + c) * inner + i];
    }
    return s;
}

// db[c] = sum of dy over outer and inner (+ db[c]): one block per channel
// (grid-stride over channels), blockDim a multiple of 32.
extern "C" __global__ void ember_bias_grad_block(float* db, const float* dy, long long outer, long long channels,
                                                 long long inner, int acc) {
    const bool small = EMBER_SMALL_INDEX(outer * channels * inner);
    for (long long c = blockIdx.x; c < channels; c += gridDim.x) {
        double s;
        if (small) {
            s = bias_grad_channel<int>(dy, (int)c, (int)outer, (int)channels, (int)inner);
        } else {
            s = bias_grad_channel<long long>(dy, c, outer, channels, inner);
        }
        s = ember_block_sum_d(s);
        if (threadIdx.x == 0) {
            const float r = (float)s;
            if (acc) {
                db[c] += r;
            } else {
                db[c] = r;
            }
        }
    }
}
