package alloc

import (
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
)

// TestAllocConcurrent hammers one allocator from several goroutines (run it
// with -race): workers allocate, record streams and free; one goroutine
// plays the GPU and completes events; one reads statistics and empties the
// cache; one captures into private pools.
func TestAllocConcurrent(t *testing.T) {
	iters := 20_000
	if testing.Short() || allocRaceEnabled {
		iters = 3_000
	}
	const workers = 4
	// The fake GPU goroutine may be starved on a loaded machine, so let the
	// allocator wait for events as it would with the real driver.
	d := newFakeDevice(2 * oneGiB)
	a := NewAllocator(&syncFakeDevice{fakeDevice: d}, AllocatorOptions{Limit: oneGiB, SharedSegment: 20 * oneMiB})
	var ooms atomic.Int64
	var wg, bg sync.WaitGroup
	var stop atomic.Bool
	errc := make(chan error, workers+3)

	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			s := Stream(1 + w%2)
			var live []Block
			for range iters {
				if len(live) < 32 && rng.IntN(2) == 0 {
					n := logUniformSize(rng, 16*oneMiB)
					b, err := a.Alloc(n, s)
					var oom *OutOfMemoryError
					if errors.As(err, &oom) {
						// Possible, if unlikely, when 128 live blocks of
						// up to 16 MiB meet the 1 GiB limit.
						ooms.Add(1)
						continue
					}
					if err != nil {
						errc <- err
						return
					}
					if b.Size() < n || b.Ptr() == 0 {
						errc <- errBadBlock
						return
					}
					live = append(live, b)
					continue
				}
				if len(live) == 0 {
					continue
				}
				i := rng.IntN(len(live))
				b := live[i]
				live[i] = live[len(live)-1]
				live = live[:len(live)-1]
				if rng.IntN(8) == 0 {
					a.RecordStream(b, 3)
				}
				if err := a.Free(b); err != nil {
					errc <- err
					return
				}
			}
			for _, b := range live {
				if err := a.Free(b); err != nil {
					errc <- err
					return
				}
			}
		}()
	}

	bg.Add(3)
	go func() { // the GPU
		defer bg.Done()
		for !stop.Load() {
			d.complete(3)
		}
	}()
	go func() { // monitoring
		defer bg.Done()
		for i := 0; !stop.Load(); i++ {
			st := a.Stats()
			if st.Requested.Current > st.Allocated.Current || st.Reserved.Current > oneGiB {
				errc <- errBadStats
				return
			}
			switch i % 50 {
			case 0:
				_ = a.MemorySummary()
			case 1:
				a.ResetPeakStats()
			case 2:
				if err := a.EmptyCache(); err != nil {
					errc <- err
					return
				}
			case 3:
				if err := a.checkInvariants(); err != nil {
					errc <- err
					return
				}
			}
		}
	}()
	go func() { // graph capture on its own stream
		defer bg.Done()
		for !stop.Load() {
			id := a.BeginPrivatePool(5)
			b, err := a.Alloc(4096, 5)
			if err == nil {
				err = a.Free(b)
			}
			a.EndPrivatePool(5)
			if err == nil {
				err = a.ReleasePool(id)
			}
			if err != nil {
				errc <- err
				return
			}
		}
	}()

	wg.Wait()
	stop.Store(true)
	bg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	t.Logf("%d workers x %d iterations, %d OOMs; %+v", workers, iters, ooms.Load(), a.Stats())
	d.completeAll()
	if err := a.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	check(t, a)
	if st := a.Stats(); st.Allocated.Current != 0 || st.Active.Current != 0 || st.Reserved.Current != 0 {
		t.Errorf("after all goroutines: %+v", st)
	}
}

type testError string

func (e testError) Error() string { return string(e) }

const (
	errBadBlock testError = "bad block"
	errBadStats testError = "inconsistent stats"
)
