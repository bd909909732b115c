package tensor_test

import (
	"math"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// TestDeviceGeneratorFallback draws from a DeviceGenerator on a backend
// without RandomStateBackend (the host round trip) and from a Generator of
// the same seed, through Dropout and RandN: the same bits, the same offset.
func TestDeviceGeneratorFallback(t *testing.T) {
	plain := plainBackend{tensor.Complete(tensor.CPU)}
	if _, ok := tensor.Backend(plain).(tensor.RandomStateBackend); ok {
		t.Fatal("plainBackend should hide RandomStateBackend")
	}
	s := tensor.NewScope()
	defer s.Release()
	x, xh := tensor.Full(plain, s, 2, 3, 7), tensor.Full(tensor.CPU, s, 2, 3, 7)
	dg := tensor.NewDeviceGenerator(plain, 99)
	defer dg.Release()
	hg := tensor.NewGenerator(99)
	pairs := [][2]*tensor.Tensor{
		{tensor.Dropout(x, 0.4, true, dg), tensor.Dropout(xh, 0.4, true, hg)},
		{tensor.RandN(plain, s, dg, 5), tensor.RandN(tensor.CPU, s, hg, 5)},
	}
	for i, p := range pairs {
		a, b := p[0].Float32s(), p[1].Float32s()
		for j := range a {
			if math.Float32bits(a[j]) != math.Float32bits(b[j]) {
				t.Fatalf("draw %d element %d: device generator %v, generator %v", i, j, a[j], b[j])
			}
		}
	}
	if seed, off := dg.SeedOffset(); seed != 99 || off != hg.Offset() || off != 6+2 {
		t.Errorf("device generator at seed %d offset %d; want 99 and %d (= 8)", seed, off, hg.Offset())
	}
}

// maskOnly hides DropoutRedrawBackend: Dropout keeps its float32 mask.
type maskOnly struct {
	tensor.CompleteBackend
	tensor.DropoutBackend
}

// TestDropoutRedrawKeepsNoMask: on a DropoutRedrawBackend, Dropout keeps
// no mask for its backward pass (measured on CountingCPU after the
// forward pass: the output and at most a 16-byte state, against the
// output and a float32 mask), and its output and gradient are the mask
// path's bit for bit, with either generator, which both paths leave at
// the same offset.
func TestDropoutRedrawKeepsNoMask(t *testing.T) {
	const rows, cols = 33, 67 // an odd count: a partial Philox block
	run := func(redraw, device bool) (held int, out, grad []float32, offset uint64) {
		c := tensor.NewCountingCPU()
		var b tensor.Backend = c
		if !redraw {
			b = maskOnly{tensor.Complete(c), c}
		}
		if _, ok := b.(tensor.DropoutRedrawBackend); ok != redraw {
			t.Fatalf("backend redraws %v, want %v", ok, redraw)
		}
		vals := make([]float32, rows*cols)
		for i := range vals {
			vals[i] = float32(i%13) - 6
		}
		x := tensor.FromFloat32(b, nil, vals, rows, cols).SetRequiresGrad(true)
		wt := tensor.FromFloat32(b, nil, vals, rows, cols)
		var gen tensor.RandomSource = tensor.NewGenerator(5)
		if device {
			dg := tensor.NewDeviceGenerator(b, 5)
			defer dg.Release()
			gen = dg
		}
		s := tensor.NewScope()
		defer s.Release()
		before := c.Live()
		y := tensor.Dropout(tensor.Dropout(x, 0.3, true, gen), 0.5, true, gen)
		held = c.Live() - before
		tensor.Sum(tensor.Mul(y, wt)).Backward()
		switch g := gen.(type) {
		case *tensor.Generator:
			offset = g.Offset()
		case *tensor.DeviceGenerator:
			_, offset = g.SeedOffset()
		}
		return held, y.Float32s(), x.Grad().Float32s(), offset
	}
	for _, device := range []bool{false, true} {
		heldR, outR, gradR, offR := run(true, device)
		heldM, outM, gradM, offM := run(false, device)
		t.Logf("device generator %v: %d bytes held with the redraw, %d with the masks", device, heldR, heldM)
		n := 4 * rows * cols
		if heldR > 2*n+2*16 || heldM < 4*n {
			t.Errorf("device generator %v: %d bytes held with the redraw, %d with the masks; want at most %d and at least %d",
				device, heldR, heldM, 2*n+2*16, 4*n)
		}
		if offR != offM {
			t.Errorf("device generator %v: offset %d with the redraw, %d with the masks", device, offR, offM)
		}
		for i := range outR {
			if math.Float32bits(outR[i]) != math.Float32bits(outM[i]) || math.Float32bits(gradR[i]) != math.Float32bits(gradM[i]) {
				t.Fatalf("device generator %v: element %d: output %v and gradient %v with the redraw, %v and %v with the mask",
					device, i, outR[i], gradR[i], outM[i], gradM[i])
			}
		}
	}
}
