package tensor_test

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// bnForward64 is batch norm in training mode (batch statistics, biased
// variance, eps 1e-5) of x [n, c, inner] with weight w and bias b.
func bnForward64(x, w, b []float64, n, c, inner int) []float64 {
	y := make([]float64, len(x))
	m := float64(n * inner)
	for ch := 0; ch < c; ch++ {
		var s, q float64
		for o := 0; o < n; o++ {
			for i := 0; i < inner; i++ {
				s += x[(o*c+ch)*inner+i]
			}
		}
		mean := s / m
		for o := 0; o < n; o++ {
			for i := 0; i < inner; i++ {
				d := x[(o*c+ch)*inner+i] - mean
				q += d * d
			}
		}
		inv := 1 / math.Sqrt(q/m+1e-5)
		for o := 0; o < n; o++ {
			for i := 0; i < inner; i++ {
				k := (o*c+ch)*inner + i
				y[k] = (x[k]-mean)*inv*w[ch] + b[ch]
			}
		}
	}
	return y
}

// lnForward64 is layer norm over rows of cols (eps 1e-5), weight and bias
// per column.
func lnForward64(x, w, b []float64, cols int) []float64 {
	y := make([]float64, len(x))
	for r := 0; r < len(x)/cols; r++ {
		row := x[r*cols : (r+1)*cols]
		var s, q float64
		for _, v := range row {
			s += v
		}
		mean := s / float64(cols)
		for _, v := range row {
			q += (v - mean) * (v - mean)
		}
		inv := 1 / math.Sqrt(q/float64(cols)+1e-5)
		for j, v := range row {
			y[r*cols+j] = (v-mean)*inv*w[j] + b[j]
		}
	}
	return y
}

func randData(rng *rand.Rand, n int, mean float64) []float32 {
	d := make([]float32, n)
	for i := range d {
		d[i] = float32(mean + rng.NormFloat64())
	}
	return d
}

// TestGradBatchNorm checks BatchNorm's backward pass (training mode, where
// dx has the terms through the batch statistics) against finite
// differences.
func TestGradBatchNorm(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	const n, c, h, w = 2, 3, 3, 2
	checkFD(t, fdCase{
		name:   "BatchNorm2d",
		shapes: [][]int{{n, c, h, w}, {c}, {c}},
		grad:   []bool{true, true, true},
		data:   [][]float32{randData(rng, n*c*h*w, 1), randData(rng, c, 0), randData(rng, c, 0)},
		op: func(in []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
			return tensor.BatchNorm(in[0], in[1], in[2], nil, nil, true, 0.1, 1e-5)
		},
		ref: func(in [][]float64, _ []int32) []float64 { return bnForward64(in[0], in[1], in[2], n, c, h*w) },
	}, rng)
}

// TestGradLayerNorm checks LayerNorm's backward pass against finite
// differences, over the last two dimensions.
func TestGradLayerNorm(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	const rows, a, b = 3, 2, 5
	checkFD(t, fdCase{
		name:   "LayerNorm",
		shapes: [][]int{{rows, a, b}, {a, b}, {a, b}},
		grad:   []bool{true, true, true},
		data:   [][]float32{randData(rng, rows*a*b, 2), randData(rng, a*b, 0), randData(rng, a*b, 0)},
		op: func(in []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
			return tensor.LayerNorm(in[0], []int{a, b}, in[1], in[2], 1e-5)
		},
		ref: func(in [][]float64, _ []int32) []float64 { return lnForward64(in[0], in[1], in[2], a*b) },
	}, rng)
}

// plainBackend is the CPU backend seen through the Backend interface only,
// so that the tensor layer takes its fallbacks (NormBackend absent).
type plainBackend struct{ tensor.CompleteBackend }

// TestNormFallback runs BatchNorm (training, with running statistics) and
// LayerNorm, forward and backward, on a backend without NormBackend and
// requires the CPU backend's results bit for bit (the fallback runs the
// same code on host copies).
func TestNormFallback(t *testing.T) {
	if _, ok := tensor.Backend(plainBackend{tensor.Complete(tensor.CPU)}).(tensor.NormBackend); ok {
		t.Fatal("plainBackend should hide NormBackend")
	}
	rng := rand.New(rand.NewPCG(11, 12))
	x, w, b := randData(rng, 2*3*5, 3), randData(rng, 3, 1), randData(rng, 3, 0)
	run := func(be tensor.Backend) (out [][]float32) {
		s := tensor.NewScope()
		defer s.Release()
		xt := tensor.FromFloat32(be, s, x, 2, 3, 5).SetRequiresGrad(true)
		wt := tensor.FromFloat32(be, s, w, 3).SetRequiresGrad(true)
		bt := tensor.FromFloat32(be, s, b, 3).SetRequiresGrad(true)
		rm, rv := tensor.Zeros(be, s, 3), tensor.Full(be, s, 1, 3)
		y := tensor.BatchNorm(xt, wt, bt, rm, rv, true, 0.1, 1e-5)
		z := tensor.LayerNorm(y, []int{5}, nil, nil, 1e-5)
		tensor.Sum(tensor.Mul(z, tensor.FromFloat32(be, s, randData(rand.New(rand.NewPCG(1, 2)), 30, 0), 2, 3, 5))).Backward()
		return [][]float32{z.Float32s(), xt.Grad().Float32s(), wt.Grad().Float32s(), bt.Grad().Float32s(), rm.Float32s(), rv.Float32s()}
	}
	want, got := run(tensor.CPU), run(plainBackend{tensor.Complete(tensor.CPU)})
	for i := range want {
		for j := range want[i] {
			if math.Float32bits(want[i][j]) != math.Float32bits(got[i][j]) {
				t.Fatalf("result %d element %d: fallback %v, CPU %v", i, j, got[i][j], want[i][j])
			}
		}
	}
}

// TestNormMisuse checks that shape errors panic naming the op and shapes.
func TestNormMisuse(t *testing.T) {
	be, s := tensor.CPU, tensor.NewScope()
	defer s.Release()
	mustPanic := func(want string, f func()) {
		t.Helper()
		defer func() {
			r := recover()
			if s, ok := r.(string); !ok || !strings.Contains(s, want) {
				t.Errorf("panic %v, want a message containing %q", r, want)
			}
		}()
		f()
	}
	x := tensor.Zeros(be, s, 2, 3, 4)
	mustPanic("BatchNorm weight [4] for input [2 3 4]", func() { tensor.BatchNorm(x, tensor.Zeros(be, s, 4), nil, nil, nil, true, 0.1, 1e-5) })
	mustPanic("evaluation mode without running statistics", func() { tensor.BatchNorm(x, nil, nil, nil, nil, false, 0.1, 1e-5) })
	mustPanic("more than one value per channel", func() { tensor.BatchNorm(tensor.Zeros(be, s, 1, 3), nil, nil, nil, nil, true, 0.1, 1e-5) })
	mustPanic("LayerNorm of [2 3 4] over [3]", func() { tensor.LayerNorm(x, []int{3}, nil, nil, 1e-5) })
	mustPanic("LayerNorm weight [3] for normalized shape [3 4]", func() { tensor.LayerNorm(x, []int{3, 4}, tensor.Zeros(be, s, 3), nil, 1e-5) })
	mustPanic("Dropout probability 1.5", func() { tensor.Dropout(x, 1.5, true, tensor.NewGenerator(1)) })
}
