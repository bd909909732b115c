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
