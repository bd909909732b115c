package tensor

import (
	"math"
	"sync"
)

// CountingCPU is the CPU backend (every optional interface of CPU) that
// counts the bytes of the buffers it handed out and that were not freed
// since, and their peak: what a step would hold on a device, measured on
// the host, as a GPU allocator's statistics would (the CPU itself leaves
// host memory to Go's collector). A freed float32 buffer is filled with
// NaN (a bfloat16 one too), so that a result computed from memory given
// back too early shows.
// Tests of when memory is given back use it; so can a program that
// estimates a model's memory before it has a GPU.
type CountingCPU struct {
	cpuBackend
	mu         sync.Mutex
	live, peak int
	allocs     int
	badFrees   int
	held       map[*cpuMem]int // live buffers and their bytes
}

// NewCountingCPU returns a CountingCPU with nothing allocated.
func NewCountingCPU() *CountingCPU { return &CountingCPU{held: map[*cpuMem]int{}} }

// Alloc is the CPU's, counted.
func (c *CountingCPU) Alloc(n int, dt DType) (Buffer, error) {
	buf, err := c.cpuBackend.Alloc(n, dt)
	if err != nil {
		return buf, err
	}
	m := buf.Mem.(*cpuMem)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.held[m] = m.Bytes()
	c.live += m.Bytes()
	c.peak = max(c.peak, c.live)
	c.allocs++
	return buf, nil
}

// Free takes the buffer's bytes off the count and poisons its float32
// memory. Freeing memory that is not live (twice, or another backend's)
// is counted by BadFrees.
func (c *CountingCPU) Free(buf Buffer) {
	if buf.Mem == nil {
		return
	}
	m, ok := buf.Mem.(*cpuMem)
	c.mu.Lock()
	defer c.mu.Unlock()
	n, live := c.held[m]
	if !ok || !live {
		c.badFrees++
		return
	}
	delete(c.held, m)
	c.live -= n
	nan := float32(math.NaN())
	for i := range m.f {
		m.f[i] = nan
	}
	for i := range m.h {
		m.h[i] = 0x7fc0 // bfloat16 NaN
	}
}

// Live is the bytes of the buffers allocated and not freed.
func (c *CountingCPU) Live() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.live
}

// Peak is the most Live has been since NewCountingCPU or ResetPeak.
func (c *CountingCPU) Peak() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.peak
}

// ResetPeak starts the peak afresh from what is live now.
func (c *CountingCPU) ResetPeak() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.peak = c.live
}

// Allocs is the number of allocations so far.
func (c *CountingCPU) Allocs() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.allocs
}

// BadFrees is the number of frees of memory that was not live: a double
// free, or a buffer of another backend.
func (c *CountingCPU) BadFrees() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.badFrees
}
