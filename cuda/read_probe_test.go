package cuda

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/ember-ml/ember/cuda/driver"
	"github.com/ember-ml/ember/tensor"
)

// readProbeSrc holds the probe's kernels: a flat read-and-sum of float4
// with V loads a lane in flight (flatd), in float with no join
// (probe_flat*) or with ember_sum's double sums, with or without its join
// by the last block to arrive, counted at one address or at 32 and then
// one (probe_flatd*); and the same read through the tensor memory
// accelerator's bulk copies into shared-memory stages (probe_bulk).
const readProbeSrc = `
__device__ __forceinline__ float4 ld_once(const float4* p) {
    float4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float part[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = 0.f;
    if (threadIdx.x < 32) {
        s = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.f;
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    }
    __syncthreads();
    return s;
}
// flatd: each thread's V float4 loads a batch issued before the adds,
// grid-stride; each float4 added in float and the thread's sums in Acc
// (double as ember_sum adds), with or without the join of the last block
// to arrive (a fence, a counter, the partials read back); without it each
// block writes its own sum.
template <typename Acc, int V, bool Join, bool Grouped = false>
__device__ void flatd(float* out, double* part, unsigned* counter, const float4* x, long long n4) {
    const long long T = (long long)gridDim.x * blockDim.x;
    Acc s = 0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += T * V) {
        float4 v[V];
#pragma unroll
        for (int j = 0; j < V; j++) v[j] = i + j * T < n4 ? ld_once(x + i + j * T) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int j = 0; j < V; j++) s += (Acc)((v[j].x + v[j].y) + (v[j].z + v[j].w));
    }
    __shared__ double wp[32];
    __shared__ int last;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) wp[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) t += wp[w];
        if (!Join) {
            out[blockIdx.x] = (float)t;
        } else {
            part[blockIdx.x] = t;
            asm volatile("fence.acq_rel.gpu;" ::: "memory");
            if (!Grouped) {
                last = atomicAdd(counter, 1u) == gridDim.x - 1;
                if (last) *counter = 0;
            } else {
                // 32 group counters 128 bytes apart, then the top one: no
                // more than 32 blocks count at one address.
                const unsigned g = blockIdx.x & 31, groups = gridDim.x < 32 ? gridDim.x : 32;
                const unsigned inGroup = (gridDim.x - g + 31) / 32;
                unsigned* gc = counter + 32 * (1 + g);
                last = atomicAdd(gc, 1u) == inGroup - 1;
                if (last) {
                    *gc = 0;
                    asm volatile("fence.acq_rel.gpu;" ::: "memory");
                    last = atomicAdd(counter, 1u) == groups - 1;
                    if (last) *counter = 0;
                }
            }
        }
    }
    if (!Join) return;
    __syncthreads();
    if (!last) return;
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
    double t = 0.0;
    for (unsigned b = threadIdx.x; b < gridDim.x; b += blockDim.x) t += __ldcg(part + b);
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) wp[threadIdx.x >> 5] = t;
    __syncthreads();
    if (threadIdx.x == 0) {
        double u = 0.0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) u += wp[w];
        out[0] = (float)u;
    }
}
extern "C" __global__ void __launch_bounds__(256) probe_flatd4(float* o, double* p, unsigned* c, const float4* x, long long n4) { flatd<double, 4, false>(o, p, c, x, n4); }
extern "C" __global__ void __launch_bounds__(256) probe_flatd8(float* o, double* p, unsigned* c, const float4* x, long long n4) { flatd<double, 8, false>(o, p, c, x, n4); }
extern "C" __global__ void __launch_bounds__(256) probe_flatd4_join(float* o, double* p, unsigned* c, const float4* x, long long n4) { flatd<double, 4, true>(o, p, c, x, n4); }
extern "C" __global__ void __launch_bounds__(256) probe_flatd4_join32(float* o, double* p, unsigned* c, const float4* x, long long n4) { flatd<double, 4, true, true>(o, p, c, x, n4); }
extern "C" __global__ void __launch_bounds__(256) probe_flatd8_join(float* o, double* p, unsigned* c, const float4* x, long long n4) { flatd<double, 8, true>(o, p, c, x, n4); }
extern "C" __global__ void __launch_bounds__(256) probe_flat4(float* o, double* p, unsigned* c, const float4* x, long long n4) { flatd<float, 4, false>(o, p, c, x, n4); }
extern "C" __global__ void __launch_bounds__(256) probe_flat8(float* o, double* p, unsigned* c, const float4* x, long long n4) { flatd<float, 8, false>(o, p, c, x, n4); }

__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void bar_init(unsigned long long* b, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(b)), "r"(count));
}
__device__ __forceinline__ void bar_expect(unsigned long long* b, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, unsigned long long* b) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(b)) : "memory");
}
__device__ __forceinline__ void bar_wait(unsigned long long* b, unsigned parity) {
    asm volatile(
        "{\n .reg .pred p;\n"
        "W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        " @!p bra W;\n}" ::"r"(smem_addr(b)), "r"(parity) : "memory");
}

// probe_bulk: block b reads bytes [b*per, b*per+per) (the last to the
// end) in chunks of chunk bytes through stages shared-memory stages.
extern "C" __global__ void probe_bulk(float* out, const char* x, long long bytes, int chunk, int stages) {
    extern __shared__ __align__(128) unsigned char stage[];
    __shared__ __align__(8) unsigned long long bar[8];
    const long long per = (bytes / gridDim.x) & ~15LL;
    const long long lo = blockIdx.x * per, hi = blockIdx.x == gridDim.x - 1 ? bytes : lo + per;
    const int chunks = (int)((hi - lo + chunk - 1) / chunk);
    if (threadIdx.x == 0) {
        for (int s = 0; s < stages; s++) bar_init(&bar[s], 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int k = 0; k < stages && k < chunks; k++) {
            const unsigned len = (unsigned)min((long long)chunk, hi - lo - (long long)k * chunk);
            bar_expect(&bar[k], len);
            bulk_load(stage + k * chunk, x + lo + (long long)k * chunk, len, &bar[k]);
        }
    }
    float s = 0.f;
    for (int k = 0; k < chunks; k++) {
        const int st = k % stages;
        bar_wait(&bar[st], (k / stages) & 1);
        const int len = (int)min((long long)chunk, hi - lo - (long long)k * chunk);
        const float4* p = reinterpret_cast<const float4*>(stage + st * chunk);
        for (int i = threadIdx.x; i < len / 16; i += blockDim.x) {
            const float4 v = p[i];
            s += (v.x + v.y) + (v.z + v.w);
        }
        __syncthreads();
        if (threadIdx.x == 0 && k + stages < chunks) {
            const int n = k + stages;
            const unsigned l = (unsigned)min((long long)chunk, hi - lo - (long long)n * chunk);
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            bar_expect(&bar[st], l);
            bulk_load(stage + st * chunk, x + lo + (long long)n * chunk, l, &bar[st]);
        }
    }
    s = block_sum(s);
    if (threadIdx.x == 0) out[blockIdx.x] = s;
}
`

// TestGPUReadProbe times reads of 25, 51 and 103 MB: the per-channel sums
// and the flat sum as built, beside what the device reads at best with no
// output to join, and what the join costs: the probe's kernels (plain
// loads with 4 or 8 in flight a lane, with and without the last block's
// join, and bulk copies into shared-memory stages) over grids and stage
// sizes (docs/performance.md, round 36). It prints µs a call and GB/s and
// asserts nothing about time, only that the joined sum of ones is their
// count. It runs only with EMBER_READ_PROBE=1.
func TestGPUReadProbe(t *testing.T) {
	if os.Getenv("EMBER_READ_PROBE") != "1" {
		t.Skip("the read probe runs with EMBER_READ_PROBE=1")
	}
	b := newGPUBackend(t, BackendOptions{})
	m, err := b.dev.Compile(readProbeSrc)
	if err != nil {
		t.Fatal(err)
	}
	fn := func(name string) *driver.Function {
		f, err := m.Function(name)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	flat4, flat8, bulk := fn("probe_flat4"), fn("probe_flat8"), fn("probe_bulk")
	if err := bulk.SetMaxDynamicSharedMemory(200 << 10); err != nil {
		t.Fatal(err)
	}
	time1 := func(launch func()) float64 {
		us, _, err := timeCalls(b, launch)
		if err != nil {
			t.Fatal(err)
		}
		return us
	}
	sm := b.dev.MultiprocessorCount()
	for _, shape := range [][3]int{{512, 128, 196}, {512, 64, 784}, {512, 256, 49}} {
		outer, channels, inner := shape[0], shape[1], shape[2]
		n := outer * channels * inner
		bytes := float64(4 * n)
		x := tensor.Full(b, nil, 1, n)
		out := tensor.Empty(b, nil, 1<<16)
		dst := tensor.Empty(b, nil, channels)
		px, pout := b.f32("probe", x.Buffer()), b.f32("probe", out.Buffer())
		report := func(what string, us float64) {
			fmt.Printf("probe %v %-52s %8.2f us %7.0f GB/s\n", shape, what, us, bytes/us/1e3)
		}
		report("ReduceChannels as built", time1(func() { b.ReduceChannels(tensor.ReduceSum, dst.Buffer(), x.Buffer(), outer, channels, inner, false) }))
		report("Sum as built", time1(func() { b.Sum(out.Buffer(), x.Buffer()) }))
		// Sum's work with flat's loads, without and with the join.
		ws := b.workspace("probe", 8*4096)
		counters := tensor.Zeros(b, nil, 32*33) // the grouped join's, reset by it
		for _, name := range []string{"probe_flatd4", "probe_flatd8", "probe_flatd4_join", "probe_flatd8_join", "probe_flatd4_join32"} {
			f := fn(name)
			for _, g := range []int{1024, 8 * sm} {
				report(fmt.Sprintf("%s grid %d", name, g), time1(func() {
					devCheck("probe", f.Launch(driver.Dim3{X: g, Y: 1, Z: 1}, driver.Dim3{X: 256, Y: 1, Z: 1}, 0, b.stream,
						pout, ws.Ptr(), b.f32("probe", counters.Buffer()), px, int64(n/4)))
				}))
				got := make([]float32, out.Len())
				b.Download(got, out.Buffer())
				if strings.Contains(name, "join") && got[0] != float32(n) {
					t.Errorf("%v %s: the joined flat sum of ones is %g, want %d", shape, name, got[0], n)
				}
			}
		}
		b.release(ws)
		counters.Release()
		for _, g := range []int{1024, 2 * 1024, 8 * sm, 16 * sm} {
			for _, f := range []*driver.Function{flat4, flat8} {
				report(fmt.Sprintf("%s grid %d", f.Name, g), time1(func() {
					devCheck("probe", f.Launch(driver.Dim3{X: g, Y: 1, Z: 1}, driver.Dim3{X: 256, Y: 1, Z: 1}, 0, b.stream, pout, uintptr(0), uintptr(0), px, int64(n/4)))
				}))
			}
		}
		for _, perSM := range []int{1, 2, 4} {
			for _, threads := range []int{256, 512} {
				for _, cfg := range [][2]int{{8 << 10, 4}, {16 << 10, 3}, {16 << 10, 4}, {32 << 10, 2}, {32 << 10, 3}, {48 << 10, 2}} {
					chunk, stages := cfg[0], cfg[1]
					if chunk*stages*perSM > 220<<10 {
						continue
					}
					g := perSM * sm
					report(fmt.Sprintf("bulk %d/SM x%d, %d KiB x %d", perSM, threads, chunk>>10, stages), time1(func() {
						devCheck("probe", bulk.Launch(driver.Dim3{X: g, Y: 1, Z: 1}, driver.Dim3{X: threads, Y: 1, Z: 1}, chunk*stages, b.stream,
							pout, px, int64(4*n), int32(chunk), int32(stages)))
					}))
				}
			}
		}
		for _, v := range []*tensor.Tensor{x, out, dst} {
			v.Release()
		}
	}
}
