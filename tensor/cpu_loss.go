package tensor

import (
	"fmt"
	"math"
)

// ClassLoss follows the steps of the CUDA kernels (kernels/xent.cu): count
// the targets that are not ignored (checking every label first, so that a
// bad one panics here rather than in a worker goroutine), then per target
// the maximum m, s = Σ exp(x - m) and lse = m + log s in float64, the
// target's loss lse - (1-ε)·x_t - ε·mean(x), and its gradient scale·(p_c -
// (1-ε)·[c = t] - ε/C). The losses are kept per target and added in order,
// so the result does not depend on how parallelFor splits the work.
func (*cpuBackend) ClassLoss(loss, dlogits, logits, labels Buffer, s ClassLossSpec) {
	outer, classes, inner := s.Outer, s.Classes, s.Inner
	targets := outer * inner
	if outer < 0 || classes < 0 || inner < 0 || loss.Len < 1 || logits.Len != targets*classes || labels.Len != targets ||
		(!dlogits.Empty() && dlogits.Len != logits.Len) {
		panic(fmt.Sprintf("tensor: cpu: ClassLoss of [%d, %d, %d] with buffers of %d logits, %d labels, %d dlogits, %d loss",
			outer, classes, inner, logits.Len, labels.Len, dlogits.Len, loss.Len))
	}
	x, lab := f32(logits), i32(labels)
	counted := 0
	for i, t := range lab {
		if s.Ignore && t == s.IgnoreIndex {
			continue
		}
		if t < 0 || int(t) >= classes {
			panic(fmt.Sprintf("tensor: cpu: ClassLoss: label %d at target %d outside [0, %d)", t, i, classes))
		}
		counted++
	}
	scale := 1.0
	if !s.Sum {
		scale = 1 / float64(counted) // +Inf for none; only counted targets use it
	}
	var dx []float32
	if !dlogits.Empty() {
		dx = f32(dlogits)
	}
	eps, cf := float64(s.Smoothing), float64(classes)
	perTarget := make([]float64, targets)
	parallelFor(targets, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			o, r := i/inner, i%inner
			base := o*classes*inner + r
			t := lab[i]
			if s.Ignore && t == s.IgnoreIndex {
				for c := 0; dx != nil && c < classes; c++ {
					dx[base+c*inner] = 0
				}
				continue
			}
			m := float32(math.Inf(-1))
			var sx float64
			for c := 0; c < classes; c++ {
				v := x[base+c*inner]
				m = max(m, v) // NaN propagates
				sx += float64(v)
			}
			var se float64
			for c := 0; c < classes; c++ {
				se += math.Exp(float64(x[base+c*inner] - m))
			}
			lse, inv := float64(m)+math.Log(se), 1/se
			perTarget[i] = lse - (1-eps)*float64(x[base+int(t)*inner]) - eps*sx/cf
			for c := 0; dx != nil && c < classes; c++ {
				w := eps / cf
				if c == int(t) {
					w += 1 - eps
				}
				dx[base+c*inner] = float32(scale * (math.Exp(float64(x[base+c*inner]-m))*inv - w))
			}
		}
	})
	var total float64
	for _, v := range perTarget {
		total += v
	}
	if s.Sum {
		f32(loss)[0] = float32(total)
	} else {
		f32(loss)[0] = float32(total / float64(counted)) // 0/0 = NaN when nothing counts, as torch
	}
}

var _ ClassLossBackend = (*cpuBackend)(nil)
