package data

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
)

// The mean and standard deviation of MNIST training pixels scaled to [0, 1],
// as used by the PyTorch MNIST examples.
const (
	Mean = 0.1307
	Std  = 0.3081
)

// normTable maps a pixel byte to (x/255 - Mean)/Std.
var normTable = func() (t [256]float32) {
	for i := range t {
		t[i] = float32((float64(i)/255 - Mean) / Std)
	}
	return t
}()

// Normalize sets dst[i] = (src[i]/255 - Mean)/Std for every i < len(src),
// computed in float64 and rounded to float32. It panics if dst is shorter
// than src.
func Normalize(dst []float32, src []uint8) {
	dst = dst[:len(src)]
	for i, x := range src {
		dst[i] = normTable[x]
	}
}

// LoaderOptions configures a Loader.
type LoaderOptions struct {
	// BatchSize is the number of examples per batch; it must be positive.
	BatchSize int
	// Shuffle visits the examples in a pseudo-random order that is a
	// function of (Seed, epoch) only: see Permutation. Without Shuffle the
	// order is 0, 1, ..., N-1 every epoch.
	Shuffle bool
	// Seed selects the shuffle.
	Seed uint64
	// DropLast drops the final batch of an epoch when it would be smaller
	// than BatchSize.
	DropLast bool
	// Prefetch is the number of batches prepared ahead by a background
	// goroutine; 0 prepares each batch synchronously in Next.
	Prefetch int
	// Normalize fills Batch.Images with normalised float32 pixels (see
	// Normalize). Without it Batch.Images is nil and the caller gathers
	// pixels itself from Batch.Indices.
	Normalize bool
}

// Batch is one mini-batch. The Loader never reuses or writes to a Batch's
// slices once it has returned it: they belong to the caller.
type Batch struct {
	// Index is the batch number within the epoch, from 0.
	Index int
	// Indices are the examples' indices into the Dataset, in batch order.
	Indices []int32
	// Images holds len(Indices)*Rows*Cols normalised pixels, image after
	// image; nil unless LoaderOptions.Normalize.
	Images []float32
	// Labels are the examples' labels.
	Labels []int32
}

// Size is the number of examples in b.
func (b Batch) Size() int { return len(b.Indices) }

// Loader cuts a Dataset into mini-batches, epoch after epoch. A Loader may
// be used by one goroutine at a time; iterators of different epochs may be
// open at once.
type Loader struct {
	ds  *Dataset
	opt LoaderOptions

	mu      sync.Mutex
	closed  bool
	workers map[*prefetcher]struct{}
}

// NewLoader returns a Loader over ds. Options out of range (a batch size
// below 1, a negative prefetch) and a data set whose sizes disagree are
// errors, as everywhere else in this package: they usually come from a
// flag.
func NewLoader(ds *Dataset, opt LoaderOptions) (*Loader, error) {
	switch {
	case ds == nil:
		return nil, fmt.Errorf("data: NewLoader: no data set")
	case opt.BatchSize <= 0:
		return nil, fmt.Errorf("data: NewLoader: batch size %d, want at least 1", opt.BatchSize)
	case opt.Prefetch < 0:
		return nil, fmt.Errorf("data: NewLoader: prefetch %d, want 0 or more", opt.Prefetch)
	case ds.N < 0 || ds.Rows < 0 || ds.Cols < 0 || len(ds.Labels) < ds.N || len(ds.Images) < ds.N*ds.Rows*ds.Cols:
		return nil, fmt.Errorf("data: NewLoader: data set of %d images of %dx%d holds %d pixels and %d labels", ds.N, ds.Rows, ds.Cols, len(ds.Images), len(ds.Labels))
	}
	return &Loader{ds: ds, opt: opt, workers: make(map[*prefetcher]struct{})}, nil
}

// Options returns the options l was made with.
func (l *Loader) Options() LoaderOptions { return l.opt }

// NumBatches is the number of batches in each epoch.
func (l *Loader) NumBatches() int {
	n, b := l.ds.N, l.opt.BatchSize
	if l.opt.DropLast {
		return n / b
	}
	return (n + b - 1) / b
}

// Epoch returns an iterator over the batches of the given epoch (counted as
// the caller likes, usually from 0). With Shuffle, the order is
// Permutation(N, Seed, epoch): a run resumed at epoch e with the same Seed
// sees exactly the batches an uninterrupted run would have seen. Close the
// iterator when done with it before the end, so that its prefetch goroutine
// stops; an iterator that has returned false from Next has already stopped.
func (l *Loader) Epoch(epoch int) *EpochIter {
	it := &EpochIter{l: l, numBatches: l.NumBatches()}
	if l.opt.Shuffle {
		it.order = Permutation(l.ds.N, l.opt.Seed, epoch)
	} else {
		it.order = make([]int32, l.ds.N)
		for i := range it.order {
			it.order[i] = int32(i)
		}
	}
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		it.done = true
		return it
	}
	if l.opt.Prefetch > 0 {
		it.startPrefetch()
	}
	return it
}

// Close stops the prefetch goroutines of every iterator of l and waits for
// them to exit. Iterators of a closed Loader return no more batches, and
// Epoch then returns an empty iterator.
func (l *Loader) Close() {
	l.mu.Lock()
	l.closed = true
	ws := make([]*prefetcher, 0, len(l.workers))
	for w := range l.workers {
		ws = append(ws, w)
	}
	l.mu.Unlock()
	for _, w := range ws {
		w.stop()
	}
}

// EpochIter yields the batches of one epoch in order.
type EpochIter struct {
	l          *Loader
	order      []int32
	numBatches int
	next       int // next batch to build (synchronous mode)
	done       bool
	pf         *prefetcher
}

// NumBatches is the number of batches the iterator yields in all.
func (it *EpochIter) NumBatches() int { return it.numBatches }

// Next returns the next batch, or false when the epoch is over or the
// iterator or its Loader has been closed.
func (it *EpochIter) Next() (Batch, bool) {
	if it.done {
		return Batch{}, false
	}
	if it.pf != nil {
		select {
		case <-it.pf.quit: // stopped by Loader.Close
			it.Close()
			return Batch{}, false
		default:
		}
		b, ok := <-it.pf.out
		if !ok {
			it.done = true
			it.pf.stop() // wait for the goroutine to be gone
		}
		return b, ok
	}
	if it.next >= it.numBatches || it.l.isClosed() {
		it.done = true
		return Batch{}, false
	}
	b := buildBatch(it.l.ds, &it.l.opt, it.order, it.next)
	it.next++
	return b, true
}

// Close stops the iterator's prefetch goroutine, if any, and waits for it to
// exit. Next returns false afterwards. Close may be called more than once.
func (it *EpochIter) Close() {
	it.done = true
	if it.pf != nil {
		it.pf.stop()
	}
}

func (l *Loader) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// liveWorkers counts running prefetch goroutines, for tests.
var liveWorkers atomic.Int64

// prefetcher is the state shared with a prefetch goroutine. It does not
// point to the EpochIter, so an iterator dropped without Close can be
// garbage collected, and its cleanup stops the goroutine.
type prefetcher struct {
	out      chan Batch
	quit     chan struct{}
	finished chan struct{}
	once     sync.Once
	l        *Loader
}

func (p *prefetcher) stop() {
	p.once.Do(func() { close(p.quit) })
	<-p.finished
	p.l.mu.Lock()
	delete(p.l.workers, p)
	p.l.mu.Unlock()
}

func (it *EpochIter) startPrefetch() {
	l := it.l
	p := &prefetcher{
		out:      make(chan Batch, l.opt.Prefetch-1), // plus the one being sent
		quit:     make(chan struct{}),
		finished: make(chan struct{}),
		l:        l,
	}
	l.mu.Lock()
	l.workers[p] = struct{}{}
	l.mu.Unlock()
	it.pf = p
	ds, opt, order, n := l.ds, l.opt, it.order, it.numBatches
	liveWorkers.Add(1)
	go func() {
		defer func() {
			close(p.out)
			liveWorkers.Add(-1)
			close(p.finished)
		}()
		for i := range n {
			b := buildBatch(ds, &opt, order, i)
			select {
			case p.out <- b:
			case <-p.quit:
				return
			}
		}
	}()
	runtime.AddCleanup(it, func(p *prefetcher) { go p.stop() }, p)
}

func buildBatch(ds *Dataset, opt *LoaderOptions, order []int32, i int) Batch {
	lo := i * opt.BatchSize
	hi := min(lo+opt.BatchSize, len(order))
	idx := order[lo:hi:hi]
	b := Batch{Index: i, Indices: idx, Labels: make([]int32, len(idx))}
	for j, k := range idx {
		b.Labels[j] = int32(ds.Labels[k])
	}
	if opt.Normalize {
		sz := ds.Rows * ds.Cols
		b.Images = make([]float32, len(idx)*sz)
		for j, k := range idx {
			Normalize(b.Images[j*sz:(j+1)*sz], ds.Images[int(k)*sz:(int(k)+1)*sz])
		}
	}
	return b
}

// Permutation returns a pseudo-random permutation of 0..n-1 that depends
// only on (n, seed, epoch), for callers that gather batches themselves (on a
// GPU, say): batch i of the epoch is perm[i*B : (i+1)*B].
//
// The order is part of this package's contract and will not change between
// versions: it is a Fisher–Yates shuffle driven by math/rand/v2's PCG
// (a fully specified generator) seeded with (seed, splitmix64(epoch)), with
// bounded integers drawn by Lemire's multiply-and-reject method implemented
// here rather than by the standard library's Shuffle, whose algorithm is not
// promised to stay the same. A training run resumed at epoch e with the same
// seed therefore sees the same order as an uninterrupted one. n must be
// below 2^31.
func Permutation(n int, seed uint64, epoch int) []int32 {
	if n < 0 || n > 1<<31-1 {
		panic(fmt.Sprintf("data: Permutation: n is %d, want 0 <= n < 2^31", n))
	}
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(i)
	}
	r := rand.NewPCG(seed, splitmix64(uint64(epoch)))
	for i := n - 1; i > 0; i-- {
		j := boundedUint32(r, uint32(i+1))
		p[i], p[j] = p[j], p[i]
	}
	return p
}

// boundedUint32 returns a uniform value in [0, n) (Lemire, "Fast Random
// Integer Generation in an Interval", 2019), using the high 32 bits of
// each 64-bit draw.
func boundedUint32(r *rand.PCG, n uint32) uint32 {
	x := uint32(r.Uint64() >> 32)
	hi, lo := bits.Mul32(x, n)
	if lo < n {
		thresh := -n % n
		for lo < thresh {
			x = uint32(r.Uint64() >> 32)
			hi, lo = bits.Mul32(x, n)
		}
	}
	return hi
}

func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
