// augment.cu: the batch gather with per-sample augmentation (random crop of
// the padded image, horizontal flip, per-channel normalisation, cutout),
// mirroring tensor/cpu_augment.go decision for decision; the layout is
// pinned in tensor/backend_augment.go (AugmentSpec). It uses ember_philox
// and ember_unit24 of random.cu, which comes before it in the same unit.

// An integer in [0, n) from a Philox word: (w·n) >> 32, as below() on the
// CPU.
__device__ __forceinline__ int ember_below(unsigned int w, int n) {
    return (int)(((unsigned long long)w * (unsigned long long)(unsigned int)n) >> 32);
}

// dst [batch, C, H, W] = augmented src[idx[i]] (uint8 [srcRows, C, H, W]),
// norm [2C] = scales then shifts. One block per sample (grid-stride over
// the samples); every thread draws the sample's two Philox blocks itself,
// so no shared memory or barrier is needed (twenty rounds against a few
// pixels each). An index outside the source gives a sample of NaN.
__device__ __forceinline__ void ember_augment_body(float* dst, const unsigned char* src, const int* idx,
                                                   const float* norm, long long batch, long long srcRows, int C, int H,
                                                   int W, int pad, int fill, float flipProb, int cutout,
                                                   unsigned long long seed, unsigned long long offset) {
    const int plane = H * W, image = C * plane;
    const unsigned int k0 = (unsigned int)seed, k1 = (unsigned int)(seed >> 32);
    for (long long i = blockIdx.x; i < batch; i += gridDim.x) {
        float* out = dst + i * (long long)image;
        const int sample = idx[i];
        if (sample < 0 || (long long)sample >= srcRows) {
            for (int e = threadIdx.x; e < image; e += blockDim.x) out[e] = ember_nan();
            continue;
        }
        const unsigned long long ctr = offset + (unsigned long long)(unsigned int)sample;
        unsigned int w0[4] = {(unsigned int)ctr, (unsigned int)(ctr >> 32), 0u, 1u};
        unsigned int w1[4] = {(unsigned int)ctr, (unsigned int)(ctr >> 32), 1u, 1u};
        ember_philox(w0, k0, k1);
        ember_philox(w1, k0, k1);
        const int ty = ember_below(w0[0], 2 * pad + 1), tx = ember_below(w0[1], 2 * pad + 1);
        const bool flip = ember_unit24(w0[2]) < flipProb;
        const int cut0y = ember_below(w0[3], H) - cutout / 2, cut0x = ember_below(w1[0], W) - cutout / 2;
        const unsigned char* img = src + (long long)sample * (long long)image;
        for (int e = threadIdx.x; e < image; e += blockDim.x) {
            const int c = e / plane, r = e - c * plane;
            const int y = r / W, x = r - y * W;
            const int sy = y + ty - pad, sx = (flip ? W - 1 - x : x) + tx - pad;
            unsigned int v = (unsigned int)fill;
            if (sy >= 0 && sy < H && sx >= 0 && sx < W) v = img[c * plane + sy * W + sx];
            float o = (float)v * norm[c] + norm[C + c];  // two roundings: --fmad=false
            if (y >= cut0y && y < cut0y + cutout && x >= cut0x && x < cut0x + cutout) o = 0.0f;
            out[e] = o;
        }
    }
}

extern "C" __global__ void ember_augment_gather(float* dst, const unsigned char* src, const int* idx, const float* norm,
                                                long long batch, long long srcRows, int C, int H, int W, int pad,
                                                int fill, float flipProb, int cutout, long long seed,
                                                long long offset) {
    ember_augment_body(dst, src, idx, norm, batch, srcRows, C, H, W, pad, fill, flipProb, cutout,
                       (unsigned long long)seed, (unsigned long long)offset);
}

// ember_augment_gather with (seed, offset) read from state (four 32-bit
// words: seed low, high, offset low, high), so that a captured graph
// augments by the state the host last wrote there (the epoch's offset).
extern "C" __global__ void ember_augment_gather_state(float* dst, const unsigned char* src, const int* idx,
                                                      const float* norm, long long batch, long long srcRows, int C,
                                                      int H, int W, int pad, int fill, float flipProb, int cutout,
                                                      const int* state) {
    const unsigned long long seed = (unsigned long long)(unsigned int)state[0] |
                                    ((unsigned long long)(unsigned int)state[1] << 32);
    const unsigned long long offset = (unsigned long long)(unsigned int)state[2] |
                                      ((unsigned long long)(unsigned int)state[3] << 32);
    ember_augment_body(dst, src, idx, norm, batch, srcRows, C, H, W, pad, fill, flipProb, cutout, seed, offset);
}
