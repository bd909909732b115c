package tensor_test

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// TestAugmentGatherAtFollowsState: AugmentGatherAt gives AugmentGather's
// batch at the state's seed and offset, and follows SetAugmentState to the
// next epoch; AugmentNorm is ToTensor then Normalize.
func TestAugmentGatherAtFollowsState(t *testing.T) {
	b, s := tensor.CPU, tensor.NewScope()
	defer s.Release()
	const n = 20
	pix := make([]uint8, n*2*6*5)
	for i := range pix {
		pix[i] = uint8(i * 37)
	}
	images := tensor.FromUint8(b, s, pix, n, 2, 6, 5)
	idx := tensor.FromInt32(b, s, []int32{3, 19, 0, 3}, 4)
	norm := tensor.AugmentNorm(b, s, []float32{0.5, 0.25}, []float32{0.2, 0.4})
	if got, want := norm.Float32s(), []float32{1 / (255 * 0.2), 1 / (255 * 0.4), -0.5 / 0.2, -0.25 / 0.4}; !slices.Equal(got, want) {
		t.Errorf("AugmentNorm = %v, want %v", got, want)
	}
	spec := tensor.AugmentSpec{Pad: 2, FlipProb: 0.5, Cutout: 2, Seed: 99}
	state := tensor.NewAugmentState(b, s, 99, tensor.AugmentOffset(0, n))
	for epoch := range 3 {
		spec.Offset = tensor.AugmentOffset(epoch, n)
		tensor.SetAugmentState(state, 99, spec.Offset)
		want := tensor.AugmentGather(s, images, idx, norm, spec).Float32s()
		got := tensor.AugmentGatherAt(s, images, idx, norm, state, tensor.AugmentSpec{Pad: 2, FlipProb: 0.5, Cutout: 2}).Float32s()
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("epoch %d: element %d is %g, want %g", epoch, i, got[i], want[i])
			}
		}
	}
}

// TestAugmentSpecChecked: a spec no backend can run is refused with the
// field named.
func TestAugmentSpecChecked(t *testing.T) {
	ok := tensor.AugmentSpec{C: 1, H: 4, W: 4}
	if err := ok.Check(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		spec tensor.AugmentSpec
		want string
	}{
		{tensor.AugmentSpec{C: 0, H: 4, W: 4}, "image size"},
		{tensor.AugmentSpec{C: 1, H: 4, W: 4, Pad: 5}, "Pad"},
		{tensor.AugmentSpec{C: 1, H: 4, W: 4, Pad: -1}, "Pad"},
		{tensor.AugmentSpec{C: 1, H: 4, W: 4, FlipProb: 1.5}, "FlipProb"},
		{tensor.AugmentSpec{C: 1, H: 4, W: 4, FlipProb: float32(math.NaN())}, "FlipProb"},
		{tensor.AugmentSpec{C: 1, H: 4, W: 4, Cutout: -2}, "Cutout"},
	} {
		err := c.spec.Check()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want one naming %s", c.spec, err, c.want)
		}
	}
}
