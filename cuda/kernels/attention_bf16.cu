// attention_bf16.cu: the fused attention of attention.cu on tensor cores,
// for autocast to bfloat16 (tensor.AttentionShape.BFloat16): the same
// FlashAttention-2 split (a forward kernel, a dQ kernel that also leaves
// delta = rowsum(dO·O), a dK/dV kernel; no atomics, deterministic), with
// every tile product an mma.sync m16n8k16 of bfloat16 operands and float32
// accumulation. q, k, v and dO arrive as float32 and are rounded to
// bfloat16 (to nearest, ties to even) as they are loaded; the weights P and
// their gradients dS are rounded where they enter a product, which is
// where autocast's composed attention rounds them (its BatchMatMul
// operands). The softmax statistics, the dropout and every output stay
// float32. Dropout draws the bits of ember_dropout over the [BH, T, S]
// weights, as attention.cu does.
//
// Layout: a block of 4 warps owns 64 rows (queries in the forward and dQ
// kernels, keys in the dK/dV kernel), 16 per warp, held as mma A fragments
// in registers; the other operand walks tiles of 64 rows through shared
// memory, converted to bfloat16 as it is stored, row-major (rows padded by
// 8 elements: the 8 rows a warp's loads touch at once fall in distinct
// banks). A B fragment along a tile's rows is one 32-bit load; one across
// them (V, or K, Q and dO in the gradient products) is ldmatrix .trans. A
// product's float32 C fragments are the A fragments of the next product
// (FlashAttention-2's register reuse), so P and dS never reach shared
// memory. Tiles wholly above a causal diagonal are skipped per block, and
// the 8-column blocks above it per warp.
//
// Fragments of mma.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16"),
// for lane = 4g + t: A (16x16, row) a0 = A[g][2t, 2t+1], a1 = A[g+8][2t..],
// a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]; B (16x8, col) b0 = B[2t, 2t+1][g],
// b1 = B[2t+8, 2t+9][g]; C (16x8) c0, c1 = C[g][2t, 2t+1], c2, c3 =
// C[g+8][2t, 2t+1]. A pair of bfloat16 is one 32-bit word, the lower index
// in the low half.

// mma.sync of bfloat16 needs sm_80: on older devices the kernels are
// compiled out and the Go side keeps the float32 kernels.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800

#define EMBER_ATTB_ROWS 64  // rows of a block: 4 warps of 16
#define EMBER_ATTB_BN 64    // rows of a shared tile
#define EMBER_ATTB_NT 128

// Two 32-bit words stored as one 8-byte access.
struct __attribute__((aligned(8))) ember_attb_u2 {
    unsigned int x, y;
};

#ifndef EMBER_HOST_EMU
// r = the B fragments (b0, b1) of columns n0..n0+7 and then of n0+8..n0+15,
// k-rows k0..k0+15, of a product whose B[k][n] is X[k][n] (X row-major in
// shared memory, stride ld): ldmatrix .trans of four 8x8 tiles, lanes
// 8m..8m+7 giving the rows of tile m (k-rows 8(m&1).., columns 8(m>>1)..).
__device__ __forceinline__ void ember_attb_ldsm_t4(unsigned int r[4], const unsigned short* X, int ld, int k0, int n0) {
    const int lane = threadIdx.x % 32, m = lane >> 3, i = lane & 7;
    const unsigned short* p = X + (k0 + 8 * (m & 1) + i) * ld + n0 + 8 * (m >> 1);
    unsigned int a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }\n" : "=r"(a) : "l"(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

// The bfloat16 pair (lo, hi), each rounded to nearest, ties to even.
__device__ __forceinline__ unsigned int ember_attb_pack(float lo, float hi) {
    unsigned int r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
#endif

__device__ __forceinline__ float ember_attb_lo(unsigned int w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float ember_attb_hi(unsigned int w) { return __uint_as_float(w & 0xffff0000u); }

// Two and four consecutive operand values as bfloat16 pairs: float32 ones
// rounded as they are loaded, or bfloat16 ones (q, k and v already cast,
// which rounds the same way) as they are. p is 8- or 16-byte aligned.
__device__ __forceinline__ unsigned int ember_attb_pair(const float* p) {
    const ember_f2 x = *reinterpret_cast<const ember_f2*>(p);
    return ember_attb_pack(x.x, x.y);
}
__device__ __forceinline__ unsigned int ember_attb_pair(const unsigned short* p) {
    return *reinterpret_cast<const unsigned int*>(p);
}
__device__ __forceinline__ ember_attb_u2 ember_attb_quad(const float* p) {
    const ember_f4 x = *reinterpret_cast<const ember_f4*>(p);
    ember_attb_u2 w;
    w.x = ember_attb_pack(x.x, x.y);
    w.y = ember_attb_pack(x.z, x.w);
    return w;
}
__device__ __forceinline__ ember_attb_u2 ember_attb_quad(const unsigned short* p) {
    return *reinterpret_cast<const ember_attb_u2*>(p);
}

// A fragments of rows row0..row0+15 of src [n, D] (float32, rounded to
// bfloat16, or bfloat16; rows ld apart): a[kk] covers columns
// 16kk..16kk+15. Rows past n are 0.
template <int D, typename In>
__device__ __forceinline__ void ember_attb_load_a(unsigned int a[D / 16][4], const In* src, long long ld, int row0,
                                                  int n) {
    const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    const int ra = row0 + g, rb = row0 + g + 8;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        const int c = 16 * kk + 2 * t;
        a[kk][0] = ra < n ? ember_attb_pair(src + (long long)ra * ld + c) : 0u;
        a[kk][1] = rb < n ? ember_attb_pair(src + (long long)rb * ld + c) : 0u;
        a[kk][2] = ra < n ? ember_attb_pair(src + (long long)ra * ld + c + 8) : 0u;
        a[kk][3] = rb < n ? ember_attb_pair(src + (long long)rb * ld + c + 8) : 0u;
    }
}

// dst[r][c] (row stride D + 8) = bfloat16(src[(row0 + r)·ld + c]) for the BN
// rows of a tile, 0 past row n (ld a multiple of 4: 16- or 8-byte loads).
template <int D, typename In>
__device__ __forceinline__ void ember_attb_fill_rows(unsigned short* dst, const In* src, long long ld, int row0, int n) {
    constexpr int LD = D + 8, BN = EMBER_ATTB_BN;
    for (int idx = threadIdx.x; idx < BN * D / 4; idx += EMBER_ATTB_NT) {
        const int r = idx / (D / 4), c = (idx % (D / 4)) * 4;
        ember_attb_u2 w = {0u, 0u};
        if (row0 + r < n) w = ember_attb_quad(src + (long long)(row0 + r) * ld + c);
        *reinterpret_cast<ember_attb_u2*>(dst + r * LD + c) = w;
    }
}

// The tile's rows as fill_rows stores them, copied by cp.async (16 bytes a
// copy, 0 past row n): no registers in between, so the next tile's copies
// fly while this one's products run. For bfloat16 sources whose rows start
// 16-byte aligned (ember_attb_async_ok); ember_attb_wait waits for all but
// the newest `pending` groups of copies this thread committed.
#ifndef EMBER_HOST_EMU
__device__ __forceinline__ void ember_attb_cp16(unsigned short* dst, const unsigned short* src, bool in) {
    unsigned int a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }\n" : "=r"(a) : "l"(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(src), "r"(in ? 16 : 0) : "memory");
}
__device__ __forceinline__ void ember_attb_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int pending>
__device__ __forceinline__ void ember_attb_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(pending) : "memory");
}
#endif
template <int D>
__device__ __forceinline__ void ember_attb_fill_async(unsigned short* dst, const unsigned short* src, long long ld,
                                                      int row0, int n) {
    constexpr int LD = D + 8, BN = EMBER_ATTB_BN, CH = D / 8;  // 16-byte chunks a row
    for (int idx = threadIdx.x; idx < BN * CH; idx += EMBER_ATTB_NT) {
        const int r = idx / CH, c = (idx % CH) * 8;
        const bool in = row0 + r < n;
        ember_attb_cp16(dst + r * LD + c, src + (in ? (long long)(row0 + r) * ld + c : 0), in);
    }
    ember_attb_commit();
}

// Whether a source's tiles may be copied by cp.async: bfloat16 rows that
// start 16-byte aligned.
__device__ __forceinline__ bool ember_attb_async_ok(const float*, long long) { return false; }
__device__ __forceinline__ bool ember_attb_async_ok(const unsigned short* p, long long ld) {
    return ((unsigned long long)p & 15) == 0 && (ld & 7) == 0;
}

// The tile of rows row0.. of src into dst: by cp.async where async (its
// group committed; the caller waits), else through registers (float32
// sources always: they are rounded on the way).
template <int D>
__device__ __forceinline__ void ember_attb_fill(unsigned short* dst, const unsigned short* src, long long ld, int row0,
                                                int n, bool async) {
    if (async)
        ember_attb_fill_async<D>(dst, src, ld, row0, n);
    else
        ember_attb_fill_rows<D>(dst, src, ld, row0, n);
}
template <int D>
__device__ __forceinline__ void ember_attb_fill(unsigned short* dst, const float* src, long long ld, int row0, int n,
                                                bool) {
    ember_attb_fill_rows<D>(dst, src, ld, row0, n);
}

// Whether K and V go by cp.async (ember_attb_async_ok), and if so the
// first tiles' copies issued, before the loop of ember_attb_kv_tiles.
template <int D, typename In>
__device__ __forceinline__ bool ember_attb_kv_first(unsigned short (*skb)[EMBER_ATTB_BN * (D + 8)],
                                                    unsigned short (*svb)[EMBER_ATTB_BN * (D + 8)], const In* k,
                                                    const In* v, long long ldk, long long ldv, int S) {
    const bool async = ember_attb_async_ok(k, ldk) && ember_attb_async_ok(v, ldv);
    if (async) {
        ember_attb_fill<D>(skb[0], k, ldk, 0, S, true);
        ember_attb_fill<D>(svb[0], v, ldv, 0, S, true);
    }
    return async;
}

// The K and V tiles of keys k0.. in buffers it & 1 of skb and svb, for
// the forward's and the dQ kernel's loops over key tiles (up to kend),
// between two barriers: with async the next tile's copies are issued first
// and this tile's awaited (the first tile's were issued before the loop),
// else this tile is copied through registers.
template <int D, typename In>
__device__ __forceinline__ void ember_attb_kv_tiles(unsigned short (*skb)[EMBER_ATTB_BN * (D + 8)],
                                                    unsigned short (*svb)[EMBER_ATTB_BN * (D + 8)], const In* k,
                                                    const In* v, long long ldk, long long ldv, int k0, int kend, int S,
                                                    int it, bool async) {
    if (!async) {
        ember_attb_fill<D>(skb[it & 1], k, ldk, k0, S, false);
        ember_attb_fill<D>(svb[it & 1], v, ldv, k0, S, false);
    } else if (k0 + EMBER_ATTB_BN < kend) {
        ember_attb_fill<D>(skb[(it + 1) & 1], k, ldk, k0 + EMBER_ATTB_BN, S, true);
        ember_attb_fill<D>(svb[(it + 1) & 1], v, ldv, k0 + EMBER_ATTB_BN, S, true);
        ember_attb_wait<2>();
    } else {
        ember_attb_wait<0>();
    }
}

// The B fragment of columns n0..n0+7 and k-rows k0..k0+15 of a product
// whose B[k][n] is X[n][k] (X row-major, stride ld).
__device__ __forceinline__ void ember_attb_frag_b(const unsigned short* X, int ld, int n0, int k0, unsigned int& b0,
                                                  unsigned int& b1) {
    const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    const unsigned short* p = X + (n0 + g) * ld + k0 + 2 * t;
    b0 = *reinterpret_cast<const unsigned int*>(p);
    b1 = *reinterpret_cast<const unsigned int*>(p + 8);
}

// The A fragment of k-step kk of a product whose A is the C fragments c
// (16 rows by 8·NB columns) of the previous product.
template <int NB>
__device__ __forceinline__ void ember_attb_c_to_a(unsigned int a[4], const float c[NB][4], int kk) {
    a[0] = ember_attb_pack(c[2 * kk][0], c[2 * kk][1]);
    a[1] = ember_attb_pack(c[2 * kk][2], c[2 * kk][3]);
    a[2] = ember_attb_pack(c[2 * kk + 1][0], c[2 * kk + 1][1]);
    a[3] = ember_attb_pack(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

// Whether weight e of the draw at (seed, off) is kept: its own block.
__device__ __forceinline__ bool ember_attb_kept(unsigned long long seed, unsigned long long off, unsigned long long e,
                                                float keep) {
    const unsigned long long blk = off + (e >> 2);
    unsigned int w[4] = {(unsigned int)blk, (unsigned int)(blk >> 32), 0u, 0u};
    ember_philox(w, (unsigned int)seed, (unsigned int)(seed >> 32));
    const unsigned int x = (e & 3) == 0 ? w[0] : (e & 3) == 1 ? w[1] : (e & 3) == 2 ? w[2] : w[3];
    return ember_unit24(x) < keep;
}

// w = the Philox block blk of the draw at (seed, off).
__device__ __forceinline__ void ember_attb_philox_at(unsigned long long seed, unsigned long long off,
                                                     unsigned long long blk, unsigned int w[4]) {
    const unsigned long long c = off + blk;
    w[0] = (unsigned int)c;
    w[1] = (unsigned int)(c >> 32);
    w[2] = 0u;
    w[3] = 0u;
    ember_philox(w, (unsigned int)seed, (unsigned int)(seed >> 32));
}

// Keep bits of a C fragment whose rows are queries and columns keys (the
// forward and dQ kernels): bit e for element e of the fragment, the weight
// (bh, row + 8(e>>1), col + (e&1)), row = the warp's first row + g, col =
// the block's first column + 2t. When S is a multiple of 4 (aligned) the
// four weights of a Philox block lie in two lanes (t, t^1) of one row:
// each lane draws one row's block and the pair swaps halves, one draw per
// four weights. Else each weight draws its own block. Warp-uniform.
__device__ __forceinline__ unsigned int ember_attb_keep_qk(long long bh, int T, int S, int row, int col,
                                                           unsigned long long seed, unsigned long long off, float keep,
                                                           bool aligned) {
    if (aligned) {
        const int t = threadIdx.x & 3;
        const bool odd = (t & 1) != 0;
        const int myrow = odd ? row + 8 : row;
        const unsigned long long e0 = ((unsigned long long)(bh * T + myrow)) * (unsigned long long)S +
                                      (unsigned long long)(col & ~3);
        unsigned int w[4];
        ember_attb_philox_at(seed, off, e0 >> 2, w);
        const unsigned int r0 = __shfl_xor_sync(0xffffffffu, odd ? w[0] : w[2], 1);
        const unsigned int r1 = __shfl_xor_sync(0xffffffffu, odd ? w[1] : w[3], 1);
        const unsigned int a0 = odd ? r0 : w[0], a1 = odd ? r1 : w[1];  // row
        const unsigned int b0 = odd ? w[2] : r0, b1 = odd ? w[3] : r1;  // row + 8
        return (ember_unit24(a0) < keep ? 1u : 0u) | (ember_unit24(a1) < keep ? 2u : 0u) |
               (ember_unit24(b0) < keep ? 4u : 0u) | (ember_unit24(b1) < keep ? 8u : 0u);
    }
    unsigned int bits = 0;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const unsigned long long idx = ((unsigned long long)(bh * T + row + 8 * (e >> 1))) * (unsigned long long)S +
                                       (unsigned long long)(col + (e & 1));
        if (ember_attb_kept(seed, off, idx, keep)) bits |= 1u << e;
    }
    return bits;
}

// Keep bits of a C fragment whose rows are keys and columns queries (the
// dK/dV kernel): bit e for the weight (bh, col + (e&1), key + 8(e>>1)),
// key = the warp's first key + g. When S is a multiple of 4 the four keys
// of a Philox block are rows of the 4 lanes with the same t and g>>2: lane
// r = g&3 of such a group draws the block of (query col + (r&1), keys of
// half r>>1), and four shuffles give each lane word r of every block.
// Warp-uniform.
__device__ __forceinline__ unsigned int ember_attb_keep_kq(long long bh, int T, int S, int key, int col,
                                                           unsigned long long seed, unsigned long long off, float keep,
                                                           bool aligned) {
    if (aligned) {
        const int lane = threadIdx.x & 31, r = (lane >> 2) & 3;
        const unsigned long long e0 = ((unsigned long long)(bh * T + col + (r & 1))) * (unsigned long long)S +
                                      (unsigned long long)(key - r + 8 * (r >> 1));
        unsigned int w[4];
        ember_attb_philox_at(seed, off, e0 >> 2, w);
        unsigned int bits = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int sw = (r + i) & 3, src = (r - i) & 3;  // the word sent, the lane (block) read
            const unsigned int send = sw == 0 ? w[0] : sw == 1 ? w[1] : sw == 2 ? w[2] : w[3];
            const unsigned int got = __shfl_sync(0xffffffffu, send, (lane & ~12) | (src << 2));
            if (ember_unit24(got) < keep) bits |= 1u << src;
        }
        return bits;
    }
    unsigned int bits = 0;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const unsigned long long idx = ((unsigned long long)(bh * T + col + (e & 1))) * (unsigned long long)S +
                                       (unsigned long long)(key + 8 * (e >> 1));
        if (ember_attb_kept(seed, off, idx, keep)) bits |= 1u << e;
    }
    return bits;
}

// The dropout's kept bits, as the forward pass drew them, for the backward
// passes to read instead of drawing again: one 32-bit word a lane for each
// (head, query tile, key tile, warp), bit 4j + e for element e of the
// lane's C fragment of column block j (the layout of ember_attb_keep_qk's
// bits, which the dQ kernel's fragments share). Words of tiles wholly
// above a causal diagonal are never written or read.
__device__ __forceinline__ unsigned int* ember_attb_mask_word(unsigned int* mask, long long bh, int qtile, int ktile,
                                                              int T, int S) {
    const long long qtiles = (T + EMBER_ATTB_ROWS - 1) / EMBER_ATTB_ROWS, ktiles = (S + EMBER_ATTB_BN - 1) / EMBER_ATTB_BN;
    return mask + ((((bh * qtiles + qtile) * ktiles + ktile) * (EMBER_ATTB_NT / 32)) * 32 + threadIdx.x);
}

// Forward: out [BH, T, D] and lse [BH, T] (natural log-sum-exp of each
// row's scaled, masked scores, before dropout), as ember_att_fwd.
template <int D, typename In>
__device__ __forceinline__ void ember_attb_fwd(float* out, float* lse, const In* q, const In* k, const In* v,
                                               int BH, int T, int S, int causal, float scale, float keep, float dscale,
                                               const int* stateOrNull, long long seed, long long offset, int H,
                                               ember_att_lay lo, ember_att_lay lq, ember_att_lay lk, ember_att_lay lv,
                                               unsigned int* maskOrNull) {
    constexpr int BM = EMBER_ATTB_ROWS, BN = EMBER_ATTB_BN, LDS = D + 8, KS = D / 16, NB = BN / 8,
                  DB = D / 8;
    // Two buffers of K and V tiles: the next tile's copies fly during this
    // one's products (cp.async), or one through registers.
    __shared__ __attribute__((aligned(16))) unsigned short skb[2][BN * LDS];
    __shared__ __attribute__((aligned(16))) unsigned short svb[2][BN * LDS];
    const int tiles = (T + BM - 1) / BM;
    const int tile = tiles - 1 - (int)(blockIdx.x / BH);  // the heaviest causal tiles first
    const long long bh = blockIdx.x % BH;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    const int q0 = tile * BM, r0 = q0 + 16 * warp;
    q += ember_att_head(lq, bh, H);
    k += ember_att_head(lk, bh, H);
    v += ember_att_head(lv, bh, H);
    out += ember_att_head(lo, bh, H);
    lse += bh * T;
    const bool drop = keep < 1.0f, aligned = (S & 3) == 0;
    unsigned long long dseed = 0, doff = 0;
    if (drop) ember_att_seed(stateOrNull, seed, offset, dseed, doff);
    const float sc = scale * EMBER_ATT_LOG2E;  // scores in base-2 units
    unsigned int qa[KS][4];
    ember_attb_load_a<D>(qa, q, lq.row, r0, T);
    float o[DB][4], m[2], l[2];
#pragma unroll
    for (int j = 0; j < DB; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    m[0] = m[1] = ember_neg_inf();
    l[0] = l[1] = 0.0f;
    const int kend = causal ? ember_imin(S, q0 + BM) : S;
    const bool async = ember_attb_kv_first<D>(skb, svb, k, v, lk.row, lv.row, S);
    for (int k0 = 0, it = 0; k0 < kend; k0 += BN, it++) {
        unsigned short *sk = skb[it & 1], *sv = svb[it & 1];
        __syncthreads();  // the previous tile's products are done with the other buffers
        ember_attb_kv_tiles<D>(skb, svb, k, v, lk.row, lv.row, k0, kend, S, it, async);
        __syncthreads();
        // Column blocks with a key at or before the warp's last row.
        const int jn = causal ? ember_imin(NB, (r0 + 15 - k0) / 8 + 1) : NB;
        unsigned int* word = drop && maskOrNull != 0 ? ember_attb_mask_word(maskOrNull, bh, tile, k0 / BN, T, S) : 0;
        if (jn <= 0) {
            if (word != 0) *word = 0u;
            continue;
        }
        float s[NB][4];
#pragma unroll
        for (int j = 0; j < NB; j++) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
            if (j < jn) {
#pragma unroll
                for (int kk = 0; kk < KS; kk++) {
                    unsigned int b0, b1;
                    ember_attb_frag_b(sk, LDS, 8 * j, 16 * kk, b0, b1);
                    ember_mma_bf16(s[j], qa[kk], b0, b1);
                }
            }
        }
        float mx[2] = {ember_neg_inf(), ember_neg_inf()};
        // Only a tile that reaches past S or the warp's diagonal masks.
        const bool edge = k0 + BN > S || (causal && k0 + BN - 1 > r0);
        auto scaled = [&](bool masking) {
#pragma unroll
            for (int j = 0; j < NB; j++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int row = r0 + g + 8 * (e >> 1), col = k0 + 8 * j + 2 * t + (e & 1);
                    const bool ok = !masking || (col < S && (!causal || col <= row));
                    s[j][e] = ok ? s[j][e] * sc : ember_neg_inf();
                    mx[e >> 1] = ember_nan_max(mx[e >> 1], s[j][e]);
                }
            }
        };
        if (edge)
            scaled(true);
        else
            scaled(false);
        float alpha[2], mnew[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float x = mx[h];
            x = ember_nan_max(x, __shfl_xor_sync(0xffffffffu, x, 1));
            x = ember_nan_max(x, __shfl_xor_sync(0xffffffffu, x, 2));
            mnew[h] = ember_nan_max(m[h], x);
            const bool none = mnew[h] == ember_neg_inf();  // every key so far masked
            alpha[h] = none ? 1.0f : exp2f(m[h] - mnew[h]);
            if (none) mnew[h] = 0.0f;  // exp2f(-inf - 0) = 0 below
            m[h] = none ? ember_neg_inf() : mnew[h];
            l[h] *= alpha[h];
        }
#pragma unroll
        for (int j = 0; j < DB; j++) {
            o[j][0] *= alpha[0];
            o[j][1] *= alpha[0];
            o[j][2] *= alpha[1];
            o[j][3] *= alpha[1];
        }
        unsigned int kept = 0;  // bit 4j + e: element e of column block j kept
#pragma unroll
        for (int j = 0; j < NB; j++) {
            unsigned int bits = 0xfu;
            if (drop && j < jn) {
                bits = ember_attb_keep_qk(bh, T, S, r0 + g, k0 + 8 * j + 2 * t, dseed, doff, keep, aligned);
                kept |= bits << (4 * j);
            }
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float p = exp2f(s[j][e] - mnew[e >> 1]);
                l[e >> 1] += p;  // this lane's part of the row sum, reduced at the end
                s[j][e] = drop ? ((bits >> e) & 1u ? p * dscale : 0.0f) : p;
            }
        }
        if (word != 0) *word = kept;
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            if (2 * kk < jn) {
                unsigned int a[4];
                ember_attb_c_to_a<NB>(a, s, kk);
#pragma unroll
                for (int j = 0; j < DB; j += 2) {
                    unsigned int b[4];
                    ember_attb_ldsm_t4(b, sv, LDS, 16 * kk, 8 * j);
                    ember_mma_bf16(o[j], a, b[0], b[1]);
                    ember_mma_bf16(o[j + 1], a, b[2], b[3]);
                }
            }
        }
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
        const int row = r0 + g + 8 * h;
        if (row >= T) continue;
        const float inv = 1.0f / l[h];
#pragma unroll
        for (int j = 0; j < DB; j++) {
            *reinterpret_cast<ember_f2*>(out + (long long)row * lo.row + 8 * j + 2 * t) = ember_f2{o[j][2 * h] * inv, o[j][2 * h + 1] * inv};
        }
        if (t == 0) lse[row] = (m[h] + log2f(l[h])) * EMBER_ATT_LN2;
    }
}

// dQ: a block per 64 queries. It first sets delta[t] = Σ_c bf16(dO[t][c])·
// O[t][c] for its rows (read by the dK/dV kernel, launched after it).
// dq = scale·Σ_s bf16(dS)·k with dS = P·(M·dO·vᵀ - delta).
template <int D, typename In>
__device__ __forceinline__ void ember_attb_dq(float* dq, float* delta, const In* q, const In* k, const In* v,
                                              const float* o, const float* lse, const float* dout, int BH, int T, int S,
                                              int causal, float scale, float keep, float dscale, const int* stateOrNull,
                                              long long seed, long long offset, int H, ember_att_lay ldq,
                                              ember_att_lay lq, ember_att_lay lk, ember_att_lay lv, ember_att_lay lo,
                                              ember_att_lay ldo, const unsigned int* maskOrNull,
                                              unsigned short* doutbOrNull) {
    constexpr int BM = EMBER_ATTB_ROWS, BN = EMBER_ATTB_BN, LDS = D + 8, KS = D / 16, NB = BN / 8,
                  DB = D / 8;
    __shared__ __attribute__((aligned(16))) unsigned short skb[2][BN * LDS];
    __shared__ __attribute__((aligned(16))) unsigned short svb[2][BN * LDS];
    const int tiles = (T + BM - 1) / BM;
    const int tile = tiles - 1 - (int)(blockIdx.x / BH);
    const long long bh = blockIdx.x % BH;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    const int q0 = tile * BM, r0 = q0 + 16 * warp;
    q += ember_att_head(lq, bh, H);
    k += ember_att_head(lk, bh, H);
    v += ember_att_head(lv, bh, H);
    o += ember_att_head(lo, bh, H);
    dout += ember_att_head(ldo, bh, H);
    dq += ember_att_head(ldq, bh, H);
    lse += bh * T;
    delta += bh * T;
    const bool drop = keep < 1.0f, aligned = (S & 3) == 0;
    unsigned long long dseed = 0, doff = 0;
    if (drop) ember_att_seed(stateOrNull, seed, offset, dseed, doff);
    const float sc = scale * EMBER_ATT_LOG2E;
    unsigned int qa[KS][4], ga[KS][4];
    ember_attb_load_a<D>(qa, q, lq.row, r0, T);
    ember_attb_load_a<D>(ga, dout, ldo.row, r0, T);
    if (doutbOrNull != 0) {
        // dO rounded to bfloat16, dense [BH, T, D], for the dK/dV kernel's
        // tiles: the fragments as they are.
        unsigned short* gb = doutbOrNull + bh * T * D;
        const int ra = r0 + g, rb = r0 + g + 8;
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
            const int c = 16 * kk + 2 * t;
            if (ra < T) {
                *reinterpret_cast<unsigned int*>(gb + (long long)ra * D + c) = ga[kk][0];
                *reinterpret_cast<unsigned int*>(gb + (long long)ra * D + c + 8) = ga[kk][2];
            }
            if (rb < T) {
                *reinterpret_cast<unsigned int*>(gb + (long long)rb * D + c) = ga[kk][1];
                *reinterpret_cast<unsigned int*>(gb + (long long)rb * D + c + 8) = ga[kk][3];
            }
        }
    }
    // delta over the fragment's columns, then over the 4 lanes of a row.
    float dl[2] = {0.0f, 0.0f}, ls[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int row = r0 + g + 8 * h;
        if (row < T) {
#pragma unroll
            for (int kk = 0; kk < KS; kk++) {
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    const int c = 16 * kk + 2 * t + 8 * half;
                    const ember_f2 x = *reinterpret_cast<const ember_f2*>(o + (long long)row * lo.row + c);
                    const unsigned int w = ga[kk][h + 2 * half];
                    dl[h] = __fmaf_rn(ember_attb_lo(w), x.x, dl[h]);
                    dl[h] = __fmaf_rn(ember_attb_hi(w), x.y, dl[h]);
                }
            }
        }
        dl[h] += __shfl_xor_sync(0xffffffffu, dl[h], 1);
        dl[h] += __shfl_xor_sync(0xffffffffu, dl[h], 2);
        ls[h] = row < T ? lse[row] * EMBER_ATT_LOG2E : 0.0f;
        if (row < T && t == 0) delta[row] = dl[h];
    }
    float acc[DB][4];
#pragma unroll
    for (int j = 0; j < DB; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    const int kend = causal ? ember_imin(S, q0 + BM) : S;
    const bool async = ember_attb_kv_first<D>(skb, svb, k, v, lk.row, lv.row, S);
    for (int k0 = 0, it = 0; k0 < kend; k0 += BN, it++) {
        unsigned short *sk = skb[it & 1], *sv = svb[it & 1];
        __syncthreads();
        ember_attb_kv_tiles<D>(skb, svb, k, v, lk.row, lv.row, k0, kend, S, it, async);
        __syncthreads();
        const int jn = causal ? ember_imin(NB, (r0 + 15 - k0) / 8 + 1) : NB;
        if (jn <= 0) continue;
        // The forward pass's kept bits of this tile, loaded ahead of the
        // products.
        const unsigned int kept =
            drop && maskOrNull != 0
                ? *ember_attb_mask_word(const_cast<unsigned int*>(maskOrNull), bh, tile, k0 / BN, T, S)
                : 0u;
        float s[NB][4], dp[NB][4];
#pragma unroll
        for (int j = 0; j < NB; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) s[j][e] = dp[j][e] = 0.0f;
            if (j < jn) {
#pragma unroll
                for (int kk = 0; kk < KS; kk++) {
                    unsigned int b0, b1;
                    ember_attb_frag_b(sk, LDS, 8 * j, 16 * kk, b0, b1);
                    ember_mma_bf16(s[j], qa[kk], b0, b1);
                    ember_attb_frag_b(sv, LDS, 8 * j, 16 * kk, b0, b1);
                    ember_mma_bf16(dp[j], ga[kk], b0, b1);
                }
            }
        }
        // Only a tile that reaches past T, S or the warp's diagonal masks.
        const bool edge = r0 + 16 > T || k0 + BN > S || (causal && k0 + BN - 1 > r0);
        auto grads = [&](bool masking) {
#pragma unroll
            for (int j = 0; j < NB; j++) {
                unsigned int bits = 0xfu;
                if (drop && j < jn)
                    bits = maskOrNull != 0 ? (kept >> (4 * j)) & 0xfu
                                           : ember_attb_keep_qk(bh, T, S, r0 + g, k0 + 8 * j + 2 * t, dseed, doff,
                                                                keep, aligned);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int h = e >> 1, row = r0 + g + 8 * h, col = k0 + 8 * j + 2 * t + (e & 1);
                    const bool ok = !masking || (row < T && col < S && (!causal || col <= row));
                    const float p = ok ? exp2f(s[j][e] * sc - ls[h]) : 0.0f;
                    float gd = dp[j][e];
                    if (drop) gd = (bits >> e) & 1u ? gd * dscale : 0.0f;
                    s[j][e] = p * (gd - dl[h]);  // dS
                }
            }
        };
        if (edge)
            grads(true);
        else
            grads(false);
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            if (2 * kk < jn) {
                unsigned int a[4];
                ember_attb_c_to_a<NB>(a, s, kk);
#pragma unroll
                for (int j = 0; j < DB; j += 2) {
                    unsigned int b[4];
                    ember_attb_ldsm_t4(b, sk, LDS, 16 * kk, 8 * j);
                    ember_mma_bf16(acc[j], a, b[0], b[1]);
                    ember_mma_bf16(acc[j + 1], a, b[2], b[3]);
                }
            }
        }
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int row = r0 + g + 8 * h;
        if (row >= T) continue;
#pragma unroll
        for (int j = 0; j < DB; j++) {
            *reinterpret_cast<ember_f2*>(dq + (long long)row * ldq.row + 8 * j + 2 * t) = ember_f2{acc[j][2 * h] * scale, acc[j][2 * h + 1] * scale};
        }
    }
}

// dK and dV: a block per 64 keys, over the tiles of queries that see them.
// dv = Σ_t bf16(M·P)·dO, dk = scale·Σ_t bf16(dS)·q, computed transposed
// (keys as the rows of every product).
template <int D, typename In>
__device__ __forceinline__ void ember_attb_dkv(float* dk, float* dv, const In* q, const In* k, const In* v,
                                               const float* lse, const float* delta, const float* dout, int BH, int T,
                                               int S, int causal, float scale, float keep, float dscale,
                                               const int* stateOrNull, long long seed, long long offset, int H,
                                               ember_att_lay ldk, ember_att_lay ldv, ember_att_lay lq, ember_att_lay lk,
                                               ember_att_lay lv, ember_att_lay ldo, const unsigned int* maskOrNull,
                                               const unsigned short* doutbOrNull) {
    constexpr int BM = EMBER_ATTB_ROWS, BQ = EMBER_ATTB_BN, LDS = D + 8, KS = D / 16, NB = BQ / 8,
                  DB = D / 8;
    __shared__ __attribute__((aligned(16))) unsigned short sqb[2][BQ * LDS];  // Q tiles, two buffers as the forward's
    __shared__ __attribute__((aligned(16))) unsigned short sgb[2][BQ * LDS];  // dO tiles, likewise
    __shared__ float slse[BQ], sdelta[BQ];
    __shared__ unsigned int smask[EMBER_ATTB_NT];  // the forward's kept bits of (query tile, this key tile)
    const int tile = (int)(blockIdx.x / BH);  // under a causal mask the first keys see the most queries
    const long long bh = blockIdx.x % BH;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    const int k0 = tile * BM, r0 = k0 + 16 * warp;
    q += ember_att_head(lq, bh, H);
    k += ember_att_head(lk, bh, H);
    v += ember_att_head(lv, bh, H);
    dout += ember_att_head(ldo, bh, H);
    dk += ember_att_head(ldk, bh, H);
    dv += ember_att_head(ldv, bh, H);
    lse += bh * T;
    delta += bh * T;
    const bool drop = keep < 1.0f, aligned = (S & 3) == 0;
    unsigned long long dseed = 0, doff = 0;
    if (drop) ember_att_seed(stateOrNull, seed, offset, dseed, doff);
    const float sc = scale * EMBER_ATT_LOG2E;
    unsigned int ka[KS][4], va[KS][4];
    ember_attb_load_a<D>(ka, k, lk.row, r0, S);
    ember_attb_load_a<D>(va, v, lv.row, r0, S);
    float gk[DB][4], gv[DB][4];
#pragma unroll
    for (int j = 0; j < DB; j++) {
#pragma unroll
        for (int e = 0; e < 4; e++) gk[j][e] = gv[j][e] = 0.0f;
    }
    // Queries before k0 see none of these keys under the causal mask.
    const int qstart = causal ? (k0 / BQ) * BQ : 0;
    // dO from the dQ kernel's bfloat16 copy where there is one (copied by
    // cp.async like Q), else rounded from float32 on the way.
    const unsigned short* gb = doutbOrNull != 0 ? doutbOrNull + bh * T * D : 0;
    const bool async = ember_attb_async_ok(q, lq.row), gasync = gb != 0 && ember_attb_async_ok(gb, D);
    if (async) ember_attb_fill<D>(sqb[0], q, lq.row, qstart, T, true);
    if (gasync) ember_attb_fill<D>(sgb[0], gb, D, qstart, T, true);
    for (int q0 = qstart, it = 0; q0 < T; q0 += BQ, it++) {
        unsigned short *sq = sqb[it & 1], *sg = sgb[it & 1];
        __syncthreads();
        const bool next = q0 + BQ < T;
        int pending = 0;  // the next tiles' copy groups, issued after this tile's
        if (next && async) {
            ember_attb_fill<D>(sqb[(it + 1) & 1], q, lq.row, q0 + BQ, T, true);
            pending++;
        }
        if (next && gasync) {
            ember_attb_fill<D>(sgb[(it + 1) & 1], gb, D, q0 + BQ, T, true);
            pending++;
        }
        if (!gasync) ember_attb_fill_rows<D>(sg, dout, ldo.row, q0, T);
        if (!async) ember_attb_fill<D>(sq, q, lq.row, q0, T, false);
        if (pending == 2)
            ember_attb_wait<2>();
        else if (pending == 1)
            ember_attb_wait<1>();
        else
            ember_attb_wait<0>();
        if (threadIdx.x < BQ) {
            const int qi = q0 + threadIdx.x;
            slse[threadIdx.x] = qi < T ? lse[qi] * EMBER_ATT_LOG2E : 0.0f;
            sdelta[threadIdx.x] = qi < T ? delta[qi] : 0.0f;
        }
        const bool fromMask = drop && maskOrNull != 0;
        if (fromMask)  // a tile the forward pass drew: under a causal mask q0 >= k0 here
            smask[threadIdx.x] = *ember_attb_mask_word(const_cast<unsigned int*>(maskOrNull), bh, q0 / BQ, tile, T, S);
        __syncthreads();
        // Column (query) blocks with a query at or after the warp's first key.
        const int jlo = causal ? (r0 > q0 ? (r0 - q0) / 8 : 0) : 0;
        if (jlo >= NB) continue;
        float s[NB][4], dp[NB][4];
#pragma unroll
        for (int j = 0; j < NB; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) s[j][e] = dp[j][e] = 0.0f;
            if (j >= jlo) {
#pragma unroll
                for (int kk = 0; kk < KS; kk++) {
                    unsigned int b0, b1;
                    ember_attb_frag_b(sq, LDS, 8 * j, 16 * kk, b0, b1);
                    ember_mma_bf16(s[j], ka[kk], b0, b1);
                    ember_attb_frag_b(sg, LDS, 8 * j, 16 * kk, b0, b1);
                    ember_mma_bf16(dp[j], va[kk], b0, b1);
                }
            }
        }
        // Only a tile that reaches past T, S or the warp's diagonal masks.
        const bool edge = q0 + BQ > T || r0 + 16 > S || (causal && r0 + 15 > q0);
        auto grads = [&](bool masking) {
#pragma unroll
            for (int j = 0; j < NB; j++) {
                unsigned int bits = 0xfu;
                if (drop && j >= jlo) {
                    if (fromMask) {
                        // Element e is the forward's (query 8j + 2t + (e&1), key
                        // 16·warp + g + 8(e>>1)) of the tiles: warp j/2's lane
                        // 4(2t + (e&1)) + g/2, bit 4(2·warp + (e>>1)) + 2(j&1) + (g&1).
                        const unsigned int w0 = smask[(j >> 1) * 32 + 8 * t + (g >> 1)];
                        const unsigned int w1 = smask[(j >> 1) * 32 + 8 * t + 4 + (g >> 1)];
                        const int b = 8 * warp + 2 * (j & 1) + (g & 1);
                        bits = ((w0 >> b) & 1u) | (((w1 >> b) & 1u) << 1) | (((w0 >> (b + 4)) & 1u) << 2) |
                               (((w1 >> (b + 4)) & 1u) << 3);
                    } else {
                        bits = ember_attb_keep_kq(bh, T, S, r0 + g, q0 + 8 * j + 2 * t, dseed, doff, keep, aligned);
                    }
                }
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = r0 + g + 8 * (e >> 1), cq = 8 * j + 2 * t + (e & 1), qi = q0 + cq;
                    const bool ok = !masking || (qi < T && key < S && (!causal || key <= qi));
                    const float p = ok ? exp2f(s[j][e] * sc - slse[cq]) : 0.0f;
                    const float mk = drop ? ((bits >> e) & 1u ? dscale : 0.0f) : 1.0f;
                    s[j][e] = p * mk;                             // the dropped weight, for dV
                    dp[j][e] = p * (dp[j][e] * mk - sdelta[cq]);  // dS, for dK
                }
            }
        };
        if (edge)
            grads(true);
        else
            grads(false);
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) {
            if (2 * kk + 1 >= jlo) {
                unsigned int a[4], d[4];
                ember_attb_c_to_a<NB>(a, s, kk);
                ember_attb_c_to_a<NB>(d, dp, kk);
#pragma unroll
                for (int j = 0; j < DB; j += 2) {
                    unsigned int b[4];
                    ember_attb_ldsm_t4(b, sg, LDS, 16 * kk, 8 * j);
                    ember_mma_bf16(gv[j], a, b[0], b[1]);
                    ember_mma_bf16(gv[j + 1], a, b[2], b[3]);
                    ember_attb_ldsm_t4(b, sq, LDS, 16 * kk, 8 * j);
                    ember_mma_bf16(gk[j], d, b[0], b[1]);
                    ember_mma_bf16(gk[j + 1], d, b[2], b[3]);
                }
            }
        }
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int key = r0 + g + 8 * h;
        if (key >= S) continue;
#pragma unroll
        for (int j = 0; j < DB; j++) {
            *reinterpret_cast<ember_f2*>(dk + (long long)key * ldk.row + 8 * j + 2 * t) = ember_f2{gk[j][2 * h] * scale, gk[j][2 * h + 1] * scale};
            *reinterpret_cast<ember_f2*>(dv + (long long)key * ldv.row + 8 * j + 2 * t) = ember_f2{gv[j][2 * h], gv[j][2 * h + 1]};
        }
    }
}

// The instantiations (D = 64), with the signatures of attention.cu's.
extern "C" __global__ void __launch_bounds__(EMBER_ATTB_NT) ember_attention_bf16_fwd_d64(
    float* out, float* lse, const float* q, const float* k, const float* v, int BH, int T, int S, int causal,
    float scale, float keep, float dscale, const int* stateOrNull, long long seed, long long offset, int H, long long og,
    long long oh, long long orow, long long qg, long long qh, long long qrow, long long kg, long long kh, long long krow,
    long long vg, long long vh, long long vrow, unsigned int* maskOrNull) {
    ember_attb_fwd<64>(out, lse, q, k, v, BH, T, S, causal, scale, keep, dscale, stateOrNull, seed, offset, H,
                       {og, oh, orow}, {qg, qh, qrow}, {kg, kh, krow}, {vg, vh, vrow}, maskOrNull);
}
extern "C" __global__ void __launch_bounds__(EMBER_ATTB_NT) ember_attention_bf16_dq_d64(
    float* dq, float* delta, const float* q, const float* k, const float* v, const float* o, const float* lse,
    const float* dout, int BH, int T, int S, int causal, float scale, float keep, float dscale, const int* stateOrNull,
    long long seed, long long offset, int H, long long dqg, long long dqh, long long dqrow, long long qg, long long qh,
    long long qrow, long long kg, long long kh, long long krow, long long vg, long long vh, long long vrow,
    long long og, long long oh, long long orow, long long dog, long long doh, long long dorow,
    const unsigned int* maskOrNull, unsigned short* doutbOrNull) {
    ember_attb_dq<64>(dq, delta, q, k, v, o, lse, dout, BH, T, S, causal, scale, keep, dscale, stateOrNull, seed,
                      offset, H, {dqg, dqh, dqrow}, {qg, qh, qrow}, {kg, kh, krow}, {vg, vh, vrow}, {og, oh, orow},
                      {dog, doh, dorow}, maskOrNull, doutbOrNull);
}
extern "C" __global__ void __launch_bounds__(EMBER_ATTB_NT) ember_attention_bf16_dkv_d64(
    float* dk, float* dv, const float* q, const float* k, const float* v, const float* lse, const float* delta,
    const float* dout, int BH, int T, int S, int causal, float scale, float keep, float dscale, const int* stateOrNull,
    long long seed, long long offset, int H, long long dkg, long long dkh, long long dkrow, long long dvg,
    long long dvh, long long dvrow, long long qg, long long qh, long long qrow, long long kg, long long kh,
    long long krow, long long vg, long long vh, long long vrow, long long dog, long long doh, long long dorow,
    const unsigned int* maskOrNull, const unsigned short* doutbOrNull) {
    ember_attb_dkv<64>(dk, dv, q, k, v, lse, delta, dout, BH, T, S, causal, scale, keep, dscale, stateOrNull, seed,
                       offset, H, {dkg, dkh, dkrow}, {dvg, dvh, dvrow}, {qg, qh, qrow}, {kg, kh, krow},
                       {vg, vh, vrow}, {dog, doh, dorow}, maskOrNull, doutbOrNull);
}

// The same with q, k and v bfloat16 (cast by the caller, which rounds them
// as the float32 kernels do as they load them: the same bits).
extern "C" __global__ void __launch_bounds__(EMBER_ATTB_NT) ember_attention_bf16h_fwd_d64(
    float* out, float* lse, const unsigned short* q, const unsigned short* k, const unsigned short* v, int BH, int T, int S, int causal,
    float scale, float keep, float dscale, const int* stateOrNull, long long seed, long long offset, int H, long long og,
    long long oh, long long orow, long long qg, long long qh, long long qrow, long long kg, long long kh, long long krow,
    long long vg, long long vh, long long vrow, unsigned int* maskOrNull) {
    ember_attb_fwd<64>(out, lse, q, k, v, BH, T, S, causal, scale, keep, dscale, stateOrNull, seed, offset, H,
                       {og, oh, orow}, {qg, qh, qrow}, {kg, kh, krow}, {vg, vh, vrow}, maskOrNull);
}
extern "C" __global__ void __launch_bounds__(EMBER_ATTB_NT) ember_attention_bf16h_dq_d64(
    float* dq, float* delta, const unsigned short* q, const unsigned short* k, const unsigned short* v, const float* o, const float* lse,
    const float* dout, int BH, int T, int S, int causal, float scale, float keep, float dscale, const int* stateOrNull,
    long long seed, long long offset, int H, long long dqg, long long dqh, long long dqrow, long long qg, long long qh,
    long long qrow, long long kg, long long kh, long long krow, long long vg, long long vh, long long vrow,
    long long og, long long oh, long long orow, long long dog, long long doh, long long dorow,
    const unsigned int* maskOrNull, unsigned short* doutbOrNull) {
    ember_attb_dq<64>(dq, delta, q, k, v, o, lse, dout, BH, T, S, causal, scale, keep, dscale, stateOrNull, seed,
                      offset, H, {dqg, dqh, dqrow}, {qg, qh, qrow}, {kg, kh, krow}, {vg, vh, vrow}, {og, oh, orow},
                      {dog, doh, dorow}, maskOrNull, doutbOrNull);
}
extern "C" __global__ void __launch_bounds__(EMBER_ATTB_NT) ember_attention_bf16h_dkv_d64(
    float* dk, float* dv, const unsigned short* q, const unsigned short* k, const unsigned short* v, const float* lse, const float* delta,
    const float* dout, int BH, int T, int S, int causal, float scale, float keep, float dscale, const int* stateOrNull,
    long long seed, long long offset, int H, long long dkg, long long dkh, long long dkrow, long long dvg,
    long long dvh, long long dvrow, long long qg, long long qh, long long qrow, long long kg, long long kh,
    long long krow, long long vg, long long vh, long long vrow, long long dog, long long doh, long long dorow,
    const unsigned int* maskOrNull, const unsigned short* doutbOrNull) {
    ember_attb_dkv<64>(dk, dv, q, k, v, lse, delta, dout, BH, T, S, causal, scale, keep, dscale, stateOrNull, seed,
                       offset, H, {dkg, dkh, dkrow}, {dvg, dvh, dvrow}, {qg, qh, qrow}, {kg, kh, krow},
                       {vg, vh, vrow}, {dog, doh, dorow}, maskOrNull, doutbOrNull);
}

#endif  // sm_80
