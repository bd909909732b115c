// The driver of TestChannelsLastKernelsOnHost: kernels/norm.cu and
// kernels/channels_last.cu (common.cu before them, host_emu.h included
// first) compiled for the host with this file. It runs the channels-last
// kernels with the launches cuda/channels_last.go makes, on small grids so
// that blocks loop, and checks them against plain loops over the same
// bfloat16 values:
//   - max pooling and its gradient bit for bit (ties, NaN, the rows and
//     columns past the last window, ceil mode's partial windows);
//   - batch norm's statistics, output (with ReLU or GELU) and gradients
//     against a double two-pass reference: statistics within 1e-5
//     relative, outputs within one bfloat16 step, dx within one step plus
//     1e-3 of the largest; its finish's other modes (a bias gradient's
//     sum, the evaluation statistics) against a double sum and bit for
//     bit;
//   - the form's GELU and its derivative against double erfc over [-12,
//     12]: within (2 + x²/2)·1e-6 of the value (of |cdf| + |x·pdf| for the
//     derivative; the exponential's argument, -x²/2, is rounded to float);
//   - a first layer's direct convolution (ember_cl_conv_small, with bias
//     and ReLU) against a float sum over the taps: within one bfloat16
//     step of the sum and of the result;
//   - its filter gradient (ember_cl_conv_dw_small, then conv.cu's join)
//     against a double sum of the products, rounded and added: within one
//     bfloat16 step and 1e-5 of the sum of |products|;
//   - batch norm's input gradient taken into max pooling's gradient in one
//     pass, against the two passes, bit for bit;
//   - the channel padding of a convolution's input, and the flipped
//     filter of its data gradient's forward pass, bit for bit;
//   - max pooling with batch norm's sums of its output in the same pass,
//     against the two passes, bit for bit;
//   - the elementwise passes (an activation, its gradient, a bias, an
//     addition) against the same function of each element, bit for bit.
// Exit status: the number of failed checks (at most 99).
#include "host_launch.h"

static unsigned short bits(float v) {
    unsigned u;
    memcpy(&u, &v, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}
static float widen(unsigned short h) {
    unsigned u = (unsigned)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static float bf(float v) { return widen(bits(v)); }

static int failed = 0;
static bool check(bool ok, const char* what, long long i, double got, double want) {
    if (!ok && failed++ < 20) printf("  %s [%lld] = %.9g, want %.9g\n", what, i, got, want);
    return ok;
}

// close is |got - want| <= one bfloat16 step of want + tol.
static bool close(double got, double want, double tol) {
    return fabs(got - want) <= fabs(want) / 128 + tol || (got != got && want != want);
}

static std::mt19937_64 rng(7);
static std::vector<unsigned short> randomBits(size_t n, float scale, float shift) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<unsigned short> v(n);
    for (auto& h : v) h = bits(shift + scale * normal(rng));
    return v;
}

static void maxpool(int N, int C, int H, int W, int K, bool ceil) {
    const int OH = ceil ? (H + K - 1) / K : H / K, OW = ceil ? (W + K - 1) / K : W / K;
    std::vector<unsigned short> x = randomBits((size_t)N * H * W * C, 1, 0), dy = randomBits((size_t)N * OH * OW * C, 1, 0);
    for (size_t i = 0; i < x.size(); i += 3) x[i] = 0; // ties
    x[5] = 0x7fc0;                                    // a NaN wins its window
    std::vector<unsigned short> y(dy.size()), dx(x.size(), 0x1234);
    std::vector<unsigned char> idx(dy.size());
    const long long n8 = (long long)N * OH * OW * C / 8;
    unsigned short *py = y.data(), *pdx = dx.data();
    const unsigned short *px = x.data(), *pdy = dy.data();
    unsigned char* pi = idx.data();
    launch(3, 64, [=] { ember_cl_maxpool(py, pi, px, H, W, C, OH, OW, K, K, n8); });
    launch(2, 64, [=] { ember_cl_maxpool_backward(pdx, pdy, pi, H, W, C, OH, OW, K, K, n8); });
    std::vector<float> want(x.size(), 0.0f);
    int bad = 0;
    for (int n = 0; n < N; n++)
        for (int oy = 0; oy < OH; oy++)
            for (int ox = 0; ox < OW; ox++)
                for (int c = 0; c < C; c++) {
                    float best = 0;
                    int at = -1;
                    for (int h = oy * K; h < std::min(oy * K + K, H); h++)
                        for (int w = ox * K; w < std::min(ox * K + K, W); w++) {
                            const float v = widen(x[(((size_t)n * H + h) * W + w) * C + c]);
                            if (at < 0 || v > best || v != v) best = v, at = h * W + w;
                        }
                    const size_t o = (((size_t)n * OH + oy) * OW + ox) * C + c;
                    const float got = widen(y[o]);
                    bad += !check(got == best || (got != got && best != best), "maxpool y", o, got, best);
                    want[((size_t)n * H * W + at) * C + c] = widen(dy[o]);
                }
    for (size_t i = 0; i < x.size(); i++) bad += !check(widen(dx[i]) == want[i], "maxpool dx", i, widen(dx[i]), want[i]);
    if (K == 2) {
        // The entry point compiled for 2x2 windows: the same bits.
        std::vector<unsigned short> y2(y.size(), 0x1234);
        std::vector<unsigned char> idx2(idx.size(), 0xee);
        unsigned short* py2 = y2.data();
        unsigned char* pi2 = idx2.data();
        launch(3, 64, [=] { ember_cl_maxpool2(py2, pi2, px, H, W, C, OH, OW, K, K, n8); });
        for (size_t i = 0; i < y.size(); i++) {
            bad += !check(y2[i] == y[i], "maxpool2 y", i, widen(y2[i]), widen(y[i]));
            bad += !check(idx2[i] == idx[i], "maxpool2 idx", i, idx2[i], idx[i]);
        }
    }
    printf("maxpool N=%d C=%d %dx%d window %d ceil=%d: %s\n", N, C, H, W, K, ceil, bad ? "FAIL" : "ok");
}

// same is bitwise equality, a NaN equal to any NaN.
static bool same(float a, float b) { return memcmp(&a, &b, 4) == 0 || (a != a && b != b); }

// maxpoolStats: ember_cl_maxpool_stats (ember_cl_maxpool2_stats for 2x2
// windows) against ember_cl_maxpool then ember_cl_stats over its output
// on the same grid: the same pooled values, positions and partial sums.
static void maxpoolStats(int N, int C, int H, int W, int K, bool ceil) {
    const int OH = ceil ? (H + K - 1) / K : H / K, OW = ceil ? (W + K - 1) / K : W / K;
    const int rows = N * OH * OW, nt = 256, R = nt / (C / 8), nb = std::min((rows + R - 1) / R, 3);
    std::vector<unsigned short> x = randomBits((size_t)N * H * W * C, 1.5f, 0.25f);
    for (size_t i = 0; i < x.size(); i += 5) x[i] = 0; // ties
    std::vector<unsigned short> y1(rows * C), y2(rows * C, 0x1234);
    std::vector<unsigned char> i1(rows * C), i2(rows * C, 0xee);
    std::vector<float> p1(2 * nb * C), p2(2 * nb * C, -1);
    const unsigned short* px = x.data();
    unsigned short *py1 = y1.data(), *py2 = y2.data();
    unsigned char *pi1 = i1.data(), *pi2 = i2.data();
    float *pp1 = p1.data(), *pp2 = p2.data();
    const long long n8 = (long long)rows * C / 8;
    launch(3, 64, [=] { ember_cl_maxpool(py1, pi1, px, H, W, C, OH, OW, K, K, n8); });
    launch(nb, nt, [=] { ember_cl_stats(pp1, py1, rows, C); });
    if (K == 2) {
        launch(nb, nt, [=] { ember_cl_maxpool2_stats(pp2, py2, pi2, px, H, W, C, OH, OW, K, K, rows); });
    } else {
        launch(nb, nt, [=] { ember_cl_maxpool_stats(pp2, py2, pi2, px, H, W, C, OH, OW, K, K, rows); });
    }
    int bad = 0;
    for (size_t i = 0; i < y1.size(); i++) {
        bad += !check(y2[i] == y1[i], "pooled y", i, widen(y2[i]), widen(y1[i]));
        bad += !check(i2[i] == i1[i], "pooled idx", i, i2[i], i1[i]);
    }
    for (size_t i = 0; i < p1.size(); i++) bad += !check(same(p2[i], p1[i]), "partial sum", i, p2[i], p1[i]);
    printf("maxpool with statistics N=%d C=%d %dx%d window %d ceil=%d (%d blocks): %s\n", N, C, H, W, K, ceil, nb, bad ? "FAIL" : "ok");
}

// pointwise: ember_cl_pointwise of each kind over [rows, C] on a small
// grid (threads take several groups, two at a time, and an odd one last)
// against the same function of each element, bit for bit.
static void pointwise(int rows, int C, int kind, int act) {
    std::vector<unsigned short> x = randomBits((size_t)rows * C, 2, 0), dy = randomBits((size_t)rows * C, 1, 0.5f);
    std::vector<float> bias(C);
    for (int c = 0; c < C; c++) bias[c] = 0.1f * c - 1;
    std::vector<unsigned short> y(x.size(), 0x1234);
    const unsigned short *px = x.data(), *pdy = dy.data();
    const float* pb = bias.data();
    unsigned short* py = y.data();
    const long long n8 = (long long)rows * C / 8;
    launch(3, 64, [=] { ember_cl_pointwise(py, px, pdy, pb, act, kind, n8, C); });
    int bad = 0;
    // GELU's own passes (channels_last.go takes them for GELU), bit for
    // bit against the general one.
    const bool gelu = act == EMBER_BN_ACT_GELU && (kind == EMBER_CL_ACT || kind == EMBER_CL_ACT_GRAD);
    std::vector<unsigned short> yg(x.size(), 0x1234);
    unsigned short* pyg = yg.data();
    if (gelu) launch(2, 64, [=] {
        if (kind == EMBER_CL_ACT) ember_cl_gelu_fwd(pyg, px, n8);
        else ember_cl_gelu_bwd(pyg, px, pdy, n8);
    });
    for (size_t i = 0; i < x.size() && gelu; i++) bad += !check(yg[i] == y[i], "GELU pass y", i, widen(yg[i]), widen(y[i]));
    for (size_t i = 0; i < x.size(); i++) {
        const float xv = widen(x[i]), gv = widen(dy[i]);
        float want;
        switch (kind) {
        case EMBER_CL_ACT: want = ember_cl_act(act, xv); break;
        case EMBER_CL_BIAS:
            want = xv + bias[i % C];
            if (act) want = ember_cl_act(act, want);
            break;
        case EMBER_CL_ACT_GRAD: want = ember_cl_act_grad(act, xv, gv); break;
        default: want = xv + gv;
        }
        bad += !check(y[i] == bits(want), "pointwise y", i, widen(y[i]), bf(want));
    }
    printf("pointwise rows=%d C=%d kind=%d act=%d%s: %s\n", rows, C, kind, act, gelu ? ", GELU's passes too" : "", bad ? "FAIL" : "ok");
}

// batchnorm runs the passes of batch norm over [rows, C]; with gInDx, as
// cuda/channels_last.go queues them for an activation: the sums pass
// leaves g = dy·act'(z) in dx's memory and the dx pass reads it there
// without the activation.
static void batchnorm(int rows, int C, int act, bool affine, bool gInDx = false) {
    const int nt = 256, G = C / 8, R = nt / G, nb = std::min((rows + R - 1) / R, 3);
    std::vector<unsigned short> x = randomBits((size_t)rows * C, 2, 3), dy = randomBits((size_t)rows * C, 1, 0);
    std::vector<float> w(C, 1), b(C, 0), mean(C), inv(C), rm(C, 0.5f), rv(C, 2), part(2 * nb * C), tab(6 * C), dw(C, 0.25f), db(C, -1);
    if (affine)
        for (int c = 0; c < C; c++) w[c] = 0.5f + 0.1f * c, b[c] = 0.2f - 0.05f * c;
    std::vector<unsigned short> y(x.size()), dx(x.size());
    const float *pw = affine ? w.data() : nullptr, *pb = affine ? b.data() : nullptr;
    float *pm = mean.data(), *pinv = inv.data(), *prm = rm.data(), *prv = rv.data(), *pp = part.data(), *pt = tab.data();
    float *pdw = dw.data(), *pdb = db.data();
    const unsigned short *px = x.data(), *pdy = dy.data();
    unsigned short *py = y.data(), *pdx = dx.data();
    const long long n8 = (long long)rows * C / 8;
    launch(nb, nt, [=] { ember_cl_stats(pp, px, rows, C); });
    launch(C / 8, EMBER_CL_FIN_THREADS, [=] { ember_cl_bn_finalize(pp, nb, C, rows, 0, px, pm, pinv, prm, prv, 0.1f, 1e-5f, pw, pb, nullptr, nullptr, 0, 0, pt); });
    launch(2, nt, [=] { ember_cl_bn_apply(py, px, pt, act, rows, C); });
    launch(nb, nt, [=] { ember_cl_grad_sums(pp, gInDx ? pdx : nullptr, px, pdy, pm, pinv, pw, pb, act, rows, C); });
    launch(C / 8, EMBER_CL_FIN_THREADS, [=] { ember_cl_bn_finalize(pp, nb, C, rows, 1, nullptr, pm, pinv, nullptr, nullptr, 0, 0, pw, pb, pdw, pdb, 1, 1, pt); });
    if (gInDx) {
        launch(3, nt, [=] { ember_cl_bn_dx(pdx, px, pdx, pt, 0, 1, rows, C); });
    } else {
        launch(3, nt, [=] { ember_cl_bn_dx(pdx, px, pdy, pt, act, 1, rows, C); });
    }
    int bad = 0;
    for (int c = 0; c < C; c++) {
        double s = 0, q = 0;
        for (int r = 0; r < rows; r++) s += widen(x[(size_t)r * C + c]);
        const double mu = s / rows;
        for (int r = 0; r < rows; r++) q += (widen(x[(size_t)r * C + c]) - mu) * (widen(x[(size_t)r * C + c]) - mu);
        const double var = q / rows, iv = 1 / sqrt(var + 1e-5);
        bad += !check(fabs(mean[c] - mu) <= 1e-5 * fabs(mu), "mean", c, mean[c], mu);
        bad += !check(fabs(inv[c] - iv) <= 1e-5 * iv, "1/std", c, inv[c], iv);
        bad += !check(fabs(rv[c] - (0.9 * 2 + 0.1 * var * rows / (rows - 1))) <= 1e-5 * rv[c], "running var", c, rv[c], 0.9 * 2 + 0.1 * var * rows / (rows - 1));
        bad += !check(fabs(rm[c] - (0.9 * 0.5 + 0.1 * mu)) <= 1e-5 * (1 + fabs(rm[c])), "running mean", c, rm[c], 0.9 * 0.5 + 0.1 * mu);
        double sg = 0, sgx = 0, biggest = 0;
        std::vector<double> g(rows), xh(rows);
        for (int r = 0; r < rows; r++) {
            const size_t i = (size_t)r * C + c;
            xh[r] = (widen(x[i]) - mean[c]) * inv[c];
            const double z = xh[r] * w[c] + b[c];
            double a = z, da = 1;
            if (act == 11) a = z > 0 ? z : 0, da = z > 0;
            if (act == 13) a = z * 0.5 * (1 + erf(z / sqrt(2.0))), da = 0.5 * (1 + erf(z / sqrt(2.0))) + z * exp(-z * z / 2) / sqrt(2 * M_PI);
            bad += !check(close(widen(y[i]), a, 1e-6), "y", i, widen(y[i]), a);
            g[r] = widen(dy[i]) * da;
            sg += g[r];
            sgx += g[r] * xh[r];
        }
        bad += !check(fabs(db[c] - (-1 + sg)) <= 1e-4 * (1 + fabs(sg)), "dbias", c, db[c], -1 + sg);
        bad += !check(fabs(dw[c] - (0.25 + sgx)) <= 1e-4 * (1 + fabs(sgx)), "dweight", c, dw[c], 0.25 + sgx);
        std::vector<double> want(rows);
        for (int r = 0; r < rows; r++) {
            want[r] = w[c] * inv[c] * (g[r] - sg / rows - xh[r] * sgx / rows);
            biggest = std::max(biggest, fabs(want[r]));
        }
        for (int r = 0; r < rows; r++) {
            const size_t i = (size_t)r * C + c;
            bad += !check(close(widen(dx[i]), want[r], 1e-3 * biggest), "dx", i, widen(dx[i]), want[r]);
        }
    }
    printf("batch norm rows=%d C=%d act=%d affine=%d g in dx=%d: %s\n", rows, C, act, affine, gInDx, bad ? "FAIL" : "ok");
}

// finalizeModes runs ember_cl_bn_finalize's other two modes over C
// channels: EMBER_CL_SUM (a bias gradient: dbias += the nb partials' sum,
// against a double sum) and EMBER_CL_EVAL (the statistics and the table
// from the running statistics, exactly as the kernel's float and double
// steps give them).
static void finalizeModes(int nb, int C) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> part(2 * nb * C), db(C), rm(C), rv(C), w(C), b(C), mean(C), inv(C), tab(6 * C);
    for (auto& v : part) v = normal(rng);
    for (int c = 0; c < C; c++) db[c] = normal(rng), rm[c] = normal(rng), rv[c] = 0.5f + fabsf(normal(rng)), w[c] = normal(rng), b[c] = normal(rng);
    std::vector<float> db0(db);
    const float *pp = part.data(), *pw = w.data(), *pb = b.data();
    float *pdb = db.data(), *prm = rm.data(), *prv = rv.data(), *pm = mean.data(), *pinv = inv.data(), *pt = tab.data();
    launch(C / 8, EMBER_CL_FIN_THREADS, [=] { ember_cl_bn_finalize(pp, nb, C, 1000, 2, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 0, nullptr, nullptr, nullptr, pdb, 0, 1, nullptr); });
    launch(C / 8, EMBER_CL_FIN_THREADS, [=] { ember_cl_bn_finalize(nullptr, 0, C, 1000, 3, nullptr, pm, pinv, prm, prv, 0.1f, 1e-5f, pw, pb, nullptr, nullptr, 0, 0, pt); });
    int bad = 0;
    for (int c = 0; c < C; c++) {
        double s = 0, mag = 0;
        for (int q = 0; q < nb; q++) s += part[(size_t)q * C + c], mag += fabs(part[(size_t)q * C + c]);
        const double want = db0[c] + s;
        bad += !check(fabs(db[c] - want) <= 1e-6 * (fabs(want) + mag), "dbias (sum)", c, db[c], want);
        const float wantInv = (float)(1.0 / sqrt((double)rv[c] + (double)1e-5f));
        bad += !check(mean[c] == rm[c] && inv[c] == wantInv, "evaluation statistics", c, inv[c], wantInv);
        bad += !check(tab[c] == rm[c] && tab[C + c] == wantInv && tab[2 * C + c] == w[c] && tab[3 * C + c] == b[c], "evaluation table", c, tab[c], rm[c]);
    }
    printf("batch norm finish nb=%d C=%d, sum and evaluation: %s\n", nb, C, bad ? "FAIL" : "ok");
}

// divider is cuda/divider.go's newDivider: ember_divide's multiplier and
// shift for d.
struct divider {
    unsigned mul, shift;
    static divider of(unsigned d) {
        unsigned shift = 0;
        while ((1ull << shift) < d) shift++;
        return {(unsigned)((((1ull << shift) - d) << 32) / d + 1), shift};
    }
};

struct cgeom { int N, C, H, W, K, R, S, SH, SW, PH, PW, DH, DW; };

static void convsmall(const cgeom& g, bool relu, bool bias, int per) {
    const int OH = (g.H + 2 * g.PH - g.DH * (g.R - 1) - 1) / g.SH + 1, OW = (g.W + 2 * g.PW - g.DW * (g.S - 1) - 1) / g.SW + 1;
    const int CRS = g.C * g.R * g.S, P = OH * OW, NP = g.N * P;
    std::vector<unsigned short> x = randomBits((size_t)g.N * g.H * g.W * g.C, 1, 0.5f), dy = randomBits((size_t)NP * g.K, 1, 0);
    std::vector<float> w(g.K * CRS), b(g.K), dw(g.K * CRS);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto& v : w) v = normal(rng);
    for (auto& v : b) v = normal(rng);
    for (auto& v : dw) v = normal(rng);
    std::vector<unsigned short> y((size_t)NP * g.K);
    const int n8 = NP * g.K / 8;
    unsigned short* py = y.data();
    const unsigned short *px = x.data(), *pdy = dy.data();
    const float *pw = w.data(), *pb = bias ? b.data() : nullptr;
    const divider dg = divider::of(g.K / 8), dow = divider::of(OW), doh = divider::of(OH), dp = divider::of(P), dc = divider::of(g.C);
    // conv_small thread's groups of eight channels (channels_last.go's
    // clSmallGroups).
    int gb = 1;
    for (int t = 4; t > 1 && gb == 1; t--)
        if ((g.K / 8) % t == 0) gb = t;
    const int items = n8 / gb;
    const divider dgi = divider::of(g.K / 8 / gb);
    // The entry point channels_last.go's clSmallKernel picks.
    auto conv = ember_cl_conv_small;
    if (g.C == 3 && g.R == 2 && g.S == 2) conv = ember_cl_conv_small_c3r2s2;
    if (g.C == 1 && g.R == 3 && g.S == 3) conv = ember_cl_conv_small_c1r3s3;
    if (g.C == 3 && g.R == 3 && g.S == 3) conv = ember_cl_conv_small_c3r3s3;
    launch(3, 64, [=] {
        conv(py, px, pw, pb, relu, g.C, g.H, g.W, g.K, g.R, g.S, g.SH, g.SW, g.PH, g.PW, g.DH, g.DW, OH, OW, items, gb, dgi.mul,
             dgi.shift, dow.mul, dow.shift, doh.mul, doh.shift);
    });
    // The tensor-core kernel where channels_last.go's clSmallMMA takes it:
    // two blocks of two warps, so that warps stride over the tiles.
    const bool mma = g.K <= 64 && CRS <= 32;
    std::vector<unsigned short> ym((size_t)NP * g.K, 0x7fc0);
    unsigned short* pym = ym.data();
    if (mma) launch(2, 64, [=] {
        auto k = CRS <= 16 ? ember_cl_conv_small_mma16_n8 : ember_cl_conv_small_mma32_n8;
        if (g.K <= 32) k = CRS <= 16 ? ember_cl_conv_small_mma16_n4 : ember_cl_conv_small_mma32_n4;
        if (g.K <= 24) k = CRS <= 16 ? ember_cl_conv_small_mma16_n3 : ember_cl_conv_small_mma32_n3;
        if (g.K <= 16) k = CRS <= 16 ? ember_cl_conv_small_mma16_n2 : ember_cl_conv_small_mma32_n2;
        k(pym, px, pw, pb, relu, g.C, g.H, g.W, g.K, g.R, g.S, g.SH, g.SW, g.PH, g.PW, g.DH, g.DW, OH, OW, NP, dp.mul, dp.shift,
          dow.mul, dow.shift);
    });
    const bool dw16 = CRS <= 16; // the filter gradient's kernel takes at most 16 taps (conv_dw_small.go)
    // Its tile (conv_dw_small.go's clDwsTile), per as many tiles as 96
    // positions would be.
    const int tile = std::min(256, 96 * 64 / g.K);
    per = per / 96 * tile;
    const int blocks = (NP + per - 1) / per, pairs = g.K * CRS;
    std::vector<double> part((size_t)pairs * blocks);
    double* pp = part.data();
    auto dwk = ember_cl_conv_dw_small;
    if (g.C == 3 && g.R == 2 && g.S == 2) dwk = ember_cl_conv_dw_small_c3r2s2;
    if (g.C == 1 && g.R == 3 && g.S == 3) dwk = ember_cl_conv_dw_small_c1r3s3;
    if (g.C == 3 && g.R == 3 && g.S == 3) dwk = ember_cl_conv_dw_small_c3r3s3;
    if (dw16) launch(blocks, 256, [=] {
        dwk(pp, px, pdy, g.N, g.C, g.H, g.W, g.K, g.R, g.S, g.SH, g.SW, g.PH, g.PW, OH, OW, g.DH, g.DW, per,
                               dp.mul, dp.shift, dow.mul, dow.shift, dc.mul, dc.shift, tile);
    });
    std::vector<float> dw0(dw), dwm(dw);
    float* pdw = dw.data();
    if (dw16) launch((pairs + 7) / 8, 256, [=] { ember_conv_dw_small_join(pdw, pp, pairs, blocks); });
    // The tensor-core filter gradient (conv_dw_small.go's pick), joined
    // the same way, over blocks of four times the positions and two warps
    // (the host emulation's threads are its cost; any partition sums the
    // same products).
    const int perm = 4 * per, blocksm = (NP + perm - 1) / perm;
    std::vector<double> partm((size_t)pairs * blocksm);
    double* ppm = partm.data();
    float* pdwm = dwm.data();
    if (dw16) {
        auto k = ember_cl_conv_dw_small_mma_n8;
        if (g.K <= 32) k = ember_cl_conv_dw_small_mma_n4;
        if (g.K <= 24) k = ember_cl_conv_dw_small_mma_n3;
        if (g.K <= 16) k = ember_cl_conv_dw_small_mma_n2;
        launch(blocksm, 64, [=] {
            k(ppm, px, pdy, g.N, g.C, g.H, g.W, g.K, g.R, g.S, g.SH, g.SW, g.PH, g.PW, OH, OW, g.DH, g.DW, perm, dp.mul, dp.shift,
              dow.mul, dow.shift, dc.mul, dc.shift, tile);
        });
        launch((pairs + 7) / 8, 256, [=] { ember_conv_dw_small_join(pdwm, ppm, pairs, blocksm); });
    }
    int bad = 0;
    std::vector<double> sum(pairs), mag(pairs);
    for (int n = 0; n < g.N; n++)
        for (int oh = 0; oh < OH; oh++)
            for (int ow = 0; ow < OW; ow++)
                for (int k = 0; k < g.K; k++) {
                    float acc = 0;
                    const size_t o = (((size_t)n * OH + oh) * OW + ow) * g.K + k;
                    for (int t = 0; t < CRS; t++) {
                        const int c = t / (g.R * g.S), r = t % (g.R * g.S) / g.S, s = t % g.S;
                        const int h = oh * g.SH - g.PH + r * g.DH, wc = ow * g.SW - g.PW + s * g.DW;
                        if (h < 0 || h >= g.H || wc < 0 || wc >= g.W) continue;
                        const float xv = widen(x[(((size_t)n * g.H + h) * g.W + wc) * g.C + c]);
                        acc += xv * bf(w[k * CRS + t]);
                        const double p = (double)widen(dy[o]) * xv;
                        sum[k * CRS + t] += p;
                        mag[k * CRS + t] += fabs(p);
                    }
                    float v = bf(acc) + (bias ? b[k] : 0.0f);
                    if (relu && !(v > 0 || v != v)) v = 0;
                    const double want = bf(v);
                    bad += !check(close(widen(y[o]), want, fabs(acc) / 128), "conv y", o, widen(y[o]), want);
                    if (mma) bad += !check(close(widen(ym[o]), want, fabs(acc) / 128), "conv y (tensor cores)", o, widen(ym[o]), want);
                }
    for (int i = 0; i < pairs && dw16; i++) {
        const double want = dw0[i] + bf((float)sum[i]);
        bad += !check(fabs(dw[i] - want) <= fabs(want) / 128 + 1e-5 * mag[i] + 1e-30, "conv dw", i, dw[i], want);
        bad += !check(fabs(dwm[i] - want) <= fabs(want) / 128 + 1e-5 * mag[i] + 1e-30, "conv dw (tensor cores)", i, dwm[i], want);
    }
    printf("direct convolution N=%d C=%d %dx%d K=%d %dx%d stride %d,%d pad %d,%d dilation %d,%d relu=%d bias=%d, %d blocks%s%s: %s\n", g.N,
           g.C, g.H, g.W, g.K, g.R, g.S, g.SH, g.SW, g.PH, g.PW, g.DH, g.DW, relu, bias, blocks, dw16 ? "" : " (forward only)",
           mma ? ", tensor cores too" : "", bad ? "FAIL" : "ok");
}

static void gelu() {
    int bad = 0;
    double worst = 0, worstGrad = 0;
    for (int i = -12000; i <= 12000; i++) {
        const float x = i * 1e-3f;
        const double xd = x, cdf = 0.5 * erfc(-xd / sqrt(2.0)), pdf = exp(-xd * xd / 2) / sqrt(2 * M_PI);
        const double want = xd * cdf, dwant = cdf + xd * pdf, scale = fabs(cdf) + fabs(xd * pdf);
        const double got = ember_cl_act(EMBER_BN_ACT_GELU, x), dgot = ember_cl_act_grad(EMBER_BN_ACT_GELU, x, 1.0f);
        if (want != 0) worst = std::max(worst, fabs(got - want) / fabs(want));
        worstGrad = std::max(worstGrad, fabs(dgot - dwant) / scale);
        const double tol = (2 + xd * xd / 2) * 1e-6;
        bad += !check(fabs(got - want) <= tol * fabs(want), "gelu", i, got, want);
        bad += !check(fabs(dgot - dwant) <= tol * scale, "gelu'", i, dgot, dwant);
    }
    const float nan = NAN;
    bad += !check(ember_cl_act(EMBER_BN_ACT_GELU, nan) != ember_cl_act(EMBER_BN_ACT_GELU, nan), "gelu(NaN)", 0, 0, nan);
    bad += !check(ember_cl_act(EMBER_BN_ACT_GELU, INFINITY) == INFINITY, "gelu(inf)", 0, ember_cl_act(EMBER_BN_ACT_GELU, INFINITY), INFINITY);
    printf("GELU over [-12, 12]: largest relative error %.2e, of the derivative %.2e: %s\n", worst, worstGrad, bad ? "FAIL" : "ok");
}

// padChannels: ember_cl_pad_channels copies each row's C channels bit for
// bit and zeroes the rest up to CP.
static void padChannels(long long rows, int C, int CP) {
    std::vector<unsigned short> x = randomBits((size_t)rows * C, 1, 0), y((size_t)rows * CP, 0x1234);
    unsigned short* py = y.data();
    const unsigned short* px = x.data();
    launch(3, 64, [=] { ember_cl_pad_channels(py, px, rows, C / 8, CP / 8); });
    int bad = 0;
    for (long long r = 0; r < rows; r++)
        for (int c = 0; c < CP; c++) {
            const unsigned short want = c < C ? x[r * C + c] : 0;
            bad += !check(y[r * CP + c] == want, "pad", r * CP + c, widen(y[r * CP + c]), widen(want));
        }
    printf("channels padded, %lld rows of %d to %d: %s\n", rows, C, CP, bad ? "FAIL" : "ok");
}

// flipFilter: ember_cl_filter_flip_bf16 writes wt[c][r][s][k] = w[k][c][R-1-r][S-1-s]
// rounded to bfloat16, bit for bit.
static void flipFilter(int K, int C, int R, int S) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> w((size_t)K * C * R * S);
    for (auto& v : w) v = normal(rng);
    std::vector<unsigned short> wt(w.size(), 0x1234);
    unsigned short* pt = wt.data();
    const float* pw = w.data();
    const long long n = (long long)w.size();
    launch(2, 64, [=] { ember_cl_filter_flip_bf16(pt, pw, K, C, R, S, n); });
    int bad = 0;
    for (int c = 0; c < C; c++)
        for (int r = 0; r < R; r++)
            for (int s = 0; s < S; s++)
                for (int k = 0; k < K; k++) {
                    const long long o = (((long long)c * R + r) * S + s) * K + k;
                    const unsigned short want = bits(w[(((long long)k * C + c) * R + (R - 1 - r)) * S + (S - 1 - s)]);
                    bad += !check(wt[o] == want, "flipped filter", o, widen(wt[o]), widen(want));
                }
    printf("filter %dx%dx%dx%d flipped: %s\n", K, C, R, S, bad ? "FAIL" : "ok");
}

// bnDxPool: ember_cl_bn_dx_maxpool_backward against ember_cl_bn_dx into
// the pooled gradient, then ember_cl_maxpool_backward: the same bits.
static void bnDxPool(int N, int C, int H, int W, int K, bool training) {
    const int OH = H / K, OW = W / K;
    const long long rows = (long long)N * OH * OW, n = rows * C, full = (long long)N * H * W * C;
    std::vector<unsigned short> x = randomBits(n, 2, 1), g = randomBits(n, 1, 0), dp(n), dx1(full, 0x1234), dx2(full, 0x4321);
    std::vector<unsigned char> idx(n);
    for (auto& v : idx) v = (unsigned char)(rng() % (K * K));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> tab(6 * C);
    for (int c = 0; c < C; c++) {
        tab[c] = normal(rng);                    // mean
        tab[C + c] = 0.5f + fabsf(normal(rng)); // 1/std
        tab[2 * C + c] = normal(rng);            // weight
        tab[3 * C + c] = normal(rng);            // bias
        tab[4 * C + c] = 0.1f * normal(rng);     // mean of g
        tab[5 * C + c] = 0.1f * normal(rng);     // mean of g·x̂
    }
    unsigned short *pdp = dp.data(), *p1 = dx1.data(), *p2 = dx2.data();
    const unsigned short *px = x.data(), *pg = g.data();
    const unsigned char* pi = idx.data();
    const float* pt = tab.data();
    const int tr = training;
    launch(3, 64, [=] { ember_cl_bn_dx_maxpool_backward(p1, px, pg, pi, pt, tr, H, W, C, OH, OW, K, K, rows); });
    launch(2, 64, [=] { ember_cl_bn_dx(pdp, px, pg, pt, 0, tr, rows, C); });
    launch(2, 64, [=] { ember_cl_maxpool_backward(p2, pdp, pi, H, W, C, OH, OW, K, K, n / 8); });
    int bad = 0;
    for (long long i = 0; i < full; i++) bad += !check(dx1[i] == dx2[i], "pooled batch norm dx", i, widen(dx1[i]), widen(dx2[i]));
    printf("batch norm dx into max pooling N=%d C=%d %dx%d k=%d training=%d: %s\n", N, C, H, W, K, training, bad ? "FAIL" : "ok");
}

int main() {
    gelu();
    maxpool(2, 16, 7, 7, 2, false);
    maxpool(2, 8, 7, 5, 2, true);
    maxpool(1, 24, 9, 6, 3, false);
    maxpoolStats(2, 16, 7, 7, 2, false);
    maxpoolStats(2, 8, 7, 5, 2, true);  // ceil mode's partial windows
    maxpoolStats(1, 24, 9, 6, 3, false); // a window of runtime size
    maxpoolStats(4, 16, 16, 14, 2, false); // several rows a thread
    maxpoolStats(2, 64, 6, 6, 2, false);
    maxpoolStats(4, 64, 24, 24, 2, false); // six rows a thread, two at a time
    maxpoolStats(8, 24, 18, 17, 2, true);  // 85 rows a block, an odd row last
    maxpoolStats(4, 64, 21, 21, 3, false); // several rows a thread, one at a time
    pointwise(101, 24, EMBER_CL_ACT, 13);
    pointwise(101, 24, EMBER_CL_ACT_GRAD, 13);
    pointwise(203, 40, EMBER_CL_BIAS, 11); // a channel that moves by the stride
    pointwise(203, 40, EMBER_CL_BIAS, 0);
    pointwise(64, 16, EMBER_CL_ADD, 0);
    pointwise(3, 8, EMBER_CL_ACT, 11); // fewer groups than threads
    batchnorm(200, 16, 0, true);
    batchnorm(150, 24, 11, false);
    batchnorm(97, 8, 13, true);
    batchnorm(2001, 16, 13, true);  // threads take rows in pairs and one last row
    batchnorm(1500, 24, 11, true);
    batchnorm(2001, 16, 13, true, true); // g through dx's memory
    batchnorm(150, 24, 11, false, true);
    finalizeModes(300, 24); // slots take several partials each
    finalizeModes(5, 64);
    convsmall({2, 1, 9, 8, 64, 3, 3, 1, 1, 1, 1, 1, 1}, true, true, 96);   // ResNet-9's first layer in small: several blocks
    convsmall({3, 3, 8, 8, 24, 2, 2, 1, 1, 0, 0, 1, 1}, false, false, 96);  // airbench's whitening layer in small
    convsmall({2, 2, 11, 9, 16, 3, 2, 2, 1, 1, 0, 1, 2}, true, false, 96);  // strides, one-sided padding, dilation
    convsmall({3, 1, 10, 10, 64, 4, 4, 1, 1, 1, 1, 1, 1}, false, true, 192); // the most taps and channels; tiles of a block
    convsmall({2, 3, 9, 10, 32, 3, 3, 1, 1, 1, 1, 1, 1}, true, true, 96);     // 27 taps: the direct forward only
    convsmall({2, 1, 7, 9, 48, 3, 3, 1, 1, 1, 1, 1, 1}, false, true, 96);   // three groups a thread, two threads a position
    convsmall({2, 2, 8, 7, 40, 2, 3, 1, 2, 0, 1, 1, 1}, true, false, 96);   // five groups: one a thread
    padChannels(1000, 24, 32); // airbench's layer after its whitening
    padChannels(37, 40, 64);
    padChannels(5, 8, 32);
    flipFilter(64, 24, 3, 3);
    bnDxPool(2, 16, 7, 7, 2, true); // the row and column past the last window zeroed
    bnDxPool(3, 24, 9, 6, 3, false);
    bnDxPool(2, 64, 5, 8, 2, true); // several rows a thread
    flipFilter(8, 5, 3, 2);
    return failed > 99 ? 99 : failed;
}
