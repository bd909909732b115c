// philox.cu: the Philox4x32-10 block and its 24-bit float, shared by
// random.cu's draws and attention.cu's dropout (the same bits as
// tensor/cpu_random.go).

// One ten-round Philox4x32 block of counter (c0, c1, c2, c3) under key (k0, k1).
__device__ __forceinline__ void ember_philox(unsigned int c[4], unsigned int k0, unsigned int k1) {
#pragma unroll
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        const unsigned int lo0 = 0xD2511F53u * c[0], hi0 = __umulhi(0xD2511F53u, c[0]);
        const unsigned int lo1 = 0xCD9E8D57u * c[2], hi1 = __umulhi(0xCD9E8D57u, c[2]);
        const unsigned int n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
        c[0] = n0;
        c[1] = lo1;
        c[2] = n2;
        c[3] = lo0;
    }
}

// 24 random bits as a float in [0, 1), exactly as unit24 on the CPU.
__device__ __forceinline__ float ember_unit24(unsigned int w) { return (float)(w >> 8) * (1.0f / 16777216.0f); }
