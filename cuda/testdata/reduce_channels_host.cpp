// The driver of TestReduceChannelsKernelsOnHost: kernels/reduce_axis.cu
// (common.cu before it, host_emu.h included first) compiled for the host
// with this file. Arguments: the threads per block, then cases of five
// numbers, outer channels inner splits chunk (the Go side's plan,
// chanSplits). Each case runs ember_reduce_channels (and its join when
// splits > 1) on fresh random inputs, as a sum into a 16-byte aligned x,
// a sum accumulated into dst from an x one float off alignment (the
// one-float path), and a mean, NaN around x, and checks every channel against a double
// sum within 1e-5 of the sum of |terms| (the conformance suite's tolAcc),
// and the guards around dst and the partial sums. Exit status: the number
// of failed checks.
#include "host_launch.h"

static const float guard = -12345.678f;

int main(int argc, char** argv) {
    if (argc < 2 || (argc - 2) % 5 != 0) {
        fprintf(stderr, "usage: %s threads [outer channels inner splits chunk]...\n", argv[0]);
        return 100;
    }
    const int nt = atoi(argv[1]);
    std::mt19937_64 rng(std::random_device{}());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    int failed = 0;
    for (int a = 2; a < argc; a += 5) {
        const long long outer = atoll(argv[a]), ch = atoll(argv[a + 1]), inner = atoll(argv[a + 2]);
        const int splits = atoi(argv[a + 3]);
        const long long chunk = atoll(argv[a + 4]);
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
            std::vector<float> dst(ch + 2, guard), d0(ch);
            for (long long c = 0; c < ch; c++) d0[c] = normal(rng);
            if (v.acc)
                for (long long c = 0; c < ch; c++) dst[c + 1] = d0[c];
            std::vector<double> part((size_t)ch * splits + 1, 0.0);
            part.back() = (double)guard;
            float* pd = dst.data() + 1;
            double* pp = part.data();
            launch((unsigned)ch, (unsigned)splits, nt, [=] { ember_reduce_channels(pd, pp, x, outer, ch, inner, chunk, v.op, v.acc); });
            if (splits > 1) {
                const int wpb = nt / 32;
                launch((unsigned)((ch + wpb - 1) / wpb), 1, nt,
                       [=] { ember_reduce_channels_join(pd, pp, ch, splits, outer * inner, v.op, v.acc); });
            }
            int bad = 0;
            if (dst[0] != guard || dst[ch + 1] != guard || part.back() != (double)guard) {
                printf("outer=%lld channels=%lld inner=%lld splits=%d %s: a guard was overwritten\n", outer, ch, inner,
                       splits, v.name);
                bad++;
            }
            for (long long c = 0; c < ch; c++) {
                double want = 0, bound = 0;
                for (long long o = 0; o < outer; o++)
                    for (long long i = 0; i < inner; i++) {
                        const double t = x[(o * ch + c) * inner + i];
                        want += t;
                        bound += fabs(t);
                    }
                if (v.acc) {
                    want += d0[c];
                    bound += fabs(d0[c]);
                }
                if (v.op == EMBER_R_MEAN) {
                    want /= (double)(outer * inner);
                    bound /= (double)(outer * inner);
                }
                const double got = pd[c];
                if (!(fabs(got - want) <= 1e-5 * bound + 1e-30)) {
                    if (bad < 5)
                        printf("outer=%lld channels=%lld inner=%lld splits=%d %s: channel %lld = %.9g, want %.9g (bound %g)\n",
                               outer, ch, inner, splits, v.name, c, got, want, bound);
                    bad++;
                }
            }
            printf("outer=%lld channels=%lld inner=%lld splits=%d chunk=%lld %s: %s\n", outer, ch, inner, splits, chunk,
                   v.name, bad ? "FAIL" : "ok");
            failed += bad;
        }
    }
    return failed > 99 ? 99 : failed;
}
