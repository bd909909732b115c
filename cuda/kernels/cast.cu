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
// tensor-core convolutions read without a transpose of their own. Both
// sides are rows r = n·P + p: float32 holds row r's channels P apart,
// bfloat16 holds them next to each other. A block of EMBER_NHWC_THREADS
// threads moves a tile of tc channels (a power of two from 8 to 64,
// cuda/conv_cudnn.go picks the smallest that holds C) by tr =
// min(EMBER_NHWC_THREADS, EMBER_NHWC_TILE/tc) rows through shared memory
// as bfloat16: the float32 side is read or written with the warp's lanes
// on consecutive rows (runs of tr floats a channel), the bfloat16 side
// with them on consecutive channels, two to a 32-bit word when C is even.
// Rows run across images, so small planes (a 3x3 output) fill tiles as
// large ones do; grid (ceil(N·P/tr), ceil(C/tc)). A row of the tile, tc +
// 2 halves, is an odd number of words, so the lanes of the float32 side
// fall on distinct banks.
#define EMBER_NHWC_TILE 4096
#define EMBER_NHWC_THREADS 256
#define EMBER_NHWC_SMEM (EMBER_NHWC_THREADS * 18) // the largest tile with its padding: 256 rows of 16 + 2

// nhwc_tile is the block's tile: rows r0 .. r0+tr, channels c0 .. c0+tc.
// tr divides EMBER_NHWC_THREADS, so a thread's float32-side row rl is the
// same for each of its elements, and its image n and position p are
// worked out once (a 32-bit division below 2^31 rows).
struct nhwc_tile {
    int tc, tr, ld, lgtc, c0, rl, cl0, cstep, elems;
    long long r0, xoff; // xoff: the float32 offset of (n, 0, p), -1 past the rows
};

__device__ __forceinline__ nhwc_tile ember_nhwc_tile(int C, int P, long long rows, int tc) {
    nhwc_tile t;
    t.tc = tc;
    t.lgtc = __ffs(tc) - 1;
    t.tr = ember_imin(EMBER_NHWC_THREADS, EMBER_NHWC_TILE / tc);
    t.elems = t.tr * tc;
    t.ld = tc + 2;
    t.r0 = (long long)blockIdx.x * t.tr;
    t.c0 = blockIdx.y * tc;
    t.rl = threadIdx.x & (t.tr - 1);
    t.cl0 = threadIdx.x / t.tr;
    t.cstep = EMBER_NHWC_THREADS / t.tr;
    const long long r = t.r0 + t.rl;
    t.xoff = -1;
    if (r < rows) {
        const long long n = rows < (1LL << 31) ? (long long)((unsigned)r / (unsigned)P) : r / P;
        t.xoff = n * C * P + (r - n * P);
    }
    return t;
}

// h[n][p][c] = bfloat16(x[n][c][p]), zero where mask (may be null) is not
// positive (a NaN mask passes, as ember_relu_backward).
extern "C" __global__ void __launch_bounds__(EMBER_NHWC_THREADS)
    ember_to_nhwc_bf16(unsigned short* h, const float* x, const float* mask, int C, int P, long long rows, int tc) {
    // Aligned for the pairs read as 32-bit words.
    __shared__ __attribute__((aligned(4))) unsigned short tile[EMBER_NHWC_SMEM];
    const nhwc_tile t = ember_nhwc_tile(C, P, rows, tc);
    if (t.xoff >= 0) {
        for (int cl = t.cl0; cl < tc; cl += t.cstep) {
            const int c = t.c0 + cl;
            float v = 0.f;
            if (c < C) {
                const long long i = t.xoff + (long long)c * P;
                v = x[i];
                if (mask && mask[i] <= 0.f) v = 0.f;
            }
            tile[t.rl * t.ld + cl] = ember_bf16_from_f32(v);
        }
    }
    __syncthreads();
    if ((C & 1) == 0) {
        // Pairs: rl*ld + cl is even (ld and cl are), so a word of the tile.
        const int lg = t.lgtc - 1;
        for (int i = threadIdx.x; i < t.elems / 2; i += EMBER_NHWC_THREADS) {
            const int rl = i >> lg, cl = 2 * (i & ((tc >> 1) - 1)), c = t.c0 + cl;
            const long long r = t.r0 + rl;
            if (r < rows && c < C) *(unsigned*)(h + r * C + c) = *(const unsigned*)(tile + rl * t.ld + cl);
        }
    } else {
        for (int i = threadIdx.x; i < t.elems; i += EMBER_NHWC_THREADS) {
            const int rl = i >> t.lgtc, cl = i & (tc - 1), c = t.c0 + cl;
            const long long r = t.r0 + rl;
            if (r < rows && c < C) h[r * C + c] = tile[rl * t.ld + cl];
        }
    }
}

// ember_to_nhwc_rows_bf16 is ember_to_nhwc_bf16 for a few channels (at
// most EMBER_NHWC_ROWS_MAX: an image's three), where the tile's eight
// channels would leave most lanes idle (airbench's batch of 1024 images:
// 25 µs): a thread per row r = n·P + p reads its C floats, P apart (a
// warp's lanes on consecutive rows), and writes its C halves together (a
// warp's 64·C contiguous bytes).
#define EMBER_NHWC_ROWS_MAX 4
extern "C" __global__ void ember_to_nhwc_rows_bf16(unsigned short* h, const float* x, const float* mask, int C, int P,
                                                   long long rows) {
    EMBER_LOOP(long long, r, rows) {
        const long long n = rows < (1LL << 31) ? (long long)((unsigned)r / (unsigned)P) : r / P;
        const long long base = n * C * P + (r - n * P);
        for (int c = 0; c < C; c++) {
            const long long i = base + (long long)c * P;
            float v = x[i];
            if (mask && mask[i] <= 0.f) v = 0.f;
            h[r * C + c] = ember_bf16_from_f32(v);
        }
    }
}

// y[n][c][p] = float32(h[n][p][c]) + bias[c] (bias may be null), then
// max(., 0) when relu; or, when accumulate, y[n][c][p] += float32(h[n][p][c]).
extern "C" __global__ void __launch_bounds__(EMBER_NHWC_THREADS)
    ember_from_nhwc_bf16(float* y, const unsigned short* h, const float* bias, int C, int P, long long rows, int tc,
                         int relu, int accumulate) {
    __shared__ __attribute__((aligned(4))) unsigned short tile[EMBER_NHWC_SMEM];
    const nhwc_tile t = ember_nhwc_tile(C, P, rows, tc);
    if ((C & 1) == 0) {
        const int lg = t.lgtc - 1;
        for (int i = threadIdx.x; i < t.elems / 2; i += EMBER_NHWC_THREADS) {
            const int rl = i >> lg, cl = 2 * (i & ((tc >> 1) - 1)), c = t.c0 + cl;
            const long long r = t.r0 + rl;
            if (r < rows && c < C) *(unsigned*)(tile + rl * t.ld + cl) = *(const unsigned*)(h + r * C + c);
        }
    } else {
        for (int i = threadIdx.x; i < t.elems; i += EMBER_NHWC_THREADS) {
            const int rl = i >> t.lgtc, cl = i & (tc - 1), c = t.c0 + cl;
            const long long r = t.r0 + rl;
            if (r < rows && c < C) tile[rl * t.ld + cl] = h[r * C + c];
        }
    }
    __syncthreads();
    if (t.xoff < 0) return;
    for (int cl = t.cl0; cl < tc; cl += t.cstep) {
        const int c = t.c0 + cl;
        if (c >= C) break;
        const long long i = t.xoff + (long long)c * P;
        float v = ember_f32_from_bf16(tile[t.rl * t.ld + cl]);
        if (accumulate) {
            v += y[i];
        } else {
            if (bias) v += bias[c];
            if (relu && !(v > 0.f || v != v)) v = 0.f;
        }
        y[i] = v;
    }
}

// The layout casts of operands with few positions per channel (a
// filter's R·S taps), where the tiled kernels above leave most of a tile
// idle. Where a slab [C][P] (one output channel of a filter) fits
// EMBER_NHWC_SLAB elements, a block per slab turns it through shared
// memory, so that both sides are read and written in order (the slab
// kernels); else a thread per element of the bfloat16 side, reading the
// float32 side where it lies (a filter is small enough to stay in L2).
// Indices within a slab are divided by host-computed dividers
// (ember_divide): ResNet-9's 512 x 512 x 3 x 3 filter took 8 and 14 us in
// the per-element kernels, whose 64-bit divisions and scattered accesses
// both cost.

#define EMBER_NHWC_SLAB 12288

// The global loads a thread issues before it uses the first: one at a
// time held the slab kernels at a fifth of the copy rate (latency-bound).
#define EMBER_NHWC_SLAB_U 4

// The slab's bfloat16 values, [P][C + 1]: the odd row length spreads a
// column's elements over the banks.
#define EMBER_NHWC_SLAB_TILE (EMBER_NHWC_SLAB + 64)

// h[s][p][c] = bfloat16(src[s][c][p]) for slabs s < n, C·P <=
// EMBER_NHWC_SLAB and P < 64; (cMul, cShift) and (pMul, pShift) divide by
// C and P.
extern "C" __global__ void ember_to_nhwc_slab_bf16(unsigned short* h, const float* src, int C, int P, int n, int cMul,
                                                   int cShift, int pMul, int pShift) {
    __shared__ unsigned short tile[EMBER_NHWC_SLAB_TILE];
    const int cp = C * P, ld = C + 1;
    for (int s = blockIdx.x; s < n; s += gridDim.x) {
        const float* x = src + (long long)s * cp;
        ember_block_each<EMBER_NHWC_SLAB_U, float>(cp, [&](int i) { return x[i]; }, [&](int i, float v) {
            const int c = (int)ember_divide((unsigned)i, (unsigned)pMul, (unsigned)pShift), p = i - c * P;
            tile[p * ld + c] = ember_bf16_from_f32(v);
        });
        __syncthreads();
        unsigned short* o = h + (long long)s * cp;
        for (int j = threadIdx.x; j < cp; j += blockDim.x) {
            const int p = (int)ember_divide((unsigned)j, (unsigned)cMul, (unsigned)cShift), c = j - p * C;
            o[j] = tile[p * ld + c];
        }
        __syncthreads();
    }
}

// y[s][c][p] = float32(h[s][p][c]), or += when accumulate; the slabs as
// ember_to_nhwc_slab_bf16's.
extern "C" __global__ void ember_from_nhwc_slab_bf16(float* y, const unsigned short* h, int C, int P, int n,
                                                     int accumulate, int cMul, int cShift, int pMul, int pShift) {
    __shared__ unsigned short tile[EMBER_NHWC_SLAB_TILE];
    const int cp = C * P, ld = C + 1;
    for (int s = blockIdx.x; s < n; s += gridDim.x) {
        const unsigned short* in = h + (long long)s * cp;
        ember_block_each<EMBER_NHWC_SLAB_U, unsigned short>(cp, [&](int j) { return in[j]; }, [&](int j, unsigned short v) {
            const int p = (int)ember_divide((unsigned)j, (unsigned)cMul, (unsigned)cShift), c = j - p * C;
            tile[p * ld + c] = v;
        });
        __syncthreads();
        float* o = y + (long long)s * cp;
        ember_block_each<EMBER_NHWC_SLAB_U, float>(cp, [&](int i) { return accumulate ? o[i] : 0.0f; }, [&](int i, float old) {
            const int c = (int)ember_divide((unsigned)i, (unsigned)pMul, (unsigned)pShift), p = i - c * P;
            const float v = ember_f32_from_bf16(tile[p * ld + c]);
            o[i] = accumulate ? old + v : v;
        });
        __syncthreads();
    }
}

// h[n][p][c] = bfloat16(src[n][c][p]) for n·P·C = total elements.
extern "C" __global__ void ember_to_nhwc_small_bf16(unsigned short* h, const float* src, int C, int P, long long total) {
    EMBER_LOOP(long long, j, total) {
        const int c = (int)(j % C);
        const long long q = j / C;
        const int p = (int)(q % P);
        const long long n = q / P;
        h[j] = ember_bf16_from_f32(src[(n * C + c) * P + p]);
    }
}

// y[n][c][p] = float32(h[n][p][c]), or += when accumulate.
extern "C" __global__ void ember_from_nhwc_small_bf16(float* y, const unsigned short* h, int C, int P, long long total,
                                                      int accumulate) {
    EMBER_LOOP(long long, j, total) {
        const int c = (int)(j % C);
        const long long q = j / C;
        const int p = (int)(q % P);
        const long long n = q / P;
        const long long i = (n * C + c) * P + p;
        const float v = ember_f32_from_bf16(h[j]);
        y[i] = accumulate ? y[i] + v : v;
    }
}
