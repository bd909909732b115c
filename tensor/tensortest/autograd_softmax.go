package tensortest

import (
	"fmt"
	"math"

	"github.com/ember-ml/ember/tensor"
)

// softmaxAutogradCases: Softmax and LogSoftmax over the last axis and over
// a middle one (the column layout of the backends), and CrossEntropyLoss in
// both of torch's layouts with label smoothing, an ignore index and both
// reductions. tolAG, normwise: sums over at most a few hundred terms.
func softmaxAutogradCases() []agCase {
	cases := []agCase{
		softmaxCase("Softmax/last axis", []int{7, 33}, -1, false),
		softmaxCase("Softmax/middle axis", []int{3, 5, 4}, 1, false),
		softmaxCase("LogSoftmax/last axis", []int{9, 10}, 1, true),
		softmaxCase("LogSoftmax/first axis", []int{6, 2, 3}, 0, true),
	}
	for _, c := range []struct {
		shape []int // logits [N, C, d...]
		opt   tensor.CrossEntropyOptions
	}{
		{[]int{9, 5}, tensor.CrossEntropyOptions{}},
		{[]int{9, 5}, tensor.CrossEntropyOptions{LabelSmoothing: 0.1}},
		{[]int{9, 5}, tensor.CrossEntropyOptions{Reduction: tensor.LossSum, Ignore: true, IgnoreIndex: 0}},
		{[]int{4, 6, 3}, tensor.CrossEntropyOptions{}},
		{[]int{3, 4, 2, 5}, tensor.CrossEntropyOptions{LabelSmoothing: 0.25, Ignore: true, IgnoreIndex: 2}},
		{[]int{5, 7, 3}, tensor.CrossEntropyOptions{Reduction: tensor.LossSum, LabelSmoothing: 1}},
	} {
		for _, direct := range []bool{true, false} {
			cases = append(cases, crossEntropyLossCase(c.shape, c.opt, direct))
		}
	}
	return cases
}

func softmaxCase(name string, shape []int, axis int, log bool) agCase {
	a := axis
	if a < 0 {
		a += len(shape)
	}
	outer, n, inner := 1, shape[a], 1
	for _, d := range shape[:a] {
		outer *= d
	}
	for _, d := range shape[a+1:] {
		inner *= d
	}
	return agCase{
		name: name, inputs: []agInput{in(true, shape...)}, tol: tolAG,
		fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
			if log {
				return tensor.LogSoftmax(t[0], axis)
			}
			return tensor.Softmax(t[0], axis)
		},
		ref: func(v [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
			y, _ := refSoftmax(v[0], outer, n, inner, log)
			dx := make([]float64, len(y))
			for o := 0; o < outer; o++ {
				for r := 0; r < inner; r++ {
					at := func(i int) int { return (o*n+i)*inner + r }
					s := 0.0
					for i := 0; i < n; i++ {
						if log {
							s += float64(g[at(i)])
						} else {
							s += float64(g[at(i)]) * y[at(i)]
						}
					}
					for i := 0; i < n; i++ {
						if log {
							dx[at(i)] = float64(g[at(i)]) - math.Exp(y[at(i)])*s
						} else {
							dx[at(i)] = y[at(i)] * (float64(g[at(i)]) - s)
						}
					}
				}
			}
			return y, [][]float64{dx}
		},
	}
}

// crossEntropyLossCase checks CrossEntropyLoss against torch's definition:
// with p = softmax over axis 1 and ε the smoothing, each counted target t
// costs (1-ε)·(-log p_t) + (ε/C)·Σ_c (-log p_c); the mean divides by the
// number of counted targets. Its gradient with respect to logit c is, per
// counted target, (1-ε)·(p_c - [c = t]) + ε·(p_c - 1/C), scaled likewise.
func crossEntropyLossCase(shape []int, opt tensor.CrossEntropyOptions, direct bool) agCase {
	n, classes := shape[0], shape[1]
	inner := 1
	for _, d := range shape[2:] {
		inner *= d
	}
	labShape := append([]int{n}, shape[2:]...)
	name := fmt.Sprintf("CrossEntropyLoss/logits %v smoothing %g reduction %d ignore %v", shape, opt.LabelSmoothing, opt.Reduction, opt.Ignore)
	if opt.Ignore {
		name += fmt.Sprintf(" index %d", opt.IgnoreIndex)
	}
	if !direct {
		name += " (scaled gradient)"
	}
	return agCase{
		name: name, inputs: []agInput{in(true, shape...)}, labels: [2]int{n * inner, classes}, direct: direct, tol: tolAG,
		fwd: func(t []*tensor.Tensor, lab *tensor.Tensor) *tensor.Tensor {
			return tensor.CrossEntropyLoss(t[0], lab.Reshape(labShape...), opt)
		},
		ref: func(v [][]float32, lab []int32, g []float32) ([]float64, [][]float64) {
			eps, x := float64(opt.LabelSmoothing), v[0]
			loss, counted := 0.0, 0
			dx := make([]float64, len(x))
			for o := 0; o < n; o++ {
				for r := 0; r < inner; r++ {
					t := lab[o*inner+r]
					if opt.Ignore && t == opt.IgnoreIndex {
						continue
					}
					counted++
					at := func(c int) int { return (o*classes+c)*inner + r }
					m := math.Inf(-1)
					for c := 0; c < classes; c++ {
						m = math.Max(m, float64(x[at(c)]))
					}
					se := 0.0
					for c := 0; c < classes; c++ {
						se += math.Exp(float64(x[at(c)]) - m)
					}
					lse := m + math.Log(se)
					smooth := 0.0
					for c := 0; c < classes; c++ {
						smooth += lse - float64(x[at(c)])
					}
					loss += (1-eps)*(lse-float64(x[at(int(t))])) + eps*smooth/float64(classes)
					for c := 0; c < classes; c++ {
						p := math.Exp(float64(x[at(c)]) - lse)
						hot := 0.0
						if c == int(t) {
							hot = 1
						}
						dx[at(c)] = (1-eps)*(p-hot) + eps*(p-1/float64(classes))
					}
				}
			}
			s := 1.0
			if opt.Reduction == tensor.LossMean {
				s = 1 / float64(counted)
			}
			return []float64{loss * s}, [][]float64{scaled(dx, s*float64(g[0]))}
		},
	}
}
