// The driver of TestMaxPoolBackwardKernelOnHost: kernels/conv.cu (common.cu
// before it, host_emu.h included first) compiled for the host with this
// file. It runs ember_maxpool2d_backward_disjoint, with the items and
// grid that cuda/conv.go's MaxPool2dBackward launches, on fresh random
// gradients and window argmaxes, and checks every dx element bit for bit
// against a plain scatter (dx = 0, then dx[argmax] = dy; or dx[argmax] +=
// dy when accumulating): planes no multiple of the stride (the last cell
// owns the rest), windows smaller than their stride, ceil mode's partial
// last window, one output. Exit status: the number of failed checks (at
// most 99).
#include "host_launch.h"

// divider is cuda/divider.go's newDivider: n / d == (umulhi(n, mul) + n) >> shift.
static void divider(unsigned d, unsigned* mul, unsigned* shift) {
    unsigned s = 0;
    while ((1ull << s) < d) s++;
    *shift = s;
    *mul = (unsigned)((((1ull << s) - d) << 32) / d + 1);
}

static int run(int planes, int H, int W, int KH, int KW, int SH, int SW, int OH, int OW, bool acc, unsigned grid) {
    std::mt19937_64 rng(planes * 1000003 + H * 101 + W * 7 + KH * 3 + SW + acc);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const long long xLen = (long long)planes * H * W, yLen = (long long)planes * OH * OW;
    std::vector<float> dx(xLen), dy(yLen);
    std::vector<int> argmax(yLen);
    for (auto& v : dx) v = normal(rng);
    for (auto& v : dy) v = normal(rng);
    // Each window's argmax: a random element of the window inside the plane.
    for (long long o = 0; o < yLen; o++) {
        const int q = (int)(o % ((long long)OH * OW)), i = q / OW, j = q % OW;
        const int h0 = i * SH, w0 = j * SW, h1 = std::min(h0 + KH, H), w1 = std::min(w0 + KW, W);
        const int h = h0 + (int)(rng() % (h1 - h0)), w = w0 + (int)(rng() % (w1 - w0));
        argmax[o] = h * W + w;
    }
    std::vector<float> want(dx);
    if (!acc) std::fill(want.begin(), want.end(), 0.0f);
    for (long long o = 0; o < yLen; o++) {
        const long long p = o / ((long long)OH * OW);
        float& d = want[p * H * W + argmax[o]];
        d = acc ? d + dy[o] : dy[o];
    }
    const long long items = (long long)planes * H * OW;
    float* pdx = dx.data();
    const float* pdy = dy.data();
    const int* pa = argmax.data();
    if (grid == 0) grid = (unsigned)((items + 63) / 64);
    unsigned rowMul, rowShift, owMul, owShift;
    divider((unsigned)(H * OW), &rowMul, &rowShift);
    divider((unsigned)OW, &owMul, &owShift);
    launch(grid, 64, [=] {
        ember_maxpool2d_backward_disjoint(pdx, pdy, pa, H, W, KH, KW, SH, SW, OH, OW, items, xLen, acc, (int)rowMul,
                                          (int)rowShift, (int)owMul, (int)owShift);
    });
    int bad = 0;
    for (long long i = 0; i < xLen; i++)
        if (memcmp(&dx[i], &want[i], 4) != 0 && bad++ < 5) printf("  element %lld = %.9g, want %.9g\n", i, dx[i], want[i]);
    printf("planes=%d %dx%d window %dx%d stride %dx%d out %dx%d acc=%d grid=%u: %s\n", planes, H, W, KH, KW, SH, SW, OH, OW, acc, grid,
           bad ? "FAIL" : "ok");
    return bad;
}

int main() {
    struct shape { int planes, H, W, KH, KW, SH, SW, OH, OW; unsigned grid; };
    const shape ss[] = {
        {3, 31, 31, 2, 2, 2, 2, 15, 15, 0},  // airbench's pool: the last cells own row and column 30
        {2, 28, 28, 2, 2, 2, 2, 14, 14, 5},  // even planes; blocks loop over the items
        {4, 3, 3, 3, 3, 3, 3, 1, 1, 0},      // one window a plane
        {2, 5, 7, 2, 2, 2, 2, 3, 4, 0},      // ceil mode: partial last windows
        {2, 9, 10, 1, 2, 2, 3, 5, 4, 0},     // windows smaller than their strides
    };
    int failed = 0;
    for (const shape& s : ss)
        for (bool acc : {false, true}) failed += run(s.planes, s.H, s.W, s.KH, s.KW, s.SH, s.SW, s.OH, s.OW, acc, s.grid);
    return failed > 99 ? 99 : failed;
}
