package cuda

import (
	"errors"
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

// TestGPULendBetweenReplays: an evaluation-like computation run under
// Lend between replays of a captured step takes its memory from the
// graph's idle blocks (reserved memory does not grow), computes what it
// computes eagerly outside Lend, and leaves the next replay's result
// intact; a tensor it keeps makes the replay refuse until it is freed.
func TestGPULendBetweenReplays(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	const n = 4 << 20 // floats: 16 MiB a tensor
	x := tensor.Full(b, nil, 1, n)
	defer x.Release()
	s := tensor.NewScope()
	defer s.Release()
	var loss *tensor.Tensor
	g, err := b.Capture(func() {
		y := tensor.Add(s.Borrow(x), s.Borrow(x))
		z := tensor.Mul(y, y)
		w := tensor.Add(z, y)
		loss = tensor.Sum(w) // (4+2)·n
		// The step's transient tensors, freed as a training step's are
		// during its backward pass: their blocks are what Lend lends.
		for _, t := range []*tensor.Tensor{w, z, y} {
			t.Release()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Replay(); err != nil {
		t.Fatal(err)
	}
	want := float32(6 * n)
	if got := loss.Item(); got != want {
		t.Fatalf("captured step's loss %v; want %v", got, want)
	}
	e := tensor.NewScope()
	defer e.Release()
	eval := func() float32 {
		defer e.Reset()
		u := tensor.Mul(e.Borrow(x), tensor.Full(b, e, 3, n))
		return tensor.Sum(tensor.Add(u, u)).Item() // 6·n
	}
	reserved := b.MemoryStats().Reserved.Current
	var got float32
	if kept := b.Lend(func() { got = eval() }); kept != 0 {
		t.Errorf("Lend: %d lent blocks still held after the evaluation reset its scope", kept)
	}
	if got != want {
		t.Errorf("evaluation under Lend: %v; want %v", got, want)
	}
	if r := b.MemoryStats().Reserved.Current; r != reserved {
		t.Errorf("reserved %d MiB after the evaluation under Lend, %d MiB before: want no growth", r>>20, reserved>>20)
	}
	if err := g.Replay(); err != nil {
		t.Fatal(err)
	}
	if got := loss.Item(); got != want {
		t.Errorf("replay after the evaluation: loss %v; want %v", got, want)
	}
	// A tensor kept past Lend holds graph memory: the replay refuses.
	var kept *tensor.Tensor
	if n := b.Lend(func() { kept = tensor.Full(b, nil, 2, n) }); n != 1 || g.Lent() != 1 {
		t.Fatalf("a kept tensor: Lend reports %d, the graph %d lent blocks; want 1, 1", n, g.Lent())
	}
	if err := g.Replay(); !errors.Is(err, ErrGraphMemoryLent) {
		t.Errorf("replay while a lent block is held: %v; want ErrGraphMemoryLent", err)
	}
	kept.Release()
	if err := g.Replay(); err != nil {
		t.Fatal(err)
	}
	if got := loss.Item(); got != want {
		t.Errorf("replay after the kept tensor's release: loss %v; want %v", got, want)
	}
}
