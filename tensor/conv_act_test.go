package tensor_test

import (
	"math/rand/v2"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// convActCL is the CPU backend with the fused convolution and GELU
// (tensor.ChannelsLastConvActBackend) counted: each pass composes the two
// operations, as the CPU does, so the fused operation's autograd is other
// code than the two operations' but must give their bits.
type convActCL struct {
	clCPU
	fwd, bwd, bwdDX int
}

func (b *convActCL) ConvActChannelsLast(g tensor.ConvGeom, act tensor.UnaryOp) bool {
	return tensor.CPU.(tensor.ChannelsLastConvActBackend).ConvActChannelsLast(g, act)
}

func (b *convActCL) Conv2dActChannelsLast(y, x, w, bias tensor.Buffer, g tensor.ConvGeom, act tensor.UnaryOp) {
	b.fwd++
	tensor.ConvActChannelsLastComposed(b, y, x, w, bias, g, act)
}

func (b *convActCL) Conv2dActBackwardChannelsLast(dx, dw, db, dy, x, w, bias tensor.Buffer, g tensor.ConvGeom, act tensor.UnaryOp) {
	b.bwd++
	if !dx.Empty() {
		b.bwdDX++
	}
	tensor.ConvActBackwardChannelsLastComposed(b, dx, dw, db, dy, x, w, bias, g, act)
}

// TestConv2dWithActMatchesTwoOps: Conv2dWithAct under autocast, one
// operation on a backend with the fused form, gives the bits of
// Conv2dWith then GELU: the output, and the gradients of the input, the
// weight and the bias. Both GELU forms; a first layer (a plain input with
// no gradient) and a layer after another convolution (an input held
// channels-last, its gradient wanted); with and without bias; and out of
// autocast, where it is the two operations.
func TestConv2dWithActMatchesTwoOps(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 4))
	normals := func(n int, scale float64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64() * scale)
		}
		return v
	}
	o := tensor.ConvOptions{Stride: [2]int{1, 2}, Padding: [2]int{1, 0}, Dilation: [2]int{2, 1}}
	xs, w0s, ws, bs := normals(2*3*9*8, 1), normals(8*3*3*3, 0.4), normals(16*8*2*3, 0.3), normals(16, 0.2)
	for _, c := range []struct {
		name           string
		act            tensor.UnaryOp
		inner, bias    bool
		autocast       bool
		wantFwd, wantB int
	}{
		{"first layer, GELU", tensor.OpGELU, false, true, true, 1, 1},
		{"first layer, GELU (tanh), no bias", tensor.OpGELUTanh, false, false, true, 1, 1},
		{"after a convolution, GELU", tensor.OpGELU, true, true, true, 1, 1},
		{"float32", tensor.OpGELU, true, true, false, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			be := &convActCL{clCPU: tensor.CPU.(clCPU)}
			run := func(fused bool) (out []float32, grads [][]float32, held bool) {
				s := tensor.NewScope()
				defer s.Release()
				if c.autocast {
					s.SetAutocast(tensor.BFloat16)
				}
				x := tensor.FromFloat32(be, s, xs, 2, 3, 9, 8)
				in := 3 // channels into the layer
				if c.inner {
					in = 8
				}
				w := tensor.FromFloat32(be, s, ws[:16*in*2*3], 16, in, 2, 3).SetRequiresGrad(true)
				var b *tensor.Tensor
				params := []*tensor.Tensor{w}
				if c.bias {
					b = tensor.FromFloat32(be, s, bs, 16).SetRequiresGrad(true)
					params = append(params, b)
				}
				if c.inner {
					w0 := tensor.FromFloat32(be, s, w0s, 8, 3, 3, 3).SetRequiresGrad(true)
					params = append(params, w0)
					x = tensor.Conv2dWith(x, w0, nil, tensor.ConvOptions{Padding: [2]int{1, 1}})
				}
				var y *tensor.Tensor
				if fused {
					y = tensor.Conv2dWithAct(x, w, b, o, c.act)
				} else {
					y = tensor.GELU(tensor.Conv2dWith(x, w, b, o), c.act == tensor.OpGELUTanh)
				}
				held = y.IsChannelsLast()
				r := tensor.FromFloat32(be, s, normalsFixed(y.Len()), y.Shape()...)
				tensor.Sum(tensor.Mul(y, r)).Backward()
				for _, p := range params {
					grads = append(grads, p.Grad().Float32s())
				}
				return y.Float32s(), grads, held
			}
			wantOut, wantGrads, wantHeld := run(false)
			if be.fwd != 0 || be.bwd != 0 {
				t.Fatalf("the two operations ran the fused form (%d forward, %d backward)", be.fwd, be.bwd)
			}
			out, grads, held := run(true)
			if be.fwd != c.wantFwd || be.bwd != c.wantB || be.bwdDX != 0 && !c.inner {
				t.Errorf("fused passes: %d forward, %d backward (%d with dx); want %d, %d", be.fwd, be.bwd, be.bwdDX, c.wantFwd, c.wantB)
			}
			if c.inner && c.autocast && be.bwdDX != 1 {
				t.Errorf("the backward pass after a convolution wrote no dx")
			}
			if held != wantHeld || held != c.autocast {
				t.Errorf("output held channels-last %v, the two operations' %v; want %v", held, wantHeld, c.autocast)
			}
			sameBits(t, "output", out, wantOut)
			for i := range wantGrads {
				sameBits(t, "gradient", grads[i], wantGrads[i])
			}
		})
	}
}

// normalsFixed is n values of a fixed normal sequence (the loss's weights,
// the same in every run).
func normalsFixed(n int) []float32 {
	rng := rand.New(rand.NewPCG(8, 8))
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}
