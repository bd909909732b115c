// The host emulation's per-program state (host_emu.h declares it) and a
// launch of a grid, for the drivers of the host tests (*_host.cpp): the
// blocks run one after another, each as one pthread per CUDA thread.
#include <algorithm>
#include <cstdlib>
#include <functional>
#include <random>
#include <thread>
#include <vector>
thread_local uint3 threadIdx, blockIdx;
uint3 blockDim, gridDim;
pthread_barrier_t g_bar;
pthread_barrier_t g_warp_bar[32];
float g_shfl[1024];
unsigned g_shflu[1024];
ember_mma_frag g_mma[1024];
const unsigned short* g_ldsm[1024];

// launch runs body as a (gx, gy) grid of blocks of nt threads.
static void launch(unsigned gx, unsigned gy, int nt, std::function<void()> body) {
    gridDim = {gx, gy, 1};
    blockDim = {(unsigned)nt, 1, 1};
    pthread_barrier_init(&g_bar, nullptr, nt);
    for (int w = 0; w < nt / 32; w++) pthread_barrier_init(&g_warp_bar[w], nullptr, 32);
    for (unsigned by = 0; by < gy; by++) {
        for (unsigned bx = 0; bx < gx; bx++) {
            std::vector<std::thread> ts;
            for (int t = 0; t < nt; t++)
                ts.emplace_back([=] { threadIdx = {(unsigned)t, 0, 0}; blockIdx = {bx, by, 0}; body(); });
            for (auto& t : ts) t.join();
        }
    }
    pthread_barrier_destroy(&g_bar);
    for (int w = 0; w < nt / 32; w++) pthread_barrier_destroy(&g_warp_bar[w]);
}

// launch runs body as a 1-D grid of gx blocks of nt threads.
static void launch(unsigned gx, int nt, std::function<void()> body) { launch(gx, 1, nt, std::move(body)); }
