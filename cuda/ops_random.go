package cuda

import (
	"fmt"

	"github.com/ember-ml/ember/tensor"
)

// Random fills dst with Philox4x32-10 draws (tensor/backend_random.go pins
// the layout): one thread per block of four elements, the same float
// operations as the CPU backend, so uniform and Bernoulli draws are equal
// bit for bit and normal ones agree to the rounding of float64 log, sqrt
// and sincos.
func (b *Backend) Random(dst tensor.Buffer, dist tensor.Distribution, seed, offset uint64, lo, hi float32) {
	const op = "random"
	if dist > tensor.Bernoulli {
		panic(fmt.Sprintf("cuda: %s: unknown distribution %d", op, dist))
	}
	n := dst.Len
	b.launch(op, b.kernel("ember_random"), (n+3)/4, b.f32(op, dst), int64(n), int32(dist),
		int64(seed), int64(offset), lo, hi)
}

// RandomAt is Random with the seed and offset in device memory
// (tensor.RandomStateBackend): the draw reads them, then a one-thread
// kernel, ordered after it on the stream, advances the offset, so that a
// captured graph draws new numbers on every replay.
func (b *Backend) RandomAt(dst tensor.Buffer, dist tensor.Distribution, state tensor.Buffer, lo, hi float32) {
	const op = "random_at"
	if dist > tensor.Bernoulli {
		panic(fmt.Sprintf("cuda: %s: unknown distribution %d", op, dist))
	}
	need(op, "state", state, 4)
	n := dst.Len
	if n == 0 {
		return
	}
	ps := b.i32(op, state)
	b.launch(op, b.kernel("ember_random_state"), (n+3)/4, b.f32(op, dst), int64(n), int32(dist), ps, lo, hi)
	b.launchGrid(op, b.kernel("ember_random_advance"), 1, 32, ps, int64((n+3)/4))
}

// Dropout draws the mask, scales it and applies it in one kernel
// (tensor.DropoutBackend): the Bernoulli draws of Random bit for bit, one
// thread per Philox block of four elements, 16-byte loads and stores.
func (b *Backend) Dropout(y, mask, x tensor.Buffer, seed, offset uint64, keep, scale float32) {
	b.dropout("dropout", y, &mask, x, nil, seed, offset, keep, scale)
}

// DropoutAt is Dropout with the seed and offset in device memory, advanced
// after the draw as RandomAt's.
func (b *Backend) DropoutAt(y, mask, x tensor.Buffer, state tensor.Buffer, keep, scale float32) {
	const op = "dropout_at"
	if ps := b.dropoutState(op, y, &mask, x, nil, state, keep, scale); ps != 0 {
		b.launchGrid(op, b.kernel("ember_random_advance"), 1, 32, ps, int64((x.Len+3)/4))
	}
}

// DropoutRedraw is Dropout's y without the mask (ember_dropout with a null
// mask).
func (b *Backend) DropoutRedraw(y, x tensor.Buffer, seed, offset uint64, keep, scale float32) {
	b.dropout("dropout_redraw", y, nil, x, nil, seed, offset, keep, scale)
}

// DropoutRedrawAt is DropoutRedraw at the seed and offset in saved, which
// it leaves as they are.
func (b *Backend) DropoutRedrawAt(y, x tensor.Buffer, saved tensor.Buffer, keep, scale float32) {
	b.dropoutState("dropout_redraw_at", y, nil, x, nil, saved, keep, scale)
}

// DropoutRedrawAdd is DropoutRedraw with r added to each kept or zeroed
// element in the same pass (tensor.DropoutAddBackend).
func (b *Backend) DropoutRedrawAdd(y, x, r tensor.Buffer, seed, offset uint64, keep, scale float32) {
	b.dropout("dropout_redraw_add", y, nil, x, &r, seed, offset, keep, scale)
}

// DropoutRedrawAddAt is DropoutRedrawAdd at the seed and offset in saved.
func (b *Backend) DropoutRedrawAddAt(y, x, r tensor.Buffer, saved tensor.Buffer, keep, scale float32) {
	b.dropoutState("dropout_redraw_add_at", y, nil, x, &r, saved, keep, scale)
}

var _ tensor.DropoutAddBackend = (*Backend)(nil)

// dropout queues ember_dropout; a nil mask or residual is none.
func (b *Backend) dropout(op string, y tensor.Buffer, mask *tensor.Buffer, x tensor.Buffer, r *tensor.Buffer, seed, offset uint64, keep, scale float32) {
	n := x.Len
	py, pm, px, pr := b.dropoutBuffers(op, y, mask, x, r)
	b.launch(op, b.kernel("ember_dropout"), (n+3)/4, py, pm, px, pr, int64(n), int64(seed), int64(offset), keep, scale)
}

// dropoutState queues ember_dropout_state at state's seed and offset and
// returns state's pointer (0 when x is empty: nothing was drawn); a nil
// mask or residual is none.
func (b *Backend) dropoutState(op string, y tensor.Buffer, mask *tensor.Buffer, x tensor.Buffer, r *tensor.Buffer, state tensor.Buffer, keep, scale float32) uintptr {
	need(op, "state", state, 4)
	n := x.Len
	py, pm, px, pr := b.dropoutBuffers(op, y, mask, x, r)
	if n == 0 {
		return 0
	}
	ps := b.i32(op, state)
	b.launch(op, b.kernel("ember_dropout_state"), (n+3)/4, py, pm, px, pr, int64(n), ps, keep, scale)
	return ps
}

// TakeRandomState copies a device generator's state into saved and
// advances it (one thread, ordered on the stream before the kernels that
// read saved), so that a captured graph draws anew on every replay.
func (b *Backend) TakeRandomState(saved, state tensor.Buffer, blocks uint64) {
	b.takeRandomState("take_random_state", saved, state, blocks)
}

func (b *Backend) takeRandomState(op string, saved, state tensor.Buffer, blocks uint64) {
	need(op, "saved", saved, 4)
	need(op, "state", state, 4)
	b.launchGrid(op, b.kernel("ember_random_take_state"), 1, 32, b.i32(op, saved), b.i32(op, state), int64(blocks))
}

var _ tensor.DropoutRedrawBackend = (*Backend)(nil)

// dropoutBuffers checks that y, mask and r hold x's length and returns the
// four pointers; a nil mask or residual is none (a null pointer: the
// redraws' mask, the plain dropout's residual).
func (b *Backend) dropoutBuffers(op string, y tensor.Buffer, mask *tensor.Buffer, x tensor.Buffer, r *tensor.Buffer) (py, pm, px, pr uintptr) {
	if y.Len != x.Len {
		panic(fmt.Sprintf("cuda: %s of %d elements into y of %d", op, x.Len, y.Len))
	}
	if mask != nil && mask.Len != x.Len {
		panic(fmt.Sprintf("cuda: %s of %d elements with a mask of %d", op, x.Len, mask.Len))
	}
	if r != nil && r.Len != x.Len {
		panic(fmt.Sprintf("cuda: %s of %d elements with a residual of %d", op, x.Len, r.Len))
	}
	if mask != nil {
		pm = b.f32(op, *mask)
	}
	if r != nil {
		pr = b.f32(op, *r)
	}
	return b.f32(op, y), pm, b.f32(op, x), pr
}
