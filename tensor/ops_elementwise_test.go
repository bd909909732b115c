package tensor_test

import (
	"slices"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

func TestBroadcastShape(t *testing.T) {
	cases := []struct{ a, b, want []int }{
		{[]int{3, 1, 5}, []int{4, 1}, []int{3, 4, 5}},
		{[]int{1}, []int{7, 33}, []int{7, 33}},
		{[]int{}, []int{2, 3}, []int{2, 3}},
		{[]int{2, 1}, []int{1, 3}, []int{2, 3}},
	}
	for _, c := range cases {
		got, err := tensor.BroadcastShape(c.a, c.b)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("BroadcastShape(%v, %v) = %v, %v; want %v", c.a, c.b, got, err, c.want)
		}
	}
	if _, err := tensor.BroadcastShape([]int{3, 4}, []int{5}); err == nil {
		t.Errorf("BroadcastShape([3 4], [5]): no error")
	}
}

// Programming errors panic with the op and the shapes.
func TestElementwiseMisuse(t *testing.T) {
	s := tensor.NewScope()
	defer s.Release()
	cpu := tensor.CPU
	a, b := tensor.Zeros(cpu, s, 3, 4), tensor.Zeros(cpu, s, 5)
	mustPanic(t, "Add of [3 4] and [5]", "Add: shapes [3 4] and [5] do not broadcast", func() { tensor.Add(a, b) })
	mustPanic(t, "Where", "Where: shapes", func() { tensor.Where(a, a, b) })
	mustPanic(t, "SumAxes axis 2", "SumAxes of [3 4] over axis 2", func() { tensor.SumAxes(a, []int{2}, false) })
	mustPanic(t, "MaxAxes repeated axis", "given twice", func() { tensor.MaxAxes(a, []int{1, -1}, false) })
	mustPanic(t, "Concat", "Concat along axis 0 of [3 4] with [1 5]", func() { tensor.Concat(0, a, b.Reshape(1, 5)) })
	mustPanic(t, "Slice", "Slice of [3 4] axis 1 [2:5:1]", func() { a.Slice(1, 2, 5, 1) })
	mustPanic(t, "Expand", "Expand of [3 4] to [3 5]", func() { a.Expand(3, 5) })
	mustPanic(t, "Squeeze", "Squeeze of [3 4]: axis 0 has size 3", func() { a.Squeeze(0) })
	mustPanic(t, "Permute", "not a permutation", func() { a.Permute(0, 0) })
	mustPanic(t, "Pad", "negative padding", func() { tensor.Pad(a, []int{-1, 0}, 0) })
}

// ArgmaxAxis and ArgminAxis against a plain loop over a [3,4,5] tensor
// with ties (values on a coarse grid: the first index must win), over
// each axis, with and without keepdim.
func TestArgAxis(t *testing.T) {
	s := tensor.NewScope()
	defer s.Release()
	shape := []int{3, 4, 5}
	data := make([]float32, 60)
	for i := range data {
		data[i] = float32((i*7)%5) - 2
	}
	x := tensor.FromFloat32(tensor.CPU, s, data, shape...)
	for axis := range 3 {
		for _, keep := range []bool{false, true} {
			for _, isMax := range []bool{true, false} {
				var got *tensor.Tensor
				if isMax {
					got = tensor.ArgmaxAxis(x, axis, keep)
				} else {
					got = tensor.ArgminAxis(x, axis, keep)
				}
				wantShape := slices.Clone(shape)
				if keep {
					wantShape[axis] = 1
				} else {
					wantShape = slices.Delete(wantShape, axis, axis+1)
				}
				if !slices.Equal(got.Shape(), wantShape) {
					t.Fatalf("axis %d keepdim %v: shape %v, want %v", axis, keep, got.Shape(), wantShape)
				}
				st := []int{20, 5, 1}
				gi := got.Int32s()
				o := 0
				for i := range shape[0] {
					for j := range shape[1] {
						for k := range shape[2] {
							idx := []int{i, j, k}
							if idx[axis] != 0 {
								continue
							}
							best, at := data[i*20+j*5+k], 0
							for m := 1; m < shape[axis]; m++ {
								v := data[i*20+j*5+k+m*st[axis]]
								if isMax && v > best || !isMax && v < best {
									best, at = v, m
								}
							}
							if int(gi[o]) != at {
								t.Errorf("axis %d max %v: output %d is %d, want %d", axis, isMax, o, gi[o], at)
							}
							o++
						}
					}
				}
			}
		}
	}
}

// A reduction of a rank-0 tensor over all (no) axes is the element.
func TestReduceRankZero(t *testing.T) {
	s := tensor.NewScope()
	defer s.Release()
	x := tensor.FromFloat32(tensor.CPU, s, []float32{2.5}).Reshape()
	if got := tensor.SumAxes(x, nil, false).Float32s(); len(got) != 1 || got[0] != 2.5 {
		t.Errorf("SumAxes of a rank-0 tensor: %v", got)
	}
}
