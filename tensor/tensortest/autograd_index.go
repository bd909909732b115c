package tensortest

import "github.com/ember-ml/ember/tensor"

// indexAutogradCases: IndexSelect on the first, a middle and the last
// axis, Embedding by ids of two dimensions, OneHot (through a product with
// an input that takes a gradient). The labels of a case are its indices;
// there are more of them than rows, so some repeat and their gradients add
// up. The forward passes are copies (exact); gradients are sums of a few
// terms: tolAG.
func indexAutogradCases() []agCase {
	return []agCase{
		indexSelectCase("IndexSelect/axis 0", []int{7, 3}, 0, 10),
		indexSelectCase("IndexSelect/middle axis", []int{4, 7, 3}, 1, 12),
		indexSelectCase("IndexSelect/last axis", []int{2, 3, 7}, -1, 9),
		{
			name: "Embedding/ids [2, 6]", inputs: []agInput{in(true, 7, 5)}, labels: [2]int{12, 7}, tol: tolAG,
			fwd: func(t []*tensor.Tensor, lab *tensor.Tensor) *tensor.Tensor {
				return tensor.Embedding(t[0], lab.Reshape(2, 6))
			},
			ref: func(v [][]float32, lab []int32, g []float32) ([]float64, [][]float64) {
				const d = 5
				out, dw := make([]float64, len(lab)*d), make([]float64, 7*d)
				for i, id := range lab {
					for j := 0; j < d; j++ {
						out[i*d+j] = float64(v[0][int(id)*d+j])
						dw[int(id)*d+j] += float64(g[i*d+j])
					}
				}
				return out, [][]float64{dw}
			},
		},
		{
			name: "OneHot/times an input", inputs: []agInput{in(true, 11, 6)}, labels: [2]int{11, 6}, tol: tolElem,
			fwd: func(t []*tensor.Tensor, lab *tensor.Tensor) *tensor.Tensor {
				return tensor.Mul(tensor.OneHot(lab, 6), t[0])
			},
			ref: func(v [][]float32, lab []int32, g []float32) ([]float64, [][]float64) {
				out, dx := make([]float64, 66), make([]float64, 66)
				for i, c := range lab {
					out[i*6+int(c)] = float64(v[0][i*6+int(c)])
					dx[i*6+int(c)] = float64(g[i*6+int(c)])
				}
				return out, [][]float64{dx}
			},
		},
	}
}

// indexSelectCase selects m entries (the labels, in [0, shape[axis])) of an
// input of shape along axis.
func indexSelectCase(name string, shape []int, axis, m int) agCase {
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
		name: name, inputs: []agInput{in(true, shape...)}, labels: [2]int{m, n}, tol: tolAG,
		fwd: func(t []*tensor.Tensor, lab *tensor.Tensor) *tensor.Tensor {
			return tensor.IndexSelect(t[0], axis, lab)
		},
		ref: func(v [][]float32, lab []int32, g []float32) ([]float64, [][]float64) {
			out, dx := make([]float64, outer*m*inner), make([]float64, len(v[0]))
			for o := 0; o < outer; o++ {
				for i, k := range lab {
					for r := 0; r < inner; r++ {
						out[(o*m+i)*inner+r] = float64(v[0][(o*n+int(k))*inner+r])
						dx[(o*n+int(k))*inner+r] += float64(g[(o*m+i)*inner+r])
					}
				}
			}
			return out, [][]float64{dx}
		},
	}
}
