package cuda

import (
	"math"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// TestGPUCaptureAfterEagerStepReservesOnce: a step run eagerly and then
// captured (as after a warm-up step) reserves its memory about once, not
// once in the general cache and again in the graph's private pool: Capture
// gives the cache's free memory back first. The captured step replays.
func TestGPUCaptureAfterEagerStepReservesOnce(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	const n = 16 << 20 // floats: 64 MiB a tensor, 256 MiB a step
	x := tensor.Full(b, nil, 1, n)
	defer x.Release()
	s := tensor.NewScope()
	defer s.Release()
	step := func() *tensor.Tensor {
		y := tensor.Add(s.Borrow(x), s.Borrow(x))
		z := tensor.Mul(y, y)
		w := tensor.Add(z, y)
		return tensor.Sum(tensor.Add(w, z))
	}
	step()
	if err := b.Synchronize(); err != nil {
		t.Fatal(err)
	}
	eager := b.MemoryStats().Reserved.Peak
	b.Allocator().ResetPeakStats()
	s.Reset()
	var loss *tensor.Tensor
	g, err := b.Capture(func() { loss = step() })
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Replay(); err != nil {
		t.Fatal(err)
	}
	if got := float64(loss.Item()); math.Abs(got-10*n) > 1e-5*10*n { // (2+4+4)·n
		t.Fatalf("captured step's loss %v; want %v", got, 10*n)
	}
	captured := b.MemoryStats().Reserved.Peak
	t.Logf("peak reserved: eager step %d MiB, through the capture %d MiB", eager>>20, captured>>20)
	// Without the release the capture's peak is the eager cache plus the
	// pool: about twice the eager one.
	if captured > eager+eager/4 {
		t.Errorf("peak reserved %d MiB through the capture after an eager step of %d MiB: want about the step's once", captured>>20, eager>>20)
	}
}
