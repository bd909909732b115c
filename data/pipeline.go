package data

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// PipelineOptions configures a Pipeline.
type PipelineOptions struct {
	// Workers is the number of goroutines building items; 0 means 1.
	Workers int
	// Depth bounds the items built (or being built) and not yet taken by
	// Next, so that memory stays bounded however far the workers could
	// run ahead; 0 means 2·Workers.
	Depth int
}

// Pipeline builds items 0..n-1 (batches, usually: gathered, augmented and
// copied into page-locked memory for an asynchronous upload) in worker
// goroutines and hands them out in order through Next, at most Depth of
// them ready or in progress at once. It is how a data set that lives on the
// host keeps the GPU fed: the workers build the next batches while the
// device computes on the current one.
//
// Close (or cancelling the context) stops the workers and waits for them,
// so that no goroutine outlives the pipeline; build is given the context
// and should return when it is done. Next, Err and Close are for one
// goroutine, the consumer.
type Pipeline[T any] struct {
	ctx    context.Context
	cancel context.CancelFunc
	n      int
	tokens chan struct{}    // one per item that may be outstanding
	slots  []chan result[T] // item i goes to slot i % Depth
	next   int              // the next item Next returns
	mu     sync.Mutex       // guards claimed
	claim  int              // the next item a worker builds
	wg     sync.WaitGroup
	err    error
	closed bool
}

type result[T any] struct {
	v   T
	err error
}

// NewPipeline starts the workers building items 0..n-1 with build.
func NewPipeline[T any](ctx context.Context, n int, opt PipelineOptions, build func(ctx context.Context, i int) (T, error)) (*Pipeline[T], error) {
	if n < 0 {
		return nil, fmt.Errorf("data: pipeline of %d items; want 0 or more", n)
	}
	if opt.Workers < 0 || opt.Depth < 0 {
		return nil, fmt.Errorf("data: pipeline Workers %d, Depth %d; want 0 (the default) or more", opt.Workers, opt.Depth)
	}
	workers := max(opt.Workers, 1)
	depth := opt.Depth
	if depth == 0 {
		depth = 2 * workers
	}
	ctx, cancel := context.WithCancel(ctx)
	p := &Pipeline[T]{ctx: ctx, cancel: cancel, n: n, tokens: make(chan struct{}, depth), slots: make([]chan result[T], depth)}
	for i := range p.slots {
		p.slots[i] = make(chan result[T], 1)
	}
	for range depth {
		p.tokens <- struct{}{}
	}
	for range workers {
		p.wg.Go(func() { p.work(build) })
	}
	return p, nil
}

// work builds items until none is left or the context ends. A worker takes
// a token before claiming an item, so the claimed but untaken items are a
// run of at most Depth consecutive indices: their slots are distinct and
// free, and the send never blocks.
func (p *Pipeline[T]) work(build func(ctx context.Context, i int) (T, error)) {
	for {
		select {
		case <-p.tokens:
		case <-p.ctx.Done():
			return
		}
		p.mu.Lock()
		i := p.claim
		if i < p.n {
			p.claim++
		}
		p.mu.Unlock()
		if i >= p.n {
			return
		}
		v, err := build(p.ctx, i)
		p.slots[i%len(p.slots)] <- result[T]{v, err}
	}
}

// Next returns item i in order, waiting for it: ok is false when every
// item was taken, or after a failure (an error from build, the context's
// end, Close), which Err then reports. An item taken is the caller's.
func (p *Pipeline[T]) Next() (v T, ok bool) {
	if p.err != nil || p.next >= p.n {
		return v, false
	}
	select {
	case r := <-p.slots[p.next%len(p.slots)]:
		if r.err != nil {
			p.fail(fmt.Errorf("data: pipeline item %d: %w", p.next, r.err))
			return v, false
		}
		p.next++
		p.tokens <- struct{}{}
		return r.v, true
	case <-p.ctx.Done():
		p.fail(p.ctx.Err())
		return v, false
	}
}

func (p *Pipeline[T]) fail(err error) {
	p.err = err
	p.cancel()
}

// Err is the failure that ended Next early, or nil.
func (p *Pipeline[T]) Err() error {
	if p.closed && errors.Is(p.err, context.Canceled) {
		return nil
	}
	return p.err
}

// Close stops the workers and waits for them to return. Items built and not
// taken are dropped. Close may be called more than once.
func (p *Pipeline[T]) Close() {
	if !p.closed && p.err == nil {
		p.closed = true
	}
	p.cancel()
	p.wg.Wait()
	if p.err == nil {
		p.err = context.Canceled
	}
}
