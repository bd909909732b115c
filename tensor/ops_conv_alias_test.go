package tensor_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// filterGradFirst is the CPU with the convolution's weight gradient queued
// before its input gradient (a backend is free to order them, or to run
// them side by side, as the GPU's side stream does).
type filterGradFirst struct{ tensor.CompleteBackend }

func (f filterGradFirst) Conv2dBackward(dx, dw, db, dy, x, w, y tensor.Buffer, g tensor.ConvGeom) {
	f.CompleteBackend.Conv2dBackward(tensor.Buffer{}, dw, db, dy, x, w, y, g)
	f.CompleteBackend.Conv2dBackward(dx, tensor.Buffer{}, tensor.Buffer{}, dy, x, w, y, g)
}

// TestConvSameTensorAsInputAndWeight: Conv2dWith(x, x) (and with its
// ReLU) gives x the sum of its gradients as input and as weight, the
// gradients of two separate copies, whichever order the backend writes
// them in, in float32 and under autocast (8 channels: the channels-last
// form there). The input's gradient must not be written where the
// weight's accumulates.
func TestConvSameTensorAsInputAndWeight(t *testing.T) {
	vals := make([]float32, 8*8*3*3)
	for i := range vals {
		vals[i] = float32(i%7)/7 - 0.4
	}
	backends := map[string]func() tensor.Backend{
		"cpu":               func() tensor.Backend { return tensor.NewCountingCPU() },
		"filter grad first": func() tensor.Backend { return filterGradFirst{tensor.Complete(tensor.NewCountingCPU())} },
	}
	for name, newBackend := range backends {
		for _, autocast := range []bool{false, true} {
			for _, relu := range []bool{false, true} {
				conv := tensor.Conv2dWith
				if relu {
					conv = tensor.Conv2dWithReLU
				}
				run := func(same bool) []float32 {
					b := newBackend()
					s := tensor.NewScope()
					defer s.Release()
					if autocast {
						s.SetAutocast(tensor.BFloat16)
					}
					// Computed tensors (a leaf's gradient is always added into).
					one := tensor.Full(b, s, 1, 8, 8, 3, 3)
					x0 := tensor.FromFloat32(b, s, vals, 8, 8, 3, 3).SetRequiresGrad(true)
					w0 := x0
					if !same {
						w0 = tensor.FromFloat32(b, s, vals, 8, 8, 3, 3).SetRequiresGrad(true)
					}
					x := tensor.Mul(x0, one)
					w := x
					if !same {
						w = tensor.Mul(w0, one)
					}
					y := conv(x, w, nil, tensor.ConvOptions{Padding: [2]int{1, 1}})
					return gradientOfBoth(y, x0, w0, same)
				}
				checkBothGradients(t, fmt.Sprintf("%s, autocast %v, relu %v", name, autocast, relu), run(true), run(false))
			}
		}
	}
}

// TestProductsSameTensorTwice: MatMul(a, a) and Linear(x, x) of one
// computed tensor give it the sum of both operands' gradients (the
// backward pass writes the first and adds the second into the same sink,
// in that order), in float32 and under autocast.
func TestProductsSameTensorTwice(t *testing.T) {
	vals := make([]float32, 8*8)
	for i := range vals {
		vals[i] = float32(i%5)/5 - 0.3
	}
	ops := map[string]func(a, b *tensor.Tensor) *tensor.Tensor{
		"MatMul": tensor.MatMul,
		"Linear": func(a, b *tensor.Tensor) *tensor.Tensor { return tensor.Linear(a, b, nil) },
	}
	for name, op := range ops {
		for _, autocast := range []bool{false, true} {
			run := func(same bool) []float32 {
				s := tensor.NewScope()
				defer s.Release()
				if autocast {
					s.SetAutocast(tensor.BFloat16)
				}
				b := tensor.NewCountingCPU()
				one := tensor.Full(b, s, 1, 8, 8)
				a0 := tensor.FromFloat32(b, s, vals, 8, 8).SetRequiresGrad(true)
				b0 := a0
				if !same {
					b0 = tensor.FromFloat32(b, s, vals, 8, 8).SetRequiresGrad(true)
				}
				a := tensor.Mul(a0, one)
				c := a
				if !same {
					c = tensor.Mul(b0, one)
				}
				return gradientOfBoth(op(a, c), a0, b0, same)
			}
			checkBothGradients(t, fmt.Sprintf("%s, autocast %v", name, autocast), run(true), run(false))
		}
	}
}

// gradientOfBoth runs the backward pass of Sum(y²) and returns a's
// gradient, plus b's when the two operands were separate copies (same
// false): the gradient one shared tensor should get.
func gradientOfBoth(y, a, b *tensor.Tensor, same bool) []float32 {
	tensor.Sum(tensor.Mul(y, y)).Backward()
	g := a.Grad().Float32s()
	if !same {
		for i, v := range b.Grad().Float32s() {
			g[i] += v
		}
	}
	return g
}

// checkBothGradients compares the shared tensor's gradient with the two
// copies' sum, within float32 rounding.
func checkBothGradients(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range got {
		if math.Abs(float64(got[i]-want[i])) > 1e-5*(1+math.Abs(float64(want[i]))) {
			t.Fatalf("%s: element %d of the gradient %v, want %v (the two copies' sum)", what, i, got[i], want[i])
		}
	}
}
