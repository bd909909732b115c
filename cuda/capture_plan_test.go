package cuda

import (
	"errors"
	"strings"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// TestGPUCapturePlannedFirstUseTensor captures, with no eager step before
// it, a step whose first run makes a tensor it keeps: the gradient of a
// parameter no optimiser holds, made on first use. The rehearsal's copy of
// it must get memory starting at zero (the capture then says it placed
// its memory as it came), and replays must accumulate into it as eager
// steps do: after two replays the gradient is twice x.
func TestGPUCapturePlannedFirstUseTensor(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	if !b.PlansGraphMemory() {
		t.Skip("no planned captures on this device (no expandable segments)")
	}
	const n = 3000
	xs := make([]float32, n)
	for i := range xs {
		xs[i] = float32(i%17) - 8
	}
	x := tensor.FromFloat32(b, nil, xs, n)
	w := tensor.Full(b, nil, 0.5, n).SetRequiresGrad(true)
	defer x.Release()
	defer w.Release()
	scope := tensor.NewScope()
	defer scope.Release()
	step := func() {
		scope.Reset()
		xc := tensor.EmptyOf(b, scope, tensor.Float32, n)
		tensor.CopyTensor(xc, x)
		tensor.Sum(tensor.Mul(xc, w)).Backward()
	}
	g, err := b.CapturePlanned(step, scope.Reset)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, _, err := g.Planned(); err == nil || !strings.Contains(err.Error(), "kept 1 blocks") {
		t.Errorf("Planned: %v, want that the rehearsal kept the gradient", err)
	}
	for range 2 {
		if err := g.Replay(); err != nil {
			t.Fatal(err)
		}
	}
	got := w.Grad().Float32s()
	for i := range xs {
		if got[i] != 2*xs[i] {
			t.Fatalf("gradient [%d] after two replays: %g, want %g", i, got[i], 2*xs[i])
		}
	}
}

// TestGPUCapturePlannedSearchesFirst: a planned capture of a step with a
// convolution cuDNN has not timed captures nothing and asks for an eager
// step first (ErrSearchFirst); after one, it captures by plan, and the
// replay gives the eager step's bits.
func TestGPUCapturePlannedSearchesFirst(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	if _, err := b.CuDNN(); err != nil || !b.PlansGraphMemory() {
		t.Skipf("needs cuDNN (%v) and planned captures (%v)", err, b.PlansGraphMemory())
	}
	b.dnnEverywhere = true // every geometry cuDNN takes goes to it
	// Stride 2: not one of the register-tiled kernels' geometries.
	x := tensor.FromFloat32(b, nil, gridRandom(8*16*32*32, 21), 8, 16, 32, 32)
	w := tensor.FromFloat32(b, nil, gridRandom(24*16*3*3, 22), 24, 16, 3, 3)
	out := tensor.Zeros(b, nil, 8, 24, 16, 16)
	defer x.Release()
	defer w.Release()
	defer out.Release()
	scope := tensor.NewScope()
	defer scope.Release()
	step := func() {
		scope.Reset()
		xc := tensor.EmptyOf(b, scope, tensor.Float32, 8, 16, 32, 32)
		tensor.CopyTensor(xc, x)
		tensor.CopyTensor(out, tensor.Conv2d(xc, w, nil, 2, 1))
	}
	if g, err := b.CapturePlanned(step, scope.Reset); !errors.Is(err, ErrSearchFirst) {
		if g != nil {
			g.Close()
		}
		t.Fatalf("CapturePlanned before any eager step: %v, want ErrSearchFirst", err)
	}
	step()
	if n, _ := b.ConvSearches(); n == 0 {
		t.Fatal("the eager step timed no cuDNN algorithm: the convolution did not go to cuDNN")
	}
	want := out.Float32s()
	b.Fill(out.Buffer(), 0)
	g, err := b.CapturePlanned(step, scope.Reset)
	if err != nil {
		t.Fatalf("CapturePlanned after an eager step: %v", err)
	}
	defer g.Close()
	if _, misses, err := g.Planned(); err != nil || misses != 0 {
		t.Errorf("Planned: %d misses, %v; want a plan, no miss", misses, err)
	}
	if err := g.Replay(); err != nil {
		t.Fatal(err)
	}
	if got := out.Float32s(); !sameBits(got, want) {
		j := firstDiff(got, want)
		t.Errorf("replayed convolution [%d] %g, eager %g", j, got[j], want[j])
	}
}
