package alloc

import (
	"fmt"
	"slices"
)

// Lending a captured graph's idle memory.
//
// A graph replays on the blocks its private pool handed out while it was
// captured, the ones still held and the ones freed again (its transient
// tensors): between two replays those free blocks hold nothing anyone
// reads. Work queued on the graph's stream in that time (an evaluation
// between training epochs, say) may use them, as long as it gives them
// back before the next replay is queued: the stream runs in order, so the
// replay writes them only after that work has read them. Between
// BeginLending and EndLending, Allocs on the lending stream that no
// capture claims take a best-fitting free block of an idle private pool
// before they turn to the general cache; such a block counts as lent until
// it is free again (after Free, and after the events of the streams
// RecordStream named). Without lending, an evaluation between epochs reserves its
// own memory on top of the graph's.

// lending is BeginLending's state.
type lending struct {
	depth  int // BeginLending calls not yet ended
	stream Stream
}

// BeginLending lets Allocs on s take free blocks of the private pools
// that are not capturing (above), until the matching EndLending. Calls
// nest on one stream; lending on a second stream at once panics.
func (a *Allocator) BeginLending(s Stream) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.lending.depth > 0 && a.lending.stream != s {
		panic(fmt.Sprintf("cuda: BeginLending on stream %#x while stream %#x is lending", s, a.lending.stream))
	}
	a.lending.depth++
	a.lending.stream = s
}

// EndLending ends the innermost BeginLending and returns how many blocks
// lent by any private pool are still held or pending. Calling it without a matching
// Begin panics.
func (a *Allocator) EndLending() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.lending.depth == 0 {
		panic("cuda: EndLending without BeginLending")
	}
	a.lending.depth--
	n := 0
	for _, pp := range a.private {
		n += pp.lent
	}
	return n
}

// Lent is how many blocks of private pool id are lent and still held or
// pending: the pool's graph must not be replayed while it is not 0.
func (a *Allocator) Lent(id PoolID) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if pp := a.private[id]; pp != nil {
		return pp.lent
	}
	return 0
}

// borrow serves a request of rounded bytes on s from the best-fitting free
// block of an idle private pool, when lending on s and no capture claims
// s; false otherwise. Pools are tried in the order they were made. An
// error is one of the driver's while blocks waiting on events were
// looked at, as Alloc's slow path returns it.
func (a *Allocator) borrow(s Stream, rounded, requested int) (Block, bool, error) {
	if a.lending.stream != s || len(a.capture[s]) != 0 || len(a.private) == 0 {
		return Block{}, false, nil
	}
	if a.pendingEvents > 0 {
		if err := a.processEvents(); err != nil {
			return Block{}, false, err
		}
	}
	var buf [8]PoolID // no allocation for the usual few graphs: this runs on every Alloc while lending
	ids := buf[:0]
	for id, pp := range a.private {
		if pp.capturing == 0 && !pp.released && !pp.virtual {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		pool := &a.private[id].large
		if c := a.takeBestFit(pool, s, rounded); c != nil {
			a.stats.CacheHits++
			b := a.take(pool, c, rounded, requested)
			c.lent = true
			pool.private.lent++
			return b, true, nil
		}
	}
	return Block{}, false, nil
}
