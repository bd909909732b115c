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
	const op = "dropout"
	n := x.Len
	py, pm, px := b.dropoutBuffers(op, y, mask, x)
	b.launch(op, b.kernel("ember_dropout"), (n+3)/4, py, pm, px, int64(n), int64(seed), int64(offset), keep, scale)
}

// DropoutAt is Dropout with the seed and offset in device memory, advanced
// after the draw as RandomAt's.
func (b *Backend) DropoutAt(y, mask, x tensor.Buffer, state tensor.Buffer, keep, scale float32) {
	const op = "dropout_at"
	need(op, "state", state, 4)
	n := x.Len
	py, pm, px := b.dropoutBuffers(op, y, mask, x)
	if n == 0 {
		return
	}
	ps := b.i32(op, state)
	b.launch(op, b.kernel("ember_dropout_state"), (n+3)/4, py, pm, px, int64(n), ps, keep, scale)
	b.launchGrid(op, b.kernel("ember_random_advance"), 1, 32, ps, int64((n+3)/4))
}

// dropoutBuffers checks that y and mask hold x's length and returns the
// three pointers.
func (b *Backend) dropoutBuffers(op string, y, mask, x tensor.Buffer) (py, pm, px uintptr) {
	if y.Len != x.Len || mask.Len != x.Len {
		panic(fmt.Sprintf("cuda: %s of %d elements into y of %d and a mask of %d", op, x.Len, y.Len, mask.Len))
	}
	return b.f32(op, y), b.f32(op, mask), b.f32(op, x)
}
