package alloc

import (
	"errors"
	"testing"
)

// fuzzReader hands out the fuzz input a byte at a time, zeros past its end.
type fuzzReader struct {
	data []byte
	i    int
}

func (r *fuzzReader) more() bool { return r.i < len(r.data) }

func (r *fuzzReader) byte() byte {
	if r.i >= len(r.data) {
		return 0
	}
	r.i++
	return r.data[r.i-1]
}

// size reads a request size from 1 B up to 64 MiB, spread over magnitudes.
func (r *fuzzReader) size() int {
	shift := int(r.byte() % 27)
	frac := int(r.byte())<<8 | int(r.byte())
	return 1 + (frac<<shift)>>16 + (1<<shift)>>1
}

// FuzzAllocator interprets the input as a sequence of allocator operations
// on three streams, with private pools, events, limits and driver failures,
// and checks every invariant after each one.
func FuzzAllocator(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 0, 10, 0, 0, 3, 0})
	f.Add([]byte{1, 0, 20, 255, 255, 1, 0, 22, 1, 0, 1, 3, 0, 3, 0})
	f.Add([]byte{0, 0, 5, 1, 2, 1, 5, 0, 2, 3, 0, 6, 2, 0, 9, 10, 0, 0, 0})
	// Private pool: begin, allocate, end, free, release.
	f.Add([]byte{0, 8, 0, 1, 0, 12, 7, 7, 1, 8, 0, 1, 3, 0, 8, 2, 0})
	// Limit lowered below what is live, then frees.
	f.Add([]byte{0, 0, 22, 128, 0, 0, 0, 21, 9, 9, 0, 7, 1, 1, 3, 0, 3, 0, 7, 0})
	// Driver failures during growth.
	f.Add([]byte{1, 9, 3, 0, 24, 1, 1, 1, 9, 2, 1, 26, 255, 255, 2, 0, 23, 50, 50, 0, 3, 1})
	// Many small blocks, frees in between, RecordStream on other streams.
	f.Add([]byte{0, 0, 9, 1, 1, 0, 0, 10, 2, 2, 1, 0, 11, 3, 3, 2, 5, 0, 1, 5, 1, 2, 3, 1, 3, 0,
		6, 1, 0, 12, 0, 0, 0, 6, 3, 4, 2, 3, 0, 3, 0, 7, 0})
	// The same sequences on expandable segments (flag bit 2).
	for _, seed := range [][]byte{
		{2, 0, 10, 0, 0, 3, 0},
		{3, 9, 3, 0, 24, 1, 1, 1, 9, 2, 1, 26, 255, 255, 2, 0, 23, 50, 50, 0, 3, 1},
		{2, 0, 22, 128, 0, 0, 0, 21, 9, 9, 0, 7, 1, 1, 3, 0, 3, 0, 7, 0},
		{2, 0, 9, 1, 1, 0, 0, 10, 2, 2, 1, 0, 11, 3, 3, 2, 5, 0, 1, 5, 1, 2, 3, 1, 3, 0,
			6, 1, 0, 12, 0, 0, 0, 6, 3, 4, 2, 3, 0, 3, 0, 7, 0},
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 4096 {
			return // long inputs only slow the fuzzer down
		}
		r := &fuzzReader{data: data}
		flags := r.byte()
		limit := 0
		if flags&1 != 0 {
			limit = 64 * oneMiB
		}
		a, d := newTestAllocator(t, 256*oneMiB, limit)
		if flags&2 != 0 {
			a = NewAllocator(d, AllocatorOptions{Limit: limit, Expandable: true})
		}
		var live []Block
		var pools []PoolID
		capturing := map[Stream]int{}
		fail := func(op string, err error) { t.Helper(); t.Fatalf("op %d (%s): %v", r.i, op, err) }

		for r.more() {
			switch op := r.byte() % 10; op {
			case 0, 1, 2:
				n := r.size()
				s := Stream(r.byte() % 3)
				b, err := a.Alloc(n, s)
				if err != nil {
					var oom *OutOfMemoryError
					if !errors.As(err, &oom) || !errors.Is(err, ErrDeviceOutOfMemory) {
						fail("alloc", err)
					}
					break
				}
				if a.Requested(b) != n || b.Size() < roundSize(n) {
					fail("alloc", errors.New("bad block sizes"))
				}
				live = append(live, b)
			case 3, 4:
				if len(live) == 0 {
					break
				}
				i := int(r.byte()) % len(live)
				b := live[i]
				live = append(live[:i], live[i+1:]...)
				if err := a.Free(b); err != nil {
					fail("free", err)
				}
				if err := a.Free(b); !errors.Is(err, ErrInvalidBlock) {
					fail("double free", err)
				}
			case 5:
				if len(live) == 0 {
					break
				}
				a.RecordStream(live[int(r.byte())%len(live)], Stream(r.byte()%3))
			case 6:
				if s := r.byte() % 4; s == 3 {
					d.completeAll()
				} else {
					d.complete(Stream(s))
				}
			case 7:
				switch r.byte() % 4 {
				case 0:
					if err := a.EmptyCache(); err != nil {
						fail("empty cache", err)
					}
				case 1:
					a.SetLimit(int(r.byte()) * oneMiB / 2)
				case 2:
					a.ResetPeakStats()
				case 3:
					_ = a.MemorySummary()
				}
			case 8:
				s := Stream(r.byte() % 3)
				switch r.byte() % 3 {
				case 0:
					pools = append(pools, a.BeginPrivatePool(s))
					capturing[s]++
				case 1:
					if capturing[s] > 0 {
						a.EndPrivatePool(s)
						capturing[s]--
					}
				case 2:
					if len(pools) > 0 {
						// Errors are expected for pools still capturing or
						// released already; the state must stay sound.
						_ = a.ReleasePool(pools[int(r.byte())%len(pools)])
					}
				}
			case 9:
				n := int(r.byte() % 4)
				d.set(func(d *fakeDevice) { d.failAllocs = n })
			}
			if err := a.checkInvariants(); err != nil {
				fail("check", err)
			}
		}

		// Unwind: everything must come back.
		for s, n := range capturing {
			for ; n > 0; n-- {
				a.EndPrivatePool(s)
			}
		}
		for _, id := range pools {
			_ = a.ReleasePool(id)
		}
		for _, b := range live {
			if err := a.Free(b); err != nil {
				fail("final free", err)
			}
		}
		d.completeAll()
		d.set(func(d *fakeDevice) { d.failAllocs = 0 })
		if err := a.EmptyCache(); err != nil {
			fail("final empty cache", err)
		}
		if err := a.checkInvariants(); err != nil {
			fail("final check", err)
		}
		st := a.Stats()
		if st.Allocated.Current != 0 || st.Active.Current != 0 || st.Reserved.Current != 0 || len(a.private) != 0 {
			t.Fatalf("after unwinding: %+v, %d private pools", st, len(a.private))
		}
		if _, _, used := d.counts(); used != 0 || d.eventsUp != 0 {
			t.Fatalf("driver still holds %d bytes and %d events", used, d.eventsUp)
		}
	})
}
