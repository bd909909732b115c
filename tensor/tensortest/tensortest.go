// Package tensortest is the conformance suite that every tensor.Backend must
// pass. RunBackend checks each Backend operation against naive float64
// reference implementations written here (plain loops, independent of the
// CPU backend); RunAutograd checks the tensor-level operations forward and
// backward. (Whole-model checks, such as LeNet's training curve, are in
// models/modelstest: this suite depends on the tensor package alone.)
//
// CoreOnly(b) hides every optional interface of b, so that the same suites
// check the fallbacks composed from the core: RunComplete the operations of
// tensor.CompleteBackend, RunAutograd the tensor layer's.
//
// Every run draws fresh random inputs from a seed taken from the clock and
// printed with every failure. Set TENSORTEST_SEED=<seed> to replay a run.
//
// Every buffer handed to the backend is a window of a larger allocation,
// starting a few (random, mostly unaligned) elements in, with guard elements
// on both sides: the suite checks that no operation writes outside its
// outputs (guards and input windows are verified after each case), that Off
// is honoured, and that outputs documented as overwritten are not read (they
// are filled with NaN first).
package tensortest

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"os"
	"runtime/debug"
	"strconv"
	"testing"
	"time"

	"github.com/ember-ml/ember/tensor"
)

const seedEnv = "TENSORTEST_SEED"

// baseSeed returns the seed of this run: TENSORTEST_SEED when set, else the
// clock.
func baseSeed(t *testing.T) uint64 {
	t.Helper()
	if s := os.Getenv(seedEnv); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("tensortest: bad %s=%q: %v", seedEnv, s, err)
		}
		return v
	}
	return uint64(time.Now().UnixNano())
}

func hashName(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

// Values written into the guard elements around every window.
const (
	guardF32 = float32(-12345.678)
	guardI32 = int32(-777777)
	guardU8  = uint8(0xA5)
	// guardBF16 is a bfloat16 pattern no cast produces: a NaN other than
	// the canonical 0x7FC0.
	guardBF16 = uint16(0x7FA5)
)

// env is the state of one subtest: the backend, a random generator derived
// from the run's seed and the subtest name, the buffers of the current case.
type env struct {
	t    *testing.T
	b    tensor.Backend
	seed uint64
	rng  *rand.Rand
	op   string // the subtest (operation) name
	ctx  string // the current case (sizes, flags)
	live []*dbuf
	// aligned16 puts every buffer alloc makes 16-byte aligned, as a
	// tensor's memory is, for the cases of a kernel with a four-at-a-time
	// path (alignedOdd).
	aligned16 bool
}

// alignedOdd makes the current case's buffers 16-byte aligned when n is
// odd (the four-at-a-time path of a device, and its tail), anywhere
// otherwise; tcase resets it after the case.
func (e *env) alignedOdd(n int) { e.aligned16 = n%2 == 1 }

// subtest runs body as subtest name of t with its own env. A panic (a
// backend crash, an index out of range) is reported as a failure of the
// subtest with the seed, and the remaining subtests still run.
func subtest(t *testing.T, b tensor.Backend, seed uint64, name string, body func(e *env)) {
	t.Run(name, func(t *testing.T) {
		e := &env{t: t, b: b, seed: seed, rng: rand.New(rand.NewPCG(seed, hashName(name))), op: name}
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("%s [%s]: panic: %v (seed %d; rerun with %s=%d)\n%s", e.op, e.ctx, r, e.seed, seedEnv, e.seed, debug.Stack())
			}
			e.freeAll()
			if err := b.Synchronize(); err != nil {
				t.Errorf("%s: Synchronize after the subtest: %v (seed %d)", name, err, seed)
			}
		}()
		body(e)
	})
}

// fail reports a failure of the current case with the op, the case and the
// seed to replay it.
func (e *env) fail(format string, args ...any) {
	e.t.Helper()
	e.t.Errorf("%s [%s]: %s (seed %d; rerun with %s=%d)", e.op, e.ctx, fmt.Sprintf(format, args...), e.seed, seedEnv, e.seed)
}

// tcase runs one case: it names it (for failure messages), runs it, then
// checks the guards and unchanged inputs of every buffer the case made and
// frees them.
func (e *env) tcase(format string, args ...any) func(func()) {
	return func(body func()) {
		e.ctx = fmt.Sprintf(format, args...)
		body()
		e.verify()
		e.freeAll()
		e.ctx, e.aligned16 = "", false
	}
}

// dbuf is a window of a device allocation with guards on both sides.
type dbuf struct {
	name      string
	raw, win  tensor.Buffer
	pre, post int
	host      any  // the window's contents as uploaded
	konst     bool // an input: its window must be unchanged after the op
}

func (e *env) alloc(name string, n int, dt tensor.DType) *dbuf {
	pre := 1 + e.rng.IntN(7)
	if e.aligned16 {
		pre = 4
	}
	return e.allocPre(name, n, dt, pre)
}

// allocPre is alloc with the window pre elements into its allocation:
// a multiple of 4 keeps a float32 window 16-byte aligned, as a tensor's
// memory is, for kernels with a vector path.
func (e *env) allocPre(name string, n int, dt tensor.DType, pre int) *dbuf {
	post := 1 + e.rng.IntN(7)
	raw, err := e.b.Alloc(pre+n+post, dt)
	if err != nil {
		e.t.Fatalf("%s [%s]: Alloc(%d, %v): %v", e.op, e.ctx, pre+n+post, dt, err)
	}
	if raw.Len != pre+n+post || raw.DType != dt {
		e.t.Fatalf("%s: Alloc(%d, %v) returned a buffer of %d %v", e.op, pre+n+post, dt, raw.Len, raw.DType)
	}
	d := &dbuf{name: name, raw: raw, win: raw.Slice(pre, n), pre: pre, post: post}
	e.live = append(e.live, d)
	return d
}

// f32 puts data on the device; konst marks an input.
func (e *env) f32(name string, data []float32, konst bool) *dbuf {
	pre := 1 + e.rng.IntN(7)
	if e.aligned16 {
		pre = 4
	}
	return e.f32Pre(name, data, konst, pre)
}

// f32Pre is f32 with the window pre elements into its allocation.
func (e *env) f32Pre(name string, data []float32, konst bool, pre int) *dbuf {
	d := e.allocPre(name, len(data), tensor.Float32, pre)
	all := make([]float32, d.raw.Len)
	for i := range all {
		all[i] = guardF32
	}
	copy(all[d.pre:], data)
	e.b.Upload(d.raw, all)
	d.host, d.konst = append([]float32(nil), data...), konst
	return d
}

func (e *env) in(name string, data []float32) tensor.Buffer { return e.f32(name, data, true).win }

// nanOut is an output of n elements filled with NaN, for operations that
// must overwrite (not read) their output.
func (e *env) nanOut(name string, n int) *dbuf {
	return e.f32(name, fill(n, float32(math.NaN())), false)
}

func (e *env) i32(name string, data []int32, konst bool) *dbuf {
	d := e.alloc(name, len(data), tensor.Int32)
	all := make([]int32, d.raw.Len)
	for i := range all {
		all[i] = guardI32
	}
	copy(all[d.pre:], data)
	e.b.Upload(d.raw, all)
	d.host, d.konst = append([]int32(nil), data...), konst
	return d
}

func (e *env) u8(name string, data []uint8, konst bool) *dbuf {
	d := e.alloc(name, len(data), tensor.Uint8)
	all := make([]uint8, d.raw.Len)
	for i := range all {
		all[i] = guardU8
	}
	copy(all[d.pre:], data)
	e.b.Upload(d.raw, all)
	d.host, d.konst = append([]uint8(nil), data...), konst
	return d
}

// bf16 puts bfloat16 bit patterns on the device; konst marks an input.
func (e *env) bf16(name string, data []uint16, konst bool) *dbuf {
	d := e.alloc(name, len(data), tensor.BFloat16)
	all := make([]uint16, d.raw.Len)
	for i := range all {
		all[i] = guardBF16
	}
	copy(all[d.pre:], data)
	e.b.Upload(d.raw, all)
	d.host, d.konst = append([]uint16(nil), data...), konst
	return d
}

func (e *env) getH(d *dbuf) []uint16 {
	out := make([]uint16, d.win.Len)
	e.b.Download(out, d.win)
	return out
}

func (e *env) getF(d *dbuf) []float32 {
	out := make([]float32, d.win.Len)
	e.b.Download(out, d.win)
	return out
}

func (e *env) getI(d *dbuf) []int32 {
	out := make([]int32, d.win.Len)
	e.b.Download(out, d.win)
	return out
}

// verify checks the guards of every live buffer and that inputs are
// unchanged.
func (e *env) verify() {
	e.t.Helper()
	for _, d := range e.live {
		switch d.raw.DType {
		case tensor.Float32:
			// Bits, not values: a NaN guard must stay that very NaN.
			verifyBuffer(e, d, guardF32, func(v float32) uint32 { return math.Float32bits(v) })
		case tensor.Int32:
			verifyBuffer(e, d, guardI32, func(v int32) int32 { return v })
		case tensor.Uint8:
			verifyBuffer(e, d, guardU8, func(v uint8) uint8 { return v })
		case tensor.BFloat16:
			verifyBuffer(e, d, guardBF16, func(v uint16) uint16 { return v })
		}
	}
}

// verifyBuffer downloads all of d (window and guards) and checks that the
// guard elements still hold guard and, for an input, that the window still
// holds what was uploaded; key gives the value compared.
func verifyBuffer[T any, K comparable](e *env, d *dbuf, guard T, key func(T) K) {
	e.t.Helper()
	n := d.raw.Len
	all := make([]T, n)
	e.b.Download(all, d.raw)
	for i, v := range all {
		if (i < d.pre || i >= n-d.post) && key(v) != key(guard) {
			e.fail("buffer %s: element %d outside the window [%d,%d) was overwritten with %v", d.name, i-d.pre, 0, d.win.Len, v)
			break
		}
	}
	if d.konst {
		want := d.host.([]T)
		for i, v := range all[d.pre : n-d.post] {
			if key(v) != key(want[i]) {
				e.fail("input %s was modified: element %d is %v, was %v", d.name, i, v, want[i])
				break
			}
		}
	}
}

func (e *env) freeAll() {
	for _, d := range e.live {
		e.b.Free(d.raw)
	}
	e.live = nil
}

// ---------------------------------------------------------------------------
// Comparison.

// unravel turns a flat index into a multi-index of shape, for messages.
func unravel(i int, shape []int) string {
	if len(shape) == 0 {
		return strconv.Itoa(i)
	}
	idx := make([]int, len(shape))
	r := i
	for k := len(shape) - 1; k >= 0; k-- {
		if shape[k] > 0 {
			idx[k] = r % shape[k]
			r /= shape[k]
		}
	}
	return fmt.Sprintf("%d %v", i, idx)
}

// near checks |got[i] - want[i]| <= tol*bound[i] for every i, where bound
// nil means |want[i]| (a relative test). A NaN or an infinity that is not
// wanted always fails. On failure it reports how many elements fail and the
// worst one (largest error relative to what is allowed).
func (e *env) near(what string, shape []int, got []float32, want, bound []float64, tol float64) {
	e.t.Helper()
	if len(got) != len(want) {
		e.fail("%s: got %d values, want %d", what, len(got), len(want))
		return
	}
	worst, worstR, bad := -1, -1.0, 0
	for i := range want {
		g := float64(got[i])
		var err float64
		switch {
		case g == want[i]:
			err = 0
		case math.IsNaN(g) || math.IsInf(g, 0):
			err = math.Inf(1)
		default:
			err = math.Abs(g - want[i])
		}
		b := math.Abs(want[i])
		if bound != nil {
			b = bound[i]
		}
		allowed := tol * b
		r := 0.0
		if err > 0 {
			r = err / allowed // +Inf when nothing is allowed
		}
		if err > allowed {
			bad++
		}
		if r > worstR {
			worst, worstR = i, r
		}
	}
	if bad > 0 {
		b := math.Abs(want[worst])
		if bound != nil {
			b = bound[worst]
		}
		e.fail("%s %v: %d of %d elements out of tolerance; worst at index %s: got %.9g, want %.9g (|err| %.3g, allowed %.3g = tol %.0e x bound %.3g)",
			what, shape, bad, len(want), unravel(worst, shape), got[worst], want[worst], math.Abs(float64(got[worst])-want[worst]), tol*b, tol, b)
	}
}

// exactF requires bitwise-equal float32 values (copies, fills, gathers).
func (e *env) exactF(what string, shape []int, got, want []float32) {
	e.t.Helper()
	if len(got) != len(want) {
		e.fail("%s: got %d values, want %d", what, len(got), len(want))
		return
	}
	bad, first := 0, -1
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			if first < 0 {
				first = i
			}
			bad++
		}
	}
	if bad > 0 {
		e.fail("%s %v: %d of %d elements differ (exact test); first at index %s: got %.9g (%#08x), want %.9g (%#08x)",
			what, shape, bad, len(want), unravel(first, shape), got[first], math.Float32bits(got[first]), want[first], math.Float32bits(want[first]))
	}
}

// exactI requires equal integers (indices, labels, bytes).
func exactI[T int32 | uint8 | uint16](e *env, what string, shape []int, got, want []T) {
	e.t.Helper()
	if len(got) != len(want) {
		e.fail("%s: got %d values, want %d", what, len(got), len(want))
		return
	}
	bad, first := 0, -1
	for i := range want {
		if got[i] != want[i] {
			if first < 0 {
				first = i
			}
			bad++
		}
	}
	if bad > 0 {
		e.fail("%s %v: %d of %d elements differ (exact test); first at index %s: got %d, want %d",
			what, shape, bad, len(want), unravel(first, shape), got[first], want[first])
	}
}

// ---------------------------------------------------------------------------
// Random data.

// sizes are vector lengths that are not multiples of typical block sizes.
var sizes = []int{1, 7, 33, 257, 1000, 4099, 65537}

func fill(n int, v float32) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = v
	}
	return s
}

// uniform returns n values uniform in [lo, hi).
func (e *env) uniform(n int, lo, hi float64) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(lo + (hi-lo)*e.rng.Float64())
	}
	return s
}

// grid returns n multiples of 1/4 in [-2, 2]: products and sums of them
// are exact in float32 in any order while they stay below 2^20 or so.
func (e *env) grid(n int) []float32 {
	out := make([]float32, n)
	for j := range out {
		out[j] = float32(e.rng.IntN(17)-8) / 4
	}
	return out
}

func (e *env) normal(n int, std float64) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(e.rng.NormFloat64() * std)
	}
	return s
}

// distinct returns n distinct values in about [-1, 1] in random order, at
// least 1/n apart, so that maxima are unique.
func (e *env) distinct(n int) []float32 {
	s := make([]float32, n)
	for i, p := range e.rng.Perm(n) {
		s[i] = float32(2*(float64(p)+0.5)/float64(n) - 1)
	}
	return s
}

func (e *env) labels(n, classes int) []int32 {
	s := make([]int32, n)
	for i := range s {
		s[i] = int32(e.rng.IntN(classes))
	}
	return s
}

func f64(s []float32) []float64 {
	out := make([]float64, len(s))
	for i, v := range s {
		out[i] = float64(v)
	}
	return out
}

func dims(d ...int) []int { return d }

func sizeStr(n int) string { return "n=" + strconv.Itoa(n) }
