package cuda

import (
	"cmp"
	"errors"
	"fmt"

	"github.com/ember-ml/ember/cuda/alloc"
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
	b          *Backend
	exec       *GraphExec
	pool       PoolID
	plan       *alloc.MemoryPlan // nil unless CapturePlanned placed the pool's blocks
	planMisses int
	planErr    error // why not, when not
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
func (b *Backend) Capture(f func()) (*StepGraph, error) {
	return b.capture(f, nil)
}

// CapturePlanned is Capture with the graph's memory placed by plan, which
// packs a step's blocks tighter than placing them as they come (see
// package cuda/alloc's plan.go): f is first rehearsed, captured on a pool
// with addresses and no memory behind them, which records the order of its
// requests and frees; that graph is discarded and nothing of it runs. Then
// rehearsed runs, to undo what f did on the host: free the tensors f made,
// take back an optimiser step it counted. Then f is captured for real,
// each request where the plan puts it. A step whose sequence changes
// between the two captures still works: the requests that differ are
// placed as they come.
//
// A tensor the rehearsal made and kept (one a step makes on its first
// run, as a gradient of a parameter no optimiser holds) is given memory,
// starting at zero, and the capture is then placed as it comes, since the
// real capture makes no such tensor. Where planning is off
// (BackendOptions.NoGraphMemoryPlan) or impossible (no expandable
// segments), or the rehearsal fails, rehearsed runs and this is Capture;
// StepGraph.Planned says which and why.
//
// A rehearsal that meets a convolution whose algorithms cuDNN has not
// timed yet (which cannot be done during a capture) captures nothing and
// returns ErrSearchFirst: one eager step of f times them, and the next
// CapturePlanned captures f with the fastest.
func (b *Backend) CapturePlanned(f func(), rehearsed func()) (*StepGraph, error) {
	var plan *alloc.MemoryPlan
	why := errPlanOff
	if b.PlansGraphMemory() {
		var pool PoolID
		guesses := b.convGuesses.Load()
		plan, pool, why = b.rehearse(f)
		rehearsed()
		if pool != 0 {
			if kept, err := b.keep(pool); err != nil || kept > 0 {
				plan, why = nil, cmp.Or(err, fmt.Errorf("cuda: the rehearsal kept %d blocks (tensors the step makes on first use), given memory from zero", kept))
			}
		}
		if b.convGuesses.Load() > guesses {
			return nil, ErrSearchFirst
		}
	} else {
		rehearsed()
	}
	g, err := b.capture(f, plan)
	if g != nil && plan == nil {
		g.planErr = why
	}
	return g, err
}

// ErrSearchFirst is CapturePlanned's error when f meets convolutions whose
// algorithms cuDNN has not timed: run f once eagerly, then capture it.
var ErrSearchFirst = errors.New("cuda: the step's convolutions have untimed algorithms: run it once eagerly before capturing it")

// errPlanOff is why CapturePlanned placed nothing by plan where it may not.
var errPlanOff = errors.New("cuda: no plan: BackendOptions.NoGraphMemoryPlan, or an allocator without expandable segments")

// PlansGraphMemory reports whether CapturePlanned places a graph's memory
// by plan: on unless BackendOptions.NoGraphMemoryPlan, where the allocator
// maps pages (expandable segments).
func (b *Backend) PlansGraphMemory() bool {
	return !b.opt.NoGraphMemoryPlan && b.alloc.MapsPages()
}

// rehearse records f on a traced pool and returns the plan of its
// requests, and the pool (0 when none was made), which the caller
// releases through keep once f's host state is undone.
func (b *Backend) rehearse(f func()) (plan *alloc.MemoryPlan, pool PoolID, err error) {
	b.rehearsing.Store(true)
	graph, err := b.record(f, func() error {
		var err error
		pool, err = b.alloc.BeginTracePool(b.stream)
		return err
	})
	b.rehearsing.Store(false)
	if err != nil {
		return nil, pool, fmt.Errorf("cuda: rehearsing the capture: %w", err)
	}
	if err := graph.Destroy(); err != nil {
		return nil, pool, err
	}
	plan, err = b.alloc.Plan(pool)
	return plan, pool, err
}

// keep gives memory, zeroed, to the blocks of traced pool id still in use
// and releases the pool; it returns how many there were.
func (b *Backend) keep(id PoolID) (int, error) {
	kept, err := b.alloc.Materialize(id)
	for _, r := range kept {
		if e := b.x.memset32(r[0], 0, int(r[1]/4)); e != nil {
			err = errors.Join(err, e)
			break
		}
	}
	return len(kept), errors.Join(err, b.alloc.ReleasePool(id))
}

// capture records f on a private pool (placed by plan, when not nil) and
// instantiates the graph.
func (b *Backend) capture(f func(), plan *alloc.MemoryPlan) (g *StepGraph, err error) {
	var pool PoolID
	graph, err := b.record(f, func() error {
		if plan != nil {
			pool = b.alloc.BeginPlannedPool(b.stream, plan)
		} else {
			pool = b.alloc.BeginPrivatePool(b.stream)
		}
		return nil
	})
	if err == nil {
		var exec *GraphExec
		exec, err = graph.Instantiate()
		graph.Destroy()
		if err == nil {
			g = &StepGraph{b: b, exec: exec, pool: pool, plan: plan}
			if plan != nil {
				g.planMisses = b.alloc.PlanMisses(pool)
			}
			return g, nil
		}
		err = fmt.Errorf("cuda: capturing a graph: %w", err)
	}
	if pool != 0 {
		b.alloc.ReleasePool(pool)
	}
	return nil, err
}

// record captures the work f queues, its allocations from the private pool
// that begin starts; the caller releases the pool.
func (b *Backend) record(f func(), begin func() error) (graph *Graph, err error) {
	if b.kl != nil {
		b.kl.settle() // no module loads in the background while the stream records
	}
	if err := b.Synchronize(); err != nil {
		return nil, err
	}
	if err := b.alloc.EmptyCache(); err != nil {
		return nil, err
	}
	if err := begin(); err != nil {
		return nil, err
	}
	poolEnded := false
	defer func() {
		if !poolEnded {
			b.alloc.EndPrivatePool(b.stream)
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
	return graph, nil
}

// Planned reports how the graph's memory was placed: by a plan
// (CapturePlanned) that spans span bytes, with misses of the capture's
// requests placed as they came instead; or, with an error that says why,
// as they came.
func (g *StepGraph) Planned() (span, misses int, err error) {
	if g.plan == nil {
		return 0, 0, cmp.Or(g.planErr, errors.New("cuda: captured by Capture, with no plan"))
	}
	return g.plan.Span(), g.planMisses, nil
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
