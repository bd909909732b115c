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
type Random interface {
	// Random fills dst (float32) with draws of dist. Element i uses the
	// Philox counter (offset + i/4) under key seed and takes output word
	// i%4 of that block; the caller advances offset by (dst.Len+3)/4 for
	// the next draw.
	Random(dst Buffer, dist Distribution, seed, offset uint64, a, b float32)
}
