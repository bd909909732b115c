package cuda

import (
	"math/rand/v2"
	"testing"
)

// TestDivider checks the kernels' division by multiplication (the same
// arithmetic as ember_divide) against integer division, for divisors
// near powers of two and random ones, and numerators at the ends of the
// range and random.
func TestDivider(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	divisors := []int{1, 2, 3, 5, 7, 49, 64, 196, 784, 1<<31 - 1}
	for p := 1; p < 31; p++ {
		divisors = append(divisors, 1<<p-1, 1<<p, 1<<p+1)
	}
	for range 200 {
		divisors = append(divisors, 1+rng.IntN(1<<31-1))
	}
	for _, d := range divisors {
		v := newDivider(d)
		nums := []uint32{0, 1, uint32(d - 1), uint32(d), uint32(d + 1), 1<<31 - 1, 1<<31 - 2, uint32(2*d - 1)}
		for range 2000 {
			nums = append(nums, uint32(rng.IntN(1<<31)))
		}
		for _, n := range nums {
			if n >= 1<<31 {
				continue
			}
			if got, want := v.div(n), n/uint32(d); got != want {
				t.Fatalf("divider %d (mul %d, shift %d): %d / %d = %d, want %d", d, v.mul, v.shift, n, d, got, want)
			}
		}
	}
}
