package models_test

import (
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/ember-ml/ember/models"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// recomputeStep is what one training step of a zoo model left on a
// CountingCPU: its loss, its parameters' gradients, and the most bytes
// live above the start during the step.
type recomputeStep struct {
	loss    float32
	grads   [][]float32
	forward int // bytes live above the start after the forward pass
	peak    int
}

// zooMemoryCase builds a zoo model on c (its blocks recomputed when
// recompute) and returns it and the loss of one step in s.
type zooMemoryCase struct {
	name   string
	blocks int // the layers RecomputeBlocks wraps
	build  func(c tensor.Backend, recompute bool) (nn.Module, func(s *tensor.Scope) *tensor.Tensor)
}

func zooMemoryCases(full bool) []zooMemoryCase {
	resnetWidth, imgBatch, gptCfg, gptBatch := 8, 2, models.GPTConfig{Layers: 4, Heads: 2, Channels: 32, Context: 32, Vocab: 11, Dropout: 0.2}, 2
	if full { // the zoo's sizes, a small batch
		resnetWidth, imgBatch, gptCfg, gptBatch = 64, 8, models.DefaultGPTConfig(65), 2
	}
	images := func(c tensor.Backend, s *tensor.Scope, n, ch, side int) *tensor.Tensor {
		rng := rand.New(rand.NewPCG(3, 3))
		v := make([]float32, n*ch*side*side)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		return tensor.FromFloat32(c, s, v, n, ch, side, side)
	}
	labels := func(c tensor.Backend, s *tensor.Scope, n, classes int) *tensor.Tensor {
		y := make([]int32, n)
		for i := range y {
			y[i] = int32(i * 3 % classes)
		}
		return tensor.FromInt32(c, s, y, n)
	}
	wrap := func(m nn.Module, recompute bool) {
		if recompute {
			nn.RecomputeBlocks(m)
		}
	}
	resnet := func(segments int) func(c tensor.Backend, recompute bool) (nn.Module, func(*tensor.Scope) *tensor.Tensor) {
		return func(c tensor.Backend, recompute bool) (nn.Module, func(*tensor.Scope) *tensor.Tensor) {
			cfg := models.DefaultResNet9Config()
			cfg.Width = resnetWidth
			m := models.NewResNet9(c, 1, cfg)
			if segments > 0 && recompute {
				m.Net.Segments = segments
			} else {
				wrap(m, recompute)
			}
			return m, func(s *tensor.Scope) *tensor.Tensor {
				return m.Loss(images(c, s, imgBatch, 1, 28), labels(c, s, imgBatch, 10))
			}
		}
	}
	return []zooMemoryCase{
		{"resnet9", 6, resnet(0)},
		// Its Sequential of 12 layers in three segments
		// (checkpoint_sequential), instead of its blocks one by one.
		{"resnet9, 3 segments", 6, resnet(3)},
		{"airbench", 3, func(c tensor.Backend, recompute bool) (nn.Module, func(*tensor.Scope) *tensor.Tensor) {
			m := models.NewAirbench(c, 1, models.DefaultAirbenchConfig())
			wrap(m, recompute)
			return m, func(s *tensor.Scope) *tensor.Tensor {
				return m.Loss(images(c, s, imgBatch, 3, 32), labels(c, s, imgBatch, 10))
			}
		}},
		{"gpt", gptCfg.Layers, func(c tensor.Backend, recompute bool) (nn.Module, func(*tensor.Scope) *tensor.Tensor) {
			m := models.NewGPT(c, 1, gptCfg)
			wrap(m, recompute)
			nn.SetRandomSource(m, tensor.NewGenerator(5))
			return m, func(s *tensor.Scope) *tensor.Tensor {
				n := gptBatch * gptCfg.Context
				ids, next := make([]int32, n), make([]int32, n)
				for i := range ids {
					ids[i], next[i] = int32(i*7%gptCfg.Vocab), int32((i*7+3)%gptCfg.Vocab)
				}
				return m.Loss(tensor.FromInt32(c, s, ids, gptBatch, gptCfg.Context), tensor.FromInt32(c, s, next, gptBatch, gptCfg.Context))
			}
		}},
	}
}

// runRecomputeStep runs one step of zc on a fresh CountingCPU, in a scope
// that gives memory back during Backward as the trainer's do.
func runRecomputeStep(t *testing.T, zc zooMemoryCase, recompute bool) recomputeStep {
	t.Helper()
	return runZooStep(t, zc, recompute, func(s *tensor.Scope) { s.SetReleaseInBackward(true) })
}

// runZooStep runs one step of zc (its blocks recomputed when recompute)
// on a fresh CountingCPU, in a scope that setup configures.
func runZooStep(t *testing.T, zc zooMemoryCase, recompute bool, setup func(*tensor.Scope)) recomputeStep {
	t.Helper()
	c := tensor.NewCountingCPU()
	m, loss := zc.build(c, recompute)
	ps := nn.Parameters(m)
	for _, p := range ps { // as an optimiser does, before the step
		p.Tensor.SetGrad(tensor.Zeros(c, nil, p.Tensor.Shape()...))
	}
	s := tensor.NewScope()
	setup(s)
	start := c.Live()
	c.ResetPeak()
	l := loss(s)
	fwd := c.Live() - start
	l.Backward()
	r := recomputeStep{loss: l.Item(), forward: fwd, peak: c.Peak() - start}
	for _, p := range ps {
		r.grads = append(r.grads, p.Tensor.Grad().Float32s())
	}
	s.Release()
	if n := c.BadFrees(); n != 0 {
		t.Errorf("%s: %d frees of memory not live", zc.name, n)
	}
	return r
}

// A zoo model with its blocks recomputed trains to the same bits as
// without, and its step peaks lower. EMBER_MEMORY_ZOO=1 runs the zoo's
// sizes (a small batch) and logs the peaks, as docs/performance.md quotes
// them.
func TestRecomputeBlocksZoo(t *testing.T) {
	full := os.Getenv("EMBER_MEMORY_ZOO") == "1"
	for _, zc := range zooMemoryCases(full) {
		t.Run(zc.name, func(t *testing.T) {
			c := tensor.NewCountingCPU()
			m, _ := zc.build(c, false)
			if n := nn.RecomputeBlocks(m); n != zc.blocks {
				t.Errorf("RecomputeBlocks wrapped %d layers; want %d", n, zc.blocks)
			}
			if n := nn.RecomputeBlocks(m); n != 0 {
				t.Errorf("RecomputeBlocks wrapped %d layers the second time; want 0", n)
			}
			plain, re := runRecomputeStep(t, zc, false), runRecomputeStep(t, zc, true)
			if math.Float32bits(plain.loss) != math.Float32bits(re.loss) {
				t.Fatalf("loss %v with recomputed blocks, %v without", re.loss, plain.loss)
			}
			for i := range plain.grads {
				for j := range plain.grads[i] {
					if math.Float32bits(plain.grads[i][j]) != math.Float32bits(re.grads[i][j]) {
						t.Fatalf("parameter %d element %d: gradient %v with recomputed blocks, %v without", i, j, re.grads[i][j], plain.grads[i][j])
					}
				}
			}
			mib := func(n int) float64 { return float64(n) / (1 << 20) }
			t.Logf("%s: after the forward pass %.2f MiB -> %.2f MiB, step peak %.2f MiB -> %.2f MiB with recomputed blocks (%.0f%%)", zc.name,
				mib(plain.forward), mib(re.forward), mib(plain.peak), mib(re.peak), 100*float64(re.peak)/float64(plain.peak))
			// The forward pass keeps the blocks' inputs and outputs only
			// (ResNet-9's blocks of one convolution, half its
			// activations); the backward pass adds one block's
			// activations and gradients at a time.
			if 5*re.forward > 3*plain.forward || re.peak >= plain.peak {
				t.Errorf("with recomputed blocks %d B after the forward pass and %d B at the peak, without %d B and %d B: want at most 60%% of the forward's, and a lower peak",
					re.forward, re.peak, plain.forward, plain.peak)
			}
		})
	}
}
