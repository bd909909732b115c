// loss.cu: row-wise kernels over [rows, classes] logits: cross entropy (loss
// and gradient in one pass) and argmax. One warp per row; warps loop over
// rows. Both are deterministic (fixed shuffle trees, no atomics).

#define EMBER_CE_THREADS 1024
#define EMBER_CE_WARPS (EMBER_CE_THREADS / 32)

// cross_entropy: per row r (one warp), with z = logits row r and y = label:
//   m = max z (NaN propagates), se = sum exp(z - m),
//   loss_r = (m - z[y]) + log(se)        (= logsumexp(z) - z[y], stable for
//                                          large logits: nothing overflows)
//   dlogits[r, c] = exp(z[c] - m)/se/n - (c == y)/n   (when dlogits != null)
// The row losses are added per warp in row order, then per block in warp
// order, in double. With one block the mean goes to loss[0]; with several,
// block b writes partial[b] and ember_sum_final(loss, partial, blocks, n)
// finishes. A label outside [0, classes) makes that row's loss and gradient
// NaN (the CPU backend panics instead).
extern "C" __global__ void __launch_bounds__(EMBER_CE_THREADS)
ember_cross_entropy(float* loss, float* dlogits, const float* logits, const int* labels, int n, int classes, double* partial) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float nf = (float)n;
    double wsum = 0.0;  // meaningful in every lane; lane 0's is used
    for (int r = blockIdx.x * EMBER_CE_WARPS + warp; r < n; r += gridDim.x * EMBER_CE_WARPS) {
        const float* z = logits + (long long)r * classes;
        const int y = labels[r];
        const bool bad = y < 0 || y >= classes;
        float m = ember_neg_inf();
        for (int c = lane; c < classes; c += 32) m = ember_nan_max(m, z[c]);
        m = ember_warp_max(m);
        float se = 0.0f;
        for (int c = lane; c < classes; c += 32) se += expf(z[c] - m);
        se = ember_warp_sum(se);
        const float zy = bad ? 0.0f : z[y];
        const float lr = bad ? ember_nan() : (m - zy) + logf(se);
        wsum += (double)lr;
        if (dlogits != 0) {
            float* dz = dlogits + (long long)r * classes;
            for (int c = lane; c < classes; c += 32) {
                float d = expf(z[c] - m) / se / nf;
                if (c == y) d -= 1.0f / nf;
                dz[c] = bad ? ember_nan() : d;
            }
        }
    }
    __shared__ double ws[EMBER_CE_WARPS];
    if (lane == 0) ws[warp] = wsum;
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0.0;
        for (int w = 0; w < EMBER_CE_WARPS; w++) s += ws[w];
        if (gridDim.x == 1) {
            loss[0] = (float)(s / (double)n);
        } else {
            partial[blockIdx.x] = s;
        }
    }
}

// argmax: dst[r] = the column of the first maximum of row r, with the CPU's
// semantics for NaN (a strict > scan from column 0): NaNs are never chosen,
// except that a NaN in column 0 makes the answer 0. One warp per row; each
// lane scans its columns in increasing order, then the lanes combine
// (larger value wins, lower column on ties).
extern "C" __global__ void ember_argmax(int* dst, const float* x, int rows, int cols) {
    const int lane = threadIdx.x & 31;
    const int wpb = blockDim.x >> 5;
    for (int r = blockIdx.x * wpb + (threadIdx.x >> 5); r < rows; r += gridDim.x * wpb) {
        const float* z = x + (long long)r * cols;
        float bv = 0.0f;
        int bi = -1;
        for (int c = lane; c < cols; c += 32) {
            const float v = z[c];
            if (v == v && (bi < 0 || v > bv)) {
                bv = v;
                bi = c;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) {
                bv = ov;
                bi = oi;
            }
        }
        if (lane == 0) {
            const float z0 = z[0];
            dst[r] = (z0 != z0 || bi < 0) ? 0 : bi;
        }
    }
}
