package data

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestPipelineOrder: with several workers taking random times, the items
// come out complete and in order.
func TestPipelineOrder(t *testing.T) {
	const n = 200
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(1, 2))
	p, err := NewPipeline(context.Background(), n, PipelineOptions{Workers: 4, Depth: 3}, func(ctx context.Context, i int) ([]int, error) {
		mu.Lock()
		d := time.Duration(rng.IntN(200)) * time.Microsecond
		mu.Unlock()
		time.Sleep(d)
		return []int{i, i * i}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	got := 0
	for v, ok := p.Next(); ok; v, ok = p.Next() {
		if v[0] != got || v[1] != got*got {
			t.Fatalf("item %d is %v", got, v)
		}
		got++
	}
	if got != n || p.Err() != nil {
		t.Fatalf("%d items, error %v; want %d and none", got, p.Err(), n)
	}
}

// TestPipelineBounded: however slow the consumer, a worker starts item i
// only once item i-Depth was handed out. The test's count of items taken
// lags the pipeline's by the one Next is returning, so at the start of
// build(i) the bound is i <= taken + Depth.
func TestPipelineBounded(t *testing.T) {
	const n, depth = 60, 4
	var taken, ahead atomic.Int64
	p, err := NewPipeline(context.Background(), n, PipelineOptions{Workers: 8, Depth: depth}, func(ctx context.Context, i int) (int, error) {
		a := int64(i) - taken.Load()
		for {
			m := ahead.Load()
			if a <= m || ahead.CompareAndSwap(m, a) {
				break
			}
		}
		return i, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i := 0; i < n; i++ {
		time.Sleep(100 * time.Microsecond) // a slow consumer: the workers are always ahead
		v, ok := p.Next()
		if !ok || v != i {
			t.Fatalf("item %d: %d, %v (%v)", i, v, ok, p.Err())
		}
		taken.Add(1)
	}
	if a := ahead.Load(); a > depth {
		t.Errorf("an item was started %d ahead of the items taken, want at most %d", a, depth)
	} else if a < depth-1 {
		t.Errorf("items were started at most %d ahead: the workers never filled the queue", a)
	}
}

// TestPipelineCancel: cancelling the context wakes a waiting Next and stops
// workers blocked in build and workers waiting for room; Close then returns
// with no goroutine left.
func TestPipelineCancel(t *testing.T) {
	base := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{}, 100)
	p, err := NewPipeline(ctx, 1000, PipelineOptions{Workers: 3, Depth: 5}, func(ctx context.Context, i int) (int, error) {
		if i >= 2 {
			started <- struct{}{}
			<-ctx.Done() // a build that only ends with the context
			return 0, ctx.Err()
		}
		return i, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if v, ok := p.Next(); !ok || v != i {
			t.Fatalf("item %d: %d, %v", i, v, ok)
		}
	}
	<-started
	go func() { time.Sleep(10 * time.Millisecond); cancel() }()
	if _, ok := p.Next(); ok {
		t.Fatal("Next returned an item after the context ended")
	}
	if !errors.Is(p.Err(), context.Canceled) {
		t.Errorf("Err = %v, want context.Canceled", p.Err())
	}
	p.Close()
	p.Close()
	waitGoroutines(t, base)
}

// TestPipelineCloseEarly: Close in the middle, with workers waiting for
// room, returns promptly, leaks nothing and is not an error.
func TestPipelineCloseEarly(t *testing.T) {
	base := runtime.NumGoroutine()
	p, err := NewPipeline(context.Background(), 1000, PipelineOptions{Workers: 4}, func(ctx context.Context, i int) (int, error) { return i, nil })
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := p.Next(); !ok || v != 0 {
		t.Fatalf("first item %d, %v", v, ok)
	}
	p.Close()
	if _, ok := p.Next(); ok {
		t.Error("Next returned an item after Close")
	}
	if p.Err() != nil {
		t.Errorf("Err after Close = %v, want nil", p.Err())
	}
	waitGoroutines(t, base)
}

// TestPipelineBuildError: an error of build ends the items at its index,
// names it, and stops the other workers.
func TestPipelineBuildError(t *testing.T) {
	base := runtime.NumGoroutine()
	boom := errors.New("boom")
	p, err := NewPipeline(context.Background(), 100, PipelineOptions{Workers: 2}, func(ctx context.Context, i int) (int, error) {
		if i == 7 {
			return 0, boom
		}
		return i, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ok := p.Next(); ok; _, ok = p.Next() {
		n++
	}
	if n != 7 || !errors.Is(p.Err(), boom) || p.Err().Error() != "data: pipeline item 7: boom" {
		t.Errorf("%d items, error %v; want 7 and item 7's", n, p.Err())
	}
	p.Close()
	waitGoroutines(t, base)
}

func TestPipelineOptionsChecked(t *testing.T) {
	build := func(ctx context.Context, i int) (int, error) { return i, nil }
	for _, c := range []struct {
		n   int
		opt PipelineOptions
	}{{-1, PipelineOptions{}}, {1, PipelineOptions{Workers: -1}}, {1, PipelineOptions{Depth: -2}}} {
		if _, err := NewPipeline(context.Background(), c.n, c.opt, build); err == nil {
			t.Errorf("NewPipeline(%d, %+v): no error", c.n, c.opt)
		}
	}
	p, err := NewPipeline(context.Background(), 0, PipelineOptions{}, build)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, ok := p.Next(); ok || p.Err() != nil {
		t.Errorf("empty pipeline: ok %v, error %v", ok, p.Err())
	}
}
