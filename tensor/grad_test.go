package tensor_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// Finite-difference checks of every backward pass. For each operation the
// test writes a float64 forward function, takes the scalar
// f = Σ W·out (W random, fixed) and computes central differences
//
//	∂f/∂x_i ≈ (f(x + h·e_i) − f(x − h·e_i)) / 2h,  h = 1e-6·max(1, |x_i|)
//
// entirely in float64, at exactly the float32 inputs the tensor code sees.
// The truncation error is O(h²·f''') ≈ 1e-12 and the rounding error about
// 1e-16·|f|/h ≈ 1e-9, so the differences are exact to ~1e-8 and what is
// measured is the error of our float32 analytic gradient: a few float32
// roundings (2⁻²⁴ ≈ 6e-8) per accumulated term, about 1e-6 relative for
// the sizes used. The usual check of a float32 gradient against
// differences taken in float32 needs ~1e-3; with float64 differences we
// can afford
//
//	|analytic_i − fd_i| ≤ 1e-4·|fd_i| + 1e-5·max_j |fd_j|
//
// (1e-4 relative per element, with a normwise floor for elements much
// smaller than the largest, whose absolute rounding error scales with the
// magnitudes summed): still ~100× the expected error, and tight enough to
// catch a gradient that is off by 0.1% (a wrong scale, a missed term).
//
// ReLU and max pooling are not differentiable at their kinks, so the inputs
// are built away from them: ReLU inputs have |x| ≥ 0.05 and pooling inputs
// are distinct values at least ~1e-3 apart, far larger than h. The seeds
// are fixed: these checks are deterministic.

const fdH = 1e-6

// fdCase is one operation under test: inputs (float32 data, shapes, which
// ones need a gradient), the tensor computation and its float64 twin.
type fdCase struct {
	name   string
	shapes [][]int
	grad   []bool
	data   [][]float32
	labels []int32
	// op builds the output from tensors made from data.
	op func(in []*tensor.Tensor, labels *tensor.Tensor) *tensor.Tensor
	// ref is the same computation in float64.
	ref func(in [][]float64, labels []int32) []float64
}

func toF64(s []float32) []float64 {
	out := make([]float64, len(s))
	for i, v := range s {
		out[i] = float64(v)
	}
	return out
}

// checkFD runs c: analytic gradients of Σ W·out by Backward on the CPU in
// float32, finite differences on the float64 reference.
func checkFD(t *testing.T, c fdCase, rng *rand.Rand) {
	t.Helper()
	s := tensor.NewScope()
	defer s.Release()
	ts := make([]*tensor.Tensor, len(c.data))
	for i, d := range c.data {
		ts[i] = tensor.FromFloat32(tensor.CPU, s, d, c.shapes[i]...)
		if c.grad[i] {
			ts[i].SetRequiresGrad(true)
		}
	}
	var lab *tensor.Tensor
	if c.labels != nil {
		lab = tensor.FromInt32(tensor.CPU, s, c.labels, len(c.labels))
	}
	out := c.op(ts, lab)
	w := make([]float32, out.Len())
	for i := range w {
		w[i] = float32(rng.NormFloat64())
	}
	tensor.Sum(tensor.Mul(out, tensor.FromFloat32(tensor.CPU, s, w, out.Shape()...))).Backward()

	// The forward pass must match the reference too.
	in64 := make([][]float64, len(c.data))
	for i, d := range c.data {
		in64[i] = toF64(d)
	}
	want := c.ref(in64, c.labels)
	got := out.Float32s()
	if len(got) != len(want) {
		t.Fatalf("%s: forward has %d values, reference %d", c.name, len(got), len(want))
	}
	maxW := 0.0
	for _, v := range want {
		maxW = math.Max(maxW, math.Abs(v))
	}
	for i := range want {
		if math.Abs(float64(got[i])-want[i]) > 1e-5*maxW+1e-5*math.Abs(want[i]) {
			t.Errorf("%s: forward element %d: got %.9g, float64 reference %.9g", c.name, i, got[i], want[i])
			break
		}
	}

	f := func() float64 {
		out := c.ref(in64, c.labels)
		var s float64
		for i, v := range out {
			s += float64(w[i]) * v
		}
		return s
	}
	for i := range c.data {
		if !c.grad[i] {
			if ts[i].Grad() != nil {
				t.Errorf("%s: input %d does not require grad but got one", c.name, i)
			}
			continue
		}
		if ts[i].Grad() == nil {
			t.Errorf("%s: input %d has no gradient", c.name, i)
			continue
		}
		analytic := ts[i].Grad().Float32s()
		fd := make([]float64, len(in64[i]))
		for j, x := range in64[i] {
			h := fdH * math.Max(1, math.Abs(x))
			in64[i][j] = x + h
			fp := f()
			in64[i][j] = x - h
			fm := f()
			in64[i][j] = x
			fd[j] = (fp - fm) / (2 * h)
		}
		maxFD := 0.0
		for _, v := range fd {
			maxFD = math.Max(maxFD, math.Abs(v))
		}
		worst, worstR, bad := -1, 0.0, 0
		for j := range fd {
			err := math.Abs(float64(analytic[j]) - fd[j])
			allowed := 1e-4*math.Abs(fd[j]) + 1e-5*maxFD
			if err > allowed {
				bad++
			}
			if r := err / allowed; r > worstR || worst < 0 {
				worst, worstR = j, r
			}
		}
		if bad > 0 {
			t.Errorf("%s: gradient of input %d %v: %d of %d elements off; worst at %d: analytic %.9g, finite difference %.9g (max |fd| %.3g)",
				c.name, i, c.shapes[i], bad, len(fd), worst, analytic[worst], fd[worst], maxFD)
		}
		ts[i].Grad().Release()
	}
}

// ---------------------------------------------------------------------------
// float64 forward functions.

func matmul64(a, b []float64, m, k, n int) []float64 {
	c := make([]float64, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			for p := 0; p < k; p++ {
				c[i*n+j] += a[i*k+p] * b[p*n+j]
			}
		}
	}
	return c
}

// linear64 is x·wᵀ + b, x [n,in], w [out,in], b [out] or nil.
func linear64(x, w, b []float64, n, in, out int) []float64 {
	y := make([]float64, n*out)
	for i := 0; i < n; i++ {
		for o := 0; o < out; o++ {
			s := 0.0
			if b != nil {
				s = b[o]
			}
			for k := 0; k < in; k++ {
				s += x[i*in+k] * w[o*in+k]
			}
			y[i*out+o] = s
		}
	}
	return y
}

// conv64 is nn.Conv2d's forward: x [N,C,H,W], w [K,C,R,S], b [K] or nil.
func conv64(x, w, b []float64, n, c, h, wd, k, r, s, stride, pad int) []float64 {
	oh, ow := (h+2*pad-r)/stride+1, (wd+2*pad-s)/stride+1
	y := make([]float64, n*k*oh*ow)
	for in := 0; in < n; in++ {
		for ik := 0; ik < k; ik++ {
			for i := 0; i < oh; i++ {
				for j := 0; j < ow; j++ {
					sum := 0.0
					if b != nil {
						sum = b[ik]
					}
					for ic := 0; ic < c; ic++ {
						for ir := 0; ir < r; ir++ {
							for is := 0; is < s; is++ {
								hh, ww := i*stride+ir-pad, j*stride+is-pad
								if hh >= 0 && hh < h && ww >= 0 && ww < wd {
									sum += x[((in*c+ic)*h+hh)*wd+ww] * w[((ik*c+ic)*r+ir)*s+is]
								}
							}
						}
					}
					y[((in*k+ik)*oh+i)*ow+j] = sum
				}
			}
		}
	}
	return y
}

// pool64 is nn.MaxPool2d's forward (no padding).
func pool64(x []float64, n, c, h, w, k, stride int) []float64 {
	oh, ow := (h-k)/stride+1, (w-k)/stride+1
	y := make([]float64, n*c*oh*ow)
	for p := 0; p < n*c; p++ {
		for i := 0; i < oh; i++ {
			for j := 0; j < ow; j++ {
				m := math.Inf(-1)
				for r := 0; r < k; r++ {
					for s := 0; s < k; s++ {
						m = math.Max(m, x[p*h*w+(i*stride+r)*w+j*stride+s])
					}
				}
				y[(p*oh+i)*ow+j] = m
			}
		}
	}
	return y
}

// crossEntropy64 is the mean over rows of logsumexp(z) − z[label].
func crossEntropy64(z []float64, labels []int32, classes int) float64 {
	n := len(labels)
	total := 0.0
	for r := 0; r < n; r++ {
		row := z[r*classes : (r+1)*classes]
		m := math.Inf(-1)
		for _, v := range row {
			m = math.Max(m, v)
		}
		se := 0.0
		for _, v := range row {
			se += math.Exp(v - m)
		}
		total += m + math.Log(se) - row[labels[r]]
	}
	return total / float64(n)
}

// ---------------------------------------------------------------------------
// Input makers.

func normals(rng *rand.Rand, n int, std float64) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(rng.NormFloat64() * std)
	}
	return s
}

// awayFromZero returns normal values with |x| ≥ 0.05 (no ReLU kink).
func awayFromZero(rng *rand.Rand, n int) []float32 {
	s := normals(rng, n, 1)
	for i, v := range s {
		if math.Abs(float64(v)) < 0.05 {
			s[i] = float32(math.Copysign(0.05+math.Abs(float64(v)), float64(v)))
		}
	}
	return s
}

// distinctValues returns a random permutation of n values spaced 2/n apart
// in [-1, 1]: no ties in any pooling window.
func distinctValues(rng *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i, p := range rng.Perm(n) {
		s[i] = float32(2*(float64(p)+0.5)/float64(n) - 1)
	}
	return s
}

// ---------------------------------------------------------------------------
// Tests.

func TestGradLinear(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	for _, bias := range []bool{true, false} {
		n, in, out := 5, 7, 4
		c := fdCase{
			name:   fmt.Sprintf("Linear bias=%v", bias),
			shapes: [][]int{{n, in}, {out, in}},
			grad:   []bool{true, true},
			data:   [][]float32{normals(rng, n*in, 1), normals(rng, out*in, 1)},
			op: func(ts []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
				var b *tensor.Tensor
				if bias {
					b = ts[2]
				}
				return tensor.Linear(ts[0], ts[1], b)
			},
			ref: func(v [][]float64, _ []int32) []float64 {
				var b []float64
				if bias {
					b = v[2]
				}
				return linear64(v[0], v[1], b, n, in, out)
			},
		}
		if bias {
			c.shapes = append(c.shapes, []int{out})
			c.grad = append(c.grad, true)
			c.data = append(c.data, normals(rng, out, 1))
		}
		checkFD(t, c, rng)
	}
}

func TestGradConv2d(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	type cc struct{ n, c, h, w, k, r, stride, pad int }
	for _, g := range []cc{
		{2, 1, 6, 6, 2, 3, 1, 0},
		{2, 3, 7, 5, 4, 3, 2, 1}, // stride 2, padding 1, non-square
		{1, 2, 6, 8, 3, 5, 1, 2}, // padding 2 with a 5×5 kernel
		{2, 3, 8, 9, 2, 3, 2, 0}, // stride 2, output a floor
		{1, 2, 5, 7, 3, 3, 2, 2}, // stride 2, padding 2
		{1, 4, 4, 4, 2, 1, 1, 0}, // 1×1 kernel
		{1, 8, 5, 5, 3, 3, 1, 0}, // many channels
	} {
		for _, bias := range []bool{true, false} {
			c := fdCase{
				name:   fmt.Sprintf("Conv2d %+v bias=%v", g, bias),
				shapes: [][]int{{g.n, g.c, g.h, g.w}, {g.k, g.c, g.r, g.r}},
				grad:   []bool{true, true},
				data:   [][]float32{normals(rng, g.n*g.c*g.h*g.w, 1), normals(rng, g.k*g.c*g.r*g.r, 1)},
				op: func(ts []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
					var b *tensor.Tensor
					if bias {
						b = ts[2]
					}
					return tensor.Conv2d(ts[0], ts[1], b, g.stride, g.pad)
				},
				ref: func(v [][]float64, _ []int32) []float64 {
					var b []float64
					if bias {
						b = v[2]
					}
					return conv64(v[0], v[1], b, g.n, g.c, g.h, g.w, g.k, g.r, g.r, g.stride, g.pad)
				},
			}
			if bias {
				c.shapes = append(c.shapes, []int{g.k})
				c.grad = append(c.grad, true)
				c.data = append(c.data, normals(rng, g.k, 1))
			}
			checkFD(t, c, rng)
		}
	}
	// Only the weight needs a gradient (the input is data), then only
	// the input.
	for _, which := range []int{0, 1} {
		c := fdCase{
			name:   fmt.Sprintf("Conv2d gradient of input %d only", which),
			shapes: [][]int{{2, 2, 5, 5}, {3, 2, 3, 3}, {3}},
			grad:   []bool{which == 0, which == 1, false},
			data:   [][]float32{normals(rng, 100, 1), normals(rng, 54, 1), normals(rng, 3, 1)},
			op: func(ts []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
				return tensor.Conv2d(ts[0], ts[1], ts[2], 1, 1)
			},
			ref: func(v [][]float64, _ []int32) []float64 {
				return conv64(v[0], v[1], v[2], 2, 2, 5, 5, 3, 3, 3, 1, 1)
			},
		}
		checkFD(t, c, rng)
	}
}

func TestGradMaxPool2d(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	type pc struct{ n, c, h, w, k, stride int }
	for _, g := range []pc{
		{2, 2, 6, 6, 2, 2},
		{1, 3, 7, 9, 2, 2}, // odd sizes: the last row/column is dropped
		{2, 1, 9, 9, 3, 2}, // overlapping windows
		{1, 2, 5, 6, 2, 1}, // overlapping, stride 1
		{1, 1, 7, 7, 3, 1},
	} {
		c := fdCase{
			name:   fmt.Sprintf("MaxPool2d %+v", g),
			shapes: [][]int{{g.n, g.c, g.h, g.w}},
			grad:   []bool{true},
			data:   [][]float32{distinctValues(rng, g.n*g.c*g.h*g.w)},
			op: func(ts []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
				return tensor.MaxPool2d(ts[0], g.k, g.stride)
			},
			ref: func(v [][]float64, _ []int32) []float64 { return pool64(v[0], g.n, g.c, g.h, g.w, g.k, g.stride) },
		}
		checkFD(t, c, rng)
	}
}

func TestGradReLU(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	checkFD(t, fdCase{
		name:   "ReLU",
		shapes: [][]int{{3, 50}},
		grad:   []bool{true},
		data:   [][]float32{awayFromZero(rng, 150)},
		op:     func(ts []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor { return tensor.ReLU(ts[0]) },
		ref: func(v [][]float64, _ []int32) []float64 {
			out := make([]float64, len(v[0]))
			for i, x := range v[0] {
				out[i] = math.Max(x, 0)
			}
			return out
		},
	}, rng)
}

func TestGradCrossEntropy(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	for _, c := range []struct {
		n, classes int
		scale      float64
	}{{1, 3, 1}, {6, 10, 1}, {4, 10, 10}, {3, 2, 1}} {
		labels := make([]int32, c.n)
		for i := range labels {
			labels[i] = int32(rng.IntN(c.classes))
		}
		checkFD(t, fdCase{
			name:   fmt.Sprintf("CrossEntropy n=%d classes=%d scale=%g", c.n, c.classes, c.scale),
			shapes: [][]int{{c.n, c.classes}},
			grad:   []bool{true},
			data:   [][]float32{normals(rng, c.n*c.classes, c.scale)},
			labels: labels,
			op:     func(ts []*tensor.Tensor, lab *tensor.Tensor) *tensor.Tensor { return tensor.CrossEntropy(ts[0], lab) },
			ref: func(v [][]float64, lab []int32) []float64 {
				return []float64{crossEntropy64(v[0], lab, c.classes)}
			},
		}, rng)
	}
}

// TestGradCrossEntropyDirect checks the gradient of the loss itself
// (Backward on the loss: the seed-is-one path that hands the gradient
// computed in the forward pass straight to the logits).
func TestGradCrossEntropyDirect(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 6))
	const n, classes = 5, 7
	z := normals(rng, n*classes, 2)
	labels := make([]int32, n)
	for i := range labels {
		labels[i] = int32(rng.IntN(classes))
	}
	s := tensor.NewScope()
	defer s.Release()
	zt := tensor.FromFloat32(tensor.CPU, s, z, n, classes).SetRequiresGrad(true)
	loss := tensor.CrossEntropy(zt, tensor.FromInt32(tensor.CPU, s, labels, n))
	loss.Backward()
	got := zt.Grad().Float32s()
	z64 := toF64(z)
	if want := crossEntropy64(z64, labels, classes); math.Abs(float64(loss.Item())-want) > 1e-6*math.Abs(want) {
		t.Errorf("loss %v, float64 reference %v", loss.Item(), want)
	}
	for i, x := range z64 {
		h := fdH * math.Max(1, math.Abs(x))
		z64[i] = x + h
		fp := crossEntropy64(z64, labels, classes)
		z64[i] = x - h
		fm := crossEntropy64(z64, labels, classes)
		z64[i] = x
		fd := (fp - fm) / (2 * h)
		if math.Abs(float64(got[i])-fd) > 1e-4*math.Abs(fd)+1e-6 {
			t.Errorf("dlogits[%d]: analytic %.9g, finite difference %.9g", i, got[i], fd)
		}
	}
}

func TestGradMatMul(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for _, d := range [][3]int{{3, 4, 5}, {1, 7, 1}, {6, 1, 3}} {
		m, k, n := d[0], d[1], d[2]
		checkFD(t, fdCase{
			name:   fmt.Sprintf("MatMul %dx%d·%dx%d", m, k, k, n),
			shapes: [][]int{{m, k}, {k, n}},
			grad:   []bool{true, true},
			data:   [][]float32{normals(rng, m*k, 1), normals(rng, k*n, 1)},
			op:     func(ts []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor { return tensor.MatMul(ts[0], ts[1]) },
			ref:    func(v [][]float64, _ []int32) []float64 { return matmul64(v[0], v[1], m, k, n) },
		}, rng)
	}
	// A transposed (strided) operand: MatMul makes it contiguous and the
	// gradient flows back through the transpose.
	checkFD(t, fdCase{
		name:   "MatMul of a transposed view",
		shapes: [][]int{{4, 3}, {4, 5}},
		grad:   []bool{true, true},
		data:   [][]float32{normals(rng, 12, 1), normals(rng, 20, 1)},
		op: func(ts []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
			return tensor.MatMul(ts[0].Transpose(0, 1), ts[1])
		},
		ref: func(v [][]float64, _ []int32) []float64 {
			at := make([]float64, 12)
			for i := 0; i < 4; i++ {
				for j := 0; j < 3; j++ {
					at[j*4+i] = v[0][i*3+j]
				}
			}
			return matmul64(at, v[1], 3, 4, 5)
		},
	}, rng)
}

func TestGradMulSumAdd(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 8))
	checkFD(t, fdCase{
		name:   "Mul",
		shapes: [][]int{{4, 6}, {4, 6}},
		grad:   []bool{true, true},
		data:   [][]float32{normals(rng, 24, 1), normals(rng, 24, 1)},
		op:     func(ts []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor { return tensor.Mul(ts[0], ts[1]) },
		ref: func(v [][]float64, _ []int32) []float64 {
			out := make([]float64, 24)
			for i := range out {
				out[i] = v[0][i] * v[1][i]
			}
			return out
		},
	}, rng)
	checkFD(t, fdCase{
		name:   "Mul x*x (fan-out)",
		shapes: [][]int{{9}},
		grad:   []bool{true},
		data:   [][]float32{normals(rng, 9, 1)},
		op:     func(ts []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor { return tensor.Mul(ts[0], ts[0]) },
		ref: func(v [][]float64, _ []int32) []float64 {
			out := make([]float64, 9)
			for i, x := range v[0] {
				out[i] = x * x
			}
			return out
		},
	}, rng)
	checkFD(t, fdCase{
		name:   "Sum",
		shapes: [][]int{{3, 4, 5}},
		grad:   []bool{true},
		data:   [][]float32{normals(rng, 60, 1)},
		op:     func(ts []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor { return tensor.Sum(ts[0]) },
		ref: func(v [][]float64, _ []int32) []float64 {
			s := 0.0
			for _, x := range v[0] {
				s += x
			}
			return []float64{s}
		},
	}, rng)
	checkFD(t, fdCase{
		name:   "Add with one input not requiring grad",
		shapes: [][]int{{10}, {10}},
		grad:   []bool{false, true},
		data:   [][]float32{normals(rng, 10, 1), normals(rng, 10, 1)},
		op:     func(ts []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor { return tensor.Add(ts[0], ts[1]) },
		ref: func(v [][]float64, _ []int32) []float64 {
			out := make([]float64, 10)
			for i := range out {
				out[i] = v[0][i] + v[1][i]
			}
			return out
		},
	}, rng)
}

func TestGradReshapeTranspose(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	// y = Transpose(Reshape(x [2,3,4] → [6,4]), 0,1).Contiguous() · m
	// exercises Reshape, Transpose and Contiguous backward together, the
	// elementwise weight making every position distinguishable.
	m := normals(rng, 24, 1)
	checkFD(t, fdCase{
		name:   "Reshape + Transpose + Contiguous",
		shapes: [][]int{{2, 3, 4}},
		grad:   []bool{true},
		data:   [][]float32{normals(rng, 24, 1)},
		op: func(ts []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
			y := ts[0].Reshape(6, 4).Transpose(0, 1).Contiguous()
			return tensor.Mul(y, tensor.FromFloat32(tensor.CPU, ts[0].Scope(), m, 4, 6))
		},
		ref: func(v [][]float64, _ []int32) []float64 {
			out := make([]float64, 24)
			for i := 0; i < 6; i++ {
				for j := 0; j < 4; j++ {
					out[j*6+i] = v[0][i*4+j] * float64(m[j*6+i])
				}
			}
			return out
		},
	}, rng)
	// Transpose of a 3-D tensor fed straight into an op that needs a
	// contiguous input (Mul calls Contiguous itself), then Flatten.
	checkFD(t, fdCase{
		name:   "Transpose (3-D) into Mul, then Flatten",
		shapes: [][]int{{2, 3, 4}, {4, 3, 2}},
		grad:   []bool{true, true},
		data:   [][]float32{normals(rng, 24, 1), normals(rng, 24, 1)},
		op: func(ts []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
			return tensor.Mul(ts[0].Transpose(0, 2), ts[1]).Flatten()
		},
		ref: func(v [][]float64, _ []int32) []float64 {
			out := make([]float64, 24)
			for a := 0; a < 4; a++ {
				for b := 0; b < 3; b++ {
					for c := 0; c < 2; c++ {
						out[(a*3+b)*2+c] = v[0][(c*3+b)*4+a] * v[1][(a*3+b)*2+c]
					}
				}
			}
			return out
		},
	}, rng)
}

// TestGradSmallConvNet checks a whole network (conv → ReLU → pool →
// flatten → linear → cross-entropy) against finite differences for every
// parameter. The fixed seed was checked to keep every ReLU input and every
// pooling window far (≫ h) from a kink.
func TestGradSmallConvNet(t *testing.T) {
	rng := rand.New(rand.NewPCG(10, 10))
	const n, c, h, w, k, r, classes = 3, 2, 8, 8, 4, 3, 5
	// conv (pad 1) keeps 8×8, pool 2 → 4×4, flatten k·16 = 64.
	labels := make([]int32, n)
	for i := range labels {
		labels[i] = int32(rng.IntN(classes))
	}
	forward64 := func(v [][]float64, lab []int32) []float64 {
		y := conv64(v[0], v[1], v[2], n, c, h, w, k, r, r, 1, 1)
		for i := range y {
			y[i] = math.Max(y[i], 0)
		}
		p := pool64(y, n, k, h, w, 2, 2)
		z := linear64(p, v[3], v[4], n, k*16, classes)
		return []float64{crossEntropy64(z, lab, classes)}
	}
	data := [][]float32{normals(rng, n*c*h*w, 1), normals(rng, k*c*r*r, 0.5), normals(rng, k, 0.1),
		normals(rng, classes*k*16, 0.2), normals(rng, classes, 0.1)}
	// Guard the construction: no ReLU input and no pair of values in a
	// pooling window closer than 1e-4 (a hundred times h times the largest
	// weight) at the chosen seed.
	in64 := make([][]float64, len(data))
	for i, d := range data {
		in64[i] = toF64(d)
	}
	y := conv64(in64[0], in64[1], in64[2], n, c, h, w, k, r, r, 1, 1)
	for _, v := range y {
		if math.Abs(v) < 1e-4 {
			t.Fatalf("a ReLU input is %g, too close to the kink for finite differences; change the seed", v)
		}
	}
	for p := 0; p < n*k; p++ { // the two largest of each window are apart
		for i := 0; i < h; i += 2 {
			for j := 0; j < w; j += 2 {
				a, b := math.Inf(-1), math.Inf(-1)
				for _, v := range []float64{y[p*h*w+i*w+j], y[p*h*w+i*w+j+1], y[p*h*w+(i+1)*w+j], y[p*h*w+(i+1)*w+j+1]} {
					v = math.Max(v, 0)
					if v > a {
						a, b = v, a
					} else if v > b {
						b = v
					}
				}
				if a > 0 && a-b < 1e-4 {
					t.Fatalf("pooling window with near-tied maxima %g, %g; change the seed", a, b)
				}
			}
		}
	}
	checkFD(t, fdCase{
		name:   "conv-relu-pool-linear-crossentropy",
		shapes: [][]int{{n, c, h, w}, {k, c, r, r}, {k}, {classes, k * 16}, {classes}},
		grad:   []bool{true, true, true, true, true},
		data:   data,
		labels: labels,
		op: func(ts []*tensor.Tensor, lab *tensor.Tensor) *tensor.Tensor {
			x := tensor.ReLU(tensor.Conv2d(ts[0], ts[1], ts[2], 1, 1))
			x = tensor.MaxPool2d(x, 2, 2).Flatten()
			return tensor.CrossEntropy(tensor.Linear(x, ts[3], ts[4]), lab)
		},
		ref: forward64,
	}, rng)
}

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}
