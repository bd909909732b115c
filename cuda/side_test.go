package cuda

import (
	"regexp"
	"strconv"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

func TestConflicts(t *testing.T) {
	r := func(p uintptr, n int) span { return span{p, n, false} }
	w := func(p uintptr, n int) span { return span{p, n, true} }
	for _, c := range []struct {
		name string
		a, b []span
		want bool
	}{
		{"both read the same bytes", []span{r(100, 50)}, []span{r(120, 10)}, false},
		{"a write under a read", []span{r(100, 50)}, []span{w(149, 4)}, true},
		{"a read under a write", []span{w(100, 50)}, []span{r(90, 11)}, true},
		{"writes side by side", []span{w(100, 50)}, []span{w(150, 8), w(92, 8)}, false},
		{"no buffer", []span{w(0, 50)}, []span{w(0, 50)}, false},
		{"the second of several", []span{r(0, 0), r(100, 4), w(300, 4)}, []span{r(200, 4), r(302, 1)}, true},
	} {
		if got := conflicts(c.a, c.b); got != c.want {
			t.Errorf("%s: conflicts = %v, want %v", c.name, got, c.want)
		}
		if got := conflicts(c.b, c.a); got != c.want {
			t.Errorf("%s, swapped: conflicts = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestGPUDetachedSideTask captures a last layer's weight gradients (a
// detached side task, on many rows so that it takes a while) followed by
// work that may overlap it, work that must wait for it and the release of
// memory it reads, and wants the replay to give the eager run's bits. It
// also checks, during the capture, when the task is joined and that memory
// it reads is kept from the allocator until then.
func TestGPUDetachedSideTask(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	if b.side == nil {
		t.Skip("EMBER_SIDE_STREAM=0: no side stream")
	}
	const n, in, out, in2 = 4096, 300, 10, 40
	h := &gpuCPU{t: t, g: b}
	defer h.free()
	x, _ := h.f32(gridRandom(n*in, 31))
	w, _ := h.f32(gridRandom(out*in, 32))
	g0, _ := h.f32(gridRandom(n*out, 33))
	x2, _ := h.f32(gridRandom(n*in2, 34))
	w2, _ := h.f32(gridRandom(in*in2, 35))
	add, _ := h.f32(gridRandom(out*in, 36))
	dw, _ := h.f32(make([]float32, out*in))
	db, _ := h.f32(make([]float32, out))
	dw2, _ := h.f32(make([]float32, in*in2))
	dx2, _ := h.f32(make([]float32, n*in2))
	dw3, _ := h.f32(make([]float32, out*in))
	dx3, _ := h.f32(make([]float32, n*in))
	dw4, _ := h.f32(make([]float32, out*in))
	alloc := func(k int) tensor.Buffer {
		buf, err := b.Alloc(k, tensor.Float32)
		if err != nil {
			t.Fatal(err)
		}
		return buf
	}
	// The step: g, a copy of g0 made inside it (as a loss's gradient is),
	// is read by the detached task and then released; a layer below that
	// reads x and writes elsewhere may run beside it; a layer that adds
	// into dw must wait for it, and so must any operation outside beside.
	step := func(captured bool) {
		g := alloc(n * out)
		b.Copy(g, g0)
		b.LinearGrads(tensor.Buffer{}, dw, db, g, tensor.Buffer{}, x, w, n, in, out, false, false, false)
		if captured && !b.side.detached.Load() {
			t.Error("the weight gradients alone were not detached")
		}
		// x as the ReLU's output of the layer below, read by both.
		b.LinearGrads(dx2, dw2, tensor.Buffer{}, x, tensor.Buffer{}, x2, w2, n, in2, in, false, false, false)
		if captured && !b.side.detached.Load() {
			t.Error("a layer that only reads the task's input joined it")
		}
		// A second task queues behind the first without joining it.
		b.LinearGrads(tensor.Buffer{}, dw4, tensor.Buffer{}, g0, tensor.Buffer{}, x, w, n, in, out, false, false, false)
		if captured && (!b.side.detached.Load() || len(b.side.uses) < 2*7) {
			t.Error("a second detached task joined the first")
		}
		gp := b.ptr("test", g, tensor.Float32)
		b.Free(g)
		if captured && len(b.side.held) != 1 {
			t.Errorf("%d blocks held after freeing the task's input, want 1", len(b.side.held))
		}
		other := alloc(n * out)
		if op := b.ptr("test", other, tensor.Float32); captured && overlaps(op, 4*n*out, gp, 4*n*out) {
			t.Error("memory the detached task reads was allocated again before the join")
		}
		// dx3 and dw (added to) from g0: dw is the task's output.
		b.LinearGrads(dx3, dw, tensor.Buffer{}, g0, tensor.Buffer{}, x, w, n, in, out, false, true, false)
		if captured && (b.side.detached.Load() || len(b.side.held) != 0) {
			t.Error("a layer adding into the task's output did not join it and free what it held")
		}
		b.Fill(other, 0.5)
		b.LinearGrads(tensor.Buffer{}, dw3, tensor.Buffer{}, other, tensor.Buffer{}, x, w, n, in, out, false, false, false)
		b.Free(other)
		b.Axpy(dw, 1, add)
		if captured && b.side.detached.Load() {
			t.Error("an operation outside beside did not join the task")
		}
	}
	results := func() [][]float32 {
		return [][]float32{downloadF(b, dw), downloadF(b, db), downloadF(b, dw2), downloadF(b, dx2), downloadF(b, dw3), downloadF(b, dx3), downloadF(b, dw4)}
	}
	step(false)
	want := results()
	for _, buf := range []tensor.Buffer{dw, db, dw2, dx2, dw3, dx3, dw4} {
		b.Fill(buf, 0)
	}
	g, err := b.Capture(func() { step(true) })
	if err != nil {
		t.Fatalf("Capture: %v", err)
	}
	defer g.Close()
	for range 3 {
		if err := g.Replay(); err != nil {
			t.Fatalf("Replay: %v", err)
		}
	}
	for i, got := range results() {
		if !sameBits(got, want[i]) {
			j := firstDiff(got, want[i])
			t.Errorf("result %d (dw, db, dw2, dx2, dw3, dx3, dw4) after replays: [%d] %g, eager %g", i, j, got[j], want[i][j])
		}
	}
}

// TestKernelConstantsMatchGo checks the kernels' #define constants that the
// Go side repeats (block sizes, shared-memory sizes, counts) against the Go
// values: a change to one side alone would launch blocks the kernel does
// not expect or accept geometries whose buffers do not fit.
func TestKernelConstantsMatchGo(t *testing.T) {
	src, err := kernelSource()
	if err != nil {
		t.Fatal(err)
	}
	defines := map[string]int{}
	for _, m := range regexp.MustCompile(`(?m)^#define (\w+) (\d+)\b`).FindAllStringSubmatch(src, -1) {
		v, _ := strconv.Atoi(m[2])
		defines[m[1]] = v
	}
	for name, want := range map[string]int{
		"EMBER_RT_SMEM":         rtSmemFloats,
		"EMBER_RT_DX_THREADS":   32 * rtDXWarps,
		"EMBER_TILE_FLOATS":     tileFloats,
		"EMBER_DIRECT_CRS":      directCRS,
		"EMBER_DW_IMAGE_FLOATS": dwImageFloats,
		"LT_THREADS":            ltThreads,
		"LT_CLUSTER":            ltCluster,
	} {
		got, ok := defines[name]
		if !ok {
			t.Errorf("no #define %s in the kernels", name)
		} else if got != want {
			t.Errorf("#define %s %d, the Go side uses %d", name, got, want)
		}
	}
}

// TestGPUCaptureFailsAfterDetach makes a capture fail (its function panics)
// with a side task detached and memory held for it, and wants the side lane
// clean afterwards and the next capture to work.
func TestGPUCaptureFailsAfterDetach(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	if b.side == nil {
		t.Skip("EMBER_SIDE_STREAM=0: no side stream")
	}
	const n, in, out = 256, 64, 10
	h := &gpuCPU{t: t, g: b}
	defer h.free()
	x, _ := h.f32(gridRandom(n*in, 41))
	w, _ := h.f32(gridRandom(out*in, 42))
	g0, _ := h.f32(gridRandom(n*out, 43))
	dw, _ := h.f32(make([]float32, out*in))
	_, err := b.Capture(func() {
		g, err := b.Alloc(n*out, tensor.Float32)
		if err != nil {
			t.Fatal(err)
		}
		b.Copy(g, g0)
		b.LinearGrads(tensor.Buffer{}, dw, tensor.Buffer{}, g, tensor.Buffer{}, x, w, n, in, out, false, false, false)
		b.Free(g)
		if !b.side.detached.Load() || len(b.side.held) != 1 {
			t.Error("the task was not detached with its input held")
		}
		panic("a failure inside the captured function")
	})
	if err == nil {
		t.Fatal("Capture of a panicking function succeeded")
	}
	if b.side.detached.Load() || len(b.side.uses) != 0 || len(b.side.held) != 0 || b.side.capturing.Load() {
		t.Errorf("side lane after a failed capture: detached %v, %d uses, %d held, capturing %v",
			b.side.detached.Load(), len(b.side.uses), len(b.side.held), b.side.capturing.Load())
	}
	step := func() {
		b.LinearGrads(tensor.Buffer{}, dw, tensor.Buffer{}, g0, tensor.Buffer{}, x, w, n, in, out, false, false, false)
	}
	step()
	want := downloadF(b, dw)
	b.Fill(dw, 0)
	g, err := b.Capture(step)
	if err != nil {
		t.Fatalf("Capture after a failed one: %v", err)
	}
	defer g.Close()
	if err := g.Replay(); err != nil {
		t.Fatal(err)
	}
	if got := downloadF(b, dw); !sameBits(got, want) {
		j := firstDiff(got, want)
		t.Errorf("dw after the replay: [%d] %g, eager %g", j, got[j], want[j])
	}
}
