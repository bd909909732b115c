package tensortest

import (
	"fmt"
	"math"

	"github.com/ember-ml/ember/tensor"
)

// refBatchNormAG is the float64 batch norm of x [n, c, inner] and its
// gradients for gout (training: batch statistics; else the given running
// statistics). w, b nil for no affine transform.
func refBatchNormAG(x, w, b, gout []float32, n, c, inner int, training bool, rm, rv []float32, eps float64) ([]float64, []float64, []float64, []float64) {
	groups := bnGroups(n, c, inner)
	mean, inv := make([]float64, c), make([]float64, c)
	for g, idx := range groups {
		mu, v := refStats(x, idx)
		if !training {
			mu, v = float64(rm[g]), float64(rv[g])
		}
		mean[g], inv[g] = mu, 1/math.Sqrt(v+eps)
	}
	ch := func(i int) int { return (i / inner) % c }
	affW, affB := func(int) float64 { return 1 }, func(int) float64 { return 0 }
	if w != nil {
		affW = func(i int) float64 { return float64(w[ch(i)]) }
	}
	if b != nil {
		affB = func(i int) float64 { return float64(b[ch(i)]) }
	}
	y, _ := refNormForward(x, groups, mean, inv, affW, affB)
	dx, _ := refNormBackward(x, gout, groups, mean, inv, affW, training)
	dw, db, _, _ := refAffineGrads(x, gout, groups, mean, inv, c, ch)
	return y, dx, dw, db
}

// batchNormCase is BatchNorm on x of shape (transposed from [C, N, ...]
// when transpose, a strided input) with weight and bias when affine. Eval
// mode uses fixed running statistics; training mode updates a pair of
// running statistics that this case does not check (testBatchNorm does).
func batchNormCase(shape []int, training, affine, transpose bool) agCase {
	n, c := shape[0], shape[1]
	inner := 1
	for _, d := range shape[2:] {
		inner *= d
	}
	inShape := append([]int(nil), shape...)
	if transpose {
		inShape[0], inShape[1] = inShape[1], inShape[0]
	}
	ins := []agInput{in(true, inShape...)}
	if affine {
		ins = append(ins, in(true, c), in(true, c))
	}
	rm, rv := make([]float32, c), make([]float32, c)
	for i := range rm {
		rm[i], rv[i] = 0.1*float32(i)-0.2, 0.5+0.3*float32(i)
	}
	name := fmt.Sprintf("BatchNorm/%v training=%v affine=%v", shape, training, affine)
	if transpose {
		name += " transposed"
	}
	return agCase{
		name: name, inputs: ins, tol: tolAG,
		fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
			x := t[0]
			if transpose {
				x = x.Transpose(0, 1)
			}
			var w, b *tensor.Tensor
			if affine {
				w, b = t[1], t[2]
			}
			be, s := x.Backend(), x.Scope()
			runM, runV := tensor.FromFloat32(be, s, rm, c), tensor.FromFloat32(be, s, rv, c)
			return tensor.BatchNorm(x, w, b, runM, runV, training, 0.1, 1e-5)
		},
		ref: func(v [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
			x := v[0]
			if transpose {
				x = f32s(swapAxes(f64(x), inShape, 0, 1))
			}
			var w, b []float32
			if affine {
				w, b = v[1], v[2]
			}
			y, dx, dw, db := refBatchNormAG(x, w, b, g, n, c, inner, training, rm, rv, 1e-5)
			if transpose {
				dx = swapAxes(dx, shape, 0, 1)
			}
			grads := [][]float64{dx}
			if affine {
				grads = append(grads, dw, db)
			}
			return y, grads
		},
	}
}

// batchNormActCase is BatchNormAct of x with the activation act: the
// reference is batchNormCase's followed by act, its gradient the
// activation's derivative at the reference's own z passed back through
// batch norm's. ReLU's cases are not checked by finite differences (the
// kink); a z within 1e-7 of 0 would flip between the float32 and float64
// masks, which these few fresh normal values make unlikely.
func batchNormActCase(shape []int, training, affine bool, act tensor.UnaryOp) agCase {
	c := batchNormCase(shape, training, affine, false)
	u := unaryRef(act)
	c.name = fmt.Sprintf("BatchNormAct/%s %v training=%v affine=%v", u.name, shape, training, affine)
	c.fwd = func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
		x := t[0]
		var w, b *tensor.Tensor
		if affine {
			w, b = t[1], t[2]
		}
		be, s := x.Backend(), x.Scope()
		ch := shape[1]
		rm, rv := make([]float32, ch), make([]float32, ch)
		for i := range rm {
			rm[i], rv[i] = 0.1*float32(i)-0.2, 0.5+0.3*float32(i)
		}
		runM, runV := tensor.FromFloat32(be, s, rm, ch), tensor.FromFloat32(be, s, rv, ch)
		return tensor.BatchNormAct(x, w, b, runM, runV, training, 0.1, 1e-5, act)
	}
	n, ch := shape[0], shape[1]
	inner := 1
	for _, d := range shape[2:] {
		inner *= d
	}
	c.ref = func(v [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
		x := v[0]
		var w, b []float32
		if affine {
			w, b = v[1], v[2]
		}
		rm, rv := make([]float32, ch), make([]float32, ch)
		for i := range rm {
			rm[i], rv[i] = 0.1*float32(i)-0.2, 0.5+0.3*float32(i)
		}
		z, _, _, _ := refBatchNormAG(x, w, b, make([]float32, len(x)), n, ch, inner, training, rm, rv, 1e-5)
		y := make([]float64, len(z))
		gz := make([]float32, len(z))
		for i, zi := range z {
			y[i] = u.f(zi, 0, 0)
			gz[i] = float32(float64(g[i]) * u.df(zi, 0, 0))
		}
		_, dx, dw, db := refBatchNormAG(x, w, b, gz, n, ch, inner, training, rm, rv, 1e-5)
		grads := [][]float64{dx}
		if affine {
			grads = append(grads, dw, db)
		}
		return y, grads
	}
	return c
}

func f32s(s []float64) []float32 {
	out := make([]float32, len(s))
	for i, v := range s {
		out[i] = float32(v)
	}
	return out
}

// layerNormCase is LayerNorm of x over its last k dimensions, with weight
// and bias as asked.
func layerNormCase(shape []int, k int, weight, bias bool) agCase {
	norm := shape[len(shape)-k:]
	cols := 1
	for _, d := range norm {
		cols *= d
	}
	ins := []agInput{in(true, shape...)}
	if weight {
		ins = append(ins, in(true, norm...))
	}
	if bias {
		ins = append(ins, in(true, norm...))
	}
	return agCase{
		name: fmt.Sprintf("LayerNorm/%v over %v weight=%v bias=%v", shape, norm, weight, bias), inputs: ins, tol: tolAG,
		fwd: func(t []*tensor.Tensor, _ *tensor.Tensor) *tensor.Tensor {
			var w, b *tensor.Tensor
			i := 1
			if weight {
				w, i = t[i], i+1
			}
			if bias {
				b = t[i]
			}
			return tensor.LayerNorm(t[0], norm, w, b, 1e-5)
		},
		ref: func(v [][]float32, _ []int32, g []float32) ([]float64, [][]float64) {
			x := v[0]
			rows := len(x) / cols
			groups := lnGroups(rows, cols)
			mean, inv := make([]float64, rows), make([]float64, rows)
			for r, idx := range groups {
				mu, va := refStats(x, idx)
				mean[r], inv[r] = mu, 1/math.Sqrt(va+1e-5)
			}
			affW, affB := func(int) float64 { return 1 }, func(int) float64 { return 0 }
			i := 1
			if weight {
				w := v[i]
				affW, i = func(j int) float64 { return float64(w[j%cols]) }, i+1
			}
			if bias {
				b := v[i]
				affB = func(j int) float64 { return float64(b[j%cols]) }
			}
			y, _ := refNormForward(x, groups, mean, inv, affW, affB)
			dx, _ := refNormBackward(x, g, groups, mean, inv, affW, true)
			dw, db, _, _ := refAffineGrads(x, g, groups, mean, inv, cols, func(j int) int { return j % cols })
			grads := [][]float64{dx}
			if weight {
				grads = append(grads, dw)
			}
			if bias {
				grads = append(grads, db)
			}
			return y, grads
		},
	}
}

// normCases are the tensor-level cases of normalisation: BatchNorm2d
// (C = 3, HW = 7x5, N = 2), BatchNorm1d on [N, C] and [N, C, L], evaluation
// mode, a strided input; LayerNorm over one and two trailing dimensions,
// one row (N = 1), with and without each affine parameter.
func normCases() []agCase {
	return []agCase{
		batchNormCase([]int{2, 3, 7, 5}, true, true, false),
		batchNormCase([]int{2, 3, 7, 5}, true, false, false),
		batchNormCase([]int{5, 3}, true, true, false),
		batchNormCase([]int{4, 3, 5}, false, true, false),
		batchNormCase([]int{2, 3, 5}, true, true, true),
		batchNormActCase([]int{2, 3, 7, 5}, true, true, tensor.OpReLU),
		batchNormActCase([]int{4, 3, 5}, false, true, tensor.OpReLU),
		fdChecked(batchNormActCase([]int{2, 3, 7, 5}, true, true, tensor.OpGELU)),
		fdChecked(batchNormActCase([]int{2, 3, 4}, true, false, tensor.OpGELU)),
		fdChecked(batchNormActCase([]int{4, 3, 5}, false, true, tensor.OpGELU)),
		fdChecked(batchNormActCase([]int{3, 2, 6}, true, true, tensor.OpGELUTanh)),
		layerNormCase([]int{1, 7, 5}, 2, true, true),
		layerNormCase([]int{4, 33}, 1, false, false),
		layerNormCase([]int{5, 2, 9}, 1, true, false),
		layerNormCase([]int{3, 257}, 1, false, true),
	}
}
