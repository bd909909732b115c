// The driver of TestReduceKernelsOnHost: kernels/reduce_axis.cu and
// kernels/reduce.cu (common.cu before them, host_emu.h included first)
// compiled for the host with this file. Arguments: the threads per block,
// then cases of nine numbers, outer channels inner splits chunk rowSplits
// rowsPer sumBlocks rowGrid (the Go side's plans: chanSplits,
// rowSplits, sumBlocks and the rows' grid, 0 to skip the rows' kernel). Each case views fresh
// random inputs as x [outer, channels, inner], as a sum into a 16-byte
// aligned x, a sum accumulated into dst from an x one float off alignment
// (the one-float paths), and a mean, NaN around x, and runs
//   - ember_reduce_channels (and its join when splits > 1): every variant;
//   - ember_reduce_channel_whole_*: every variant, the float4 entry points
//     on aligned rows of whole float4;
//   - ember_reduce_channel_rows, ember_reduce_rows_sum4 (the rows of
//     inner): the aligned variants with inner a multiple of 4, the means
//     through the entry points with plain loads (_l2), the sums through
//     the streaming ones;
//   - ember_sum of all of x: the sums, aligned or not;
// and checks every result against a double sum within 1e-5 of the sum of
// |terms| (the conformance suite's tolAcc), the guards around dst and the
// partial sums, and that the counters of the last-block joins are back at
// 0. Exit status: the number of failed checks.
#include "host_launch.h"

static const float guard = -12345.678f;

struct sums {
    double want, bound;
};

int main(int argc, char** argv) {
    if (argc < 2 || (argc - 2) % 9 != 0) {
        fprintf(stderr, "usage: %s threads [outer channels inner splits chunk rowSplits rowsPer sumBlocks rowGrid]...\n", argv[0]);
        return 100;
    }
    const int nt = atoi(argv[1]);
    std::mt19937_64 rng(std::random_device{}());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    int failed = 0;
    for (int a = 2; a < argc; a += 9) {
        const long long outer = atoll(argv[a]), ch = atoll(argv[a + 1]), inner = atoll(argv[a + 2]);
        const int splits = atoi(argv[a + 3]);
        const long long chunk = atoll(argv[a + 4]);
        const int rsplits = atoi(argv[a + 5]);
        const long long rowsPer = atoll(argv[a + 6]);
        const int sumBlocks = atoi(argv[a + 7]), rowGrid = atoi(argv[a + 8]);
        struct variant { int op, acc, off; const char* name; };
        const variant vs[] = {{EMBER_R_SUM, 0, 0, "sum"}, {EMBER_R_SUM, 1, 1, "sum+acc unaligned"}, {EMBER_R_MEAN, 0, 0, "mean"}};
        for (const variant& v : vs) {
            // 16-byte aligned storage; x starts v.off floats in.
            const long long n = outer * ch * inner;
            // NaN around x: a read outside it spoils the sums.
            const float nan = __int_as_float(0x7fc00000);
            std::vector<ember_f4> store((n + 1 + 3) / 4 + 64, ember_f4{nan, nan, nan, nan});
            float* x = reinterpret_cast<float*>(store.data()) + v.off;
            for (long long i = 0; i < n; i++) x[i] = normal(rng);
            const long long m = std::max(ch, outer * ch);  // the most outputs of a kernel here
            std::vector<float> d0(m);
            for (long long c = 0; c < m; c++) d0[c] = normal(rng);
            // check compares got[0..k) with groups of x: element e of output
            // r is x[idx(r, e)], for e < cnt; the accumulation and the mean
            // as v says.
            auto check = [&](const char* kernel, const float* got, long long k, long long cnt, auto idx) {
                int bad = 0;
                for (long long r = 0; r < k; r++) {
                    double want = 0, bound = 0;
                    for (long long e = 0; e < cnt; e++) {
                        const double t = x[idx(r, e)];
                        want += t;
                        bound += fabs(t);
                    }
                    if (v.acc) {
                        want += d0[r];
                        bound += fabs(d0[r]);
                    }
                    if (v.op == EMBER_R_MEAN) {
                        want /= (double)cnt;
                        bound /= (double)cnt;
                    }
                    if (!(fabs(got[r] - want) <= 1e-5 * bound + 1e-30)) {
                        if (bad < 5)
                            printf("%s outer=%lld channels=%lld inner=%lld %s: output %lld = %.9g, want %.9g (bound %g)\n",
                                   kernel, outer, ch, inner, v.name, r, got[r], want, bound);
                        bad++;
                    }
                }
                return bad;
            };
            // run gives a kernel k outputs between guards (d0 in them when
            // accumulating), parts partial sums between guards and counters
            // zeroed, and checks the guards and counters after.
            auto run = [&](const char* kernel, long long k, int parts, int ncounters, auto launchIt, auto idx, long long cnt) {
                std::vector<float> dst(k + 2, guard);
                if (v.acc)
                    for (long long r = 0; r < k; r++) dst[r + 1] = d0[r];
                std::vector<double> part((size_t)parts + 1, 0.0);
                part.back() = (double)guard;
                std::vector<unsigned> counters((size_t)ncounters + 1, 0u);
                counters.back() = 12345u;
                launchIt(dst.data() + 1, part.data(), counters.data());
                int bad = check(kernel, dst.data() + 1, k, cnt, idx);
                if (dst[0] != guard || dst[k + 1] != guard || part.back() != (double)guard || counters.back() != 12345u) {
                    printf("%s outer=%lld channels=%lld inner=%lld %s: a guard was overwritten\n", kernel, outer, ch, inner, v.name);
                    bad++;
                }
                for (int i = 0; i < ncounters; i++)
                    if (counters[i] != 0) {
                        printf("%s outer=%lld channels=%lld inner=%lld %s: counter %d left at %u\n", kernel, outer, ch, inner,
                               v.name, i, counters[i]);
                        bad++;
                    }
                printf("%s outer=%lld channels=%lld inner=%lld %s: %s\n", kernel, outer, ch, inner, v.name, bad ? "FAIL" : "ok");
                failed += bad;
            };
            // The host's factor of a sum (1) or a mean of k (1/k).
            auto scale = [&](long long k) { return v.op == EMBER_R_MEAN ? 1.0 / (double)k : 1.0; };
            auto chanIdx = [=](long long c, long long e) { return (e / inner * ch + c) * inner + e % inner; };
            run("reduce_channels", ch, (int)ch * splits, 0, [&](float* pd, double* pp, unsigned*) {
                launch((unsigned)ch, (unsigned)splits, nt, [=] { ember_reduce_channels(pd, pp, x, outer, ch, inner, chunk, v.op, v.acc); });
                if (splits > 1) {
                    const int wpb = nt / 32;
                    launch((unsigned)((ch + wpb - 1) / wpb), 1, nt,
                           [=] { ember_reduce_channels_join(pd, pp, ch, splits, outer * inner, v.op, v.acc); });
                }
            }, chanIdx, outer * inner);
            // The whole-channel kernels (a block a channel), every entry point
            // on every case, the float4 ones where rows are whole float4 from
            // an aligned x; the sums streamed, the means through plain loads.
            {
                using whole = decltype(&ember_reduce_channel_whole1_u4v2);
                const struct {
                    const char* name;
                    whole streamed, l2;
                    bool vec;
                } wholes[] = {{"reduce_channel_whole4_u2v2", ember_reduce_channel_whole4_u2v2, ember_reduce_channel_whole4_u2v2_l2, true},
                              {"reduce_channel_whole4_u1v4", ember_reduce_channel_whole4_u1v4, ember_reduce_channel_whole4_u1v4_l2, true},
                              {"reduce_channel_whole4_u1v7", ember_reduce_channel_whole4_u1v7, ember_reduce_channel_whole4_u1v7_l2, true},
                              {"reduce_channel_whole1_u4v2", ember_reduce_channel_whole1_u4v2, ember_reduce_channel_whole1_u4v2_l2, false},
                              {"reduce_channel_whole1_u2v4", ember_reduce_channel_whole1_u2v4, ember_reduce_channel_whole1_u2v4_l2, false},
                              {"reduce_channel_whole1_u1v8", ember_reduce_channel_whole1_u1v8, ember_reduce_channel_whole1_u1v8_l2, false}};
                for (const auto& w : wholes) {
                    if (w.vec && (inner % 4 != 0 || v.off != 0)) continue;
                    const long long innerV = w.vec ? inner / 4 : inner;
                    run(w.name, ch, 0, 0, [&](float* pd, double*, unsigned*) {
                        const whole k = v.op == EMBER_R_MEAN ? w.l2 : w.streamed;
                        launch((unsigned)ch, 1, nt, [=] { k(pd, x, outer, ch, innerV, scale(outer * inner), v.acc); });
                    }, chanIdx, outer * inner);
                }
            }
            if (inner % 4 == 0 && v.off == 0) {  // rowGrid 0: not the rows' kernel
                // Both widths of the per-channel rows' kernel on the same
                // rows: four float4 a lane, and seven (_long); the means
                // through the plain loads (_l2), the sums streamed.
                using chanRows = decltype(&ember_reduce_channel_rows);
                const struct {
                    const char* name;
                    chanRows streamed, l2;
                } widths[] = {{"reduce_channel_rows", ember_reduce_channel_rows, ember_reduce_channel_rows_l2},
                              {"reduce_channel_rows_long", ember_reduce_channel_rows_long, ember_reduce_channel_rows_long_l2}};
                for (const auto& kw : widths)
                    run(kw.name, ch, (int)ch * rsplits, (int)ch, [&](float* pd, double* pp, unsigned* pc) {
                        const chanRows k = v.op == EMBER_R_MEAN ? kw.l2 : kw.streamed;
                        launch((unsigned)ch, (unsigned)rsplits, nt,
                               [=] { k(pd, pp, pc, x, outer, ch, inner, rowsPer, scale(outer * inner), v.acc); });
                    }, chanIdx, outer * inner);
                if (rowGrid > 0)
                    run("reduce_rows_sum4", outer * ch, 0, 0, [&](float* pd, double*, unsigned*) {
                        launch((unsigned)rowGrid, 1, nt, [=] {
                            if (v.op == EMBER_R_MEAN)
                                ember_reduce_rows_sum4_l2(pd, x, outer * ch, inner, scale(inner), v.acc);
                            else
                                ember_reduce_rows_sum4(pd, x, outer * ch, inner, scale(inner), v.acc);
                        });
                    }, [=](long long r, long long e) { return r * inner + e; }, inner);
            }
            if (v.op == EMBER_R_SUM && v.acc == 0) {
                run("sum", 1, sumBlocks, 1, [&](float* pd, double* pp, unsigned* pc) {
                    launch((unsigned)sumBlocks, 1, nt, [=] { ember_sum(pd, pp, pc, x, n, 1); });
                }, [](long long, long long e) { return e; }, n);
                // The same from one float off alignment (the one-float path).
                float* x1 = x + 1;
                const long long n1 = n - 1;
                std::vector<float> dst(3, guard);
                std::vector<double> part((size_t)sumBlocks + 1, (double)guard);
                unsigned counter = 0;
                launch((unsigned)sumBlocks, 1, nt, [&, x1, n1] { ember_sum(dst.data() + 1, part.data(), &counter, x1, n1, 0); });
                double want = 0, bound = 0;
                for (long long e = 0; e < n1; e++) {
                    want += x1[e];
                    bound += fabs(x1[e]);
                }
                const bool ok = fabs(dst[1] - want) <= 1e-5 * bound + 1e-30 && dst[0] == guard && dst[2] == guard &&
                                part[sumBlocks] == (double)guard && counter == 0;
                printf("sum unaligned outer=%lld channels=%lld inner=%lld: %s (%.9g, want %.9g)\n", outer, ch, inner,
                       ok ? "ok" : "FAIL", dst[1], want);
                failed += !ok;
            }
        }
    }
    return failed > 99 ? 99 : failed;
}
