package alloc

import (
	"errors"
	"fmt"
	"strings"
)

// StatPair is a statistic's current value and its peak since the allocator
// was made or ResetPeakStats was last called.
type StatPair struct {
	Current, Peak int
}

// MemoryStats describes an allocator, in the spirit of torch.cuda.memory_stats.
type MemoryStats struct {
	// Allocated is the bytes of blocks held by callers (block sizes, so
	// after rounding).
	Allocated StatPair
	// Reserved is the bytes of segments obtained from the driver.
	Reserved StatPair
	// Active is Allocated plus blocks freed but still waiting for events of
	// other streams: memory that cannot be reused yet.
	Active StatPair
	// Requested is the bytes callers asked for, before rounding.
	Requested StatPair
	// InactiveSplit is the free bytes in segments that are partly in use:
	// memory that cannot be returned to the driver, a measure of
	// fragmentation.
	InactiveSplit StatPair

	DriverAllocs int // segments obtained from the driver, or pages mapped into expandable segments
	DriverFrees  int // segments returned to the driver, or pages unmapped
	CacheHits    int // Allocs served from cached memory
	CacheMisses  int // Allocs that needed a new segment
	Retries      int // segment allocations retried after freeing cached memory
	OOMs         int // Allocs that failed for lack of memory
	Segments     int // segments held now
	ActiveBlocks int // blocks allocated or waiting for events now

	LargestFreeBlock int // biggest cached free block, in bytes
}

// Stats returns a snapshot of the statistics.
func (a *Allocator) Stats() MemoryStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.stats
	st.LargestFreeBlock = a.largestFree()
	return st
}

// ResetPeakStats sets every peak to its current value.
func (a *Allocator) ResetPeakStats() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range a.statPairs() {
		p.Peak = p.Current
	}
}

func (a *Allocator) statPairs() []*StatPair {
	s := &a.stats
	return []*StatPair{&s.Allocated, &s.Reserved, &s.Active, &s.Requested, &s.InactiveSplit}
}

// largestFree is the biggest cached free chunk in any pool. Private pools
// are few, so looking at each is cheap.
func (a *Allocator) largestFree() int {
	m := max(a.small.largestFree(), a.large.largestFree())
	for _, pp := range a.private {
		m = max(m, pp.small.largestFree(), pp.large.largestFree())
	}
	return m
}

// MemorySummary returns a readable table of the statistics, in the spirit of
// torch.cuda.memory_summary.
func (a *Allocator) MemorySummary() string {
	a.mu.Lock()
	st := a.stats
	st.LargestFreeBlock = a.largestFree()
	limit := a.limit
	nsmall, nlarge := a.small.nsegs, a.large.nsegs
	npriv, nprivSegs := len(a.private), 0
	for _, pp := range a.private {
		nprivSegs += pp.small.nsegs + pp.large.nsegs
	}
	pending := a.pendingEvents
	a.mu.Unlock()

	const width = 76
	var b strings.Builder
	rule := func(c byte) { fmt.Fprintf(&b, "|%s|\n", strings.Repeat(string(c), width-2)) }
	row := func(name, cur, peak string) { fmt.Fprintf(&b, "| %-34s | %16s | %16s |\n", name, cur, peak) }
	line := func(name, val string) { fmt.Fprintf(&b, "| %-34s | %35s |\n", name, val) }
	title := "CUDA caching allocator memory summary"
	pad := (width - 2 - len(title)) / 2
	rule('=')
	fmt.Fprintf(&b, "|%s%s%s|\n", strings.Repeat(" ", pad), title, strings.Repeat(" ", width-2-pad-len(title)))
	rule('=')
	row("Metric", "Current", "Peak")
	rule('-')
	for _, m := range []struct {
		name string
		p    StatPair
	}{
		{"Allocated memory", st.Allocated},
		{"Active memory", st.Active},
		{"Requested memory", st.Requested},
		{"Reserved memory", st.Reserved},
		{"Non-releasable memory (free split)", st.InactiveSplit},
	} {
		row(m.name, fmtSize(m.p.Current), fmtSize(m.p.Peak))
	}
	rule('-')
	line("Segments (small / large / private)", fmt.Sprintf("%d (%d / %d / %d in %d pools)", st.Segments, nsmall, nlarge, nprivSegs, npriv))
	line("Active blocks", fmt.Sprint(st.ActiveBlocks))
	line("Events pending", fmt.Sprint(pending))
	line("Largest free block", fmtSize(st.LargestFreeBlock))
	line("Driver allocs / frees", fmt.Sprintf("%d / %d", st.DriverAllocs, st.DriverFrees))
	line("Cache hits / misses", fmt.Sprintf("%d / %d", st.CacheHits, st.CacheMisses))
	line("OOM retries / OOMs", fmt.Sprintf("%d / %d", st.Retries, st.OOMs))
	if limit > 0 {
		line("Limit", fmtSize(limit))
	} else {
		line("Limit", "none")
	}
	rule('=')
	return b.String()
}

// fmtSize formats n in the largest binary unit that keeps it at least 1.
func fmtSize(n int) string {
	neg := ""
	if n < 0 {
		neg, n = "-", -n
	}
	switch {
	case n >= oneGiB:
		return fmt.Sprintf("%s%.2f GiB", neg, float64(n)/oneGiB)
	case n >= oneMiB:
		return fmt.Sprintf("%s%.2f MiB", neg, float64(n)/oneMiB)
	case n >= oneKiB:
		return fmt.Sprintf("%s%.2f KiB", neg, float64(n)/oneKiB)
	default:
		return fmt.Sprintf("%s%d B", neg, n)
	}
}

// OutOfMemoryError is returned by Alloc when neither the cache nor the driver
// (within the limit) can provide the memory, after every retry. Its fields
// tell apart a full device, a reached limit and fragmentation (much reserved
// but unallocated, yet no free block big enough).
type OutOfMemoryError struct {
	Requested           int // bytes asked for
	Rounded             int // block size the request was rounded to
	SegmentSize         int // size of the segment that could not be had
	DeviceFree          int // free device memory, from the driver
	DeviceTotal         int // total device memory, from the driver
	Allocated           int // bytes held by callers
	Reserved            int // bytes in segments held by the allocator
	ReservedUnallocated int // Reserved - Allocated
	AwaitingEvents      int // part of ReservedUnallocated freed but waiting for events of other streams
	LargestFreeBlock    int // biggest cached free block
	Limit               int // cap on Reserved, 0 if none
}

func (e *OutOfMemoryError) Error() string {
	limit := "no limit"
	if e.Limit > 0 {
		limit = "limit " + fmtMiB(e.Limit)
	}
	// Memory waiting for events looks like fragmentation unless named.
	awaiting := ""
	if e.AwaitingEvents > 0 {
		awaiting = ", " + fmtMiB(e.AwaitingEvents) + " of it awaiting stream events"
	}
	return fmt.Sprintf("cuda: out of memory allocating %s (rounded %s, segment %s): device %.2f of %.2f GiB free, "+
		"%s allocated, %s reserved (%s reserved but unallocated%s, largest free block %s), %s",
		fmtMiB(e.Requested), fmtMiB(e.Rounded), fmtMiB(e.SegmentSize),
		float64(e.DeviceFree)/oneGiB, float64(e.DeviceTotal)/oneGiB,
		fmtMiB(e.Allocated), fmtMiB(e.Reserved), fmtMiB(e.ReservedUnallocated), awaiting,
		fmtMiB(e.LargestFreeBlock), limit)
}

// Unwrap makes errors.Is(err, ErrDeviceOutOfMemory) true.
func (e *OutOfMemoryError) Unwrap() error { return ErrDeviceOutOfMemory }

func fmtMiB(n int) string { return fmt.Sprintf("%.2f MiB", float64(n)/oneMiB) }

// oomError describes a failed Alloc. If the driver cannot even say how much
// memory is free, that error is returned too rather than hidden.
func (a *Allocator) oomError(bytes, rounded, segSize int) error {
	e := &OutOfMemoryError{
		Requested:           bytes,
		Rounded:             rounded,
		SegmentSize:         segSize,
		Allocated:           a.stats.Allocated.Current,
		Reserved:            a.stats.Reserved.Current,
		ReservedUnallocated: a.stats.Reserved.Current - a.stats.Allocated.Current,
		AwaitingEvents:      a.stats.Active.Current - a.stats.Allocated.Current,
		LargestFreeBlock:    a.largestFree(),
		Limit:               a.limit,
	}
	free, total, err := a.dm.MemGetInfo()
	if err != nil {
		return errors.Join(e, fmt.Errorf("cuda: querying device memory: %w", err))
	}
	e.DeviceFree, e.DeviceTotal = free, total
	return e
}
