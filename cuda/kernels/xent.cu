// xent.cu: the class loss of tensor.ClassLossBackend (cross entropy with
// label smoothing, an ignore index, mean or sum) over logits viewed as
// [outer, classes, inner] with int32 labels [outer, inner], mirroring
// tensor/cpu_loss.go. Nothing returns to the host: the number of counted
// targets, which scales a mean and its gradient, is counted on the device.
//
// Three launches, every partition a function of the shape alone and every
// sum a fixed tree in double (deterministic, no atomics):
//   1. ember_class_loss_count: per block, the targets not ignored (and a
//      trap on a label outside [0, classes), as IndexSelect's);
//   2. ember_class_loss_rows / _cols: per target, m = max x (NaN
//      propagates), s = Σ expf(x - m) in double, lse = m + log s, the loss
//      lse - (1-ε)·x_t - ε·Σx/C, added per block into partial[block]; and,
//      when dlogits is wanted, scale·(expf(x_c - m)·(1/s) - w_c) with w_c =
//      ε/C + (1-ε)·[c = t], scale = 1 (sum) or 1/count (mean; each block
//      adds the few counts of step 1 itself). Ignored targets cost 0 and
//      get a zero gradient. The gradient is made here, in the pass that
//      reads the logits anyway, because the count is already known: one
//      read of the logits and one write of the gradient in all;
//   3. ember_class_loss_final (one block): loss = Σ partial (/ count).
// expf rather than a double exp: within 2 ulps, and a double exp per
// element would cost as much as the memory traffic on an H200.
//
// Layouts, as softmax.cu: rows (inner == 1) a warp per row (lanes striding
// over the classes, every branch warp-uniform so that the shuffles see all
// lanes); columns (inner > 1) a thread per (outer, inner) target, adjacent
// threads reading adjacent addresses.

#define EMBER_XENT_WARPS 8
#define EMBER_XENT_THREADS (32 * EMBER_XENT_WARPS)

extern "C" __global__ void __launch_bounds__(256)
ember_class_loss_count(int* counts, const int* labels, long long targets, int classes, int ignoreIndex, int useIgnore) {
    int n = 0;
    EMBER_LOOP(long long, i, targets) {
        const int t = labels[i];
        if (useIgnore && t == ignoreIndex) continue;
        if (t < 0 || t >= classes) __trap();
        n++;
    }
    const double s = ember_block_sum_d((double)n);  // exact: counts stay far below 2^53
    if (threadIdx.x == 0) counts[blockIdx.x] = (int)s;
}

// ember_xent_scale returns, in every thread of the block, the factor of the
// gradient: 1 for a sum, 1/count for a mean (+Inf when nothing counts; only
// counted targets use it). Every thread must call it.
__device__ double ember_xent_scale(const int* counts, int countBlocks, int sumOut) {
    __shared__ double scale;
    double c = 0.0;
    for (int i = threadIdx.x; i < countBlocks; i += blockDim.x) c += (double)counts[i];
    c = ember_block_sum_d(c);
    if (threadIdx.x == 0) scale = sumOut ? 1.0 : 1.0 / c;
    __syncthreads();
    return scale;
}

// ember_xent_weight is the target weight w_c of class c.
__device__ __forceinline__ double ember_xent_weight(int c, int t, double eps, double cf) {
    return eps / cf + (c == t ? 1.0 - eps : 0.0);
}

extern "C" __global__ void __launch_bounds__(EMBER_XENT_THREADS)
ember_class_loss_rows(double* partial, float* dlogits, const float* logits, const int* labels, const int* counts,
                      int countBlocks, long long rows, int classes, float smoothing, int ignoreIndex, int useIgnore,
                      int sumOut) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const double scale = dlogits != 0 ? ember_xent_scale(counts, countBlocks, sumOut) : 0.0;
    const double eps = (double)smoothing, cf = (double)classes;
    const long long warps = (long long)gridDim.x * EMBER_XENT_WARPS;
    double acc = 0.0;  // the same in every lane
    for (long long r = (long long)blockIdx.x * EMBER_XENT_WARPS + warp; r < rows; r += warps) {
        const float* x = logits + r * classes;
        const int t = labels[r];
        if (useIgnore && t == ignoreIndex) {
            if (dlogits != 0)
                for (int c = lane; c < classes; c += 32) dlogits[r * classes + c] = 0.0f;
            continue;
        }
        if (t < 0 || t >= classes) __trap();
        float m = ember_neg_inf();
        double sx = 0.0;
        for (int c = lane; c < classes; c += 32) {
            const float v = x[c];
            m = ember_nan_max(m, v);
            sx += (double)v;
        }
        m = ember_warp_max(m);
        sx = ember_warp_sum_d(sx);
        double s = 0.0;
        for (int c = lane; c < classes; c += 32) s += (double)expf(x[c] - m);
        s = ember_warp_sum_d(s);
        const double lse = (double)m + log(s);
        acc += lse - (1.0 - eps) * (double)x[t] - eps * sx / cf;
        if (dlogits != 0) {
            float* d = dlogits + r * classes;
            const double inv = 1.0 / s;  // one division a row, not one an element
            for (int c = lane; c < classes; c += 32)
                d[c] = (float)(scale * ((double)expf(x[c] - m) * inv - ember_xent_weight(c, t, eps, cf)));
        }
    }
    __shared__ double ws[EMBER_XENT_WARPS];
    if (lane == 0) ws[warp] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        double b = 0.0;
        for (int w = 0; w < EMBER_XENT_WARPS; w++) b += ws[w];
        partial[blockIdx.x] = b;
    }
}

extern "C" __global__ void __launch_bounds__(256)
ember_class_loss_cols(double* partial, float* dlogits, const float* logits, const int* labels, const int* counts,
                      int countBlocks, long long outer, int classes, long long inner, float smoothing, int ignoreIndex,
                      int useIgnore, int sumOut) {
    const double scale = dlogits != 0 ? ember_xent_scale(counts, countBlocks, sumOut) : 0.0;
    const double eps = (double)smoothing, cf = (double)classes;
    double acc = 0.0;
    EMBER_LOOP(long long, i, outer * inner) {
        const long long o = i / inner, r = i - o * inner;
        const long long base = o * classes * inner + r;
        const float* x = logits + base;
        const int t = labels[i];
        if (useIgnore && t == ignoreIndex) {
            if (dlogits != 0)
                for (int c = 0; c < classes; c++) dlogits[base + c * inner] = 0.0f;
            continue;
        }
        if (t < 0 || t >= classes) __trap();
        float m = ember_neg_inf();
        double sx = 0.0;
        for (int c = 0; c < classes; c++) {
            const float v = x[c * inner];
            m = ember_nan_max(m, v);
            sx += (double)v;
        }
        double s = 0.0;
        for (int c = 0; c < classes; c++) s += (double)expf(x[c * inner] - m);
        const double lse = (double)m + log(s);
        acc += lse - (1.0 - eps) * (double)x[(long long)t * inner] - eps * sx / cf;
        if (dlogits != 0) {
            const double inv = 1.0 / s;
            for (int c = 0; c < classes; c++)
                dlogits[base + c * inner] =
                    (float)(scale * ((double)expf(x[c * inner] - m) * inv - ember_xent_weight(c, t, eps, cf)));
        }
    }
    acc = ember_block_sum_d(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// One block: the loss from the per-block sums and counts, both added in
// block order. A mean over no counted target is 0/0 = NaN, as torch's.
extern "C" __global__ void __launch_bounds__(256)
ember_class_loss_final(float* loss, const double* partial, int parts, const int* counts, int countBlocks, int sumOut) {
    double s = 0.0, c = 0.0;
    for (int i = threadIdx.x; i < parts; i += blockDim.x) s += partial[i];
    for (int i = threadIdx.x; i < countBlocks; i += blockDim.x) c += (double)counts[i];
    s = ember_block_sum_d(s);
    c = ember_block_sum_d(c);
    if (threadIdx.x == 0) loss[0] = (float)(sumOut ? s : s / c);
}
