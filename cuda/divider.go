package cuda

import "math/bits"

// divider is the multiplier and shift with which a kernel divides an index
// n < 2^31 by d: q = (umulhi(n, mul) + n) >> shift (ember_divide in
// common.cu; Granlund and Montgomery, "Division by invariant integers using
// multiplication", 1994). shift = ⌈log2 d⌉ and mul = ⌊2^32·(2^shift -
// d)/d⌋ + 1, which fits 32 bits for d < 2^31.
type divider struct{ mul, shift uint32 }

func newDivider(d int) divider {
	shift := uint32(bits.Len32(uint32(d - 1)))
	mul := ((uint64(1)<<shift-uint64(d))<<32)/uint64(d) + 1
	return divider{mul: uint32(mul), shift: shift}
}

// div is ember_divide on the host (the tests check it against /).
func (v divider) div(n uint32) uint32 {
	return uint32((uint64(n)*uint64(v.mul))>>32+uint64(n)) >> v.shift
}

// dividerArgs is the kernel arguments (mul, shift as int32, one pair per
// divisor) of ember_divide by each of ds.
func dividerArgs(ds ...int) []any {
	args := make([]any, 0, 2*len(ds))
	for _, d := range ds {
		v := newDivider(d)
		args = append(args, int32(v.mul), int32(v.shift))
	}
	return args
}
