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
