package nn_test

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// A Sequential of Recompute-wrapped blocks has the plain model's state
// dict names, and trains to the same bits (batch norm's running
// statistics included), with and without dropout's generator on the
// device.
func TestRecomputeModuleMatchesPlain(t *testing.T) {
	build := func(wrap bool) (*nn.Sequential, *tensor.DeviceGenerator) {
		b := tensor.CPU
		rng := rand.New(rand.NewPCG(1, 2))
		block := func() nn.Module {
			return nn.NewSequential(
				nn.NewConv2dWith(b, rng, 4, 4, nn.Conv2dOptions{Kernel: [2]int{3, 3}, Padding: [2]int{1, 1}}),
				nn.NewBatchNorm2d(b, 4),
				nn.ReLU{},
				nn.NewDropout(0.3),
			)
		}
		blocks := []nn.Module{block(), block()}
		if wrap {
			for i, m := range blocks {
				blocks[i] = nn.NewRecompute(m)
			}
		}
		m := nn.NewSequential(append(blocks, nn.Flatten{}, nn.NewLinear(b, rng, 4*5*5, 3))...)
		dev := tensor.NewDeviceGenerator(b, 11)
		nn.SetRandomSource(m, dev)
		return m, dev
	}
	plain, pdev := build(false)
	re, rdev := build(true)
	defer pdev.Release()
	defer rdev.Release()
	var names [2][]string
	for i, m := range []*nn.Sequential{plain, re} {
		for _, p := range nn.StateTensors(m) {
			names[i] = append(names[i], p.Name)
		}
	}
	if !slices.Equal(names[0], names[1]) {
		t.Fatalf("state dict names with Recompute %v; want %v", names[1], names[0])
	}
	x := make([]float32, 2*4*5*5)
	for i := range x {
		x[i] = float32(math.Sin(float64(i)))
	}
	for step := range 2 {
		var losses [2]float32
		for i, m := range []*nn.Sequential{plain, re} {
			s := tensor.NewScope()
			s.SetReleaseInBackward(true)
			loss := tensor.CrossEntropyLoss(m.Forward(tensor.FromFloat32(tensor.CPU, s, x, 2, 4, 5, 5)),
				tensor.FromInt32(tensor.CPU, s, []int32{0, 2}, 2), tensor.CrossEntropyOptions{})
			loss.Backward()
			losses[i] = loss.Item()
			s.Release()
		}
		if losses[0] != losses[1] {
			t.Fatalf("step %d: loss %v with Recompute, %v without", step, losses[1], losses[0])
		}
	}
	ps, rs := nn.StateTensors(plain), nn.StateTensors(re)
	for i := range ps {
		want, got := ps[i].Tensor.Float32s(), rs[i].Tensor.Float32s()
		if g := ps[i].Tensor.Grad(); g != nil {
			want, got = g.Float32s(), rs[i].Tensor.Grad().Float32s()
		}
		for j := range want {
			if math.Float32bits(want[j]) != math.Float32bits(got[j]) {
				t.Fatalf("%s element %d: %v with Recompute, %v without", ps[i].Name, j, got[j], want[j])
			}
		}
	}
}
