package cuda

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ember-ml/ember/cuda/driver"
)

// cuBLASLt's algorithm chosen by timing, as cuDNN's are for convolutions
// (conv_cudnn.go): on a small product shape's first call outside a
// capture (ltTuneMaxOutputs), the algorithms its heuristics rank first
// (up to ltTuneCandidates) each run ltTuneCalls times in a captured graph,
// so that the gaps between them are a captured step's, and the fastest is
// kept for the shape. The heuristics' first pick is a split over k and a
// second kernel that adds the parts for the MLP's 64-row products;
// whether another candidate does better is a question of the shape and
// the device, which only a measurement answers. A shape whose first call
// is inside a capture keeps the heuristics' pick for good: its graph
// holds that algorithm, and eager calls must give the same bits. The
// trainer's first step of a shape runs eagerly before it is captured
// (nn/trainer), so a training step's products are timed.
// BackendOptions.NoTuneProducts (EMBER_LT_TUNE=0) keeps the heuristics'
// picks.

// ltTuneCandidates is the most algorithms timed for one shape.
const ltTuneCandidates = 8

// ltTuneCalls is the products in each candidate's graph.
const ltTuneCalls = 10

// ltTuneMaxOutputs is the largest product (elements of its output) that is
// timed: the small ones, where a step's time is the products' fixed costs
// and the heuristics' ranking measured off (the MLP's at batch 64). A
// larger one would need a scratch output as large as its own for the
// timing, on top of the step's peak memory, and was not measured to gain.
const ltTuneMaxOutputs = 1 << 20

// ltTuner remembers which shapes have been seen.
type ltTuner struct {
	mu   sync.Mutex
	seen map[LtGemm]bool
}

// first reports whether g is seen for the first time, and marks it seen.
func (t *ltTuner) first(g LtGemm) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.seen == nil {
		t.seen = map[LtGemm]bool{}
	}
	if t.seen[g] {
		return false
	}
	t.seen[g] = true
	return true
}

// tuneLt chooses g's algorithm by timing its candidates on its first call
// outside a capture (above). The product is run on the caller's inputs
// into scratch outputs; the caller's outputs are not touched. Products
// with an epilogue matrix (aux) keep the heuristics' pick. A failure
// leaves the heuristics' pick and is said in the kernel log.
func (b *Backend) tuneLt(op string, g LtGemm, alpha float32, pa, pb uintptr, beta float32, pbias uintptr) {
	if b.opt.NoTuneProducts || g.M*g.N > ltTuneMaxOutputs || !b.ltTune.first(g) || b.capturing.Load() || g.Epilogue&128 != 0 {
		return
	}
	if _, ok := b.x.(*gpuExec); !ok {
		return // a recorder in tests: nothing to time
	}
	start := time.Now()
	best, times, err := b.searchLt(op, g, alpha, pa, pb, beta, pbias)
	if err != nil {
		if e := b.lt.Use(g, 0); e != nil {
			err = fmt.Errorf("%w; %w", err, e)
		}
	}
	if w := b.opt.KernelLog; w != nil && (times != nil || err != nil) { // nothing to say of a shape with one candidate
		fmt.Fprintf(w, "cuda: cuBLASLt algorithm of %dx%dx%d (trans %v,%v, epilogue %d) chosen in %.1f ms: candidate %d of %v, err %v\n",
			g.M, g.N, g.K, g.TransA, g.TransB, g.Epilogue, time.Since(start).Seconds()*1e3, best, times, err)
	}
}

// searchLt times g's candidates (tuneLt) and keeps the fastest; it returns
// its index and each candidate's time per product. Like Capture, it
// captures the backend's stream, so no other goroutine may queue work on
// the backend meanwhile.
func (b *Backend) searchLt(op string, g LtGemm, alpha float32, pa, pb uintptr, beta float32, pbias uintptr) (int, []time.Duration, error) {
	cands, err := b.lt.Candidates(g, ltTuneCandidates)
	if err != nil || len(cands) < 2 {
		return 0, nil, err
	}
	if err := b.Synchronize(); err != nil {
		return 0, nil, err
	}
	c := b.workspace(op, 4*g.M*g.N)
	defer b.release(c)
	bias := pbias
	if g.Epilogue&(driver.LtBGradA|driver.LtBGradB) != 0 {
		s := b.workspace(op, 4*max(g.M, g.N))
		defer b.release(s)
		bias = s.Ptr()
	}
	ws, wsBytes := uintptr(0), 0
	if !g.NoWorkspace && !b.blasWorkspace.IsZero() {
		ws, wsBytes = b.blasWorkspace.Ptr(), b.blasWorkspace.Size()
	}
	times := make([]time.Duration, len(cands))
	best := 0
	for i := range cands {
		if err := b.lt.Use(g, i); err != nil {
			return 0, times, err
		}
		t, err := b.timeGraph(func() error {
			for range ltTuneCalls {
				if err := b.lt.Matmul(g, alpha, pa, pb, beta, c.Ptr(), bias, 0, ws, wsBytes, b.stream); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return 0, times, err
		}
		times[i] = t / ltTuneCalls
		if times[i] < times[best] {
			best = i
		}
	}
	return best, times, b.lt.Use(g, best)
}

// timeGraph captures what queue puts on the backend's stream into a graph
// and returns the time of one replay: the least of three, after a first.
func (b *Backend) timeGraph(queue func() error) (time.Duration, error) {
	if err := b.dev.BeginCapture(b.stream); err != nil {
		return 0, err
	}
	qerr := queue()
	graph, err := b.dev.EndCapture(b.stream)
	if qerr != nil || err != nil {
		graph.Destroy()
		return 0, fmt.Errorf("cuda: timing a product: %w", errors.Join(qerr, err))
	}
	exec, err := graph.Instantiate()
	graph.Destroy()
	if err != nil {
		return 0, err
	}
	defer exec.Destroy()
	best := time.Duration(-1)
	for i := range 4 {
		start := time.Now()
		if err := exec.Launch(b.stream); err != nil {
			return 0, err
		}
		if err := b.dev.Synchronize(b.stream); err != nil {
			return 0, err
		}
		if d := time.Since(start); i > 0 && (best < 0 || d < best) {
			best = d
		}
	}
	return best, nil
}
