package parallel

import (
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/ember-ml/ember/tensor"
)

// FakeGroup is an in-process stand-in for NCCL: N ranks that are goroutines
// of one test, each with its own Communicator (Comm). A collective waits
// until every rank has called it, then the last to arrive computes the
// result on the host in rank order (rank 0's values, plus rank 1's, ...),
// so results are the same from run to run whatever the goroutines'
// timing. An average is that sum divided by N.
//
// Faults are modelled too: ranks calling different collectives at the same
// point, or a rank that does not come within the group's Timeout, fail the
// collective on every rank; InjectAsyncError makes a rank's AsyncError
// report a fault as NCCL's would; Abort on any rank ends the group.
type FakeGroup struct {
	n       int
	timeout time.Duration

	mu      sync.Mutex
	rounds  map[int]*fakeRound
	err     error         // the group is over: every call fails with it
	aborted chan struct{} // closed when err is set
	async   map[int]error
}

type fakeRound struct {
	kind    string // "allreduce/sum", "broadcast/1", "barrier"
	n       int    // elements
	vals    [][]float32
	came    []bool
	arrived int
	taken   int
	done    chan struct{}
	result  []float32
}

// NewFakeGroup makes a group of n ranks. timeout bounds each collective's
// wait for the other ranks (0: one minute), so that a test with a missing
// rank ends.
func NewFakeGroup(n int, timeout time.Duration) *FakeGroup {
	if n < 1 {
		panic(fmt.Sprintf("parallel: NewFakeGroup(%d)", n))
	}
	if timeout <= 0 {
		timeout = time.Minute
	}
	return &FakeGroup{n: n, timeout: timeout, rounds: map[int]*fakeRound{}, aborted: make(chan struct{}), async: map[int]error{}}
}

// Comm returns the communicator of rank, whose buffers live on b.
func (g *FakeGroup) Comm(rank int, b tensor.Backend) *FakeComm {
	if rank < 0 || rank >= g.n {
		panic(fmt.Sprintf("parallel: FakeGroup.Comm(%d) of %d ranks", rank, g.n))
	}
	return &FakeComm{g: g, rank: rank, b: b}
}

// InjectAsyncError makes rank's AsyncError return err, as NCCL reports a
// dead peer.
func (g *FakeGroup) InjectAsyncError(rank int, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.async[rank] = err
}

// Abort ends the group: collectives waiting, and all later ones, fail with
// cause on every rank.
func (g *FakeGroup) Abort(cause error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.abortLocked(cause)
}

func (g *FakeGroup) abortLocked(cause error) {
	if g.err == nil {
		g.err = cause
		close(g.aborted)
	}
}

// Pending lists the ranks that have not yet reached the oldest collective
// some rank waits in (nil when none waits): who hangs.
func (g *FakeGroup) Pending() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	seqs := make([]int, 0, len(g.rounds))
	for s, r := range g.rounds {
		if r.arrived < g.n {
			seqs = append(seqs, s)
		}
	}
	if len(seqs) == 0 {
		return nil
	}
	sort.Ints(seqs)
	r := g.rounds[seqs[0]]
	var out []int
	for rank, came := range r.came {
		if !came {
			out = append(out, rank)
		}
	}
	return out
}

// collective runs one round: rank gives vals (copied), gets the result.
func (g *FakeGroup) collective(rank, seq int, kind string, vals []float32, combine func([][]float32) []float32) ([]float32, error) {
	g.mu.Lock()
	if g.err != nil {
		g.mu.Unlock()
		return nil, g.err
	}
	r := g.rounds[seq]
	if r == nil {
		r = &fakeRound{kind: kind, n: len(vals), vals: make([][]float32, g.n), came: make([]bool, g.n), done: make(chan struct{})}
		g.rounds[seq] = r
	}
	if r.kind != kind || r.n != len(vals) {
		err := fmt.Errorf("collective #%d: rank %d called %s of %d values where another rank called %s of %d", seq, rank, kind, len(vals), r.kind, r.n)
		g.abortLocked(err)
		g.mu.Unlock()
		return nil, err
	}
	r.vals[rank] = append([]float32(nil), vals...)
	r.came[rank] = true
	r.arrived++
	if r.arrived == g.n {
		r.result = combine(r.vals)
		r.vals = nil
		close(r.done)
	}
	g.mu.Unlock()

	timer := time.NewTimer(g.timeout)
	defer timer.Stop()
	select {
	case <-r.done:
	case <-g.aborted:
		return nil, g.abortErr()
	case <-timer.C:
		g.mu.Lock()
		var missing []int
		for i, came := range r.came {
			if !came {
				missing = append(missing, i)
			}
		}
		err := fmt.Errorf("collective #%d (%s): rank %d waited %v for rank(s) %v", seq, kind, rank, g.timeout, missing)
		g.abortLocked(err)
		g.mu.Unlock()
		return nil, g.abortErr()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	out := append([]float32(nil), r.result...)
	if r.taken++; r.taken == g.n {
		delete(g.rounds, seq)
	}
	return out, nil
}

func (g *FakeGroup) abortErr() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// sumInRankOrder adds the ranks' values in float32, rank 0 first.
func sumInRankOrder(vals [][]float32) []float32 {
	out := append([]float32(nil), vals[0]...)
	for _, v := range vals[1:] {
		for i, x := range v {
			out[i] += x
		}
	}
	return out
}

func combineFor(op Op, n int) func([][]float32) []float32 {
	if op == Average {
		return func(vals [][]float32) []float32 {
			out := sumInRankOrder(vals)
			for i := range out {
				out[i] /= float32(n)
			}
			return out
		}
	}
	return sumInRankOrder
}

// FakeComm is one rank of a FakeGroup; it implements Communicator. Like an
// NCCL communicator it belongs to one goroutine (its rank's).
type FakeComm struct {
	g    *FakeGroup
	rank int
	b    tensor.Backend
	seq  int
}

var _ Communicator = (*FakeComm)(nil)

// Rank is this rank.
func (c *FakeComm) Rank() int { return c.rank }

// Size is the number of ranks of the group.
func (c *FakeComm) Size() int { return c.g.n }

// Backend is where the buffers live.
func (c *FakeComm) Backend() tensor.Backend { return c.b }

// Group is the group this rank belongs to.
func (c *FakeComm) Group() *FakeGroup { return c.g }

func (c *FakeComm) next() int { c.seq++; return c.seq }

// AllReduce reduces buf over the ranks with op.
func (c *FakeComm) AllReduce(buf tensor.Buffer, op Op) error {
	if op != Sum && op != Average {
		return fmt.Errorf("parallel: AllReduce with %v", op)
	}
	host := make([]float32, buf.Len)
	c.b.Download(host, buf)
	out, err := c.g.collective(c.rank, c.next(), "allreduce/"+op.String(), host, combineFor(op, c.g.n))
	if err != nil {
		return rankError(c.rank, err)
	}
	c.b.Upload(buf, out)
	return nil
}

// Broadcast copies root's buf to every rank.
func (c *FakeComm) Broadcast(buf tensor.Buffer, root int) error {
	if root < 0 || root >= c.g.n {
		return fmt.Errorf("parallel: Broadcast from root %d of %d ranks", root, c.g.n)
	}
	host := make([]float32, buf.Len)
	c.b.Download(host, buf)
	out, err := c.g.collective(c.rank, c.next(), fmt.Sprintf("broadcast/%d", root), host, func(v [][]float32) []float32 { return v[root] })
	if err != nil {
		return rankError(c.rank, err)
	}
	c.b.Upload(buf, out)
	return nil
}

// AllReduceValues reduces host values.
func (c *FakeComm) AllReduceValues(vals []float32, op Op) error {
	out, err := c.g.collective(c.rank, c.next(), "values/"+op.String(), vals, combineFor(op, c.g.n))
	if err != nil {
		return rankError(c.rank, err)
	}
	copy(vals, out)
	return nil
}

// Barrier waits for every rank.
func (c *FakeComm) Barrier() error {
	if err := c.b.Synchronize(); err != nil {
		return err
	}
	if _, err := c.g.collective(c.rank, c.next(), "barrier", nil, func([][]float32) []float32 { return nil }); err != nil {
		return rankError(c.rank, err)
	}
	return nil
}

// AsyncError is the error injected for this rank, if any.
func (c *FakeComm) AsyncError() error {
	c.g.mu.Lock()
	defer c.g.mu.Unlock()
	return c.g.async[c.rank]
}

// Abort ends the whole group.
func (c *FakeComm) Abort(cause error) { c.g.Abort(cause) }

// Close does nothing: the group has no resources.
func (c *FakeComm) Close() error { return nil }

// Pending lists the ranks not yet in the oldest waiting collective.
func (c *FakeComm) Pending() []int { return c.g.Pending() }
