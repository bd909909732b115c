package tensor_test

import (
	"slices"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// TestUniformGradients checks the gradients that reductions of a whole
// tensor hand on unfilled (a view of their one element, every stride 0)
// against their values worked by hand, exact in float32: adopted by a
// computed tensor and filled for a backward function that reads memory,
// handed on through Add (broadcast too), Expand and Borrow, read by Mul,
// met by another part of the same gradient, added into leaves over two
// steps, scaled and averaged. Every buffer goes back when the scope does.
func TestUniformGradients(t *testing.T) {
	// p and q are [3, 4]; element i is at row i/4, column i%4.
	pv := []float32{-2, -1, 0, 1, 2, 3, -3, 4, 5, -4, 6, 7}
	qv := []float32{1, -1, 2, -2, 3, -3, 4, -4, 5, -5, 6, -6}
	pos := func(v float32) float32 {
		if v > 0 {
			return 1
		}
		return 0
	}
	relu := tensor.ReLU
	all := []int{0, 1}
	cases := []struct {
		name   string
		loss   func(p, q *tensor.Tensor) *tensor.Tensor
		dp, dq func(i int) float32 // nil: no gradient
	}{
		{"sum(relu p + relu q)", func(p, q *tensor.Tensor) *tensor.Tensor { return tensor.Sum(tensor.Add(relu(p), relu(q))) },
			func(i int) float32 { return pos(pv[i]) }, func(i int) float32 { return pos(qv[i]) }},
		{"sum(relu p) + sum(relu p · relu p)", func(p, q *tensor.Tensor) *tensor.Tensor {
			r := relu(p)
			return tensor.Add(tensor.Sum(r), tensor.Sum(tensor.Mul(r, r)))
		}, func(i int) float32 { return pos(pv[i]) * (1 + 2*max(pv[i], 0)) }, nil},
		{"sum(r + r), r = relu p", func(p, q *tensor.Tensor) *tensor.Tensor {
			r := relu(p)
			return tensor.Sum(tensor.Add(r, r))
		}, func(i int) float32 { return 2 * pos(pv[i]) }, nil},
		{"sum(p) + sum(p)", func(p, q *tensor.Tensor) *tensor.Tensor { return tensor.Add(tensor.Sum(p), tensor.Sum(p)) },
			func(i int) float32 { return 2 }, nil},
		{"3 · sum(p + q)", func(p, q *tensor.Tensor) *tensor.Tensor { return tensor.MulScalar(tensor.Sum(tensor.Add(p, q)), 3) },
			func(i int) float32 { return 3 }, func(i int) float32 { return 3 }},
		{"mean over all of (relu p + q)", func(p, q *tensor.Tensor) *tensor.Tensor {
			return tensor.MeanAxes(tensor.Add(relu(p), q), all, false)
		}, func(i int) float32 { return pos(pv[i]) / 12 }, func(i int) float32 { return 1.0 / 12 }},
		{"sum over all axes of relu(q) · p", func(p, q *tensor.Tensor) *tensor.Tensor {
			return tensor.SumAxes(tensor.Mul(relu(q), p), all, true)
		}, func(i int) float32 { return max(qv[i], 0) }, func(i int) float32 { return pos(qv[i]) * pv[i] }},
		{"sum(p · p)", func(p, q *tensor.Tensor) *tensor.Tensor { return tensor.Sum(tensor.Mul(p, p)) },
			func(i int) float32 { return 2 * pv[i] }, nil},
		{"sum(relu p · q) / 2", func(p, q *tensor.Tensor) *tensor.Tensor {
			return tensor.MulScalar(tensor.Sum(tensor.Mul(relu(p), q)), 0.5)
		}, func(i int) float32 { return pos(pv[i]) * qv[i] / 2 }, func(i int) float32 { return max(pv[i], 0) / 2 }},
		{"sum(p + q's first row, broadcast)", func(p, q *tensor.Tensor) *tensor.Tensor {
			return tensor.Sum(tensor.Add(p, q.Narrow(0, 0, 1)))
		}, func(i int) float32 { return 1 }, func(i int) float32 { return 3 * float32(1-min(i/4, 1)) }},
		{"mean over all of (relu p + q's first column, broadcast)", func(p, q *tensor.Tensor) *tensor.Tensor {
			return tensor.MeanAxes(tensor.Add(relu(p), q.Narrow(1, 0, 1)), all, false)
		}, func(i int) float32 { return pos(pv[i]) / 12 }, func(i int) float32 {
			if i%4 == 0 {
				return 4 * (float32(1) / 12)
			}
			return 0
		}},
		{"sum(q's first row expanded · p)", func(p, q *tensor.Tensor) *tensor.Tensor {
			return tensor.Sum(tensor.Mul(q.Narrow(0, 0, 1).Expand(3, 4), p))
		}, func(i int) float32 { return qv[i%4] }, func(i int) float32 {
			if i >= 4 {
				return 0
			}
			return (pv[i] + pv[i+4]) + pv[i+8]
		}},
		{"sum of relu p transposed", func(p, q *tensor.Tensor) *tensor.Tensor { return tensor.Sum(relu(p).Transpose(0, 1)) },
			func(i int) float32 { return pos(pv[i]) }, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			be := tensor.NewCountingCPU()
			p := tensor.FromFloat32(be, nil, pv, 3, 4).SetRequiresGrad(true)
			q := tensor.FromFloat32(be, nil, qv, 3, 4).SetRequiresGrad(true)
			s := tensor.NewScope()
			for step := 1; step <= 2; step++ {
				s.Reset()
				c.loss(s.Borrow(p), s.Borrow(q)).Backward()
				for _, x := range []struct {
					name string
					leaf *tensor.Tensor
					d    func(i int) float32
				}{{"p", p, c.dp}, {"q", q, c.dq}} {
					if x.d == nil {
						if x.leaf.Grad() != nil {
							t.Fatalf("step %d: d%s exists, want none", step, x.name)
						}
						continue
					}
					want := make([]float32, len(pv))
					for i := range want {
						want[i] = float32(step) * x.d(i)
					}
					if got := x.leaf.Grad().Float32s(); !slices.Equal(got, want) {
						t.Errorf("step %d: d%s = %v, want %v", step, x.name, got, want)
					}
				}
			}
			s.Release()
			for _, x := range []*tensor.Tensor{p, q} {
				if g := x.Grad(); g != nil {
					g.Release()
				}
				x.Release()
			}
			if be.Live() != 0 || be.BadFrees() != 0 {
				t.Errorf("after release: %d bytes live, %d bad frees", be.Live(), be.BadFrees())
			}
		})
	}
}
