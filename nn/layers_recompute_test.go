package nn_test

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// A Sequential of Recompute-wrapped blocks, and one run in two Segments,
// have the plain model's state dict names, and train to the same bits
// (batch norm's running statistics included; dropout drawn on the device),
// through Forward and through the fused CrossEntropyLoss.
func TestRecomputeModuleMatchesPlain(t *testing.T) {
	build := func(wrap bool, segments int) (*nn.Sequential, *tensor.DeviceGenerator) {
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
		m.Segments = segments
		dev := tensor.NewDeviceGenerator(b, 11)
		nn.SetRandomSource(m, dev)
		return m, dev
	}
	for _, c := range []struct {
		name     string
		wrap     bool
		segments int
		fused    bool
	}{{"blocks", true, 0, false}, {"segments", false, 2, false}, {"segments, fused loss", false, 3, true}} {
		t.Run(c.name, func(t *testing.T) {
			plain, pdev := build(false, 0)
			re, rdev := build(c.wrap, c.segments)
			defer pdev.Release()
			defer rdev.Release()
			compareTraining(t, plain, re, c.fused)
		})
	}
}

// compareTraining trains plain and re for two steps on the same batch and
// fails unless their state dict names, losses, gradients and buffers agree
// bit for bit.
func compareTraining(t *testing.T, plain, re *nn.Sequential, fused bool) {
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
			in, labels := tensor.FromFloat32(tensor.CPU, s, x, 2, 4, 5, 5), tensor.FromInt32(tensor.CPU, s, []int32{0, 2}, 2)
			var loss *tensor.Tensor
			if fused {
				loss = m.CrossEntropyLoss(in, labels)
			} else {
				loss = tensor.CrossEntropyLoss(m.Forward(in), labels, tensor.CrossEntropyOptions{})
			}
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

// deepMLP is 8 Linear+ReLU layers of 64 features on c, in segments.
func deepMLP(c tensor.Backend, segments int) *nn.Sequential {
	rng := rand.New(rand.NewPCG(3, 4))
	var layers []nn.Module
	for range 8 {
		layers = append(layers, nn.NewLinear(c, rng, 64, 64), nn.ReLU{})
	}
	m := nn.NewSequential(layers...)
	m.Segments = segments
	return m
}

// Segments keeps the groups' inputs and outputs only: a deep MLP run in
// four segments holds less after its forward pass, and its gradients
// are the plain run's.
func TestSequentialSegmentsMemory(t *testing.T) {
	run := func(segments int) (live int, grad []float32) {
		c := tensor.NewCountingCPU()
		m := deepMLP(c, segments)
		defer func() {
			for _, p := range nn.StateTensors(m) {
				p.Tensor.Release()
				if g := p.Tensor.Grad(); g != nil {
					g.Release()
				}
			}
		}()
		s := tensor.NewScope()
		s.SetReleaseInBackward(true)
		defer s.Release()
		start := c.Live()
		y := m.Forward(tensor.Full(c, s, 0.5, 32, 64))
		live = c.Live() - start
		tensor.Sum(y).Backward()
		return live, nn.Parameters(m)[0].Tensor.Grad().Float32s()
	}
	plainLive, plainGrad := run(0)
	segLive, segGrad := run(4)
	for i := range plainGrad {
		if math.Float32bits(plainGrad[i]) != math.Float32bits(segGrad[i]) {
			t.Fatalf("gradient element %d: %v in segments, %v without", i, segGrad[i], plainGrad[i])
		}
	}
	t.Logf("after the forward pass: %d B plain, %d B in four segments", plainLive, segLive)
	// Plain: the eight ReLUs' outputs and the result (each Linear's
	// output goes back once its ReLU has run, tensor.ReleaseInput: a
	// ReLU's backward reads its output, not its input); in segments, the
	// three boundaries and the last group's.
	const act = 32 * 64 * 4
	if plainLive > 9*act || segLive > 6*act {
		t.Errorf("after the forward pass %d B in four segments, %d B without: want at most 6 and 9 activations of %d B", segLive, plainLive, act)
	}
}

// In evaluation (a no-grad scope that releases early) a Sequential in
// Segments gives each layer's input back as it goes, as a plain one does.
func TestSequentialSegmentsEvaluation(t *testing.T) {
	run := func(segments int) int {
		c := tensor.NewCountingCPU()
		m := deepMLP(c, segments)
		s := tensor.NewNoGradScope()
		s.SetReleaseInBackward(true)
		defer s.Release()
		start := c.Live()
		m.Forward(tensor.Full(c, s, 0.5, 32, 64))
		return c.Live() - start
	}
	plain, seg := run(0), run(4)
	if seg > plain {
		t.Errorf("evaluation holds %d B after the forward pass in 4 segments, %d B plain", seg, plain)
	}
}

// A Residual in evaluation (a no-grad scope that releases early) gives its
// block's activations back as it goes, fused or not: after the forward
// pass only the input and the output are left.
func TestResidualEvaluationGivesActivationsBack(t *testing.T) {
	for _, unfused := range []bool{false, true} {
		c := tensor.NewCountingCPU()
		rng := rand.New(rand.NewPCG(5, 6))
		r := nn.NewResidual(nn.NewSequential(nn.NewLinear(c, rng, 32, 32), nn.ReLU{}, nn.NewLinear(c, rng, 32, 32), nn.ReLU{}))
		r.Unfused = unfused
		s := tensor.NewNoGradScope()
		s.SetReleaseInBackward(true)
		start := c.Live()
		x := tensor.Full(c, s, 0.5, 16, 32)
		y := r.Forward(x)
		if left, want := c.Live()-start, 4*(x.Len()+y.Len()); left > want {
			t.Errorf("unfused %v: %d B left after the forward pass; want the input and the output, %d B", unfused, left, want)
		}
		s.Release()
	}
}

// RecomputeBlocks finds transformer blocks outside a Sequential too (a
// user's struct holding a slice of them), sets each once, and the
// recomputed stack gives the plain one's gradients.
func TestRecomputeBlocksInASlice(t *testing.T) {
	type stack struct{ Blocks []*nn.TransformerBlock }
	build := func() *stack {
		rng := rand.New(rand.NewPCG(8, 9))
		return &stack{Blocks: []*nn.TransformerBlock{nn.NewTransformerBlock(tensor.CPU, rng, 16, 2, 0), nn.NewTransformerBlock(tensor.CPU, rng, 16, 2, 0)}}
	}
	grads := func(m *stack) []float32 {
		s := tensor.NewScope()
		s.SetReleaseInBackward(true)
		defer s.Release()
		x := tensor.Full(tensor.CPU, s, 0.25, 2, 5, 16)
		for _, b := range m.Blocks {
			x = b.Forward(x)
		}
		tensor.Sum(tensor.Mul(x, x)).Backward()
		return nn.Parameters(m)[0].Tensor.Grad().Float32s()
	}
	plain, re := build(), build()
	if n := nn.RecomputeBlocks(re); n != 2 || !re.Blocks[0].Recompute || !re.Blocks[1].Recompute {
		t.Fatalf("RecomputeBlocks set %d blocks; want both", n)
	}
	if n := nn.RecomputeBlocks(re); n != 0 {
		t.Errorf("RecomputeBlocks set %d blocks the second time; want 0", n)
	}
	want, got := grads(plain), grads(re)
	for i := range want {
		if math.Float32bits(want[i]) != math.Float32bits(got[i]) {
			t.Fatalf("gradient element %d: %v recomputed, %v plain", i, got[i], want[i])
		}
	}
}

// FusionPlan shows Segments' groups: no fused group spans two of them.
func TestSequentialSegmentsFusionPlan(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	m := nn.NewSequential(nn.NewLinear(tensor.CPU, rng, 4, 4), nn.ReLU{}, nn.NewLinear(tensor.CPU, rng, 4, 4), nn.ReLU{})
	for _, c := range []struct {
		segments int
		want     []string
	}{
		{0, []string{"0+1 (linear+relu)", "2+3 (linear+relu)"}},
		{2, []string{"0+1 (linear+relu)", "2+3 (linear+relu)"}},
		{3, []string{"0", "1", "2+3 (linear+relu)"}},
	} {
		m.Segments = c.segments
		if got := m.FusionPlan(); !slices.Equal(got, c.want) {
			t.Errorf("Segments %d: FusionPlan %q; want %q", c.segments, got, c.want)
		}
	}
}

// Models this package's zoo does not have: a CNN of nn.Residual blocks
// (convolution, batch norm, GELU, dropout) recomputed by RecomputeBlocks,
// and a U-Net-like network whose decoder block reads the encoder's
// feature map through a skip connection, recomputed by tensor.Recompute
// with two inputs and a Concat. Each trains to the plain one's gradients
// and running statistics, bit for bit, and holds less after its forward
// pass.
func TestRecomputeOtherModels(t *testing.T) {
	conv := func(c tensor.Backend, rng *rand.Rand, in, out int) *nn.Conv2d {
		return nn.NewConv2dWith(c, rng, in, out, nn.Conv2dOptions{Kernel: [2]int{3, 3}, Padding: [2]int{1, 1}})
	}
	type unet struct {
		Enc1, Enc2, Dec *nn.Sequential
		Head            *nn.Linear
	}
	cases := []struct {
		name  string
		build func(c tensor.Backend, recompute bool) (m any, loss func(s *tensor.Scope) *tensor.Tensor)
	}{
		{"residual CNN", func(c tensor.Backend, recompute bool) (any, func(*tensor.Scope) *tensor.Tensor) {
			rng := rand.New(rand.NewPCG(4, 4))
			res := func() nn.Module {
				return nn.NewResidual(nn.NewSequential(conv(c, rng, 8, 8), nn.NewBatchNorm2d(c, 8), nn.GELU{}, nn.NewDropout(0.1), conv(c, rng, 8, 8), nn.GELU{}))
			}
			m := nn.NewSequential(conv(c, rng, 3, 8), res(), nn.NewMaxPool2d(2), res(), nn.Flatten{}, nn.NewLinear(c, rng, 8*4*4, 5))
			dev := tensor.NewDeviceGenerator(c, 3)
			nn.SetRandomSource(m, dev)
			if recompute && nn.RecomputeBlocks(m) != 2 {
				t.Fatal("RecomputeBlocks did not wrap the two residual blocks")
			}
			return m, func(s *tensor.Scope) *tensor.Tensor {
				x := tensor.Full(c, s, 0.3, 4, 3, 8, 8)
				return m.CrossEntropyLoss(x, tensor.FromInt32(c, s, []int32{0, 1, 2, 4}, 4))
			}
		}},
		{"U-Net skip", func(c tensor.Backend, recompute bool) (any, func(*tensor.Scope) *tensor.Tensor) {
			rng := rand.New(rand.NewPCG(5, 5))
			m := &unet{
				Enc1: nn.NewSequential(conv(c, rng, 3, 8), nn.NewBatchNorm2d(c, 8), nn.ReLU{}),
				Enc2: nn.NewSequential(conv(c, rng, 8, 8), nn.NewBatchNorm2d(c, 8), nn.ReLU{}),
				Dec:  nn.NewSequential(conv(c, rng, 16, 8), nn.ReLU{}),
				Head: nn.NewLinear(c, rng, 8*8*8, 3),
			}
			run := func(f func(in ...*tensor.Tensor) *tensor.Tensor, in ...*tensor.Tensor) *tensor.Tensor {
				if recompute {
					return tensor.Recompute(f, in...)
				}
				return f(in...)
			}
			return m, func(s *tensor.Scope) *tensor.Tensor {
				x := tensor.Full(c, s, 0.3, 2, 3, 8, 8)
				e1 := m.Enc1.Forward(x)
				e2 := run(func(in ...*tensor.Tensor) *tensor.Tensor { return m.Enc2.Forward(in[0]) }, e1)
				d := run(func(in ...*tensor.Tensor) *tensor.Tensor { return m.Dec.Forward(tensor.Concat(1, in[0], in[1])) }, e2, e1)
				return nn.CrossEntropyLoss(m.Head.Forward(d.Reshape(2, 8*8*8)), tensor.FromInt32(c, s, []int32{1, 2}, 2))
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var state [2][][]float32
			var held [2]int
			for i, recompute := range []bool{false, true} {
				c := tensor.NewCountingCPU()
				m, loss := tc.build(c, recompute)
				for step := range 2 {
					s := tensor.NewScope()
					s.SetReleaseInBackward(true)
					start := c.Live()
					l := loss(s)
					if step == 1 {
						held[i] = c.Live() - start
					}
					l.Backward()
					s.Release()
				}
				for _, p := range nn.StateTensors(m) {
					v := p.Tensor.Float32s()
					if g := p.Tensor.Grad(); g != nil {
						v = append(v, g.Float32s()...)
					}
					state[i] = append(state[i], v)
				}
			}
			for k := range state[0] {
				for j := range state[0][k] {
					if math.Float32bits(state[0][k][j]) != math.Float32bits(state[1][k][j]) {
						t.Fatalf("state tensor %d element %d: %v recomputed, %v plain", k, j, state[1][k][j], state[0][k][j])
					}
				}
			}
			t.Logf("after the forward pass: %d B plain, %d B recomputed", held[0], held[1])
			if held[1] >= held[0] {
				t.Errorf("after the forward pass %d B recomputed, %d B plain: want less", held[1], held[0])
			}
		})
	}
}
