package tensor_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// convWith64 is nn.Conv2d in float64 from its definition: y[n,k,i,j] =
// b[k] + Σ x[n, g·C/G + c, i·SH - PH + r·DH, j·SW - PW + s·DW] · w[k,c,r,s]
// over the channels c of k's group g and the taps inside the input.
func convWith64(x, w, b []float64, shape [4]int, wShape [4]int, o tensor.ConvOptions) []float64 {
	n, c, h, wd := shape[0], shape[1], shape[2], shape[3]
	k, cg, r, s := wShape[0], wShape[1], wShape[2], wShape[3]
	sh, sw, ph, pw := max(o.Stride[0], 1), max(o.Stride[1], 1), o.Padding[0], o.Padding[1]
	dh, dw := max(o.Dilation[0], 1), max(o.Dilation[1], 1)
	kg := k / max(o.Groups, 1)
	oh, ow := (h+2*ph-dh*(r-1)-1)/sh+1, (wd+2*pw-dw*(s-1)-1)/sw+1
	y := make([]float64, n*k*oh*ow)
	for in := 0; in < n; in++ {
		for ik := 0; ik < k; ik++ {
			for i := 0; i < oh; i++ {
				for j := 0; j < ow; j++ {
					acc := 0.0
					if b != nil {
						acc = b[ik]
					}
					for ic := 0; ic < cg; ic++ {
						xc := ik/kg*cg + ic
						for ir := 0; ir < r; ir++ {
							for is := 0; is < s; is++ {
								hh, ww := i*sh-ph+ir*dh, j*sw-pw+is*dw
								if hh >= 0 && hh < h && ww >= 0 && ww < wd {
									acc += x[((in*c+xc)*h+hh)*wd+ww] * w[((ik*cg+ic)*r+ir)*s+is]
								}
							}
						}
					}
					y[((in*k+ik)*oh+i)*ow+j] = acc
				}
			}
		}
	}
	return y
}

// TestGradConv2dWith checks the general convolution's gradients (input,
// weight, bias) against finite differences of convWith64.
func TestGradConv2dWith(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for _, c := range []struct {
		x, w [4]int
		o    tensor.ConvOptions
	}{
		{[4]int{2, 3, 7, 8}, [4]int{4, 3, 3, 2}, tensor.ConvOptions{Stride: [2]int{2, 1}, Padding: [2]int{1, 0}}},
		{[4]int{1, 2, 9, 8}, [4]int{3, 2, 3, 3}, tensor.ConvOptions{Padding: [2]int{2, 1}, Dilation: [2]int{2, 3}}},
		{[4]int{2, 4, 6, 6}, [4]int{6, 2, 3, 3}, tensor.ConvOptions{Padding: [2]int{1, 1}, Groups: 2}},
		{[4]int{2, 3, 7, 7}, [4]int{3, 1, 3, 3}, tensor.ConvOptions{Stride: [2]int{2, 2}, Padding: [2]int{1, 1}, Groups: 3}},
		{[4]int{1, 2, 8, 9}, [4]int{4, 1, 2, 3}, tensor.ConvOptions{Stride: [2]int{1, 2}, Dilation: [2]int{2, 1}, Groups: 2}},
	} {
		xs, ws := c.x[:], c.w[:]
		o := c.o
		x, w := c.x, c.w
		checkFD(t, fdCase{
			name:   fmt.Sprintf("Conv2dWith x %v w %v %+v", xs, ws, o),
			shapes: [][]int{xs, ws, {c.w[0]}},
			grad:   []bool{true, true, true},
			data:   [][]float32{normals(rng, numel(xs), 1), normals(rng, numel(ws), 1), normals(rng, c.w[0], 1)},
			op: func(ts []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
				return tensor.Conv2dWith(ts[0], ts[1], ts[2], o)
			},
			ref: func(v [][]float64, _ []int32) []float64 { return convWith64(v[0], v[1], v[2], x, w, o) },
		}, rng)
	}
}

// TestConv2dWithPlainIsConv2d checks that the general form with default
// options computes what Conv2d does, bit for bit (the same backend calls).
func TestConv2dWithPlainIsConv2d(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 8))
	s := tensor.NewScope()
	defer s.Release()
	x := tensor.FromFloat32(tensor.CPU, s, normals(rng, 2*3*9*9, 1), 2, 3, 9, 9)
	w := tensor.FromFloat32(tensor.CPU, s, normals(rng, 4*3*3*3, 1), 4, 3, 3, 3)
	a := tensor.Conv2d(x, w, nil, 2, 1).Float32s()
	b := tensor.Conv2dWith(x, w, nil, tensor.ConvOptions{Stride: [2]int{2, 2}, Padding: [2]int{1, 1}, Dilation: [2]int{1, 1}, Groups: 1}).Float32s()
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("element %d: Conv2d %g, Conv2dWith %g", i, a[i], b[i])
		}
	}
}

// TestConv2dWithMisuse checks that bad shapes and options panic naming the
// op and the shapes.
func TestConv2dWithMisuse(t *testing.T) {
	s := tensor.NewScope()
	defer s.Release()
	x := tensor.Zeros(tensor.CPU, s, 1, 4, 5, 5)
	for _, c := range []struct {
		what string
		w    []int
		o    tensor.ConvOptions
	}{
		{"channels not split by groups", []int{3, 2, 3, 3}, tensor.ConvOptions{Groups: 2}},
		{"weight channels times groups not C", []int{4, 1, 3, 3}, tensor.ConvOptions{Groups: 2}},
		{"negative dilation", []int{2, 4, 3, 3}, tensor.ConvOptions{Dilation: [2]int{-1, 1}}},
		{"dilated kernel larger than the input", []int{2, 4, 3, 3}, tensor.ConvOptions{Dilation: [2]int{3, 1}}},
	} {
		func() {
			defer func() {
				if r := recover(); r == nil {
					t.Errorf("%s: no panic", c.what)
				} else if msg := fmt.Sprint(r); !strings.Contains(msg, "Conv2dWith") {
					t.Errorf("%s: panic %q does not name the op", c.what, msg)
				}
			}()
			tensor.Conv2dWith(x, tensor.Zeros(tensor.CPU, s, c.w...), nil, c.o)
		}()
	}
}
