//go:build race

package alloc

// allocRaceEnabled shortens the long allocator tests, which the race
// detector slows down about tenfold.
const allocRaceEnabled = true
