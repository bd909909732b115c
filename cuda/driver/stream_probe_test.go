package driver

import (
	"fmt"
	"os"
	"slices"
	"testing"
	"time"
	"unsafe"
)

// streamProbeSrc holds the probes' kernels. sp_*: one read and one write
// of float4 (a copy, or a ReLU), U float4 a thread with all U loads issued
// before the stores (sp_copy and sp_u2 as ember_copy16 and ember_relu),
// each load plain, read-only (ld.global.nc) or not kept in L1
// (L1::no_allocate), each store plain or streaming (st.global.cs).
// sp_read: a read of float4 with eight loads a lane in flight, summed a
// block.
const streamProbeSrc = `
template <int LD>
__device__ __forceinline__ float4 sp_ld(const float4* p) {
    if (LD == 0) return *p;
    if (LD == 1) return __ldg(p);
    float4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
    return v;
}
template <int U, int LD, bool CS, bool RELU>
__device__ __forceinline__ void sp_stream(float4* y, const float4* x, long long n) {
    const long long step = (long long)gridDim.x * blockDim.x * U;
    for (long long q0 = (long long)blockIdx.x * blockDim.x * U + threadIdx.x; q0 < n; q0 += step) {
        float4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) if (q0 + u * blockDim.x < n) v[u] = sp_ld<LD>(x + q0 + u * blockDim.x);
#pragma unroll
        for (int u = 0; u < U; u++) if (q0 + u * blockDim.x < n) {
            float4 r = v[u];
            if (RELU) r = make_float4(fmaxf(r.x, 0.f), fmaxf(r.y, 0.f), fmaxf(r.z, 0.f), fmaxf(r.w, 0.f));
            if (CS) __stcs(y + q0 + u * blockDim.x, r); else y[q0 + u * blockDim.x] = r;
        }
    }
}
#define SP(name, U, LD, CS, RELU) extern "C" __global__ void name(float4* y, const float4* x, long long n) { sp_stream<U, LD, CS, RELU>(y, x, n); }
SP(sp_copy, 2, 0, false, false)
SP(sp_u1, 1, 0, false, true)
SP(sp_u2, 2, 0, false, true)
SP(sp_u4, 4, 0, false, true)
SP(sp_u8, 8, 0, false, true)
SP(sp_u2_nc, 2, 1, false, true)
SP(sp_u2_na, 2, 2, false, true)
SP(sp_u2_cs, 2, 0, true, true)
SP(sp_u2_na_cs, 2, 2, true, true)
SP(sp_u4_na_cs, 4, 2, true, true)
extern "C" __global__ void sp_read(float* out, const float4* x, long long n) {
    const long long T = (long long)gridDim.x * blockDim.x;
    float s = 0.f;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += 8 * T) {
        float4 v[8];
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = i + j * T < n ? __ldg(x + i + j * T) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int j = 0; j < 8; j++) s += (v[j].x + v[j].y) + (v[j].z + v[j].w);
    }
    __shared__ float part[32];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.f;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) t += part[w];
        out[blockIdx.x] = t;
    }
}
`

// probeMemory is device memory placed one way: from cuMemAlloc, or mapped
// into a reserved range with physical allocations of handle bytes each.
type probeMemory struct {
	ptr, bytes int
	handles    []uint64
	maps       [][2]uintptr // mapped ranges to unmap
	reserved   bool
}

func (d *Device) probeMap(bytes, handle int) (*probeMemory, error) {
	m := &probeMemory{bytes: bytes, reserved: true}
	p, err := d.ReserveAddress(bytes)
	if err != nil {
		return nil, err
	}
	m.ptr = int(p)
	prop := d.allocationProp()
	err = d.Do(func() error {
		for off := 0; off < bytes; off += handle {
			size := min(handle, bytes-off)
			var h uint64
			if err := cuCheck("cuMemCreate", CCall(cuDrv.cuMemCreate, uintptr(unsafe.Pointer(&h)), uintptr(size), uintptr(unsafe.Pointer(&prop)), 0)); err != nil {
				return err
			}
			m.handles = append(m.handles, h)
			at := p + uintptr(off)
			if err := cuCheck("cuMemMap", CCall(cuDrv.cuMemMap, at, uintptr(size), 0, uintptr(h), 0)); err != nil {
				return err
			}
			m.maps = append(m.maps, [2]uintptr{at, uintptr(size)})
		}
		access := cuMemAccessDesc{locationType: cuMemLocationTypeDevice, locationID: d.dev, flags: cuMemAccessProtReadWrite}
		return cuCheck("cuMemSetAccess", CCall(cuDrv.cuMemSetAccess, p, uintptr(bytes), uintptr(unsafe.Pointer(&access)), 1))
	})
	if err != nil {
		return nil, err
	}
	return m, nil
}

func (d *Device) probeFree(m *probeMemory) error {
	if !m.reserved {
		return d.MemFree(uintptr(m.ptr))
	}
	if err := d.SynchronizeDevice(); err != nil {
		return err
	}
	return d.Do(func() error {
		for _, r := range m.maps {
			if err := cuCheck("cuMemUnmap", CCall(cuDrv.cuMemUnmap, r[0], r[1])); err != nil {
				return err
			}
		}
		for _, h := range m.handles {
			if err := cuCheck("cuMemRelease", CCall(cuDrv.cuMemRelease, uintptr(h))); err != nil {
				return err
			}
		}
		return cuCheck("cuMemAddressFree", CCall(cuDrv.cuMemAddressFree, uintptr(m.ptr), uintptr(m.bytes)))
	})
}

// TestGPUPlacementProbe times a copy, a ReLU and a read of 100 MB and of
// 1 GiB on memory placed four ways: cuMemAlloc; a reserved range with a
// physical allocation a 2 MiB page (the allocator's expandable segments);
// one allocation for the whole range; and allocations of 32 MiB
// (docs/performance.md, round 37: all within 1% of one another). Mapping
// one allocation a page at a time is not supported by the driver. It prints µs a call and GB/s and asserts nothing
// about time. It runs only with EMBER_PLACEMENT_PROBE=1.
func TestGPUPlacementProbe(t *testing.T) {
	if os.Getenv("EMBER_PLACEMENT_PROBE") != "1" {
		t.Skip("the placement probe runs with EMBER_PLACEMENT_PROBE=1")
	}
	d := requireGPU(t)
	if !d.VirtualMemorySupported() {
		t.Skip("no virtual memory management")
	}
	m, err := d.Compile(streamProbeSrc)
	if err != nil {
		t.Fatal(err)
	}
	fn := func(name string) *Function {
		f, err := m.Function(name)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	cp, relu, read := fn("sp_copy"), fn("sp_u2"), fn("sp_read")
	page := d.PageSize()
	timeIt := func(launch func() error) float64 { return probeTime(t, d, launch) }
	type placement struct {
		name string
		get  func(bytes int) (*probeMemory, error)
	}
	placements := []placement{
		{"cuMemAlloc", func(n int) (*probeMemory, error) {
			p, err := d.MemAlloc(n)
			return &probeMemory{ptr: int(p), bytes: n}, err
		}},
		{"a handle a 2 MiB page", func(n int) (*probeMemory, error) { return d.probeMap(n, page) }},
		{"one handle, mapped whole", func(n int) (*probeMemory, error) { return d.probeMap(n, n) }},
		{"handles of 32 MiB", func(n int) (*probeMemory, error) { return d.probeMap(n, 32<<20) }},
	}
	out, err := d.MemAlloc(4 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer d.MemFree(out)
	for round := range 2 {
		for _, size := range []int{64 * 256 * 1536 * 4, 1 << 30} {
			bytes := (size + page - 1) / page * page
			for _, pl := range placements {
				src, err := pl.get(bytes)
				if err != nil {
					t.Fatalf("%s: %v", pl.name, err)
				}
				dst, err := pl.get(bytes)
				if err != nil {
					t.Fatalf("%s: %v", pl.name, err)
				}
				if err := d.Memset32(uintptr(src.ptr), 0x3f800000, bytes/4, 0); err != nil {
					t.Fatal(err)
				}
				n16 := int64(size / 16)
				bs := Dim3{X: 256, Y: 1, Z: 1}
				g := Dim3{X: int((n16 + 511) / 512), Y: 1, Z: 1}
				report := func(what string, moved int, us float64) {
					fmt.Printf("placement round %d %5.0f MB %-36s %-10s %9.2f us %6.0f GB/s\n", round, float64(size)/1e6, pl.name, what, us, float64(moved)/us/1e3)
				}
				report("copy", 2*size, timeIt(func() error {
					return cp.Launch(g, bs, 0, 0, uintptr(dst.ptr), uintptr(src.ptr), n16)
				}))
				report("relu", 2*size, timeIt(func() error {
					return relu.Launch(g, bs, 0, 0, uintptr(dst.ptr), uintptr(src.ptr), n16)
				}))
				report("read", size, timeIt(func() error {
					return read.Launch(Dim3{X: 1056, Y: 1, Z: 1}, bs, 0, 0, out, uintptr(src.ptr), n16)
				}))
				report("memcpy", 2*size, timeIt(func() error { return d.CopyDtoD(uintptr(dst.ptr), uintptr(src.ptr), size, 0) }))
				got := make([]float32, 4)
				if err := d.CopyDtoH(unsafe.Pointer(&got[0]), uintptr(dst.ptr)+uintptr(size)-16, 16, 0); err != nil {
					t.Fatal(err)
				}
				if got[3] != 1 {
					t.Errorf("%s: the copy's last float is %g, want 1", pl.name, got[3])
				}
				for _, x := range []*probeMemory{src, dst} {
					if err := d.probeFree(x); err != nil {
						t.Fatalf("%s: %v", pl.name, err)
					}
				}
			}
		}
	}
}

// TestGPUStreamShapeProbe times a ReLU of 100 MB and of 25 MB over the
// shapes of streamProbeSrc's sp_* kernels and block sizes, each grid one pass (and, for
// some, a grid-stride grid of a few blocks an SM), beside the same ReLU as
// ember_stream runs it (two float4 a thread, 256 threads: sp_u2 at 256).
// It prints µs a call and GB/s and asserts only the results. It runs only
// with EMBER_STREAM_PROBE=1.
func TestGPUStreamShapeProbe(t *testing.T) {
	if os.Getenv("EMBER_STREAM_PROBE") != "1" {
		t.Skip("the stream probe runs with EMBER_STREAM_PROBE=1")
	}
	d := requireGPU(t)
	m, err := d.Compile(streamProbeSrc)
	if err != nil {
		t.Fatal(err)
	}
	sm := d.MultiprocessorCount()
	for _, n := range []int{64 * 256 * 1536, 64 * 256 * 384} {
		bytes := 4 * n
		x, err := d.MemAlloc(bytes)
		if err != nil {
			t.Fatal(err)
		}
		y, err := d.MemAlloc(bytes)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Memset32(x, 0x3f800000, n, 0); err != nil {
			t.Fatal(err)
		}
		n4 := int64(n / 4)
		for round := range 2 {
			for _, c := range []struct {
				name        string
				u           int
				blocks      []int
				strideGrids []int // blocks an SM
			}{
				{"sp_u1", 1, []int{128, 256, 512}, nil},
				{"sp_u2", 2, []int{128, 256, 512}, []int{8, 16}},
				{"sp_u4", 4, []int{128, 256}, []int{8}},
				{"sp_u8", 8, []int{128, 256}, nil},
				{"sp_u2_nc", 2, []int{256}, nil},
				{"sp_u2_na", 2, []int{256}, nil},
				{"sp_u2_cs", 2, []int{256}, nil},
				{"sp_u2_na_cs", 2, []int{128, 256}, nil},
				{"sp_u4_na_cs", 4, []int{128}, nil},
			} {
				f, err := m.Function(c.name)
				if err != nil {
					t.Fatal(err)
				}
				run := func(grid, block int) {
					if err := d.Memset32(y, 0, n, 0); err != nil {
						t.Fatal(err)
					}
					us := probeTime(t, d, func() error {
						return f.Launch(Dim3{X: grid, Y: 1, Z: 1}, Dim3{X: block, Y: 1, Z: 1}, 0, 0, y, x, n4)
					})
					fmt.Printf("stream round %d %4.0f MB %-12s block %3d grid %6d %8.2f us %6.0f GB/s\n", round, float64(bytes)/1e6, c.name, block, grid, us, 2*float64(bytes)/us/1e3)
					got := make([]float32, 4)
					if err := d.CopyDtoH(unsafe.Pointer(&got[0]), y+uintptr(bytes)-16, 16, 0); err != nil {
						t.Fatal(err)
					}
					if got[3] != 1 {
						t.Errorf("%s block %d grid %d: the last output is %g, want 1", c.name, block, grid, got[3])
					}
				}
				for _, bs := range c.blocks {
					run(int((n4+int64(c.u*bs)-1)/int64(c.u*bs)), bs)
				}
				for _, per := range c.strideGrids {
					run(per*sm, 256)
				}
			}
		}
		for _, p := range []uintptr{x, y} {
			if err := d.MemFree(p); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// probeTime is the median µs a call of launch, from 15 samples of k calls
// between two synchronisations, k chosen so that a sample takes about 2 ms
// (as the operator benchmark times its cases).
func probeTime(t *testing.T, d *Device, launch func() error) float64 {
	run := func(k int) time.Duration {
		t0 := time.Now()
		for range k {
			if err := launch(); err != nil {
				t.Fatal(err)
			}
		}
		if err := d.SynchronizeDevice(); err != nil {
			t.Fatal(err)
		}
		return time.Since(t0)
	}
	run(3)
	k := min(max(int(2*time.Millisecond/max(run(1), time.Microsecond)), 1), 500)
	s := make([]float64, 15)
	for r := range s {
		s[r] = float64(run(k).Nanoseconds()) / 1e3 / float64(k)
	}
	slices.Sort(s)
	return s[len(s)/2]
}
