// attention.cu: fused scaled dot-product attention in float32, after
// FlashAttention-2 (Dao, 2023, "FlashAttention-2: Faster Attention with
// Better Parallelism and Work Partitioning"): a block holds a tile of
// queries, walks the tiles of keys with an online softmax and never stores
// the [T, S] scores; the causal tiles above the diagonal are skipped. The
// backward pass recomputes the probabilities from the saved row
// log-sum-exp: one kernel for dQ (a block per tile of queries, which also
// computes delta = rowsum(dO·O)) and one for dK and dV (a block per tile of
// keys), so that no atomics are needed and the result is deterministic.
//
// Dropout on the attention weights draws exactly the bits of
// ember_dropout over the [BH, T, S] weights (random.cu, the layout of
// tensor/backend_random.go): weight (bh, t, s) is element (bh·T + t)·S + s.
//
// The products use explicit __fmaf_rn (the module is compiled with
// --fmad=false, which would otherwise split every multiply-add in two).
// Head dimensions: D = Dv, a multiple of 16 up to 64 (the instantiations
// at the end); the Go side falls back to the composed operators otherwise.
//
// Every [BH, rows, D] tensor is read or written through its layout
// (ember_att_lay, tensor.AttentionLayout: the trailing arguments, H the
// inner heads), so that the heads of a transformer's [B, T, 3, H, D]
// projection are read in place and its output written as [B, T, H, D];
// only each row's D elements must be contiguous. lse and delta are dense.
//
// Thread layout of every tile product: 16 threads (tx) across the columns
// and ROWS/4 (ty) down the rows; a thread owns rows 4ty..4ty+3 and columns
// tx + 16j. Shared rows are padded to D + 4 floats, so that the 16-byte row
// reads of a quarter warp fall in distinct banks.

#define EMBER_ATT_BN 32  // keys (dQ, forward) or queries (dK/dV) per inner tile
#define EMBER_ATT_LOG2E 1.4426950408889634f
#define EMBER_ATT_LN2 0.6931471805599453f

// (seed, offset) of the dropout draw: from state (four words, as
// ember_random_state reads them) when it is not null, else the arguments.
__device__ __forceinline__ void ember_att_seed(const int* stateOrNull, long long seed, long long offset,
                                               unsigned long long& s, unsigned long long& off) {
    if (stateOrNull != nullptr) {
        s = (unsigned long long)(unsigned int)stateOrNull[0] | ((unsigned long long)(unsigned int)stateOrNull[1] << 32);
        off = (unsigned long long)(unsigned int)stateOrNull[2] | ((unsigned long long)(unsigned int)stateOrNull[3] << 32);
    } else {
        s = (unsigned long long)seed;
        off = (unsigned long long)offset;
    }
}

// keepm[r·BN + c] = 1 when weight (bh, q0 + r, k0 + c) is kept: its
// Bernoulli draw of probability keep is 1. Four consecutive weights per
// thread step; they share one Philox block when S is a multiple of 4 (and
// span at most two otherwise). Weights outside [T, S] get bits that are
// never read.
template <int ROWS, int NT>
__device__ __forceinline__ void ember_att_keep(unsigned char* keepm, long long bh, int q0, int k0, int T, int S,
                                               unsigned long long seed, unsigned long long off, float keep) {
    constexpr int BN = EMBER_ATT_BN;
    for (int g = threadIdx.x; g < ROWS * BN / 4; g += NT) {
        const int r = g / (BN / 4), c = (g % (BN / 4)) * 4;
        const unsigned long long e0 = (unsigned long long)(bh * T + q0 + r) * (unsigned long long)S + (unsigned long long)(k0 + c);
        const unsigned long long blk = e0 >> 2;
        unsigned int w[4] = {(unsigned int)(off + blk), (unsigned int)((off + blk) >> 32), 0u, 0u};
        ember_philox(w, (unsigned int)seed, (unsigned int)(seed >> 32));
        unsigned int w2[4] = {(unsigned int)(off + blk + 1), (unsigned int)((off + blk + 1) >> 32), 0u, 0u};
        if (((e0 + 3) >> 2) != blk) ember_philox(w2, (unsigned int)seed, (unsigned int)(seed >> 32));
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const unsigned long long e = e0 + i;
            const unsigned int word = (e >> 2) == blk ? w[e & 3] : w2[e & 3];
            keepm[r * BN + c + i] = ember_unit24(word) < keep ? 1 : 0;
        }
    }
}

// Where a tensor's rows lie (tensor.AttentionLayout): row r of head bh,
// bh = g·H + i (i < H), starts at element g·group + i·head + r·row; its D
// elements are contiguous.
struct ember_att_lay {
    long long group, head, row;
};

__device__ __forceinline__ long long ember_att_head(ember_att_lay l, long long bh, int H) {
    return bh / H * l.group + bh % H * l.head;
}

// dst[r·(D+4) + c] = src[(row0 + r)·ld + c] for the ROWS rows of a tile, 0
// past row n.
template <int D, int ROWS, int NT>
__device__ __forceinline__ void ember_att_load(float* dst, const float* src, long long ld, int row0, int n) {
    constexpr int LD = D + 4;
    for (int idx = threadIdx.x; idx < ROWS * D; idx += NT) {
        const int r = idx / D, c = idx % D;
        dst[r * LD + c] = row0 + r < n ? src[(long long)(row0 + r) * ld + c] : 0.0f;
    }
}

// acc[i][j] += Σ_c A[4ty+i][c]·B[tx+16j][c] over D (rows of stride D + 4).
template <int D, int NJ>
__device__ __forceinline__ void ember_att_abt(float acc[4][NJ], const float* A, const float* B, int ty, int tx) {
    constexpr int LD = D + 4;
#pragma unroll 4
    for (int c = 0; c < D; c += 4) {
        ember_f4 a[4], b[NJ];
#pragma unroll
        for (int i = 0; i < 4; i++) a[i] = *reinterpret_cast<const ember_f4*>(A + (4 * ty + i) * LD + c);
#pragma unroll
        for (int j = 0; j < NJ; j++) b[j] = *reinterpret_cast<const ember_f4*>(B + (tx + 16 * j) * LD + c);
#pragma unroll
        for (int i = 0; i < 4; i++) {
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                float s = acc[i][j];
                s = __fmaf_rn(a[i].x, b[j].x, s);
                s = __fmaf_rn(a[i].y, b[j].y, s);
                s = __fmaf_rn(a[i].z, b[j].z, s);
                s = __fmaf_rn(a[i].w, b[j].w, s);
                acc[i][j] = s;
            }
        }
    }
}

// acc[i][c] += Σ_n P[4ty+i][n]·V[n][tx+16c] over the BN columns of P
// (stride BN + 4) and rows of V (stride D + 4).
template <int D>
__device__ __forceinline__ void ember_att_pv(float acc[4][D / 16], const float* P, const float* V, int ty, int tx) {
    constexpr int LD = D + 4, LDP = EMBER_ATT_BN + 4, DC = D / 16;
#pragma unroll 2
    for (int n = 0; n < EMBER_ATT_BN; n += 4) {
        ember_f4 p[4];
#pragma unroll
        for (int i = 0; i < 4; i++) p[i] = *reinterpret_cast<const ember_f4*>(P + (4 * ty + i) * LDP + n);
#pragma unroll
        for (int c = 0; c < DC; c++) {
            const float v0 = V[(n + 0) * LD + tx + 16 * c], v1 = V[(n + 1) * LD + tx + 16 * c];
            const float v2 = V[(n + 2) * LD + tx + 16 * c], v3 = V[(n + 3) * LD + tx + 16 * c];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float s = acc[i][c];
                s = __fmaf_rn(p[i].x, v0, s);
                s = __fmaf_rn(p[i].y, v1, s);
                s = __fmaf_rn(p[i].z, v2, s);
                s = __fmaf_rn(p[i].w, v3, s);
                acc[i][c] = s;
            }
        }
    }
}

// Reductions over the 16 lanes of a row (lanes tx = 0..15 of one ty).
__device__ __forceinline__ float ember_att_row_max(float v) {
    for (int o = 8; o > 0; o >>= 1) v = ember_nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float ember_att_row_sum(float v) {
    for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Forward: a block of 4·ROWS threads per tile of ROWS queries of one head
// (bh). out [BH, T, D] (through lo); lse [BH, T] the natural log-sum-exp of each row's
// scaled, masked scores (before dropout). keep < 1 applies dropout with
// mask values dscale.
template <int D, int ROWS>
__device__ __forceinline__ void ember_att_fwd(float* out, float* lse, const float* q, const float* k, const float* v,
                                              int BH, int T, int S, int causal, float scale, float keep, float dscale,
                                              const int* stateOrNull, long long seed, long long offset, int H,
                                              ember_att_lay lo, ember_att_lay lq, ember_att_lay lk, ember_att_lay lv) {
    constexpr int BN = EMBER_ATT_BN, LD = D + 4, LDP = BN + 4, NT = ROWS * 4, DC = D / 16;
    __shared__ __attribute__((aligned(16))) float sq[ROWS * LD];
    __shared__ __attribute__((aligned(16))) float skv[BN * LD];
    __shared__ __attribute__((aligned(16))) float sp[ROWS * LDP];
    __shared__ unsigned char skeep[ROWS * BN];
    const int tiles = (T + ROWS - 1) / ROWS;
    // The heaviest (last, under a causal mask) tiles are launched first.
    const int tile = tiles - 1 - (int)(blockIdx.x / BH);
    const long long bh = blockIdx.x % BH;
    const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
    const int q0 = tile * ROWS;
    q += ember_att_head(lq, bh, H);
    k += ember_att_head(lk, bh, H);
    v += ember_att_head(lv, bh, H);
    out += ember_att_head(lo, bh, H);
    lse += bh * T;
    const bool drop = keep < 1.0f;
    unsigned long long dseed = 0, doff = 0;
    if (drop) ember_att_seed(stateOrNull, seed, offset, dseed, doff);
    const float sc = scale * EMBER_ATT_LOG2E;  // scores in base-2 units
    ember_att_load<D, ROWS, NT>(sq, q, lq.row, q0, T);
    float m[4], l[4], o[4][DC];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        m[i] = ember_neg_inf();
        l[i] = 0.0f;
#pragma unroll
        for (int c = 0; c < DC; c++) o[i][c] = 0.0f;
    }
    const int kend = causal ? ember_imin(S, q0 + ROWS) : S;
    for (int k0 = 0; k0 < kend; k0 += BN) {
        __syncthreads();  // the previous tile's products are done with skv, sp
        ember_att_load<D, BN, NT>(skv, k, lk.row, k0, S);
        if (drop) ember_att_keep<ROWS, NT>(skeep, bh, q0, k0, T, S, dseed, doff, keep);
        __syncthreads();
        float s[4][2];
#pragma unroll
        for (int i = 0; i < 4; i++) s[i][0] = s[i][1] = 0.0f;
        ember_att_abt<D, 2>(s, sq, skv, ty, tx);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int qi = q0 + 4 * ty + i;
            float mx = ember_neg_inf();
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int kj = k0 + tx + 16 * j;
                const bool ok = kj < S && (!causal || kj <= qi);
                s[i][j] = ok ? s[i][j] * sc : ember_neg_inf();
                mx = ember_nan_max(mx, s[i][j]);
            }
            mx = ember_att_row_max(mx);
            const float mnew = ember_nan_max(m[i], mx);
            const bool none = mnew == ember_neg_inf();  // every key so far masked
            const float alpha = none ? 1.0f : exp2f(m[i] - mnew);
            float rs = 0.0f;
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const float p = none ? 0.0f : exp2f(s[i][j] - mnew);
                rs += p;
                float pd = p;
                if (drop) pd = skeep[(4 * ty + i) * BN + tx + 16 * j] ? p * dscale : 0.0f;
                sp[(4 * ty + i) * LDP + tx + 16 * j] = pd;
            }
            rs = ember_att_row_sum(rs);
            l[i] = l[i] * alpha + rs;
            m[i] = mnew;
#pragma unroll
            for (int c = 0; c < DC; c++) o[i][c] *= alpha;
        }
        __syncthreads();  // every thread is done reading K
        ember_att_load<D, BN, NT>(skv, v, lv.row, k0, S);
        __syncthreads();
        ember_att_pv<D>(o, sp, skv, ty, tx);
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int qi = q0 + 4 * ty + i;
        if (qi >= T) continue;
        const float inv = 1.0f / l[i];
#pragma unroll
        for (int c = 0; c < DC; c++) out[(long long)qi * lo.row + tx + 16 * c] = o[i][c] * inv;
        if (tx == 0) lse[qi] = (m[i] + log2f(l[i])) * EMBER_ATT_LN2;
    }
}

// dQ: a block of 128 threads per tile of 32 queries. It first sets
// delta[t] = Σ_c dO[t][c]·O[t][c] for its rows (read by the dK/dV kernel,
// launched after it). dq = scale·Σ_s dS·k with dS = P·(M·dO·vᵀ - delta),
// M the dropout mask values (1 without dropout).
template <int D>
__device__ __forceinline__ void ember_att_dq(float* dq, float* delta, const float* q, const float* k, const float* v,
                                             const float* o, const float* lse, const float* dout, int BH, int T, int S,
                                             int causal, float scale, float keep, float dscale, const int* stateOrNull,
                                             long long seed, long long offset, int H, ember_att_lay ldq, ember_att_lay lq,
                                             ember_att_lay lk, ember_att_lay lv, ember_att_lay lo, ember_att_lay ldo) {
    constexpr int ROWS = 32, BN = EMBER_ATT_BN, LD = D + 4, LDP = BN + 4, NT = 128, DC = D / 16;
    __shared__ __attribute__((aligned(16))) float sq[ROWS * LD];
    __shared__ __attribute__((aligned(16))) float sdo[ROWS * LD];
    __shared__ __attribute__((aligned(16))) float sk[BN * LD];
    __shared__ __attribute__((aligned(16))) float sv[BN * LD];
    __shared__ __attribute__((aligned(16))) float sds[ROWS * LDP];
    __shared__ unsigned char skeep[ROWS * BN];
    __shared__ float slse[ROWS], sdelta[ROWS];
    const int tiles = (T + ROWS - 1) / ROWS;
    const int tile = tiles - 1 - (int)(blockIdx.x / BH);
    const long long bh = blockIdx.x % BH;
    const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16, warp = tid / 32, lane = tid % 32;
    const int q0 = tile * ROWS;
    q += ember_att_head(lq, bh, H);
    k += ember_att_head(lk, bh, H);
    v += ember_att_head(lv, bh, H);
    o += ember_att_head(lo, bh, H);
    dout += ember_att_head(ldo, bh, H);
    dq += ember_att_head(ldq, bh, H);
    lse += bh * T;
    delta += bh * T;
    const bool drop = keep < 1.0f;
    unsigned long long dseed = 0, doff = 0;
    if (drop) ember_att_seed(stateOrNull, seed, offset, dseed, doff);
    const float sc = scale * EMBER_ATT_LOG2E;
    ember_att_load<D, ROWS, NT>(sq, q, lq.row, q0, T);
    ember_att_load<D, ROWS, NT>(sdo, dout, ldo.row, q0, T);
    for (int r = warp; r < ROWS; r += NT / 32) {  // a warp per row
        const int qi = q0 + r;
        float d = 0.0f;
        if (qi < T) {
            for (int c = lane; c < D; c += 32) d = __fmaf_rn(dout[(long long)qi * ldo.row + c], o[(long long)qi * lo.row + c], d);
        }
        d = ember_warp_sum(d);
        if (lane == 0) {
            sdelta[r] = d;
            slse[r] = qi < T ? lse[qi] * EMBER_ATT_LOG2E : 0.0f;
            if (qi < T) delta[qi] = d;
        }
    }
    float acc[4][DC];
#pragma unroll
    for (int i = 0; i < 4; i++) {
#pragma unroll
        for (int c = 0; c < DC; c++) acc[i][c] = 0.0f;
    }
    const int kend = causal ? ember_imin(S, q0 + ROWS) : S;
    for (int k0 = 0; k0 < kend; k0 += BN) {
        __syncthreads();
        ember_att_load<D, BN, NT>(sk, k, lk.row, k0, S);
        ember_att_load<D, BN, NT>(sv, v, lv.row, k0, S);
        if (drop) ember_att_keep<ROWS, NT>(skeep, bh, q0, k0, T, S, dseed, doff, keep);
        __syncthreads();
        float s[4][2], dp[4][2];
#pragma unroll
        for (int i = 0; i < 4; i++) s[i][0] = s[i][1] = dp[i][0] = dp[i][1] = 0.0f;
        ember_att_abt<D, 2>(s, sq, sk, ty, tx);
        ember_att_abt<D, 2>(dp, sdo, sv, ty, tx);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = 4 * ty + i, qi = q0 + r;
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int kj = k0 + tx + 16 * j;
                const bool ok = qi < T && kj < S && (!causal || kj <= qi);
                const float p = ok ? exp2f(s[i][j] * sc - slse[r]) : 0.0f;
                float g = dp[i][j];
                if (drop) g = skeep[r * BN + tx + 16 * j] ? g * dscale : 0.0f;
                sds[r * LDP + tx + 16 * j] = p * (g - sdelta[r]);
            }
        }
        __syncthreads();
        ember_att_pv<D>(acc, sds, sk, ty, tx);
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int qi = q0 + 4 * ty + i;
        if (qi >= T) continue;
#pragma unroll
        for (int c = 0; c < DC; c++) dq[(long long)qi * ldq.row + tx + 16 * c] = acc[i][c] * scale;
    }
}

// dK and dV: a block of 128 threads per tile of 32 keys, over the tiles of
// queries that see them. dv = Σ_t M·P·dO, dk = scale·Σ_t dS·q.
template <int D>
__device__ __forceinline__ void ember_att_dkv(float* dk, float* dv, const float* q, const float* k, const float* v,
                                              const float* lse, const float* delta, const float* dout, int BH, int T,
                                              int S, int causal, float scale, float keep, float dscale, const int* stateOrNull,
                                              long long seed, long long offset, int H, ember_att_lay ldk, ember_att_lay ldv,
                                              ember_att_lay lq, ember_att_lay lk, ember_att_lay lv, ember_att_lay ldo) {
    constexpr int ROWS = 32, BQ = EMBER_ATT_BN, LD = D + 4, LDP = BQ + 4, NT = 128, DC = D / 16;
    __shared__ __attribute__((aligned(16))) float sk[ROWS * LD];
    __shared__ __attribute__((aligned(16))) float sv[ROWS * LD];
    __shared__ __attribute__((aligned(16))) float sq[BQ * LD];
    __shared__ __attribute__((aligned(16))) float sdo[BQ * LD];
    __shared__ __attribute__((aligned(16))) float sp[ROWS * LDP];
    __shared__ unsigned char skeep[BQ * ROWS];  // [query][key], as ember_att_keep draws them
    __shared__ float slse[BQ], sdelta[BQ];
    // Under a causal mask the first tiles of keys see the most queries:
    // they are launched first.
    const int tile = (int)(blockIdx.x / BH);
    const long long bh = blockIdx.x % BH;
    const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
    const int k0 = tile * ROWS;
    q += ember_att_head(lq, bh, H);
    k += ember_att_head(lk, bh, H);
    v += ember_att_head(lv, bh, H);
    dout += ember_att_head(ldo, bh, H);
    dk += ember_att_head(ldk, bh, H);
    dv += ember_att_head(ldv, bh, H);
    lse += bh * T;
    delta += bh * T;
    const bool drop = keep < 1.0f;
    unsigned long long dseed = 0, doff = 0;
    if (drop) ember_att_seed(stateOrNull, seed, offset, dseed, doff);
    const float sc = scale * EMBER_ATT_LOG2E;
    ember_att_load<D, ROWS, NT>(sk, k, lk.row, k0, S);
    ember_att_load<D, ROWS, NT>(sv, v, lv.row, k0, S);
    float gk[4][DC], gv[4][DC];
#pragma unroll
    for (int i = 0; i < 4; i++) {
#pragma unroll
        for (int c = 0; c < DC; c++) gk[i][c] = gv[i][c] = 0.0f;
    }
    // Queries before k0 see none of these keys under the causal mask.
    const int qstart = causal ? (k0 / BQ) * BQ : 0;
    for (int q0 = qstart; q0 < T; q0 += BQ) {
        __syncthreads();
        ember_att_load<D, BQ, NT>(sq, q, lq.row, q0, T);
        ember_att_load<D, BQ, NT>(sdo, dout, ldo.row, q0, T);
        if (tid < BQ) {
            const int qi = q0 + tid;
            slse[tid] = qi < T ? lse[qi] * EMBER_ATT_LOG2E : 0.0f;
            sdelta[tid] = qi < T ? delta[qi] : 0.0f;
        }
        if (drop) ember_att_keep<BQ, NT>(skeep, bh, q0, k0, T, S, dseed, doff, keep);
        __syncthreads();
        float s[4][2], dp[4][2];
#pragma unroll
        for (int i = 0; i < 4; i++) s[i][0] = s[i][1] = dp[i][0] = dp[i][1] = 0.0f;
        ember_att_abt<D, 2>(s, sk, sq, ty, tx);   // [key][query]
        ember_att_abt<D, 2>(dp, sv, sdo, ty, tx);  // dPᵀ
        float ds[4][2];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = 4 * ty + i, kj = k0 + r;
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int cq = tx + 16 * j, qi = q0 + cq;
                const bool ok = qi < T && kj < S && (!causal || kj <= qi);
                const float p = ok ? exp2f(s[i][j] * sc - slse[cq]) : 0.0f;
                float mk = 1.0f;
                if (drop) mk = skeep[cq * ROWS + r] ? dscale : 0.0f;
                ds[i][j] = p * (dp[i][j] * mk - sdelta[cq]);
                sp[r * LDP + cq] = p * mk;
            }
        }
        __syncthreads();
        ember_att_pv<D>(gv, sp, sdo, ty, tx);
        __syncthreads();
#pragma unroll
        for (int i = 0; i < 4; i++) {
#pragma unroll
            for (int j = 0; j < 2; j++) sp[(4 * ty + i) * LDP + tx + 16 * j] = ds[i][j];
        }
        __syncthreads();
        ember_att_pv<D>(gk, sp, sq, ty, tx);
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int kj = k0 + 4 * ty + i;
        if (kj >= S) continue;
#pragma unroll
        for (int c = 0; c < DC; c++) {
            dk[(long long)kj * ldk.row + tx + 16 * c] = gk[i][c] * scale;
            dv[(long long)kj * ldv.row + tx + 16 * c] = gv[i][c];
        }
    }
}

// The instantiations, written out so that each extern "C" signature is
// plain text (the Go side reads the signatures from the source).
extern "C" __global__ void ember_attention_fwd_d16(float* out, float* lse, const float* q, const float* k, const float* v,
                                              int BH, int T, int S, int causal, float scale, float keep, float dscale,
                                              const int* stateOrNull, long long seed, long long offset, int H,
                                              long long og, long long oh, long long orow, long long qg, long long qh,
                                              long long qrow, long long kg, long long kh, long long krow, long long vg,
                                              long long vh, long long vrow) {
    ember_att_fwd<16, 64>(out, lse, q, k, v, BH, T, S, causal, scale, keep, dscale, stateOrNull, seed, offset, H,
                          {og, oh, orow}, {qg, qh, qrow}, {kg, kh, krow}, {vg, vh, vrow});
}
extern "C" __global__ void ember_attention_dq_d16(float* dq, float* delta, const float* q, const float* k, const float* v,
                                             const float* o, const float* lse, const float* dout, int BH, int T, int S,
                                             int causal, float scale, float keep, float dscale, const int* stateOrNull,
                                             long long seed, long long offset, int H, long long dqg, long long dqh,
                                             long long dqrow, long long qg, long long qh, long long qrow, long long kg,
                                             long long kh, long long krow, long long vg, long long vh, long long vrow,
                                             long long og, long long oh, long long orow, long long dog, long long doh,
                                             long long dorow) {
    ember_att_dq<16>(dq, delta, q, k, v, o, lse, dout, BH, T, S, causal, scale, keep, dscale, stateOrNull, seed, offset, H,
                     {dqg, dqh, dqrow}, {qg, qh, qrow}, {kg, kh, krow}, {vg, vh, vrow}, {og, oh, orow},
                     {dog, doh, dorow});
}
extern "C" __global__ void ember_attention_dkv_d16(float* dk, float* dv, const float* q, const float* k, const float* v,
                                              const float* lse, const float* delta, const float* dout, int BH, int T,
                                              int S, int causal, float scale, float keep, float dscale, const int* stateOrNull,
                                              long long seed, long long offset, int H, long long dkg, long long dkh,
                                              long long dkrow, long long dvg, long long dvh, long long dvrow, long long qg,
                                              long long qh, long long qrow, long long kg, long long kh, long long krow,
                                              long long vg, long long vh, long long vrow, long long dog, long long doh,
                                              long long dorow) {
    ember_att_dkv<16>(dk, dv, q, k, v, lse, delta, dout, BH, T, S, causal, scale, keep, dscale, stateOrNull, seed, offset, H,
                      {dkg, dkh, dkrow}, {dvg, dvh, dvrow}, {qg, qh, qrow}, {kg, kh, krow}, {vg, vh, vrow},
                      {dog, doh, dorow});
}

extern "C" __global__ void ember_attention_fwd_d32(float* out, float* lse, const float* q, const float* k, const float* v,
                                              int BH, int T, int S, int causal, float scale, float keep, float dscale,
                                              const int* stateOrNull, long long seed, long long offset, int H,
                                              long long og, long long oh, long long orow, long long qg, long long qh,
                                              long long qrow, long long kg, long long kh, long long krow, long long vg,
                                              long long vh, long long vrow) {
    ember_att_fwd<32, 64>(out, lse, q, k, v, BH, T, S, causal, scale, keep, dscale, stateOrNull, seed, offset, H,
                          {og, oh, orow}, {qg, qh, qrow}, {kg, kh, krow}, {vg, vh, vrow});
}
extern "C" __global__ void ember_attention_dq_d32(float* dq, float* delta, const float* q, const float* k, const float* v,
                                             const float* o, const float* lse, const float* dout, int BH, int T, int S,
                                             int causal, float scale, float keep, float dscale, const int* stateOrNull,
                                             long long seed, long long offset, int H, long long dqg, long long dqh,
                                             long long dqrow, long long qg, long long qh, long long qrow, long long kg,
                                             long long kh, long long krow, long long vg, long long vh, long long vrow,
                                             long long og, long long oh, long long orow, long long dog, long long doh,
                                             long long dorow) {
    ember_att_dq<32>(dq, delta, q, k, v, o, lse, dout, BH, T, S, causal, scale, keep, dscale, stateOrNull, seed, offset, H,
                     {dqg, dqh, dqrow}, {qg, qh, qrow}, {kg, kh, krow}, {vg, vh, vrow}, {og, oh, orow},
                     {dog, doh, dorow});
}
extern "C" __global__ void ember_attention_dkv_d32(float* dk, float* dv, const float* q, const float* k, const float* v,
                                              const float* lse, const float* delta, const float* dout, int BH, int T,
                                              int S, int causal, float scale, float keep, float dscale, const int* stateOrNull,
                                              long long seed, long long offset, int H, long long dkg, long long dkh,
                                              long long dkrow, long long dvg, long long dvh, long long dvrow, long long qg,
                                              long long qh, long long qrow, long long kg, long long kh, long long krow,
                                              long long vg, long long vh, long long vrow, long long dog, long long doh,
                                              long long dorow) {
    ember_att_dkv<32>(dk, dv, q, k, v, lse, delta, dout, BH, T, S, causal, scale, keep, dscale, stateOrNull, seed, offset, H,
                      {dkg, dkh, dkrow}, {dvg, dvh, dvrow}, {qg, qh, qrow}, {kg, kh, krow}, {vg, vh, vrow},
                      {dog, doh, dorow});
}

extern "C" __global__ void ember_attention_fwd_d64(float* out, float* lse, const float* q, const float* k, const float* v,
                                              int BH, int T, int S, int causal, float scale, float keep, float dscale,
                                              const int* stateOrNull, long long seed, long long offset, int H,
                                              long long og, long long oh, long long orow, long long qg, long long qh,
                                              long long qrow, long long kg, long long kh, long long krow, long long vg,
                                              long long vh, long long vrow) {
    ember_att_fwd<64, 64>(out, lse, q, k, v, BH, T, S, causal, scale, keep, dscale, stateOrNull, seed, offset, H,
                          {og, oh, orow}, {qg, qh, qrow}, {kg, kh, krow}, {vg, vh, vrow});
}
extern "C" __global__ void ember_attention_dq_d64(float* dq, float* delta, const float* q, const float* k, const float* v,
                                             const float* o, const float* lse, const float* dout, int BH, int T, int S,
                                             int causal, float scale, float keep, float dscale, const int* stateOrNull,
                                             long long seed, long long offset, int H, long long dqg, long long dqh,
                                             long long dqrow, long long qg, long long qh, long long qrow, long long kg,
                                             long long kh, long long krow, long long vg, long long vh, long long vrow,
                                             long long og, long long oh, long long orow, long long dog, long long doh,
                                             long long dorow) {
    ember_att_dq<64>(dq, delta, q, k, v, o, lse, dout, BH, T, S, causal, scale, keep, dscale, stateOrNull, seed, offset, H,
                     {dqg, dqh, dqrow}, {qg, qh, qrow}, {kg, kh, krow}, {vg, vh, vrow}, {og, oh, orow},
                     {dog, doh, dorow});
}
extern "C" __global__ void ember_attention_dkv_d64(float* dk, float* dv, const float* q, const float* k, const float* v,
                                              const float* lse, const float* delta, const float* dout, int BH, int T,
                                              int S, int causal, float scale, float keep, float dscale, const int* stateOrNull,
                                              long long seed, long long offset, int H, long long dkg, long long dkh,
                                              long long dkrow, long long dvg, long long dvh, long long dvrow, long long qg,
                                              long long qh, long long qrow, long long kg, long long kh, long long krow,
                                              long long vg, long long vh, long long vrow, long long dog, long long doh,
                                              long long dorow) {
    ember_att_dkv<64>(dk, dv, q, k, v, lse, delta, dout, BH, T, S, causal, scale, keep, dscale, stateOrNull, seed, offset, H,
                      {dkg, dkh, dkrow}, {dvg, dvh, dvrow}, {qg, qh, qrow}, {kg, kh, krow}, {vg, vh, vrow},
                      {dog, doh, dorow});
}

