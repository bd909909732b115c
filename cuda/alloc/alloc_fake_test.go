package alloc

import (
	"errors"
	"fmt"
	"sync"
)

// fakeDevice is a DeviceMemory without a GPU: addresses are made up, memory
// is counted against a configurable total, and events complete only when the
// test says so.
type fakeDevice struct {
	mu sync.Mutex

	total int
	used  int
	next  uintptr
	live  map[uintptr]int

	failAllocs int   // fail this many next MemAllocs with out of memory
	allocErr   error // if set, MemAlloc fails with it (not out of memory)
	freeErr    error // if set, MemFree fails with it
	infoErr    error
	recordErr  error
	queryErr   error
	onAlloc    func() // called (without the lock) at the start of MemAlloc

	nextEvent uintptr
	events    map[Event]*fakeEvent

	ranges       map[uintptr]int  // address ranges reserved (VirtualMemory)
	pages        map[uintptr]bool // mapped pages
	unmapErr     error            // if set, UnmapPages fails with it
	maps, unmaps int

	allocs, frees, allocFails, infos     int
	records, queries, destroys, eventsUp int
}

type fakeEvent struct {
	stream Stream
	done   bool
}

func newFakeDevice(total int) *fakeDevice {
	return &fakeDevice{
		total:  total,
		next:   0x7f00_0000_0000,
		live:   make(map[uintptr]int),
		events: make(map[Event]*fakeEvent),
		ranges: make(map[uintptr]int),
		pages:  make(map[uintptr]bool),
	}
}

// fakePage is the fake driver's mapping granularity, the H200's.
const fakePage = 2 * oneMiB

func (d *fakeDevice) PageSize() int { return fakePage }

func (d *fakeDevice) ReserveAddress(bytes int) (uintptr, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if bytes <= 0 || bytes%fakePage != 0 {
		return 0, fmt.Errorf("fake: ReserveAddress(%d)", bytes)
	}
	p := (d.next + fakePage - 1) &^ (fakePage - 1)
	d.next = p + uintptr(bytes) + 2*fakePage
	d.ranges[p] = bytes
	return p, nil
}

func (d *fakeDevice) FreeAddress(p uintptr, bytes int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ranges[p] != bytes {
		return fmt.Errorf("fake: FreeAddress(%#x, %d) of no such range", p, bytes)
	}
	for q := p; q < p+uintptr(bytes); q += fakePage {
		if d.pages[q] {
			return fmt.Errorf("fake: FreeAddress(%#x, %d) with page %#x still mapped", p, bytes, q)
		}
	}
	delete(d.ranges, p)
	return nil
}

// inRange says whether [p, p+bytes) lies in one reserved range.
func (d *fakeDevice) inRange(p uintptr, bytes int) bool {
	for base, n := range d.ranges {
		if p >= base && p+uintptr(bytes) <= base+uintptr(n) {
			return true
		}
	}
	return false
}

func (d *fakeDevice) MapPages(p uintptr, bytes int) error {
	d.mu.Lock()
	hook := d.onAlloc
	d.mu.Unlock()
	if hook != nil {
		hook()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.allocs++
	d.maps++
	if d.allocErr != nil {
		return d.allocErr
	}
	if bytes <= 0 || bytes%fakePage != 0 || p%fakePage != 0 || !d.inRange(p, bytes) {
		return fmt.Errorf("fake: MapPages(%#x, %d): not whole pages of a reserved range", p, bytes)
	}
	for q := p; q < p+uintptr(bytes); q += fakePage {
		if d.pages[q] {
			return fmt.Errorf("fake: MapPages(%#x, %d): page %#x already mapped", p, bytes, q)
		}
	}
	if d.failAllocs > 0 || d.used+bytes > d.total {
		if d.failAllocs > 0 {
			d.failAllocs--
		}
		d.allocFails++
		return fmt.Errorf("fake: cuMemCreate(%d): %w", bytes, ErrDeviceOutOfMemory)
	}
	for q := p; q < p+uintptr(bytes); q += fakePage {
		d.pages[q] = true
	}
	d.used += bytes
	return nil
}

func (d *fakeDevice) UnmapPages(p uintptr, bytes int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.unmapErr != nil {
		return d.unmapErr
	}
	if bytes <= 0 || bytes%fakePage != 0 || p%fakePage != 0 {
		return fmt.Errorf("fake: UnmapPages(%#x, %d): not whole pages", p, bytes)
	}
	for q := p; q < p+uintptr(bytes); q += fakePage {
		if !d.pages[q] {
			return fmt.Errorf("fake: UnmapPages(%#x, %d): page %#x not mapped", p, bytes, q)
		}
	}
	for q := p; q < p+uintptr(bytes); q += fakePage {
		delete(d.pages, q)
	}
	d.used -= bytes
	d.frees++
	d.unmaps++
	return nil
}

var errFakeDriver = errors.New("fake driver failure")

func (d *fakeDevice) MemAlloc(bytes int) (uintptr, error) {
	d.mu.Lock()
	hook := d.onAlloc
	d.mu.Unlock()
	if hook != nil {
		hook()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.allocs++
	if d.allocErr != nil {
		return 0, d.allocErr
	}
	if bytes <= 0 {
		return 0, fmt.Errorf("fake: MemAlloc(%d)", bytes)
	}
	if d.failAllocs > 0 || d.used+bytes > d.total {
		if d.failAllocs > 0 {
			d.failAllocs--
		}
		d.allocFails++
		return 0, fmt.Errorf("fake: cuMemAlloc(%d): %w", bytes, ErrDeviceOutOfMemory)
	}
	p := d.next
	// Leave a gap so that a block running past its segment would be seen
	// as an overlap with nothing rather than with the next segment.
	d.next += uintptr(bytes) + 2<<20
	d.live[p] = bytes
	d.used += bytes
	return p, nil
}

func (d *fakeDevice) MemFree(p uintptr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.freeErr != nil {
		return d.freeErr
	}
	n, ok := d.live[p]
	if !ok {
		return fmt.Errorf("fake: MemFree(%#x) of unknown pointer", p)
	}
	delete(d.live, p)
	d.used -= n
	d.frees++
	return nil
}

func (d *fakeDevice) MemGetInfo() (int, int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.infos++
	if d.infoErr != nil {
		return 0, 0, d.infoErr
	}
	return d.total - d.used, d.total, nil
}

func (d *fakeDevice) EventRecord(s Stream) (Event, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.recordErr != nil {
		return 0, d.recordErr
	}
	d.records++
	d.nextEvent++
	e := Event(d.nextEvent)
	d.events[e] = &fakeEvent{stream: s}
	d.eventsUp++
	return e, nil
}

func (d *fakeDevice) EventQuery(e Event) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.queries++
	if d.queryErr != nil {
		return false, d.queryErr
	}
	ev, ok := d.events[e]
	if !ok {
		return false, fmt.Errorf("fake: EventQuery(%d) of unknown event", e)
	}
	return ev.done, nil
}

func (d *fakeDevice) EventDestroy(e Event) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.events[e]; !ok {
		return fmt.Errorf("fake: EventDestroy(%d) of unknown event", e)
	}
	delete(d.events, e)
	d.destroys++
	d.eventsUp--
	return nil
}

// complete marks every event recorded on s so far as done.
func (d *fakeDevice) complete(s Stream) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, ev := range d.events {
		if ev.stream == s {
			ev.done = true
		}
	}
}

// completeAll marks every event recorded so far as done.
func (d *fakeDevice) completeAll() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, ev := range d.events {
		ev.done = true
	}
}

func (d *fakeDevice) set(f func(d *fakeDevice)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	f(d)
}

func (d *fakeDevice) counts() (allocs, frees, used int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.allocs, d.frees, d.used
}

// syncFakeDevice is a fakeDevice whose driver can also wait for events, as
// the real one can.
type syncFakeDevice struct {
	*fakeDevice
	syncs   int
	syncErr error
}

// EventSynchronize completes e and the events recorded before it on its
// stream, as a stream would.
func (d *syncFakeDevice) EventSynchronize(e Event) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.syncErr != nil {
		return d.syncErr
	}
	ev, ok := d.events[e]
	if !ok {
		return fmt.Errorf("fake: EventSynchronize(%d) of unknown event", e)
	}
	d.syncs++
	for id, x := range d.events {
		if x.stream == ev.stream && id <= e {
			x.done = true
		}
	}
	return nil
}
