package cuda

import (
	"fmt"
	"time"
)

// A channels-last convolution whose input channels are a multiple of 8
// but not of 32 (airbench's 24 after its whitening layer) may run cuDNN's
// forward pass on copies of x and the filter padded with zero channels to
// the next multiple of 32: the tensor-core kernels then take a tap's
// channels whole, and the sums are the same. On the H200 airbench's
// 31x31 24->64 layer took 196 µs a forward pass at 24 channels and 103 at
// 32 (docs/performance.md, round 33); its data and filter gradients were
// no faster padded (181 and 203 µs against 182 and 228), so they keep the
// layer's own geometry. Whether a geometry pads is measured on its first
// forward pass outside a capture, the padding's two passes included.

// padChannelsTo is the channel count a convolution's input of c channels
// is padded to for cuDNN's forward pass: the next multiple of 32 when c is
// a multiple of 8 that is not one already (the pad kernel moves eight
// channels at a time), c itself otherwise.
func padChannelsTo(c int) int {
	if c%8 != 0 || c%32 == 0 {
		return c
	}
	return (c + 31) &^ 31
}

// Another way to run a plan's direction (the forward pass on padded
// channels, conv_pad.go; the data gradient as a forward pass,
// conv_dgrad.go): not yet measured, measured slower than the direction's
// own, or measured faster (and taken from then on).
const (
	altUndecided = iota
	altSlower
	altFaster
)

// altFaster times own and alt, two ways of one direction on the call's
// buffers (each run once to warm, then timed), and reports whether alt
// took less time; what names alt in the kernel log. s.mu is held.
func (b *Backend) altFaster(what string, p *convPlan, own, alt func()) bool {
	s := b.dnn
	run := func(f func()) func() error { return func() error { f(); return nil } }
	tOwn, err := s.clock(run(own), run(own))
	var tAlt time.Duration
	if err == nil {
		tAlt, err = s.clock(run(alt), run(alt))
	}
	if w := b.opt.KernelLog; w != nil {
		fmt.Fprintf(w, "cuda: cuDNN %s of %s: %v against %v, err %v\n", what, p.geom, tAlt, tOwn, err)
	}
	return err == nil && tAlt < tOwn
}

// padChannels queues dst [rows, cp] = src [rows, c] with channels c to cp
// zero (bfloat16, channels multiples of 8, 16-byte aligned).
func (b *Backend) padChannels(op string, dst, src uintptr, rows, c, cp int) {
	b.launch(op, b.kernel("ember_cl_pad_channels"), rows*cp/8, dst, src, int64(rows), int32(c/8), int32(cp/8))
}

// paddedBuffers pads x and the filter wh of c's convolution to cp channels
// into workspaces, which done releases; ok is false, with nothing queued,
// where the device has no room for them.
func (b *Backend) paddedBuffers(op string, px, wh uintptr, c convShape, cp int) (xp, wp uintptr, done func(), ok bool) {
	g := c.g
	rows, taps := g.N*g.H*g.W, g.K*g.R*g.S
	xb, err := b.alloc.Alloc(2*rows*cp, b.stream)
	if err != nil {
		return 0, 0, nil, false
	}
	wb, err := b.alloc.Alloc(2*taps*cp, b.stream)
	if err != nil {
		b.release(xb)
		return 0, 0, nil, false
	}
	b.padChannels(op, xb.Ptr(), px, rows, g.C, cp)
	b.padChannels(op, wb.Ptr(), wh, taps, g.C, cp)
	return xb.Ptr(), wb.Ptr(), func() { b.release(xb); b.release(wb) }, true
}

// forwardPadded queues y = conv(x, wh) through pp, the plan of c's
// geometry on padded channels, with its algorithm a; false, with nothing
// queued, where the padded copies find no room (the caller then runs the
// convolution as it is).
func (b *Backend) forwardPadded(op string, pp *convPlan, a convAlgo, py, px, wh uintptr, c convShape) bool {
	xp, wp, done, ok := b.paddedBuffers(op, px, wh, c, pp.geom.c)
	if !ok {
		return false
	}
	defer done()
	b.runDNN(op, pp, dirForward, a, xp, wp, 0, py)
	return true
}

// paddedForward returns the plan of p's forward pass on padded channels
// and its algorithm where that measured faster than a, p's own (nil
// otherwise). The first call outside a capture searches the padded
// geometry and times both ways on the call's buffers (y is overwritten);
// inside a capture an undecided plan runs unpadded. s.mu is held.
func (b *Backend) paddedForward(op string, p *convPlan, a convAlgo, py, px, wh uintptr, c convShape) (*convPlan, convAlgo) {
	switch p.padForward {
	case altFaster:
		return p.pad, p.pad.algo[dirForward]
	case altSlower:
		return nil, convAlgo{}
	}
	cp := padChannelsTo(c.g.C)
	if b.capturing.Load() && cp != c.g.C {
		return nil, convAlgo{}
	}
	p.padForward = altSlower
	s := b.dnn
	if cp == c.g.C || c.groups != 1 || s.clock == nil {
		return nil, convAlgo{}
	}
	dg := p.geom
	dg.c = cp
	pp := s.plan(dg)
	xp, wp, done, ok := b.paddedBuffers(op, px, wh, c, cp)
	if !ok {
		return nil, convAlgo{}
	}
	pa, ok := b.algoFor(op, pp, dirForward, xp, wp, py, 0)
	done()
	if !ok {
		return nil, convAlgo{}
	}
	if !b.altFaster(fmt.Sprintf("forward on channels padded to %d", cp), p,
		func() { b.runDNN(op, p, dirForward, a, px, wh, 0, py) },
		func() {
			if !b.forwardPadded(op, pp, pa, py, px, wh, c) {
				b.runDNN(op, p, dirForward, a, px, wh, 0, py)
			}
		}) {
		return nil, convAlgo{}
	}
	p.padForward, p.pad = altFaster, pp
	return pp, pa
}
