// The driver of TestNHWCCastKernelsOnHost: kernels/cast.cu (common.cu
// before it, host_emu.h included first) compiled for the host with this
// file. It runs ember_to_nhwc_bf16 and ember_from_nhwc_bf16 with the grid
// and tile that cuda/conv_cudnn.go's nhwcGrid picks (tc, the tile's
// channels, comes as an argument with each shape) on fresh random inputs,
// and checks every element bit for bit against a plain loop over the
// layouts: with and without the mask, bias, ReLU and accumulation, odd and
// even channel counts, planes no multiple of the tile's rows; and, for the
// shapes of a filter, the slab kernels; for at most four channels, the
// thread-a-row kernel against the tiled one. Exit status:
// the number of failed checks (at most 99).
#include "host_launch.h"

static unsigned short bf16(float f) { return (unsigned short)ember_host_bf16(f); }
static float widen(unsigned short h) { return __uint_as_float((unsigned)h << 16); }

static int run(int n, int C, int P, int tc, bool masked, bool biased, bool relu, bool acc) {
    std::mt19937_64 rng(n * 1000003 + C * 101 + P * 7 + tc + masked * 2 + biased * 3 + relu * 5 + acc * 11);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const long long len = (long long)n * C * P, rows = (long long)n * P;
    std::vector<float> x(len), mask(len), bias(C), y(len);
    for (auto& v : x) v = normal(rng);
    for (auto& v : mask) v = normal(rng);
    for (auto& v : bias) v = normal(rng);
    for (auto& v : y) v = normal(rng);
    x[0] = NAN;  // a NaN rounds to the quiet NaN
    const int tr = std::min(EMBER_NHWC_THREADS, EMBER_NHWC_TILE / tc);
    const unsigned gx = (unsigned)((rows + tr - 1) / tr), gy = (unsigned)((C + tc - 1) / tc);
    int bad = 0;
    // To NHWC: h[n][p][c] = bf16(x[n][c][p]), masked.
    std::vector<unsigned short> h(len + 2, 0x1234);
    {
        unsigned short* ph = h.data() + 2;  // 4-byte aligned, as the workspace
        const float* px = x.data();
        const float* pm = masked ? mask.data() : nullptr;
        launch(gx, gy, EMBER_NHWC_THREADS, [=] { ember_to_nhwc_bf16(ph, px, pm, C, P, rows, tc); });
        for (int b = 0; b < n; b++)
            for (int c = 0; c < C; c++)
                for (int p = 0; p < P; p++) {
                    const long long i = ((long long)b * C + c) * P + p;
                    const float v = (masked && !(mask[i] > 0.f) && mask[i] == mask[i]) ? 0.f : x[i];
                    const unsigned short want = bf16(v), got = ph[((long long)b * P + p) * C + c];
                    if (got != want && bad++ < 5) printf("to n=%d C=%d P=%d tc=%d: (%d,%d,%d) = %04x, want %04x\n", n, C, P, tc, b, c, p, got, want);
                }
        if (h[0] != 0x1234 || h[1] != 0x1234) bad++, printf("to n=%d C=%d P=%d: wrote before h\n", n, C, P);
        if (C <= EMBER_NHWC_ROWS_MAX) {
            // The thread-a-row kernel for few channels: the same bits.
            std::vector<unsigned short> hr(len + 2, 0x1234);
            unsigned short* pr = hr.data() + 2;
            launch(3, 1, 64, [=] { ember_to_nhwc_rows_bf16(pr, px, pm, C, P, rows); });
            for (long long i = 0; i < len + 2; i++)
                if (hr[i] != h[i] && bad++ < 5) printf("rows n=%d C=%d P=%d: element %lld = %04x, want %04x\n", n, C, P, i - 2, hr[i], h[i]);
        }
    }
    // From NHWC: y[n][c][p] = float32(h[n][p][c]) + bias, ReLU; or += .
    {
        std::vector<float> want(y);
        const unsigned short* ph = h.data() + 2;
        for (int b = 0; b < n; b++)
            for (int c = 0; c < C; c++)
                for (int p = 0; p < P; p++) {
                    const long long i = ((long long)b * C + c) * P + p;
                    float v = widen(ph[((long long)b * P + p) * C + c]);
                    if (acc) {
                        v += want[i];
                    } else {
                        if (biased) v += bias[c];
                        if (relu && !(v > 0.f || v != v)) v = 0.f;
                    }
                    want[i] = v;
                }
        float* py = y.data();
        const float* pb = biased ? bias.data() : nullptr;
        launch(gx, gy, EMBER_NHWC_THREADS, [=] { ember_from_nhwc_bf16(py, ph, pb, C, P, rows, tc, relu, acc); });
        for (long long i = 0; i < len; i++)
            if (memcmp(&y[i], &want[i], 4) != 0 && bad++ < 5)
                printf("from n=%d C=%d P=%d tc=%d: element %lld = %.9g, want %.9g\n", n, C, P, tc, i, y[i], want[i]);
    }
    printf("n=%d C=%d P=%d tc=%d mask=%d bias=%d relu=%d acc=%d: %s\n", n, C, P, tc, masked, biased, relu, acc, bad ? "FAIL" : "ok");
    return bad;
}

// divider is divider.go's newDivider: the multiplier and shift of
// ember_divide by d.
static void divider(unsigned d, int* mul, int* shift) {
    unsigned s = 0;
    while (s < 32 && (1ull << s) < d) s++;
    *shift = (int)s;
    *mul = (int)(unsigned)((((1ull << s) - d) << 32) / d + 1);
}

// runSlab checks the slab kernels (filters: P < 32, C·P <= EMBER_NHWC_SLAB)
// against the plain loops, bit for bit, with a grid of fewer blocks than
// slabs (each block takes several), and the from direction written and
// accumulated.
static int runSlab(int n, int C, int P) {
    std::mt19937_64 rng(n * 7919 + C * 13 + P);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const long long len = (long long)n * C * P;
    std::vector<float> x(len), y(len);
    for (auto& v : x) v = normal(rng);
    for (auto& v : y) v = normal(rng);
    x[len - 1] = NAN;
    int cm, cs, pm, ps;
    divider((unsigned)C, &cm, &cs);
    divider((unsigned)P, &pm, &ps);
    const unsigned grid = (unsigned)std::max(1, n / 2);
    int bad = 0;
    std::vector<unsigned short> h(len + 2, 0x1234);
    unsigned short* ph = h.data() + 1;
    const float* px = x.data();
    launch(grid, 1, 256, [=] { ember_to_nhwc_slab_bf16(ph, px, C, P, n, cm, cs, pm, ps); });
    for (int b = 0; b < n; b++)
        for (int c = 0; c < C; c++)
            for (int p = 0; p < P; p++) {
                const unsigned short want = bf16(x[((long long)b * C + c) * P + p]), got = ph[((long long)b * P + p) * C + c];
                if (got != want && bad++ < 5) printf("slab to n=%d C=%d P=%d: (%d,%d,%d) = %04x, want %04x\n", n, C, P, b, c, p, got, want);
            }
    if (h[0] != 0x1234 || h[len + 1] != 0x1234) bad++, printf("slab to n=%d C=%d P=%d: wrote outside h\n", n, C, P);
    for (int acc = 0; acc < 2; acc++) {
        std::vector<float> want(y);
        for (int b = 0; b < n; b++)
            for (int c = 0; c < C; c++)
                for (int p = 0; p < P; p++) {
                    const long long i = ((long long)b * C + c) * P + p;
                    const float v = widen(ph[((long long)b * P + p) * C + c]);
                    want[i] = acc ? want[i] + v : v;
                }
        float* py = y.data();
        launch(grid, 1, 256, [=] { ember_from_nhwc_slab_bf16(py, ph, C, P, n, acc, cm, cs, pm, ps); });
        for (long long i = 0; i < len; i++)
            if (memcmp(&y[i], &want[i], 4) != 0 && bad++ < 5)
                printf("slab from n=%d C=%d P=%d acc=%d: element %lld = %.9g, want %.9g\n", n, C, P, acc, i, y[i], want[i]);
    }
    printf("slab n=%d C=%d P=%d: %s\n", n, C, P, bad ? "FAIL" : "ok");
    return bad;
}

// Arguments: groups of four, n C P tc.
int main(int argc, char** argv) {
    int failed = 0;
    for (int a = 1; a + 3 < argc; a += 4) {
        const int n = atoi(argv[a]), C = atoi(argv[a + 1]), P = atoi(argv[a + 2]), tc = atoi(argv[a + 3]);
        const int k = a / 4;  // vary the epilogue across shapes
        failed += run(n, C, P, tc, k % 2 == 0, k % 3 == 0, k % 4 == 1, false);
        failed += run(n, C, P, tc, false, false, false, true);
        if (P < 32 && (long long)C * P <= EMBER_NHWC_SLAB) failed += runSlab(n, C, P);
    }
    return failed > 99 ? 99 : failed;
}
