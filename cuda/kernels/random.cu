// random.cu: Philox4x32-10 counter-based random numbers, mirroring
// tensor/cpu_random.go bit for bit (the layout is pinned in
// tensor/backend_random.go). The Philox block itself is in philox.cu.

// Box-Muller in double precision, as boxMuller on the CPU.
__device__ __forceinline__ void ember_box_muller(unsigned int w0, unsigned int w1, double& z0, double& z1) {
    const double u1 = (double)((w0 >> 8) + 1u) * (1.0 / 16777216.0);
    const double u2 = (double)(w1 >> 8) * (1.0 / 16777216.0);
    const double r = sqrt(-2.0 * log(u1));
    double s, c;
    sincos(2.0 * 3.14159265358979323846 * u2, &s, &c);
    z0 = r * c;
    z1 = r * s;
}

// dst[i] for i in [0, n): one thread per Philox block of four elements,
// block j = offset + i/4. dist: 0 uniform [a, b), 1 normal (mean a, std
// b), 2 Bernoulli (probability a).
__device__ __forceinline__ void ember_random_body(float* dst, long long n, int dist, unsigned long long s,
                                                  unsigned long long off, float a, float b) {
    const long long blocks = (n + 3) / 4;
    const float span = b - a;
    EMBER_LOOP(long long, j, blocks) {
        const unsigned long long ctr = off + (unsigned long long)j;
        unsigned int w[4] = {(unsigned int)ctr, (unsigned int)(ctr >> 32), 0u, 0u};
        ember_philox(w, (unsigned int)s, (unsigned int)(s >> 32));
        double z[4] = {0.0, 0.0, 0.0, 0.0};
        if (dist == 1) {
            ember_box_muller(w[0], w[1], z[0], z[1]);
            ember_box_muller(w[2], w[3], z[2], z[3]);
        }
        const long long base = 4 * j;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            if (base + k >= n) break;
            float v;
            if (dist == 0) {
                v = a + span * ember_unit24(w[k]);
            } else if (dist == 2) {
                v = ember_unit24(w[k]) < a ? 1.0f : 0.0f;
            } else {
                v = (float)((double)a + (double)b * z[k]);
            }
            dst[base + k] = v;
        }
    }
}

extern "C" __global__ void ember_random(float* dst, long long n, int dist, long long seed, long long offset, float a,
                                        float b) {
    ember_random_body(dst, n, dist, (unsigned long long)seed, (unsigned long long)offset, a, b);
}

// ember_random with (seed, offset) read from state (four 32-bit words:
// seed low, high, offset low, high), for draws inside a captured graph.
extern "C" __global__ void ember_random_state(float* dst, long long n, int dist, const int* state, float a, float b) {
    const unsigned long long seed = (unsigned long long)(unsigned int)state[0] |
                                    ((unsigned long long)(unsigned int)state[1] << 32);
    const unsigned long long offset = (unsigned long long)(unsigned int)state[2] |
                                      ((unsigned long long)(unsigned int)state[3] << 32);
    ember_random_body(dst, n, dist, seed, offset, a, b);
}

// Adds blocks to the offset words of state: launched (one thread) after
// ember_random_state on the same stream, so that every block of the draw
// has read the old offset.
extern "C" __global__ void ember_random_advance(int* state, long long blocks) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    unsigned long long offset = (unsigned long long)(unsigned int)state[2] |
                                ((unsigned long long)(unsigned int)state[3] << 32);
    offset += (unsigned long long)blocks;
    state[2] = (int)(unsigned int)offset;
    state[3] = (int)(unsigned int)(offset >> 32);
}

// saved = state, then state's offset advances by blocks (one thread): a
// draw read from saved in a forward and a backward pass (the fused
// attention's weights, a dropout's mask drawn again), while the generator
// moves on.
extern "C" __global__ void ember_random_take_state(int* saved, int* state, long long blocks) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    unsigned long long offset = (unsigned long long)(unsigned int)state[2] |
                                ((unsigned long long)(unsigned int)state[3] << 32);
    saved[0] = state[0];
    saved[1] = state[1];
    saved[2] = state[2];
    saved[3] = state[3];
    offset += (unsigned long long)blocks;
    state[2] = (int)(unsigned int)offset;
    state[3] = (int)(unsigned int)(offset >> 32);
}

// Dropout in one pass: element i keeps x[i]·scale where its Bernoulli
// draw of probability keep (ember_random_body's, bit for bit) is 1, else
// 0, and stores the mask (scale or 0) for the backward pass unless mask
// is null (the backward pass then draws it again). Where r is not null
// the residual r[i] is added to the rounded product (__fadd_rn: never
// contracted into a multiply-add), the bits of the dropout and then the
// addition. One thread per Philox block of four elements, as the draw.
__device__ __forceinline__ void ember_dropout_body(float* y, float* mask, const float* x, const float* r, long long n,
                                                   unsigned long long s, unsigned long long off, float keep,
                                                   float scale) {
    const long long blocks = (n + 3) / 4;
    EMBER_LOOP(long long, j, blocks) {
        const unsigned long long ctr = off + (unsigned long long)j;
        unsigned int w[4] = {(unsigned int)ctr, (unsigned int)(ctr >> 32), 0u, 0u};
        ember_philox(w, (unsigned int)s, (unsigned int)(s >> 32));
        const long long base = 4 * j;
        if (base + 4 <= n && ((reinterpret_cast<unsigned long long>(x + base) |
                               reinterpret_cast<unsigned long long>(y + base) |
                               reinterpret_cast<unsigned long long>(mask ? mask + base : y) |
                               reinterpret_cast<unsigned long long>(r ? r + base : y)) & 15) == 0) {
            const ember_f4 v = *reinterpret_cast<const ember_f4*>(x + base);
            ember_f4 m, o;
            m.x = ember_unit24(w[0]) < keep ? scale : 0.0f;
            m.y = ember_unit24(w[1]) < keep ? scale : 0.0f;
            m.z = ember_unit24(w[2]) < keep ? scale : 0.0f;
            m.w = ember_unit24(w[3]) < keep ? scale : 0.0f;
            o.x = v.x * m.x;
            o.y = v.y * m.y;
            o.z = v.z * m.z;
            o.w = v.w * m.w;
            if (r) {
                const ember_f4 rv = *reinterpret_cast<const ember_f4*>(r + base);
                o.x = __fadd_rn(rv.x, o.x);
                o.y = __fadd_rn(rv.y, o.y);
                o.z = __fadd_rn(rv.z, o.z);
                o.w = __fadd_rn(rv.w, o.w);
            }
            if (mask) *reinterpret_cast<ember_f4*>(mask + base) = m;
            *reinterpret_cast<ember_f4*>(y + base) = o;
            continue;
        }
#pragma unroll
        for (int k = 0; k < 4; k++) {
            if (base + k >= n) break;
            const float m = ember_unit24(w[k]) < keep ? scale : 0.0f;
            if (mask) mask[base + k] = m;
            const float o = x[base + k] * m;
            y[base + k] = r ? __fadd_rn(r[base + k], o) : o;
        }
    }
}

extern "C" __global__ void ember_dropout(float* y, float* mask, const float* x, const float* residualOrNull, long long n,
                                         long long seed, long long offset, float keep, float scale) {
    ember_dropout_body(y, mask, x, residualOrNull, n, (unsigned long long)seed, (unsigned long long)offset, keep, scale);
}

// ember_dropout with (seed, offset) read from state, as ember_random_state
// (ember_random_advance then moves the offset).
extern "C" __global__ void ember_dropout_state(float* y, float* mask, const float* x, const float* residualOrNull,
                                               long long n, const int* state, float keep, float scale) {
    const unsigned long long seed = (unsigned long long)(unsigned int)state[0] |
                                    ((unsigned long long)(unsigned int)state[1] << 32);
    const unsigned long long offset = (unsigned long long)(unsigned int)state[2] |
                                      ((unsigned long long)(unsigned int)state[3] << 32);
    ember_dropout_body(y, mask, x, residualOrNull, n, seed, offset, keep, scale);
}
