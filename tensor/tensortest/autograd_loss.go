package tensortest

import (
	"fmt"

	"github.com/ember-ml/ember/tensor"
)

// lossAutogradCases are CrossEntropyLoss cases beyond autograd_softmax.go's,
// for the shapes and options of ClassLossBackend (on a backend without it
// they check the composed path): [7, 5] and [3, 11, 4, 2] (8 targets per
// sample) with smoothing 0 and 0.1, an ignore index, sum and mean; every
// target ignored (one class, ignored: a sum of 0 and a zero gradient; the
// NaN mean is checked in package tensor); and the loss inside a larger
// graph, scaled by a learnt factor and added to a second loss of the same
// logits, so that its backward pass takes an upstream gradient that is not
// 1 and adds into a gradient already begun. tolAG, normwise.
func lossAutogradCases() []agCase {
	var cases []agCase
	for _, c := range []struct {
		shape []int
		opt   tensor.CrossEntropyOptions
	}{
		{[]int{7, 5}, tensor.CrossEntropyOptions{Reduction: tensor.LossSum}},
		{[]int{7, 5}, tensor.CrossEntropyOptions{LabelSmoothing: 0.1, Ignore: true, IgnoreIndex: 2}},
		{[]int{3, 11, 4, 2}, tensor.CrossEntropyOptions{}},
		{[]int{3, 11, 4, 2}, tensor.CrossEntropyOptions{LabelSmoothing: 0.1, Reduction: tensor.LossSum, Ignore: true, IgnoreIndex: 4}},
		{[]int{4, 1, 3}, tensor.CrossEntropyOptions{LabelSmoothing: 0.1, Reduction: tensor.LossSum, Ignore: true, IgnoreIndex: 0}}, // all ignored
	} {
		for _, direct := range []bool{true, false} {
			cases = append(cases, crossEntropyLossCase(c.shape, c.opt, direct))
		}
	}
	return append(cases, lossInGraphCase([]int{7, 5}), lossInGraphCase([]int{3, 11, 4, 2}))
}

// lossInGraphCase is y·CE(x, smoothing 0.1, ignoring class 1) + CE(x, sum):
// the first loss's gradient is scaled by y (a tensor, so a device value),
// the second adds into the same gradient of x; y's gradient is the first
// loss. The reference composes crossEntropyLossCase's.
func lossInGraphCase(shape []int) agCase {
	optA := tensor.CrossEntropyOptions{LabelSmoothing: 0.1, Ignore: true, IgnoreIndex: 1}
	optB := tensor.CrossEntropyOptions{Reduction: tensor.LossSum}
	a, b := crossEntropyLossCase(shape, optA, true), crossEntropyLossCase(shape, optB, true)
	labShape := append([]int{shape[0]}, shape[2:]...)
	return agCase{
		name:   fmt.Sprintf("CrossEntropyLoss/inside a graph, logits %v", shape),
		inputs: []agInput{in(true, shape...), in(true, 1)}, labels: a.labels, tol: tolAG,
		fwd: func(t []*tensor.Tensor, lab *tensor.Tensor) *tensor.Tensor {
			l := lab.Reshape(labShape...)
			return tensor.Add(tensor.Mul(t[1], tensor.CrossEntropyLoss(t[0], l, optA)), tensor.CrossEntropyLoss(t[0], l, optB))
		},
		ref: func(v [][]float32, lab []int32, g []float32) ([]float64, [][]float64) {
			one := []float32{1}
			la, da := a.ref(v[:1], lab, one)
			lb, db := b.ref(v[:1], lab, one)
			y, g0 := float64(v[1][0]), float64(g[0])
			dx := make([]float64, len(da[0]))
			for i := range dx {
				dx[i] = g0 * (y*da[0][i] + db[0][i])
			}
			return []float64{y*la[0] + lb[0]}, [][]float64{dx, {g0 * la[0]}}
		},
	}
}
