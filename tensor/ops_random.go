package tensor

import (
	"fmt"
	"slices"
	"sync"
)

// Generator is a stream of counter-based random numbers: a seed and the
// offset (in Philox blocks of four values) of the next draw. Each draw of n
// values advances the offset by (n+3)/4, so successive draws never reuse a
// counter and a run is reproduced by the same seed and order of draws, on
// any backend (see Random for the layout). Safe for concurrent use, though
// concurrent draws then take offsets in an unspecified order.
//
// The offset is host state: a CUDA graph captured around a draw replays the
// numbers of the capture (DeviceGenerator does not).
type Generator struct {
	mu     sync.Mutex
	seed   uint64
	offset uint64
}

// NewGenerator returns a generator at offset 0 of seed's stream.
func NewGenerator(seed uint64) *Generator { return &Generator{seed: seed} }

// Seed is the generator's seed.
func (g *Generator) Seed() uint64 { return g.seed }

// Offset is the Philox block the next draw starts at.
func (g *Generator) Offset() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.offset
}

// SetOffset moves the stream, to resume a run from a checkpoint.
func (g *Generator) SetOffset(off uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.offset = off
}

// take reserves the blocks of a draw of n values and returns its offset.
func (g *Generator) take(n int) uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	off := g.offset
	g.offset += uint64(n+3) / 4
	return off
}

// RandomSource is where the random tensors draw from: a Generator (offset
// on the host) or a DeviceGenerator (offset on the device).
type RandomSource interface {
	// fill draws dst on b and advances the source past it.
	fill(b Backend, dst Buffer, dist Distribution, lo, hi float32)
	// dropout is b's Dropout (or DropoutAt) at the source's next draw,
	// and advances the source past it.
	dropout(b DropoutBackend, y, mask, x Buffer, keep, scale float32)
	// dropoutDraw reserves the draw of a dropout of n elements on rb and
	// advances the source past it: d.apply (for the forward pass, and
	// again for the backward one) is rb's DropoutRedraw(At) at that draw;
	// saved, when not nil, is the device copy of the draw's state that d
	// reads (the caller keeps it as long as d may run).
	dropoutDraw(rb DropoutRedrawBackend, b Backend, s *Scope, n int, keep, scale float32) (d redraw, saved *Tensor)
	// attentionDraw reserves the draw of n attention weights for ab's fused
	// attention and advances the source past it; saved, when not nil, is
	// the device copy of the draw's state that drop reads (the caller
	// releases it).
	attentionDraw(ab AttentionBackend, b Backend, s *Scope, n int) (drop AttentionDropout, saved *Tensor)
	// snapshot returns a function that puts the source back where it
	// stands now (queued like a draw); keep holds what that needs.
	snapshot(keep *Scope) (restore func())
}

func (g *Generator) snapshot(*Scope) func() {
	off := g.Offset()
	return func() { g.SetOffset(off) }
}

func (g *DeviceGenerator) snapshot(keep *Scope) func() {
	b := g.state.st.b
	saved := EmptyOf(b, keep, Int32, 4)
	b.Copy(saved.buffer(), g.state.buffer())
	return func() { b.Copy(g.state.buffer(), saved.buffer()) }
}

func (g *Generator) fill(b Backend, dst Buffer, dist Distribution, lo, hi float32) {
	b.Random(dst, dist, g.seed, g.take(dst.Len), lo, hi)
}

func (g *Generator) dropout(b DropoutBackend, y, mask, x Buffer, keep, scale float32) {
	b.Dropout(y, mask, x, g.seed, g.take(x.Len), keep, scale)
}

// redraw applies one reserved dropout draw: apply sets y = x·mask, add
// (nil where the backend is no DropoutAddBackend) y = r + x·mask.
type redraw struct {
	apply func(y, x Buffer)
	add   func(y, x, r Buffer)
}

func (g *Generator) dropoutDraw(rb DropoutRedrawBackend, _ Backend, _ *Scope, n int, keep, scale float32) (redraw, *Tensor) {
	seed, off := g.seed, g.take(n)
	d := redraw{apply: func(y, x Buffer) { rb.DropoutRedraw(y, x, seed, off, keep, scale) }}
	if ab, ok := rb.(DropoutAddBackend); ok {
		d.add = func(y, x, r Buffer) { ab.DropoutRedrawAdd(y, x, r, seed, off, keep, scale) }
	}
	return d, nil
}

func (g *Generator) attentionDraw(_ AttentionBackend, _ Backend, _ *Scope, n int) (AttentionDropout, *Tensor) {
	return AttentionDropout{Seed: g.seed, Offset: g.take(n)}, nil
}

// DeviceGenerator is a Generator whose seed and offset live in four int32
// words of device memory that every draw advances there
// (RandomStateBackend), so that draws inside a captured CUDA graph are new
// on every replay. The numbers are those of a Generator of the same seed.
// On a backend without RandomStateBackend each draw reads and writes the
// state through the host (correct, but not capturable).
type DeviceGenerator struct {
	state *Tensor // int32 [4]: seed low, high; offset low, high
}

// NewDeviceGenerator returns a generator on b at offset 0 of seed's stream.
// Its memory is the caller's: Release it.
func NewDeviceGenerator(b Backend, seed uint64) *DeviceGenerator {
	return &DeviceGenerator{state: FromInt32(b, nil, stateWords(seed, 0), 4)}
}

func stateWords(seed, offset uint64) []int32 {
	return []int32{int32(uint32(seed)), int32(uint32(seed >> 32)), int32(uint32(offset)), int32(uint32(offset >> 32))}
}

// SeedOffset downloads the state (waiting for queued draws).
func (g *DeviceGenerator) SeedOffset() (seed, offset uint64) {
	w := g.state.Int32s()
	return uint64(uint32(w[0])) | uint64(uint32(w[1]))<<32, uint64(uint32(w[2])) | uint64(uint32(w[3]))<<32
}

// Release frees the state.
func (g *DeviceGenerator) Release() { g.state.Release() }

func (g *DeviceGenerator) fill(b Backend, dst Buffer, dist Distribution, lo, hi float32) {
	if rb, ok := b.(RandomStateBackend); ok {
		rb.RandomAt(dst, dist, g.state.buffer(), lo, hi)
		return
	}
	seed, off := g.SeedOffset()
	b.Random(dst, dist, seed, off, lo, hi)
	b.Upload(g.state.buffer(), stateWords(seed, off+uint64(dst.Len+3)/4))
}

func (g *DeviceGenerator) dropout(b DropoutBackend, y, mask, x Buffer, keep, scale float32) {
	b.DropoutAt(y, mask, x, g.state.buffer(), keep, scale)
}

func (g *DeviceGenerator) dropoutDraw(rb DropoutRedrawBackend, b Backend, s *Scope, n int, keep, scale float32) (redraw, *Tensor) {
	saved := EmptyOf(b, s, Int32, 4)
	rb.TakeRandomState(saved.buffer(), g.state.buffer(), uint64(n+3)/4)
	d := redraw{apply: func(y, x Buffer) { rb.DropoutRedrawAt(y, x, saved.buffer(), keep, scale) }}
	if ab, ok := rb.(DropoutAddBackend); ok {
		d.add = func(y, x, r Buffer) { ab.DropoutRedrawAddAt(y, x, r, saved.buffer(), keep, scale) }
	}
	return d, saved
}

func (g *DeviceGenerator) attentionDraw(ab AttentionBackend, b Backend, s *Scope, n int) (AttentionDropout, *Tensor) {
	saved := EmptyOf(b, s, Int32, 4)
	ab.AttentionTakeState(saved.buffer(), g.state.buffer(), uint64(n+3)/4)
	return AttentionDropout{State: saved.buffer()}, saved
}

func randomTensor(b Backend, s *Scope, gen RandomSource, dist Distribution, lo, hi float32, shape []int) *Tensor {
	out := Empty(b, s, shape...)
	if out.Len() > 0 {
		noteDraw(s, gen)
		gen.fill(b, out.buffer(), dist, lo, hi)
	}
	return out
}

// Rand returns values uniform in [0, 1) (torch.rand).
func Rand(b Backend, s *Scope, gen RandomSource, shape ...int) *Tensor {
	return randomTensor(b, s, gen, Uniform, 0, 1, shape)
}

// RandUniform returns values uniform in [lo, hi) (Tensor.uniform_).
func RandUniform(b Backend, s *Scope, gen RandomSource, lo, hi float32, shape ...int) *Tensor {
	return randomTensor(b, s, gen, Uniform, lo, hi, shape)
}

// RandN returns standard normal values (torch.randn).
func RandN(b Backend, s *Scope, gen RandomSource, shape ...int) *Tensor {
	return randomTensor(b, s, gen, Normal, 0, 1, shape)
}

// RandBernoulli returns 1 with probability p, else 0 (torch.bernoulli of a
// constant p). (Bernoulli is the name of the Distribution.)
func RandBernoulli(b Backend, s *Scope, gen RandomSource, p float32, shape ...int) *Tensor {
	return randomTensor(b, s, gen, Bernoulli, p, 0, shape)
}

// Dropout zeroes each element of x with probability p and scales the others
// by 1/(1-p) when train is set, as nn.Dropout: the expected value is kept.
// With p = 0 or in evaluation mode it returns x itself, and with p = 1
// zeros (no draw). The mask (0 or 1/(1-p)) is kept for the backward pass,
// dx = dy·mask. On a DropoutBackend the mask is drawn and applied in one
// pass, with the same bits as the draw, scale and product of the others.
func Dropout(x *Tensor, p float32, train bool, gen RandomSource) *Tensor {
	if !(p >= 0 && p <= 1) {
		panic(fmt.Sprintf("tensor: Dropout probability %v outside [0, 1]", p))
	}
	if !train || p == 0 {
		return x
	}
	be := x.st.b
	if p == 1 {
		// Multiplying by zero keeps the graph (and NaN·0 = NaN, as torch's
		// x * mask gives).
		mask := Zeros(be, x.scope, x.shape...)
		return dropoutApply(x, mask)
	}
	if rb, ok := be.(DropoutRedrawBackend); ok {
		return dropoutRedrawn(rb, x, p, gen)
	}
	if db, ok := be.(DropoutBackend); ok {
		return dropoutFused(db, x, p, gen)
	}
	mask := RandBernoulli(be, x.scope, gen, 1-p, x.shape...)
	scale := Full(be, x.scope, 1/(1-p), 1)
	Complete(be).ScaleBy(mask.buffer(), mask.buffer(), scale.buffer(), false)
	scale.Release()
	return dropoutApply(x, mask)
}

// dropoutFused is Dropout in one pass of db: the mask drawn, scaled and
// applied together, equal bit for bit to the draw, scale and product.
func dropoutFused(db DropoutBackend, x *Tensor, p float32, gen RandomSource) *Tensor {
	x = x.Contiguous()
	be := x.st.b
	out := Empty(be, x.scope, x.shape...)
	mask := Empty(be, x.scope, x.shape...)
	if out.Len() > 0 { // an empty draw takes no counter, as randomTensor's
		noteDraw(x.scope, gen)
		gen.dropout(db, out.buffer(), mask.buffer(), x.buffer(), 1-p, 1/(1-p))
	}
	return recordMasked(out, x, mask)
}

// dropoutRedrawn is Dropout on rb keeping no mask: the backward pass
// draws it again from the forward's draw (its seed and offset, or a device
// copy of the generator's state) and applies it to dy, the bits of dy·mask.
func dropoutRedrawn(rb DropoutRedrawBackend, x *Tensor, p float32, gen RandomSource) *Tensor {
	x = x.Contiguous()
	be := x.st.b
	out := Empty(be, x.scope, x.shape...)
	d, saved := redraw{apply: func(y, x Buffer) {}}, (*Tensor)(nil)
	if out.Len() > 0 { // an empty draw takes no counter, as randomTensor's
		noteDraw(x.scope, gen)
		d, saved = gen.dropoutDraw(rb, be, x.scope, out.Len(), 1-p, 1/(1-p))
	}
	d.apply(out.buffer(), x.buffer())
	record(out, "dropout", func(g *Tensor, e *engine) {
		dx := Empty(be, e.scopeFor(x), x.shape...)
		d.apply(dx.buffer(), g.buffer())
		e.give(x, dx)
	}, x)
	saveFor(out, saved)
	readsNot(out, true, x) // the draw is what it reads
	return out
}

// DropoutAdd returns r + Dropout(x, p, train, gen) for r and x of one
// shape: a residual connection after a dropout (a transformer block's).
// Where the backend redraws dropout masks and can add in the same pass
// (DropoutAddBackend) it is one pass each way, with the bits of the two
// operations and the same draw; elsewhere it is the two.
func DropoutAdd(r, x *Tensor, p float32, train bool, gen RandomSource) *Tensor {
	if !slices.Equal(r.shape, x.shape) {
		panic(fmt.Sprintf("tensor: DropoutAdd of a residual %v and an input %v; want one shape", r.shape, x.shape))
	}
	ab, ok := x.st.b.(DropoutAddBackend)
	if !ok || !train || !(p > 0 && p < 1) || x.Len() == 0 {
		d := Dropout(x, p, train, gen)
		y := Add(r, d)
		if d != x {
			ReleaseInput(d, y)
		}
		return y
	}
	sameBackend(r, x)
	x, r = x.Contiguous(), r.Contiguous()
	be := x.st.b
	out := Empty(be, scopeOf(r, x), x.shape...)
	noteDraw(x.scope, gen)
	d, saved := gen.dropoutDraw(ab, be, x.scope, out.Len(), 1-p, 1/(1-p))
	d.add(out.buffer(), x.buffer(), r.buffer())
	record(out, "dropout_add", func(g *Tensor, e *engine) {
		if x.requiresGrad {
			dx := Empty(be, e.scopeFor(x), x.shape...)
			d.apply(dx.buffer(), g.buffer())
			e.give(x, dx)
		}
		// Queued after the draw that reads it, g may become r's own
		// gradient (no copy), as Add gives it.
		e.give(r, g)
	}, x, r)
	saveFor(out, saved)
	readsNot(out, true, x, r) // the draw is what it reads
	return out
}

// dropoutApply returns x·mask with the backward pass dy·mask.
func dropoutApply(x, mask *Tensor) *Tensor {
	x = x.Contiguous()
	be := x.st.b
	out := Empty(be, x.scope, x.shape...)
	Complete(be).Mul(out.buffer(), x.buffer(), mask.buffer())
	return recordMasked(out, x, mask)
}

// recordMasked records out = x·mask with the backward pass dy·mask, and
// releases the mask when no backward pass will read it.
func recordMasked(out, x, mask *Tensor) *Tensor {
	be := x.st.b
	record(out, "dropout", func(g *Tensor, e *engine) {
		dx := Empty(be, e.scopeFor(x), x.shape...)
		Complete(be).Mul(dx.buffer(), g.buffer(), mask.buffer())
		e.give(x, dx)
	}, x)
	saveFor(out, mask)
	readsNot(out, true, x) // the mask is what it reads
	return out
}
