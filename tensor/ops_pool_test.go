package tensor_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/ember-ml/ember/tensor"
	"github.com/ember-ml/ember/tensor/tensortest"
)

// poolWindows64 visits, for each output of a pooling of x [n,c,h,w] with
// windows k, strides st and paddings p (ceil mode as torch), the output
// index, its window's input indices and its count of positions in the
// padded input (clipped at the padding's end) and in the input.
func poolWindows64(shape [4]int, k, st, p [2]int, ceil bool, f func(o int, in []int, padded, inside int)) {
	outSize := func(in, k, s, p int) int {
		if !ceil {
			return (in+2*p-k)/s + 1
		}
		o := int(math.Ceil(float64(in+2*p-k)/float64(s))) + 1
		if (o-1)*s >= in+p {
			o--
		}
		return o
	}
	n, c, h, w := shape[0], shape[1], shape[2], shape[3]
	oh, ow := outSize(h, k[0], st[0], p[0]), outSize(w, k[1], st[1], p[1])
	for pl := 0; pl < n*c; pl++ {
		for i := 0; i < oh; i++ {
			for j := 0; j < ow; j++ {
				var in []int
				rowsPadded, colsPadded := 0, 0
				for r := 0; r < k[0]; r++ {
					if hh := i*st[0] - p[0] + r; hh < h+p[0] {
						rowsPadded++
					}
				}
				for s := 0; s < k[1]; s++ {
					if ww := j*st[1] - p[1] + s; ww < w+p[1] {
						colsPadded++
					}
				}
				for r := 0; r < k[0]; r++ {
					for s := 0; s < k[1]; s++ {
						hh, ww := i*st[0]-p[0]+r, j*st[1]-p[1]+s
						if hh >= 0 && hh < h && ww >= 0 && ww < w {
							in = append(in, (pl*h+hh)*w+ww)
						}
					}
				}
				rows, cols := 0, 0
				for r := 0; r < k[0]; r++ {
					if hh := i*st[0] - p[0] + r; hh >= 0 && hh < h {
						rows++
					}
				}
				for s := 0; s < k[1]; s++ {
					if ww := j*st[1] - p[1] + s; ww >= 0 && ww < w {
						cols++
					}
				}
				f((pl*oh+i)*ow+j, in, rowsPadded*colsPadded, rows*cols)
			}
		}
	}
}

// TestGradPooling checks MaxPool2dWith and AvgPool2d (padding, ceil mode,
// both counts of padding, a divisor override) against finite differences
// of float64 twins.
func TestGradPooling(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	for _, c := range []struct {
		x       [4]int
		k, s, p [2]int
		ceil    bool
	}{
		{[4]int{2, 2, 7, 9}, [2]int{3, 3}, [2]int{2, 2}, [2]int{1, 1}, false},
		{[4]int{1, 3, 7, 8}, [2]int{2, 2}, [2]int{2, 2}, [2]int{0, 0}, true},
		{[4]int{2, 2, 5, 6}, [2]int{2, 3}, [2]int{2, 2}, [2]int{1, 1}, true},
		{[4]int{1, 2, 8, 7}, [2]int{3, 2}, [2]int{1, 2}, [2]int{1, 0}, true},
	} {
		c := c
		po := tensor.PoolOptions{Kernel: c.k, Stride: c.s, Padding: c.p, CeilMode: c.ceil}
		xs := c.x[:]
		checkFD(t, fdCase{
			name: fmt.Sprintf("MaxPool2dWith %v %+v", xs, po), shapes: [][]int{xs}, grad: []bool{true},
			data: [][]float32{distinctValues(rng, numel(xs))},
			op:   func(ts []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor { return tensor.MaxPool2dWith(ts[0], po) },
			ref: func(v [][]float64, _ []int32) []float64 {
				var y []float64
				poolWindows64(c.x, c.k, c.s, c.p, c.ceil, func(o int, in []int, _, _ int) {
					m := math.Inf(-1)
					for _, i := range in {
						m = math.Max(m, v[0][i])
					}
					y = append(y, m)
				})
				return y
			},
		}, rng)
		for _, ao := range []tensor.AvgPoolOptions{{PoolOptions: po}, {PoolOptions: po, ExcludePad: true}, {PoolOptions: po, Divisor: 7}} {
			checkFD(t, fdCase{
				name: fmt.Sprintf("AvgPool2d %v %+v", xs, ao), shapes: [][]int{xs}, grad: []bool{true},
				data: [][]float32{normals(rng, numel(xs), 1)},
				op:   func(ts []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor { return tensor.AvgPool2d(ts[0], ao) },
				ref: func(v [][]float64, _ []int32) []float64 {
					var y []float64
					poolWindows64(c.x, c.k, c.s, c.p, c.ceil, func(o int, in []int, padded, inside int) {
						div := float64(padded)
						switch {
						case ao.Divisor > 0:
							div = float64(ao.Divisor)
						case ao.ExcludePad:
							div = float64(inside)
						}
						sum := 0.0
						for _, i := range in {
							sum += v[0][i]
						}
						y = append(y, sum/div)
					})
					return y
				},
			}, rng)
		}
	}
}

// adaptive64 pools x [n,c,h,w] to oh×ow over torch's adaptive windows
// (from real-valued bounds: floor(i·h/oh) to ceil((i+1)·h/oh)) with reduce.
func adaptive64(x []float64, shape [4]int, oh, ow int, reduce func([]float64) float64) []float64 {
	n, c, h, w := shape[0], shape[1], shape[2], shape[3]
	var y []float64
	for p := 0; p < n*c; p++ {
		for i := 0; i < oh; i++ {
			h0, h1 := int(math.Floor(float64(i*h)/float64(oh))), int(math.Ceil(float64((i+1)*h)/float64(oh)))
			for j := 0; j < ow; j++ {
				w0, w1 := int(math.Floor(float64(j*w)/float64(ow))), int(math.Ceil(float64((j+1)*w)/float64(ow)))
				var win []float64
				for hh := h0; hh < h1; hh++ {
					for ww := w0; ww < w1; ww++ {
						win = append(win, x[(p*h+hh)*w+ww])
					}
				}
				y = append(y, reduce(win))
			}
		}
	}
	return y
}

func mean64(v []float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

func max64(v []float64) float64 {
	m := math.Inf(-1)
	for _, x := range v {
		m = math.Max(m, x)
	}
	return m
}

// TestGradAdaptivePooling checks AdaptiveAvgPool2d and AdaptiveMaxPool2d
// against finite differences, for sizes that divide, that do not, and an
// output larger than the input.
func TestGradAdaptivePooling(t *testing.T) {
	rng := rand.New(rand.NewPCG(10, 10))
	for _, c := range []struct {
		x      [4]int
		oh, ow int
	}{{[4]int{2, 2, 8, 6}, 4, 3}, {[4]int{2, 3, 7, 9}, 3, 4}, {[4]int{1, 2, 3, 5}, 5, 7}, {[4]int{2, 2, 6, 5}, 1, 1}} {
		c := c
		xs := c.x[:]
		checkFD(t, fdCase{
			name: fmt.Sprintf("AdaptiveAvgPool2d %v to %dx%d", xs, c.oh, c.ow), shapes: [][]int{xs}, grad: []bool{true},
			data: [][]float32{normals(rng, numel(xs), 1)},
			op: func(ts []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
				return tensor.AdaptiveAvgPool2d(ts[0], c.oh, c.ow)
			},
			ref: func(v [][]float64, _ []int32) []float64 { return adaptive64(v[0], c.x, c.oh, c.ow, mean64) },
		}, rng)
		checkFD(t, fdCase{
			name: fmt.Sprintf("AdaptiveMaxPool2d %v to %dx%d", xs, c.oh, c.ow), shapes: [][]int{xs}, grad: []bool{true},
			data: [][]float32{distinctValues(rng, numel(xs))},
			op: func(ts []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
				return tensor.AdaptiveMaxPool2d(ts[0], c.oh, c.ow)
			},
			ref: func(v [][]float64, _ []int32) []float64 { return adaptive64(v[0], c.x, c.oh, c.ow, max64) },
		}, rng)
	}
}

// TestGlobalAvgPoolFallback checks AdaptiveAvgPool2d to 1×1 on a backend
// without PoolBackend (the core's Reduce, and Complete's Axpy and
// AddBias) against the CPU's PoolBackend, forward and backward, and that the other sizes and
// pooling operations refuse such a backend by name. The fallback needs the
// core's Reduce, implemented by the reductions family: until that is
// merged this test skips.
func TestGlobalAvgPoolFallback(t *testing.T) {
	be := tensortest.CoreOnly(tensor.CPU)
	s := tensor.NewScope()
	defer s.Release()
	mustPanic := func(what string, f func()) {
		t.Helper()
		defer func() {
			if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "PoolBackend") {
				t.Errorf("%s: panic %v, want one naming tensor.PoolBackend", what, r)
			}
		}()
		f()
	}
	x0 := tensor.Zeros(be, s, 1, 1, 4, 4)
	mustPanic("AdaptiveAvgPool2d to 2x2", func() { tensor.AdaptiveAvgPool2d(x0, 2, 2) })
	mustPanic("AdaptiveMaxPool2d", func() { tensor.AdaptiveMaxPool2d(x0, 1, 1) })
	mustPanic("AvgPool2d", func() {
		tensor.AvgPool2d(x0, tensor.AvgPoolOptions{PoolOptions: tensor.PoolOptions{Kernel: [2]int{2, 2}}})
	})
	if reduceMissing() {
		t.Skip("the core's Reduce is not implemented yet: the fallback is checked once the reductions are merged")
	}
	rng := rand.New(rand.NewPCG(11, 11))
	data := normals(rng, 2*3*5*7, 1)
	w := normals(rng, 2*3, 1)
	run := func(b tensor.Backend) (y, dx []float32) {
		x := tensor.FromFloat32(b, s, data, 2, 3, 5, 7).SetRequiresGrad(true)
		out := tensor.AdaptiveAvgPool2d(x, 1, 1)
		tensor.Sum(tensor.Mul(out, tensor.FromFloat32(b, s, w, 2, 3, 1, 1))).Backward()
		return out.Float32s(), x.Grad().Float32s()
	}
	wantY, wantDX := run(tensor.CPU)
	gotY, gotDX := run(be)
	// The fallback sums each plane in the reduction's order and scales
	// by 1/35 where the CPU kernel divides by 35: a few float32 roundings
	// of values of order 1.
	for i := range wantY {
		if math.Abs(float64(gotY[i]-wantY[i])) > 1e-6 {
			t.Errorf("forward %d: fallback %g, PoolBackend %g", i, gotY[i], wantY[i])
		}
	}
	for i := range wantDX {
		if math.Abs(float64(gotDX[i]-wantDX[i])) > 1e-6 {
			t.Errorf("gradient %d: fallback %g, PoolBackend %g", i, gotDX[i], wantDX[i])
		}
	}
}

// reduceMissing reports whether the CPU's Reduce is still a stub.
func reduceMissing() (missing bool) {
	defer func() {
		if r := recover(); r != nil {
			missing = true
		}
	}()
	s := tensor.NewScope()
	defer s.Release()
	x, y := tensor.Zeros(tensor.CPU, s, 2), tensor.Zeros(tensor.CPU, s, 1)
	tensor.CPU.Reduce(tensor.ReduceSum, y.Buffer(), x.Buffer(), 1, 2, 1, false)
	return false
}

// TestMaxPoolFallbackEdges checks Complete's MaxPool2d on the CPU's core
// against the CPU's kernel where the tensortest inputs do not go: windows
// whose inputs are all -Inf beside padding (the maximum is -Inf, its
// position the window's first input, never a padding tap) and a NaN (it
// wins, and propagates).
func TestMaxPoolFallbackEdges(t *testing.T) {
	g := tensor.PoolGeom{N: 1, C: 2, H: 5, W: 4, KH: 3, KW: 3, StrideH: 2, StrideW: 2, PadH: 1, PadW: 1, CeilMode: true}
	inf := float32(math.Inf(-1))
	x := make([]float32, g.N*g.C*g.H*g.W)
	for i := range x {
		x[i] = inf
	}
	x[g.H*g.W+7] = 2                    // plane 1: one finite value
	x[g.H*g.W+13] = float32(math.NaN()) // and one NaN
	n := g.N * g.C * g.OutH() * g.OutW()
	run := func(b tensor.Backend) ([]float32, []int32) {
		xb, _ := b.Alloc(len(x), tensor.Float32)
		yb, _ := b.Alloc(n, tensor.Float32)
		ib, _ := b.Alloc(n, tensor.Int32)
		defer func() { b.Free(xb); b.Free(yb); b.Free(ib) }()
		b.Upload(xb, x)
		tensor.Complete(b).MaxPool2d(yb, ib, xb, g)
		y, idx := make([]float32, n), make([]int32, n)
		b.Download(y, yb)
		b.Download(idx, ib)
		return y, idx
	}
	wantY, wantI := run(tensor.CPU)
	gotY, gotI := run(tensortest.CoreOnly(tensor.CPU))
	for o := range wantY {
		same := gotY[o] == wantY[o] || (gotY[o] != gotY[o] && wantY[o] != wantY[o])
		if !same || gotI[o] != wantI[o] {
			t.Errorf("output %d: fallback %g at %d, kernel %g at %d", o, gotY[o], gotI[o], wantY[o], wantI[o])
		}
	}
}
