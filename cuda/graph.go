package cuda

import (
	"errors"
	"fmt"
)

// StepGraph is device work recorded once from the backend's stream as a CUDA
// graph and replayed with one launch, as torch.cuda.CUDAGraph does: a
// training step of LeNet is dozens of small kernels whose launch cost, not
// their arithmetic, bounds the step time at small batch sizes.
//
// A replay repeats exactly the recorded work on exactly the recorded
// addresses. Inputs change between replays by overwriting the tensors the
// work reads (Upload into them before Replay); the values the work wrote
// (the loss, say) are read from the tensors that held them during capture.
// Those tensors must stay allocated for the life of the graph, so the memory
// allocated during capture comes from a private pool of the allocator that
// nothing else draws from.
type StepGraph struct {
	b    *Backend
	exec *GraphExec
	pool PoolID
}

// Capture records the work f queues on the backend into a graph instead of
// running it: after Capture returns, nothing of f has executed yet; call
// Replay to run it. f must not wait for the device (no Download, Item or
// Synchronize) and must not upload from the host. If f fails or the driver
// cannot capture, Capture returns an error and the caller runs its work
// eagerly instead; what f allocated goes back to the general cache once the
// caller releases it.
//
// Capture first gives the general cache's wholly free memory back to the
// driver (EmptyCache): f allocates from a private pool of its own, which
// would otherwise hold a second copy of the memory that the eager steps
// before it cached (a step captured after an eager warm-up step reserved
// twice the step's memory). A caller frees the eager step's tensors before
// it calls Capture for them to be given back.
func (b *Backend) Capture(f func()) (g *StepGraph, err error) {
	if b.kl != nil {
		b.kl.settle() // no module loads in the background while the stream records
	}
	if err := b.Synchronize(); err != nil {
		return nil, err
	}
	if err := b.alloc.EmptyCache(); err != nil {
		return nil, err
	}
	pool := b.alloc.BeginPrivatePool(b.stream)
	poolEnded := false
	defer func() {
		if !poolEnded {
			b.alloc.EndPrivatePool(b.stream)
		}
		if err != nil {
			b.alloc.ReleasePool(pool)
		}
	}()
	if err := b.dev.BeginCapture(b.stream); err != nil {
		return nil, err
	}
	runErr := func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				if e, ok := r.(error); ok {
					err = e
				} else {
					err = fmt.Errorf("%v", r)
				}
			}
		}()
		b.capturing.Store(true) // no cuDNN algorithm searches (conv_cudnn.go)
		defer b.capturing.Store(false)
		if b.side != nil {
			b.side.capturing.Store(true)
			defer b.side.capturing.Store(false)
			// Before the capture ends, a side task f left detached joins the
			// stream (or the driver fails the capture as unjoined).
			defer func() {
				if e := b.x.settle(); e != nil && err == nil {
					err = e
				}
			}()
		}
		f()
		return nil
	}()
	graph, endErr := b.dev.EndCapture(b.stream)
	b.alloc.EndPrivatePool(b.stream)
	poolEnded = true
	if runErr != nil || endErr != nil {
		graph.Destroy()
		return nil, fmt.Errorf("cuda: capturing a graph: %w", errors.Join(runErr, endErr))
	}
	exec, err := graph.Instantiate()
	graph.Destroy()
	if err != nil {
		return nil, fmt.Errorf("cuda: capturing a graph: %w", err)
	}
	return &StepGraph{b: b, exec: exec, pool: pool}, nil
}

// ErrGraphMemoryLent is the error of a Replay while blocks of the graph's
// memory that Lend handed out are still held.
var ErrGraphMemoryLent = errors.New("cuda: the graph's memory is lent out")

// Replay queues one run of the recorded work on the backend's stream. It
// refuses (ErrGraphMemoryLent) while blocks that Lend took from the
// graph's memory are still held: the replay would overwrite them.
func (g *StepGraph) Replay() error {
	if n := g.Lent(); n > 0 {
		return fmt.Errorf("%w: %d blocks that work between replays took from it (Backend.Lend) are still held, and the replay would write over them", ErrGraphMemoryLent, n)
	}
	return g.exec.Launch(g.b.stream)
}

// Lent is how many blocks of the graph's memory that Lend handed out are
// still held.
func (g *StepGraph) Lent() int { return g.b.alloc.Lent(g.pool) }

// Lend runs f with the memory of the backend's captured graphs open to
// its allocations: between replays, a graph's transient tensors (what its
// private pool freed while it was captured) hold nothing anyone reads,
// and f's tensors may take those blocks before the cache reserves more
// (an evaluation between training epochs then fits in memory the step
// already reserved, instead of adding its own). f's work is queued on the
// backend's stream before the next replay, so the replay writes those
// blocks only after f's work has read them; f must free what it made
// (reset its scope) before a graph it borrowed from replays again. Lend
// returns how many lent blocks are still held when f returns: while they
// are, the graphs they came from refuse to replay (StepGraph.Lent).
func (b *Backend) Lend(f func()) (kept int) {
	b.alloc.BeginLending(b.stream)
	defer func() { kept = b.alloc.EndLending() }()
	f()
	return kept
}

// Close destroys the graph and gives the private pool back to the general
// cache once the tensors allocated during capture are released.
func (g *StepGraph) Close() error {
	if err := g.b.Synchronize(); err != nil {
		return err
	}
	return errors.Join(g.exec.Destroy(), g.b.alloc.ReleasePool(g.pool))
}
