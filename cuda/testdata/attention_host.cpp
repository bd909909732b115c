// The driver of TestAttentionKernelsOnHost: kernels/attention.cu (with
// common.cu and random.cu before it, and host_emu.h included first) is
// compiled for the host with this file, run on fresh random inputs and
// checked against attention in double precision, dropout drawn with the
// same Philox function: output and the three gradients within 1e-5 of the
// largest value (float32 sums of at most 256 terms). Arguments: the
// forward's queries per block and threads per block (the Go side's
// constants). Exit status: the number of failed cases.
#include "host_launch.h"

static bool kept(unsigned long long seed, unsigned long long off, unsigned long long e, float keep) {
    unsigned long long ctr = off + e / 4;
    unsigned w[4] = {(unsigned)ctr, (unsigned)(ctr >> 32), 0, 0};
    ember_philox(w, (unsigned)seed, (unsigned)(seed >> 32));
    return ember_unit24(w[e % 4]) < keep;
}

// rb is x rounded to bfloat16 when lowp (ties to even), else x.
static double rb(double x, bool lowp) {
    return lowp ? (double)ember_bf16_bits(ember_host_bf16((float)x), 0) : x;
}

static std::vector<float> rounded(const std::vector<float>& x) {
    std::vector<float> r(x.size());
    for (size_t i = 0; i < x.size(); i++) r[i] = (float)rb(x[i], true);
    return r;
}

// ref is attention in double precision and its gradients for g. With lowp
// the dropped weights and the score gradients are rounded to bfloat16
// where they enter a product, as autocast's composed attention rounds them
// (the caller rounds q, k, v and g).
static void ref(int BH, int T, int S, int D, bool causal, float scale, float keep, float dscale, unsigned long long seed,
                unsigned long long off, const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                const std::vector<float>& g, std::vector<double>& out, std::vector<double>& dq, std::vector<double>& dk,
                std::vector<double>& dv, bool lowp = false) {
    out.assign(BH * T * D, 0); dq.assign(BH * T * D, 0); dk.assign(BH * S * D, 0); dv.assign(BH * S * D, 0);
    std::vector<double> p(S), dp(S), m(S);
    for (int h = 0; h < BH; h++)
        for (int i = 0; i < T; i++) {
            int keys = causal ? std::min(i + 1, S) : S;
            double mx = -1e300;
            for (int j = 0; j < keys; j++) {
                double s = 0;
                for (int c = 0; c < D; c++) s += (double)q[(h * T + i) * D + c] * k[(h * S + j) * D + c];
                p[j] = s * scale; mx = std::max(mx, p[j]);
            }
            double z = 0;
            for (int j = 0; j < keys; j++) { p[j] = exp(p[j] - mx); z += p[j]; }
            double sum = 0;
            for (int j = 0; j < keys; j++) {
                p[j] /= z;
                m[j] = keep < 1 ? (kept(seed, off, (unsigned long long)(h * T + i) * S + j, keep) ? dscale : 0) : 1;
                dp[j] = 0;
                const double pm = rb(p[j] * m[j], lowp);
                for (int c = 0; c < D; c++) {
                    out[(h * T + i) * D + c] += pm * v[(h * S + j) * D + c];
                    dv[(h * S + j) * D + c] += pm * g[(h * T + i) * D + c];
                    dp[j] += (double)g[(h * T + i) * D + c] * v[(h * S + j) * D + c];
                }
                dp[j] *= m[j];
                sum += p[j] * dp[j];
            }
            for (int j = 0; j < keys; j++) {
                double ds = rb(p[j] * (dp[j] - sum), lowp) * scale;
                for (int c = 0; c < D; c++) {
                    dq[(h * T + i) * D + c] += ds * k[(h * S + j) * D + c];
                    dk[(h * S + j) * D + c] += ds * q[(h * T + i) * D + c];
                }
            }
        }
}

static double err(const std::vector<float>& got, const std::vector<double>& want) {
    double m = 0, w = 0;
    for (size_t i = 0; i < want.size(); i++) { m = std::max(m, fabs(want[i])); w = std::max(w, fabs(got[i] - want[i])); }
    return w / m;
}

#define L3 long long, long long, long long
typedef void (*fwd_t)(float*, float*, const float*, const float*, const float*, int, int, int, int, float, float, float, const int*, long long, long long, int, L3, L3, L3, L3);
typedef void (*dq_t)(float*, float*, const float*, const float*, const float*, const float*, const float*, const float*, int, int, int, int, float, float, float, const int*, long long, long long, int, L3, L3, L3, L3, L3, L3);
typedef void (*dkv_t)(float*, float*, const float*, const float*, const float*, const float*, const float*, const float*, int, int, int, int, float, float, float, const int*, long long, long long, int, L3, L3, L3, L3, L3, L3);

// Lay is a tensor.AttentionLayout: row r of head bh (= g·H + i) at
// element g·group + i·head + r·row.
struct Lay { long long group, head, row; };
#define LA(l) (l).group, (l).head, (l).row

// Layouts is one case's memory: dense [BH, rows, D] tensors (H = 1), or
// with packed a transformer's (H inner heads, T = S): q, k, v and their
// gradients views of one [B, T, 3, H, D] projection each (at offsets 0,
// H·D, 2·H·D), out and dout [B, T, H, D]. The kernels read and write
// through the layouts; to and from convert to and from dense tensors, the
// rest of a buffer holding a sentinel the kernels must not overwrite.
struct Layouts {
    int BH, T, S, D, H;
    bool packed;
    Lay q, k, v, o;
    long long koff, voff, qkvLen, oLen;
    Layouts(int BH_, int T_, int S_, int D_, int H_) : BH(BH_), T(T_), S(S_), D(D_), H(H_ > 0 ? H_ : 1), packed(H_ > 0) {
        if (packed) {
            const long long row = 3LL * H * D;
            q = k = v = {T * row, D, row};
            o = {(long long)T * H * D, D, (long long)H * D};
            koff = (long long)H * D, voff = 2LL * H * D;
            qkvLen = BH / H * T * row, oLen = (long long)BH * T * D;
        } else {
            q = o = {(long long)T * D, (long long)T * D, D};
            k = v = {(long long)S * D, (long long)S * D, D};
            koff = voff = 0, qkvLen = oLen = 0;
        }
    }
    long long at(Lay l, int bh, int r, int c) const { return bh / H * l.group + bh % H * l.head + (long long)r * l.row + c; }
    // to writes dense x [BH, rows, D] into buf at off through l.
    template <class E>
    void to(std::vector<E>& buf, long long off, Lay l, int rows, const std::vector<E>& x) const {
        for (int bh = 0; bh < BH; bh++)
            for (int r = 0; r < rows; r++)
                for (int c = 0; c < D; c++) buf[off + at(l, bh, r, c)] = x[((long long)bh * rows + r) * D + c];
    }
    std::vector<float> from(const std::vector<float>& buf, long long off, Lay l, int rows) const {
        std::vector<float> x((long long)BH * rows * D);
        for (int bh = 0; bh < BH; bh++)
            for (int r = 0; r < rows; r++)
                for (int c = 0; c < D; c++) x[((long long)bh * rows + r) * D + c] = buf[off + at(l, bh, r, c)];
        return x;
    }
};

static const float kSentinel = 1234.5f;

// sentinelOf is kSentinel as an element of a buffer of E (a float, or
// the bfloat16 bits of the packed inputs of the bf16h kernels).
template <class E> static E sentinelOf();
template <> float sentinelOf<float>() { return kSentinel; }
template <> unsigned short sentinelOf<unsigned short>() { return (unsigned short)ember_host_bf16(kSentinel); }

// bf16Of is x rounded to bfloat16 bits (ties to even), as a cast does.
static std::vector<unsigned short> bf16Of(const std::vector<float>& x) {
    std::vector<unsigned short> r(x.size());
    for (size_t i = 0; i < x.size(); i++) r[i] = (unsigned short)ember_host_bf16(x[i]);
    return r;
}

// untouched counts the sentinels of buf that the kernels overwrote: the
// elements of no tensor at the offsets offs of the layouts ls.
template <class E>
static int untouched(const Layouts& L, const std::vector<E>& buf, std::vector<std::pair<long long, Lay>> views, int rows) {
    std::vector<bool> mine(buf.size());
    for (auto& [off, l] : views)
        for (int bh = 0; bh < L.BH; bh++)
            for (int r = 0; r < rows; r++)
                for (int c = 0; c < L.D; c++) mine[off + L.at(l, bh, r, c)] = true;
    int bad = 0;
    for (size_t i = 0; i < buf.size(); i++) bad += !mine[i] && buf[i] != sentinelOf<E>();
    return bad;
}

// Run is the three kernels of one case through its layouts: the dense
// results (out, dq, dk, dv) and how many elements outside the tensors
// they wrote.
struct Run { std::vector<float> out, dq, dk, dv; int stray; };

template <class E, class F, class Q, class KV>
static Run runLaid(const Layouts& L, int fwdRows, int fwdNT, int bwdRows, int bwdNT, F fwd, Q dqk, KV dkv,
                   const std::vector<E>& q, const std::vector<E>& k, const std::vector<E>& v,
                   const std::vector<float>& g, bool causal, float scale, float keep, float dscale, const int* st,
                   long long sd, long long of) {
    const int BH = L.BH, T = L.T, S = L.S, D = L.D;
    std::vector<float> lse(BH * T), delta(BH * T);
    Run res;
    if (!L.packed) {
        res.out.resize(q.size()), res.dq.resize(q.size()), res.dk.resize(k.size()), res.dv.resize(v.size());
        launch((T + fwdRows - 1) / fwdRows * BH, fwdNT, [&] { fwd(res.out.data(), lse.data(), q.data(), k.data(), v.data(), BH, T, S, causal, scale, keep, dscale, st, sd, of, L.H, LA(L.o), LA(L.q), LA(L.k), LA(L.v)); });
        launch((T + bwdRows - 1) / bwdRows * BH, bwdNT, [&] { dqk(res.dq.data(), delta.data(), q.data(), k.data(), v.data(), res.out.data(), lse.data(), g.data(), BH, T, S, causal, scale, keep, dscale, st, sd, of, L.H, LA(L.q), LA(L.q), LA(L.k), LA(L.v), LA(L.o), LA(L.o)); });
        launch((S + bwdRows - 1) / bwdRows * BH, bwdNT, [&] { dkv(res.dk.data(), res.dv.data(), q.data(), k.data(), v.data(), lse.data(), delta.data(), g.data(), BH, T, S, causal, scale, keep, dscale, st, sd, of, L.H, LA(L.k), LA(L.v), LA(L.q), LA(L.k), LA(L.v), LA(L.o)); });
        res.stray = 0;
        return res;
    }
    std::vector<E> qkv(L.qkvLen, sentinelOf<E>());
    std::vector<float> gb(L.oLen), ob(L.oLen, kSentinel), dqkv(L.qkvLen, kSentinel);
    L.to(qkv, 0, L.q, T, q), L.to(qkv, L.koff, L.k, S, k), L.to(qkv, L.voff, L.v, S, v), L.to(gb, 0, L.o, T, g);
    const E *pq = qkv.data(), *pk = qkv.data() + L.koff, *pv = qkv.data() + L.voff;
    launch((T + fwdRows - 1) / fwdRows * BH, fwdNT, [&] { fwd(ob.data(), lse.data(), pq, pk, pv, BH, T, S, causal, scale, keep, dscale, st, sd, of, L.H, LA(L.o), LA(L.q), LA(L.k), LA(L.v)); });
    launch((T + bwdRows - 1) / bwdRows * BH, bwdNT, [&] { dqk(dqkv.data(), delta.data(), pq, pk, pv, ob.data(), lse.data(), gb.data(), BH, T, S, causal, scale, keep, dscale, st, sd, of, L.H, LA(L.q), LA(L.q), LA(L.k), LA(L.v), LA(L.o), LA(L.o)); });
    launch((S + bwdRows - 1) / bwdRows * BH, bwdNT, [&] { dkv(dqkv.data() + L.koff, dqkv.data() + L.voff, pq, pk, pv, lse.data(), delta.data(), gb.data(), BH, T, S, causal, scale, keep, dscale, st, sd, of, L.H, LA(L.k), LA(L.v), LA(L.q), LA(L.k), LA(L.v), LA(L.o)); });
    res.out = L.from(ob, 0, L.o, T);
    res.dq = L.from(dqkv, 0, L.q, T), res.dk = L.from(dqkv, L.koff, L.k, S), res.dv = L.from(dqkv, L.voff, L.v, S);
    res.stray = untouched(L, dqkv, {{0, L.q}, {L.koff, L.k}, {L.voff, L.v}}, T) + untouched(L, ob, {{0, L.o}}, T) +
                untouched(L, qkv, {{0, L.q}, {L.koff, L.k}, {L.voff, L.v}}, T);
    return res;
}

// bf16Cases checks attention_bf16.cu (D = 64, blocks of 64 rows and 128
// threads) against ref on the bfloat16-rounded inputs with the weights and
// score gradients rounded as autocast's composed attention rounds them.
// dV = Σ bf16(M·P)·dO rounds the same normalised weights as ref: within
// 1e-4 of the largest value (float32 sums; this also pins the dropout
// bits). The output rounds its weights before they are normalised, and
// against the running maximum, so each weight may round the other way
// (2^-8 relative), and dQ, dK inherit that through delta = rowsum(dO·O):
// within 1e-2, about 5·2^-9 (measured at most 4.4e-3). Against the
// unrounded float64 attention all four within 3e-2 (tensortest's
// tolAutocast: the inputs' 2^-9 rounding carried through the softmax;
// measured at most 7.5e-3).
static int bf16Cases() {
    struct C { int BH, T, S; bool causal; float p; bool state; int H; };
    C cases[] = {{1, 130, 130, true, 0.2f, false, 0}, {2, 70, 45, true, 0.2f, false, 0}, {2, 45, 70, true, 0, true, 0},
                 {3, 33, 40, false, 0.5f, false, 0}, {1, 19, 21, false, 0, false, 0}, {1, 64, 128, false, 0.2f, true, 0},
                 {1, 256, 256, true, 0.2f, false, 0}, {1, 100, 37, false, 0.3f, false, 0},
                 // A transformer's layout: q, k, v views of [B, T, 3, H, D], out [B, T, H, D].
                 {6, 70, 70, true, 0.2f, false, 3}, {4, 130, 130, true, 0, true, 2}, {2, 45, 45, false, 0.3f, false, 1}};
    const int D = 64;
    int fails = 0;
    for (auto c : cases) {
        std::mt19937 rng(c.T * 11 + c.S);
        std::normal_distribution<float> nd;
        auto mk = [&](int n) { std::vector<float> x(n); for (auto& e : x) e = nd(rng); return x; };
        auto q = mk(c.BH * c.T * D), k = mk(c.BH * c.S * D), v = mk(c.BH * c.S * D), g = mk(c.BH * c.T * D);
        float scale = 1 / sqrtf((float)D), keep = 1 - c.p, dscale = 1 / (1 - c.p);
        unsigned long long seed = 0x5eedd80full, off = 777;
        int state[4] = {(int)(unsigned)seed, (int)(unsigned)(seed >> 32), (int)(unsigned)off, (int)(unsigned)(off >> 32)};
        const int* st = c.state ? state : nullptr;
        long long sd = c.state ? 0 : (long long)seed, of = c.state ? 0 : (long long)off;
        Layouts L(c.BH, c.T, c.S, D, c.H);
        // Without the mask words (nullptr): the backward passes draw the
        // dropout's bits again.
        auto fwd0 = [&](auto... a) { ember_attention_bf16_fwd_d64(a..., nullptr); };
        auto dq0 = [&](auto... a) { ember_attention_bf16_dq_d64(a..., nullptr, nullptr); };
        auto dkv0 = [&](auto... a) { ember_attention_bf16_dkv_d64(a..., nullptr, nullptr); };
        Run run = runLaid(L, 64, 128, 64, 128, fwd0, dq0, dkv0, q, k, v, g, c.causal, scale, keep, dscale, st, sd, of);
        // The same with q, k and v cast to bfloat16 first (the bf16h
        // kernels): the same bits.
        auto fwdh = [&](auto... a) { ember_attention_bf16h_fwd_d64(a..., nullptr); };
        auto dqh = [&](auto... a) { ember_attention_bf16h_dq_d64(a..., nullptr, nullptr); };
        auto dkvh = [&](auto... a) { ember_attention_bf16h_dkv_d64(a..., nullptr, nullptr); };
        Run runh = runLaid(L, 64, 128, 64, 128, fwdh, dqh, dkvh, bf16Of(q), bf16Of(k), bf16Of(v), g, c.causal, scale, keep, dscale, st, sd, of);
        // And with the forward pass's kept bits stored for the backward
        // passes (the mask words, filled with a pattern first): the same
        // bits again.
        std::vector<unsigned> mask((size_t)c.BH * ((c.T + 63) / 64) * ((c.S + 63) / 64) * 128, 0xa5a5a5a5u);
        // dO's bfloat16 copy from the dQ kernel for the dK/dV kernel too.
        std::vector<unsigned short> doutb((size_t)c.BH * c.T * D, 0xa5a5);
        auto fwdM = [&](auto... a) { ember_attention_bf16h_fwd_d64(a..., mask.data()); };
        auto dqM = [&](auto... a) { ember_attention_bf16h_dq_d64(a..., mask.data(), doutb.data()); };
        auto dkvM = [&](auto... a) { ember_attention_bf16h_dkv_d64(a..., mask.data(), doutb.data()); };
        Run runm = runLaid(L, 64, 128, 64, 128, fwdM, dqM, dkvM, bf16Of(q), bf16Of(k), bf16Of(v), g, c.causal, scale, keep,
                           dscale, st, sd, of);
        const bool same = runh.out == run.out && runh.dq == run.dq && runh.dk == run.dk && runh.dv == run.dv && runh.stray == 0 &&
                          runm.out == run.out && runm.dq == run.dq && runm.dk == run.dk && runm.dv == run.dv && runm.stray == 0;
        auto &out = run.out, &dq = run.dq, &dk = run.dk, &dv = run.dv;
        std::vector<double> ro, rq, rk, rv, fo, fq, fk, fv;
        ref(c.BH, c.T, c.S, D, c.causal, scale, keep, dscale, seed, off, rounded(q), rounded(k), rounded(v), rounded(g), ro, rq, rk, rv, true);
        ref(c.BH, c.T, c.S, D, c.causal, scale, keep, dscale, seed, off, q, k, v, g, fo, fq, fk, fv);
        double e[4] = {err(out, ro), err(dq, rq), err(dk, rk), err(dv, rv)};
        double f[4] = {err(out, fo), err(dq, fq), err(dk, fk), err(dv, fv)};
        bool ok = e[3] < 1e-4 && run.stray == 0 && same;
        for (int i = 0; i < 4; i++) ok = ok && e[i] < 1e-2 && f[i] < 3e-2;
        fails += !ok;
        printf("%s bf16 BH %d T %d S %d D %d causal %d p %.1f state %d packed H %d (stray writes %d, bfloat16 inputs: %s): rounded out %.2e dq %.2e dk %.2e dv %.2e; float64 out %.2e dq %.2e dk %.2e dv %.2e\n",
               ok ? "ok  " : "FAIL", c.BH, c.T, c.S, D, c.causal, c.p, c.state, c.H, run.stray, same ? "the same bits" : "DIFFER", e[0], e[1], e[2], e[3], f[0], f[1], f[2], f[3]);
    }
    return fails;
}

int main(int argc, char** argv) {
    int fwdRows = atoi(argv[1]), fwdNT = atoi(argv[2]);
    struct C { int BH, T, S, D; bool causal; float p; bool state; int H; };
    C cases[] = {{1, 130, 130, 64, true, 0.2f, false, 0}, {2, 70, 45, 16, true, 0, false, 0}, {2, 45, 70, 16, true, 0.2f, true, 0},
                 {3, 33, 40, 32, false, 0.5f, false, 0}, {1, 19, 21, 16, false, 0, false, 0},
                 // A transformer's layout: q, k, v views of [B, T, 3, H, D], out [B, T, H, D].
                 {6, 70, 70, 16, true, 0.2f, false, 3}, {4, 45, 45, 32, false, 0, true, 2}, {2, 130, 130, 64, true, 0.2f, false, 2}};
    int fails = 0;
    for (auto c : cases) {
        std::mt19937 rng(c.T * 7 + c.S);
        std::normal_distribution<float> nd;
        auto mk = [&](int n) { std::vector<float> x(n); for (auto& e : x) e = nd(rng); return x; };
        auto q = mk(c.BH * c.T * c.D), k = mk(c.BH * c.S * c.D), v = mk(c.BH * c.S * c.D), g = mk(c.BH * c.T * c.D);
        float scale = 1 / sqrtf((float)c.D), keep = 1 - c.p, dscale = 1 / (1 - c.p);
        unsigned long long seed = 0x5eedd80full, off = 12345;
        int state[4] = {(int)(unsigned)seed, (int)(unsigned)(seed >> 32), (int)(unsigned)off, (int)(unsigned)(off >> 32)};
        const int* st = c.state ? state : nullptr;
        fwd_t F = c.D == 16 ? ember_attention_fwd_d16 : c.D == 32 ? ember_attention_fwd_d32 : ember_attention_fwd_d64;
        dq_t Q = c.D == 16 ? ember_attention_dq_d16 : c.D == 32 ? ember_attention_dq_d32 : ember_attention_dq_d64;
        dkv_t KV = c.D == 16 ? ember_attention_dkv_d16 : c.D == 32 ? ember_attention_dkv_d32 : ember_attention_dkv_d64;
        long long sd = c.state ? 0 : (long long)seed, of = c.state ? 0 : (long long)off;
        Layouts L(c.BH, c.T, c.S, c.D, c.H);
        Run run = runLaid(L, fwdRows, fwdNT, 32, 128, F, Q, KV, q, k, v, g, c.causal, scale, keep, dscale, st, sd, of);
        auto &out = run.out, &dq = run.dq, &dk = run.dk, &dv = run.dv;
        std::vector<double> ro, rq, rk, rv;
        ref(c.BH, c.T, c.S, c.D, c.causal, scale, keep, dscale, seed, off, q, k, v, g, ro, rq, rk, rv);
        double e[4] = {err(out, ro), err(dq, rq), err(dk, rk), err(dv, rv)};
        bool ok = e[0] < 1e-5 && e[1] < 1e-5 && e[2] < 1e-5 && e[3] < 1e-5 && run.stray == 0;
        fails += !ok;
        printf("%s BH %d T %d S %d D %d causal %d p %.1f state %d packed H %d (stray writes %d): out %.2e dq %.2e dk %.2e dv %.2e\n", ok ? "ok  " : "FAIL", c.BH, c.T, c.S, c.D, c.causal, c.p, c.state, c.H, run.stray, e[0], e[1], e[2], e[3]);
    }
    fails += bf16Cases();
    return fails;
}
