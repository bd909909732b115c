// The driver of TestConvFilterGradSmallOnHost: kernels/conv.cu (common.cu
// before it, host_emu.h included first) compiled for the host with this
// file. It runs ember_conv_dw_small and its join on small geometries
// (padding, strides, dilation, several input channels, blocks of one and
// of several tiles, the ReLU mask, dw added to) and checks every weight
// gradient against a double sum of the bfloat16-rounded products, rounded
// to bfloat16 and added: within one bfloat16 step of that (the kernel sums
// in float32 within a block) and 1e-5 of the sum of |products|. Exit
// status: the number of failed cases.
#include "host_launch.h"


static float bf(float v) {
    unsigned u;
    memcpy(&u, &v, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return NAN;
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    float r;
    memcpy(&r, &u, 4);
    return r;
}

struct geom { int N, C, H, W, K, R, S, SH, SW, PH, PW, DH, DW, per; bool mask; };

static int run(const geom& g) {
    const int OH = (g.H + 2 * g.PH - g.DH * (g.R - 1) - 1) / g.SH + 1, OW = (g.W + 2 * g.PW - g.DW * (g.S - 1) - 1) / g.SW + 1;
    const int P = OH * OW, NP = g.N * P, CRS = g.C * g.R * g.S, pairs = g.K * CRS;
    std::mt19937_64 rng(g.N * 7 + g.C * 11 + g.K * 13 + g.per);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x((size_t)g.N * g.C * g.H * g.W), dy((size_t)g.N * g.K * P), y(dy.size()), dw(pairs);
    for (auto& v : x) v = normal(rng);
    for (auto& v : dy) v = normal(rng);
    for (auto& v : y) v = normal(rng);
    for (auto& v : dw) v = normal(rng);
    std::vector<float> want(dw);
    std::vector<double> mag(pairs);
    for (int k = 0; k < g.K; k++)
        for (int t = 0; t < CRS; t++) {
            const int c = t / (g.R * g.S), r = t % (g.R * g.S) / g.S, s = t % g.S;
            double sum = 0, abs = 0;
            for (int n = 0; n < g.N; n++)
                for (int oh = 0; oh < OH; oh++)
                    for (int ow = 0; ow < OW; ow++) {
                        const int h = oh * g.SH - g.PH + r * g.DH, w = ow * g.SW - g.PW + s * g.DW;
                        if (h < 0 || h >= g.H || w < 0 || w >= g.W) continue;
                        const size_t e = ((size_t)n * g.K + k) * P + oh * OW + ow;
                        float d = dy[e];
                        if (g.mask && y[e] <= 0) d = 0;
                        const double p = (double)bf(d) * bf(x[(((size_t)n * g.C + c) * g.H + h) * g.W + w]);
                        sum += p;
                        abs += fabs(p);
                    }
            want[k * CRS + t] += bf((float)sum);
            mag[k * CRS + t] = abs;
        }
    const int blocks = (NP + g.per - 1) / g.per;
    std::vector<double> part((size_t)pairs * blocks);
    double* pp = part.data();
    const float *px = x.data(), *pdy = dy.data(), *pm = g.mask ? y.data() : nullptr;
    launch(blocks, 256, [=] { ember_conv_dw_small(pp, px, pdy, pm, g.N, g.C, g.H, g.W, g.K, g.R, g.S, g.SH, g.SW, g.PH, g.PW, OH, OW, g.DH, g.DW, g.per); });
    float* pdw = dw.data();
    launch((pairs + 7) / 8, 256, [=] { ember_conv_dw_small_join(pdw, pp, pairs, blocks); });
    int bad = 0;
    for (int i = 0; i < pairs; i++) {
        const double tol = fabs(want[i]) * 0x1p-7 + 1e-5 * mag[i] + 1e-30;
        if (!(fabs((double)dw[i] - want[i]) <= tol)) {
            if (bad < 5) printf("  pair %d: %.9g, want %.9g (tolerance %.3g)\n", i, dw[i], want[i], tol);
            bad++;
        }
    }
    printf("N=%d C=%d %dx%d K=%d %dx%d stride %d,%d pad %d,%d dilation %d,%d per %d mask %d (%d blocks): %s\n", g.N, g.C, g.H, g.W, g.K, g.R,
           g.S, g.SH, g.SW, g.PH, g.PW, g.DH, g.DW, g.per, g.mask, blocks, bad ? "FAIL" : "ok");
    return bad != 0;
}

int main() {
    const geom gs[] = {
        {2, 1, 7, 6, 5, 3, 3, 1, 1, 1, 1, 1, 1, 96, false},   // ResNet-9's first layer in small: one block
        {3, 1, 9, 8, 64, 3, 3, 1, 1, 1, 1, 1, 1, 96, true},   // 64 channels (the most), the mask, several blocks
        {3, 2, 9, 8, 4, 2, 3, 2, 1, 1, 0, 1, 2, 192, false},  // strides, padding, dilation, two tiles a block
        {2, 3, 6, 6, 24, 2, 2, 1, 1, 0, 0, 1, 1, 96, true},   // airbench's 3 -> 24 2x2 (C*R*S 12)
        {1, 4, 5, 5, 16, 2, 2, 1, 1, 0, 0, 1, 1, 96, false},  // C*R*S 16 (the most), 1024 pairs
    };
    int failed = 0;
    for (const geom& g : gs) failed += run(g);
    return failed;
}
