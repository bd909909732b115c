package nn_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// Gradients with SetReleaseInBackward(true), under which Sequential and
// the transformer block give activations back during the forward pass
// (tensor.ReleaseInput), equal those of a scope that keeps everything, bit
// for bit, with and without autocast and recomputation, and no freed
// memory is read (a NaN would show; "given back early" panics).
func TestReleaseDuringForwardGradsEqual(t *testing.T) {
	type model struct {
		name  string
		build func(c tensor.Backend) (any, func(s *tensor.Scope) *tensor.Tensor)
	}
	models := []model{
		{"transformer", func(c tensor.Backend) (any, func(*tensor.Scope) *tensor.Tensor) {
			rng := rand.New(rand.NewPCG(3, 3))
			blk := nn.NewTransformerBlock(c, rng, 8, 2, 0.2)
			blk2 := nn.NewTransformerBlock(c, rng, 8, 2, 0.2)
			head := nn.NewLinear(c, rng, 8, 5)
			m := []any{blk, blk2, head}
			return m, func(s *tensor.Scope) *tensor.Tensor {
				r := rand.New(rand.NewPCG(9, 9))
				v := make([]float32, 2*4*8)
				for i := range v {
					v[i] = float32(r.NormFloat64())
				}
				x := tensor.FromFloat32(c, s, v, 2, 4, 8)
				y := blk2.Forward(blk.Forward(x))
				return nn.CrossEntropyLoss(head.Forward(y).Reshape(8, 5), tensor.FromInt32(c, s, []int32{1, 2, 3, 4, 0, 1, 2, 3}, 8))
			}
		}},
		{"mlp", func(c tensor.Backend) (any, func(*tensor.Scope) *tensor.Tensor) {
			rng := rand.New(rand.NewPCG(4, 4))
			m := nn.NewSequential(
				nn.NewLinear(c, rng, 6, 16), nn.NewLayerNorm(c, 16), nn.GELU{}, nn.NewDropout(0.3),
				nn.NewLinear(c, rng, 16, 16), nn.ReLU{}, nn.NewLinear(c, rng, 16, 16), nn.Tanh{}, nn.Sigmoid{},
				nn.NewLinear(c, rng, 16, 16), nn.NewBatchNorm1d(c, 16), nn.ReLU{}, nn.NewDropout(0.1),
				nn.NewLinear(c, rng, 16, 4),
			)
			return m, func(s *tensor.Scope) *tensor.Tensor {
				r := rand.New(rand.NewPCG(9, 9))
				v := make([]float32, 5*6)
				for i := range v {
					v[i] = float32(r.NormFloat64())
				}
				x := tensor.FromFloat32(c, s, v, 5, 6)
				return nn.CrossEntropyLoss(m.Forward(x), tensor.FromInt32(c, s, []int32{1, 2, 3, 0, 1}, 5))
			}
		}},
		{"conv", func(c tensor.Backend) (any, func(*tensor.Scope) *tensor.Tensor) {
			rng := rand.New(rand.NewPCG(5, 5))
			m := nn.NewSequential(
				nn.NewConv2dWith(c, rng, 3, 4, nn.Conv2dOptions{Kernel: [2]int{3, 3}, Padding: [2]int{1, 1}, NoBias: true}),
				nn.NewBatchNorm2d(c, 4), nn.ReLU{}, nn.NewMaxPool2d(2),
				nn.NewConv2dWith(c, rng, 4, 4, nn.Conv2dOptions{Kernel: [2]int{3, 3}, Padding: [2]int{1, 1}}),
				nn.NewMaxPool2d(2), nn.NewBatchNorm2d(c, 4), nn.GELU{},
				nn.NewConv2d(c, rng, 4, 4, 1), nn.ReLU{},
			)
			head := nn.NewLinear(c, rng, 16, 3)
			return []any{m, head}, func(s *tensor.Scope) *tensor.Tensor {
				r := rand.New(rand.NewPCG(9, 9))
				v := make([]float32, 2*3*8*8)
				for i := range v {
					v[i] = float32(r.NormFloat64())
				}
				x := tensor.FromFloat32(c, s, v, 2, 3, 8, 8)
				return nn.CrossEntropyLoss(head.Forward(m.Forward(x).Reshape(2, 16)), tensor.FromInt32(c, s, []int32{1, 2}, 2))
			}
		}},
	}
	for _, md := range models {
		for _, ac := range []bool{false, true} {
			for _, rec := range []int{0, 2} {
				t.Run(fmt.Sprintf("%s autocast=%v segments=%d", md.name, ac, rec), func(t *testing.T) {
					var grads [2][][]float32
					for i, release := range []bool{false, true} {
						c := tensor.NewCountingCPU()
						m, loss := md.build(c)
						nn.SetRandomSource(m, tensor.NewGenerator(7))
						nn.SetTraining(m, true)
						if rec > 0 {
							nn.RecomputeBlocks(m)
							if sq, ok := m.(*nn.Sequential); ok {
								sq.Segments = rec
							}
							if ms, ok := m.([]any); ok {
								if sq, ok := ms[0].(*nn.Sequential); ok {
									sq.Segments = rec
								}
							}
						}
						s := tensor.NewScope()
						if ac {
							s.SetAutocast(tensor.BFloat16)
						}
						s.SetReleaseInBackward(release)
						l := loss(s)
						l.Backward()
						for _, p := range nn.Parameters(m) {
							if g := p.Tensor.Grad(); g != nil {
								grads[i] = append(grads[i], g.Float32s())
							}
						}
						s.Release()
						if c.BadFrees() != 0 {
							t.Errorf("%d bad frees", c.BadFrees())
						}
					}
					if len(grads[0]) != len(grads[1]) || len(grads[0]) == 0 {
						t.Fatalf("%d and %d gradients", len(grads[0]), len(grads[1]))
					}
					for k := range grads[0] {
						for j := range grads[0][k] {
							a, b := grads[0][k][j], grads[1][k][j]
							if math.IsNaN(float64(b)) || math.Float32bits(a) != math.Float32bits(b) {
								t.Fatalf("grad %d[%d]: %v released, %v kept", k, j, b, a)
							}
						}
					}
				})
			}
		}
	}
}

type argmaxLayer struct{}

func (argmaxLayer) Forward(x *tensor.Tensor) *tensor.Tensor { return tensor.Argmax(x) }

// Through a Sequential: the ids a layer makes stay until the Embedding's
// backward pass has read them (a gather counts its indices as read).
func TestReleaseDuringForwardKeepsGatherIndices(t *testing.T) {
	c := tensor.NewCountingCPU()
	rng := rand.New(rand.NewPCG(1, 1))
	m := nn.NewSequential(nn.NewLinear(c, rng, 4, 6), argmaxLayer{}, nn.NewEmbedding(c, rng, 6, 3))
	s := tensor.NewScope()
	defer s.Release()
	s.SetReleaseInBackward(true)
	x := tensor.Full(c, s, 0.5, 5, 4)
	loss := tensor.Sum(m.Forward(x))
	defer func() {
		if r := recover(); r != nil {
			t.Errorf("Backward panicked: %v", r)
		}
	}()
	loss.Backward()
}
