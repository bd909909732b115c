// The driver of TestLayerNormKernelsOnHost: kernels/norm.cu (common.cu
// before it, host_emu.h included first) compiled for the host with this
// file. Arguments: the threads per block, then cases of four numbers, rows
// cols npl grid (the Go side's lnLanes and lnRowsBlocks). Each case runs
// layer norm's kernels over rows of cols held in registers
// (ember_layer_norm_rows<npl>, ember_layer_norm_backward_rows<npl> and
// ember_layer_norm_params_finish over its partial sums, at 1,024 threads)
// and the kernels they replace (ember_layer_norm_warp,
// ember_layer_norm_backward_dx_warp, ember_layer_norm_params_partial and
// ember_layer_norm_params_finish) on fresh random inputs, with and without
// weights, dx stored and accumulated, and checks:
//   - y, the means, the inverse deviations and dx: the same bits;
//   - dweight and dbias (the same double terms in another order): within
//     1e-6 of the sum of |terms|, and against a double reference within 1e-5;
//   - NaN guards after dx and the partial sums untouched.
// Exit status: the number of failed checks (at most 99).
#include "host_launch.h"

extern "C" __global__ void ember_layer_norm_rows4(float*, float*, float*, const float*, const float*, const float*, long long, int, float);
extern "C" __global__ void ember_layer_norm_rows8(float*, float*, float*, const float*, const float*, const float*, long long, int, float);
extern "C" __global__ void ember_layer_norm_rows12(float*, float*, float*, const float*, const float*, const float*, long long, int, float);
extern "C" __global__ void ember_layer_norm_rows16(float*, float*, float*, const float*, const float*, const float*, long long, int, float);

static int failed = 0;

static void fail(const char* what, long long rows, int cols, long long i, double got, double want) {
    if (failed < 20)
        printf("rows=%lld cols=%d %s [%lld]: got %.9g, want %.9g\n", rows, cols, what, i, got, want);
    failed++;
}

static void same(const char* what, long long rows, int cols, const std::vector<float>& got, const std::vector<float>& want) {
    for (size_t i = 0; i < want.size(); i++) {
        if (memcmp(&got[i], &want[i], 4) != 0) {
            fail(what, rows, cols, (long long)i, got[i], want[i]);
            return;
        }
    }
}

int main(int argc, char** argv) {
    if (argc < 2 || (argc - 2) % 4 != 0) {
        fprintf(stderr, "usage: %s threads [rows cols npl grid]...\n", argv[0]);
        return 100;
    }
    const int nt = atoi(argv[1]);
    std::mt19937_64 rng(std::random_device{}());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const float nan = __int_as_float(0x7fc00000);
    for (int a = 2; a < argc; a += 4) {
        const long long rows = atoll(argv[a]);
        const int cols = atoi(argv[a + 1]), npl = atoi(argv[a + 2]), grid = atoi(argv[a + 3]);
        const long long n = rows * cols;
        std::vector<float> x(n), dy(n), w(cols), b(cols);
        for (auto& v : x) v = 3.0f + 2.0f * normal(rng);  // a mean away from 0
        for (auto& v : dy) v = normal(rng);
        for (auto& v : w) v = normal(rng);
        for (auto& v : b) v = normal(rng);
        // The warp kernels take any grid: a small one keeps the emulation's
        // threads few.
        const unsigned warpGrid = (unsigned)std::min(std::max((rows + nt / 32 - 1) / (nt / 32), 1LL), 64LL);
        for (int affine = 0; affine < 2; affine++) {
            const float* pw = affine ? w.data() : nullptr;
            const float* pb = affine ? b.data() : nullptr;
            std::vector<float> y0(n), m0(rows), i0(rows), y1(n), m1(rows), i1(rows);
            launch(warpGrid, nt, [&] { ember_layer_norm_warp(y0.data(), m0.data(), i0.data(), x.data(), pw, pb, rows, cols, 1e-5f); });
            launch(warpGrid, nt, [&] {
                switch (npl) {
                    case 4: ember_layer_norm_rows4(y1.data(), m1.data(), i1.data(), x.data(), pw, pb, rows, cols, 1e-5f); break;
                    case 8: ember_layer_norm_rows8(y1.data(), m1.data(), i1.data(), x.data(), pw, pb, rows, cols, 1e-5f); break;
                    case 12: ember_layer_norm_rows12(y1.data(), m1.data(), i1.data(), x.data(), pw, pb, rows, cols, 1e-5f); break;
                    default: ember_layer_norm_rows16(y1.data(), m1.data(), i1.data(), x.data(), pw, pb, rows, cols, 1e-5f); break;
                }
            });
            same("y", rows, cols, y1, y0);
            same("mean", rows, cols, m1, m0);
            same("invstd", rows, cols, i1, i0);
            for (int acc = 0; acc < 2; acc++) {
                // dx: the old kernel, then the new one (NaN guard after it).
                std::vector<float> dx0(n), dx1(n + 4, nan);
                for (long long i = 0; i < n; i++) dx0[i] = dx1[i] = acc ? normal(rng) : 0.0f;
                launch(warpGrid, nt, [&] { ember_layer_norm_backward_dx_warp(dx0.data(), dy.data(), x.data(), pw, m0.data(), i0.data(), rows, cols, acc); });
                std::vector<double> part(2 * (size_t)grid * cols + 4, (double)nan);
                launch((unsigned)grid, nt, [&] {
                    switch (npl) {
                        case 4: ember_layer_norm_backward_rows4(dx1.data(), part.data(), dy.data(), x.data(), pw, m0.data(), i0.data(), rows, cols, acc); break;
                        case 8: ember_layer_norm_backward_rows8(dx1.data(), part.data(), dy.data(), x.data(), pw, m0.data(), i0.data(), rows, cols, acc); break;
                        case 12: ember_layer_norm_backward_rows12(dx1.data(), part.data(), dy.data(), x.data(), pw, m0.data(), i0.data(), rows, cols, acc); break;
                        default: ember_layer_norm_backward_rows16(dx1.data(), part.data(), dy.data(), x.data(), pw, m0.data(), i0.data(), rows, cols, acc); break;
                    }
                });
                for (int g = 0; g < 4; g++) {
                    if (!std::isnan(dx1[n + g])) fail("dx guard", rows, cols, n + g, dx1[n + g], nan);
                    if (!std::isnan(part[2 * (size_t)grid * cols + g])) fail("partial guard", rows, cols, g, part[2 * (size_t)grid * cols + g], nan);
                }
                dx1.resize(n);
                same("dx", rows, cols, dx1, dx0);
                if (acc) continue;
                // The parameters' sums: the new partials through the finish
                // kernel at 1,024 threads, the old two stages, a double loop.
                std::vector<float> dw1(cols), db1(cols), dw0(cols), db0(cols);
                launch((unsigned)((cols + 31) / 32), 1024, [&] { ember_layer_norm_params_finish(dw1.data(), db1.data(), part.data(), cols, grid, 0, 0); });
                const long long perChunk = 16, chunks = (rows + perChunk - 1) / perChunk, tiles = (cols + 31) / 32;
                std::vector<double> old(2 * chunks * cols);
                launch((unsigned)(tiles * chunks), nt, [&] { ember_layer_norm_params_partial(old.data(), dy.data(), x.data(), m0.data(), i0.data(), rows, cols, perChunk); });
                launch((unsigned)tiles, nt, [&] { ember_layer_norm_params_finish(dw0.data(), db0.data(), old.data(), cols, chunks, 0, 0); });
                for (int j = 0; j < cols; j++) {
                    double sw = 0, sb = 0, aw = 0, ab = 0;
                    for (long long r = 0; r < rows; r++) {
                        const double xh = ((double)x[r * cols + j] - m0[r]) * i0[r], g = dy[r * cols + j];
                        sw += g * xh;
                        sb += g;
                        aw += fabs(g * xh);
                        ab += fabs(g);
                    }
                    if (!(fabs(dw1[j] - dw0[j]) <= 1e-6 * aw + 1e-30)) fail("dweight against the old kernels", rows, cols, j, dw1[j], dw0[j]);
                    if (!(fabs(db1[j] - db0[j]) <= 1e-6 * ab + 1e-30)) fail("dbias against the old kernels", rows, cols, j, db1[j], db0[j]);
                    if (!(fabs(dw1[j] - sw) <= 1e-5 * aw + 1e-30)) fail("dweight", rows, cols, j, dw1[j], sw);
                    if (!(fabs(db1[j] - sb) <= 1e-5 * ab + 1e-30)) fail("dbias", rows, cols, j, db1[j], sb);
                }
            }
        }
    }
    if (failed) printf("%d failed checks\n", failed);
    else printf("layer norm kernels: every check passed\n");
    return failed > 99 ? 99 : failed;
}
