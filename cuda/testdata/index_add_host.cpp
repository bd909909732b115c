// The driver of TestIndexAddScanOnHost: kernels/index.cu (common.cu
// before it, host_emu.h included first) compiled for the host with this
// file. It runs ember_index_add_scan on shapes of repeated and distinct
// indices, lists of one to three tiles and grids smaller than the elements
// (blocks loop), and checks every element bit for bit against the CPU
// backend's loop (tensor/cpu_index.go); then that each bad index (-1, n),
// wherever it lies in the list, traps. Exit status: the number of failed
// checks (at most 99).
#include "host_launch.h"

static int run(long long outer, long long n, long long inner, const std::vector<int>& ix, unsigned grid, int nt, bool check) {
    const long long m = ix.size();
    std::mt19937_64 rng(outer * 1000003 + n * 101 + inner * 7 + m);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> src(outer * m * inner), dst(outer * n * inner + 2);
    for (auto& v : src) v = normal(rng);
    for (auto& v : dst) v = normal(rng);
    std::vector<float> want(dst);
    for (long long o = 0; o < outer; o++)
        for (long long j = 0; j < m; j++)
            if (ix[j] >= 0 && ix[j] < n)
                for (long long r = 0; r < inner; r++) want[1 + (o * n + ix[j]) * inner + r] += src[(o * m + j) * inner + r];
    float* pd = dst.data() + 1;
    const float* ps = src.data();
    const int* pi = ix.data();
    launch(grid, nt, [=] { ember_index_add_scan(pd, ps, pi, outer, n, m, inner); });
    if (!check) return 0;
    int bad = 0;
    for (size_t i = 0; i < dst.size(); i++)
        if (memcmp(&dst[i], &want[i], 4) != 0) {
            if (bad < 5) printf("outer=%lld n=%lld inner=%lld m=%lld: element %zu = %.9g, want %.9g\n", outer, n, inner, m, i, dst[i], want[i]);
            bad++;
        }
    printf("outer=%lld n=%lld inner=%lld m=%lld grid=%u: %s\n", outer, n, inner, m, grid, bad ? "FAIL" : "ok");
    return bad;
}

int main() {
    int failed = 0;
    std::mt19937 rng(7);
    struct shape { long long outer, n, inner, m; unsigned grid; int repeats; };
    const shape ss[] = {
        {1, 256, 3, 256, 0, 0},  // distinct (a permutation)
        {1, 256, 3, 256, 0, 1},  // repeats
        {2, 7, 5, 1024, 0, 1},   // one full tile
        {3, 5, 2, 2500, 0, 1},   // three tiles, the last partial
        {1, 1, 70, 1100, 0, 1},  // one row: every index the same
        {4, 9, 33, 40, 2, 1},    // blocks loop over the elements
        {1, 300, 1, 17, 0, 0},   // rows of one element
    };
    for (const shape& s : ss) {
        std::vector<int> ix(s.m);
        for (long long j = 0; j < s.m; j++) ix[j] = s.repeats ? (int)(rng() % (s.n / 2 + 1)) : (int)(j % s.n);
        if (!s.repeats) std::shuffle(ix.begin(), ix.end(), rng);
        const long long total = s.outer * s.n * s.inner;
        const unsigned grid = s.grid ? s.grid : (unsigned)((total + 63) / 64);
        g_traps = 0;
        failed += run(s.outer, s.n, s.inner, ix, grid, 64, true);
        if (g_traps) {
            printf("outer=%lld n=%lld inner=%lld m=%lld: %d traps on good indices\n", s.outer, s.n, s.inner, s.m, g_traps);
            failed++;
        }
    }
    // Each bad index alone, first, last and in a later tile of the list.
    for (int bad : {-1, 10}) {
        for (long long at : {0LL, 1023LL, 1024LL, 2999LL}) {
            std::vector<int> ix(3000, 3);
            ix[at] = bad;
            g_traps = 0;
            run(1, 10, 2, ix, 2, 64, false);
            printf("index %d at %lld of 3000: %d traps\n", bad, at, g_traps);
            if (g_traps == 0) failed++;
        }
    }
    return failed > 99 ? 99 : failed;
}
