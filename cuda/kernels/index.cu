// index.cu: gathers and scatter-adds along an axis (IndexSelect,
// IndexAdd, embeddings), mirroring tensor/cpu_index.go.
//
// An index outside [0, n) is a programming error that the host cannot see
// without a synchronization: the kernel traps, which surfaces as a device
// error at the next Download or Synchronize.

extern "C" __global__ void ember_index_select(float* dst, const float* src, const int* idx, long long outer, long long n,
                                              long long m, long long inner) {
    EMBER_LOOP(long long, i, outer * m * inner) {
        const long long r = i % inner, j = (i / inner) % m, o = i / (inner * m);
        const int k = idx[j];
        if (k < 0 || k >= n) __trap();
        dst[i] = src[(o * n + k) * inner + r];
    }
}

// ember_index_add_ordered: a thread per (outer, inner) column adds the m
// gathered rows into dst in the order of idx, as the CPU backend does, so
// the result is deterministic and equal to the CPU's bit for bit. Its
// chain is m long: the Go side takes it for short index lists only.
extern "C" __global__ void ember_index_add_ordered(float* dst, const float* src, const int* idx, long long outer,
                                                   long long n, long long m, long long inner) {
    EMBER_LOOP(long long, c, outer * inner) {
        const long long o = c / inner, r = c - o * inner;
        for (long long j = 0; j < m; j++) {
            const int k = idx[j];
            if (k < 0 || k >= n) __trap();
            dst[(o * n + k) * inner + r] += src[(o * m + j) * inner + r];
        }
    }
}

// ember_index_add_atomic: a thread per source element, atomicAdd into dst.
// Fast for long index lists, but repeated indices add up in the order the
// hardware serves the atomics: not bitwise reproducible.
extern "C" __global__ void ember_index_add_atomic(float* dst, const float* src, const int* idx, long long outer,
                                                  long long n, long long m, long long inner) {
    EMBER_LOOP(long long, i, outer * m * inner) {
        const long long r = i % inner, j = (i / inner) % m, o = i / (inner * m);
        const int k = idx[j];
        if (k < 0 || k >= n) __trap();
        atomicAdd(dst + (o * n + k) * inner + r, src[i]);
    }
}
