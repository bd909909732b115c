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

// ember_index_add_scan: a thread per destination element (o, k, r) of
// [outer, n, inner] scans the whole index list and adds src[o, j, r] for
// each j with idx[j] == k, in the order of j, to a register that started
// at dst's value, and stores once: the CPU's additions in the CPU's order
// (bit for bit, as ember_index_add_ordered) without its chain of m
// dependent global read-modify-writes. The list is staged through shared
// memory in tiles of EMBER_IDX_TILE, each block checking every index as it
// stages it; a block's threads take part in every tile (block-uniform
// loops), those past the end idle. 1-D blocks of at most EMBER_IDX_TILE
// threads.
// Cost: outer*n*inner*m compares from shared memory (the Go side keeps
// that under 2^27), m*4 bytes of indices per block, dst and src once.
#define EMBER_IDX_TILE 1024
extern "C" __global__ void ember_index_add_scan(float* dst, const float* src, const int* idx, long long outer,
                                                long long n, long long m, long long inner) {
    __shared__ int tile[EMBER_IDX_TILE];
    const long long total = outer * n * inner;
    for (long long base = (long long)blockIdx.x * blockDim.x; base < total; base += (long long)gridDim.x * blockDim.x) {
        const long long i = base + threadIdx.x;
        const bool active = i < total;
        const long long r = active ? i % inner : 0, o = active ? i / (inner * n) : 0;
        const int k = active ? (int)((i / inner) % n) : -1;  // n < 2^31: the Go side's bound on the work
        const float* s = src + o * m * inner + r;
        float acc = active ? dst[i] : 0.0f;
        for (long long j0 = 0; j0 < m; j0 += EMBER_IDX_TILE) {
            const int cnt = m - j0 < EMBER_IDX_TILE ? (int)(m - j0) : EMBER_IDX_TILE;
            __syncthreads();  // the last tile read
            for (int t = threadIdx.x; t < cnt; t += blockDim.x) {
                const int v = idx[j0 + t];
                if (v < 0 || v >= n) __trap();
                tile[t] = v;
            }
            __syncthreads();
            if (active) {
                for (int t = 0; t < cnt; t++) {
                    if (tile[t] == k) acc += s[(j0 + t) * inner];
                }
            }
        }
        if (active) dst[i] = acc;
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
