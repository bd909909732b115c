package cuda

import (
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
