package tensor

// Distribution selects what Backend.Random draws.
type Distribution uint8

const (
	// Uniform draws from [a, b).
	Uniform Distribution = iota
	// Normal draws from N(a, b²) (mean a, standard deviation b).
	Normal
	// Bernoulli draws 1 with probability a, else 0.
	Bernoulli
)

// Random is the random-number part of the Backend core: a counter-based
// generator (Philox4x32-10, as PyTorch and JAX use on GPUs), so that the
// values depend only on (seed, offset, element index) and every backend
// produces the same bits for uniform and Bernoulli draws (normal draws use
// transcendental functions and agree to a few ulps).
//
// The bit layout, which every backend follows exactly:
//   - key = (seed & 0xffffffff, seed >> 32);
//   - element i uses the 128-bit counter whose low 64 bits are offset + i/4
//     and whose high 64 bits are 0, as the four 32-bit words (lo32, hi32, 0,
//     0), and Philox4x32-10 with the constants of Salmon et al. (2011),
//     "Parallel random numbers: as easy as 1, 2, 3" (multipliers
//     0xD2511F53, 0xCD9E8D57; key increments 0x9E3779B9, 0xBB67AE85);
//     it takes output word w = out[i%4];
//   - a uniform is u = (w >> 8) · 2⁻²⁴ in [0, 1), 24 random bits (exact in
//     float32), and the value is a + float32((b-a)·u), two float32
//     roundings (it can round up to b when b-a is not a power of two
//     times u's grid, as torch's uniform_ can);
//   - a Bernoulli draw is 1 when u < a, else 0;
//   - a normal draw takes the block's words in pairs (out[0], out[1]) for
//     elements 4j and 4j+1 and (out[2], out[3]) for 4j+2 and 4j+3: with
//     u1 = ((first >> 8) + 1) · 2⁻²⁴ in (0, 1] and u2 = (second >> 8) ·
//     2⁻²⁴, r = √(-2 ln u1), θ = 2π·u2, the first element takes r·cos θ
//     and the second r·sin θ (Box–Muller), computed in float64, and the
//     value is float32(a + b·z) rounded once.
//
// Random's seed and offset are host values: a CUDA graph captured around a
// draw freezes the (seed, offset) of the capture, so a replayed graph
// repeats the same numbers. RandomStateBackend keeps them in device memory
// instead.
type Random interface {
	// Random fills dst (float32) with draws of dist. Element i uses the
	// Philox counter (offset + i/4) under key seed and takes output word
	// i%4 of that block; the caller advances offset by (dst.Len+3)/4 for
	// the next draw.
	Random(dst Buffer, dist Distribution, seed, offset uint64, a, b float32)
}

// RandomStateBackend is implemented by backends that can read a draw's seed
// and offset from device memory and advance the offset there, so that a
// captured CUDA graph replays fresh numbers on every launch (the CPU and
// CUDA backends).
type RandomStateBackend interface {
	// RandomAt is Random with (seed, offset) read from state, an int32
	// buffer of four words (seed low, seed high, offset low, offset high
	// 32 bits); after the draw it adds (dst.Len+3)/4 to the offset in
	// state. The values are those of Random at the same seed and offset.
	RandomAt(dst Buffer, dist Distribution, state Buffer, a, b float32)
}

// DropoutBackend is implemented by backends that draw dropout's mask and
// apply it in one pass (read x, write y and the mask), instead of a draw,
// a scaling of the mask and a product.
type DropoutBackend interface {
	// Dropout sets mask[i] to scale where Random's Bernoulli draw of
	// probability keep at (seed, offset) is 1 and to 0 elsewhere, and
	// y[i] = x[i]·mask[i]: bit for bit Random, then mask·scale, then x·mask.
	// The caller advances offset by (len+3)/4, as for Random.
	Dropout(y, mask, x Buffer, seed, offset uint64, keep, scale float32)
	// DropoutAt is Dropout with (seed, offset) read from state and the
	// offset advanced there, as RandomAt.
	DropoutAt(y, mask, x Buffer, state Buffer, keep, scale float32)
}

// DropoutRedrawBackend is implemented by backends that apply dropout
// without writing its mask, so that Dropout keeps sixteen bytes for its
// backward pass (where the draw was) instead of a float32 mask the size
// of its input: the backward pass draws the same mask again (Philox is
// counter-based) and applies it to the gradient.
type DropoutRedrawBackend interface {
	DropoutBackend
	// DropoutRedraw sets y[i] = x[i]·mask[i] for the mask Dropout draws
	// at (seed, offset), bit for bit Dropout's y; it writes no mask and
	// advances nothing.
	DropoutRedraw(y, x Buffer, seed, offset uint64, keep, scale float32)
	// DropoutRedrawAt is DropoutRedraw with (seed, offset) read from
	// saved (four int32 words, as a device generator's state), which it
	// does not advance.
	DropoutRedrawAt(y, x Buffer, saved Buffer, keep, scale float32)
	// TakeRandomState copies the four words of a device generator's state
	// into saved and then advances state's offset by blocks (ordered on
	// the stream, so capturable): saved holds one draw for its forward
	// and backward passes.
	TakeRandomState(saved, state Buffer, blocks uint64)
}

// DropoutAddBackend is implemented by backends whose redrawn dropout can
// add a residual in the same pass: DropoutAdd, a transformer's r +
// dropout(x), is then one pass each way instead of a dropout and an
// addition.
type DropoutAddBackend interface {
	DropoutRedrawBackend
	// DropoutRedrawAdd sets y[i] = r[i] + x[i]·mask[i] for DropoutRedraw's
	// mask: the rounded product, then the rounded sum, the bits of
	// DropoutRedraw followed by Add.
	DropoutRedrawAdd(y, x, r Buffer, seed, offset uint64, keep, scale float32)
	// DropoutRedrawAddAt is DropoutRedrawAdd at saved's seed and offset.
	DropoutRedrawAddAt(y, x, r Buffer, saved Buffer, keep, scale float32)
}
