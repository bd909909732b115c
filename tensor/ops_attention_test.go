package tensor_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// Bad arguments to the attention with dropout are clear panics.
func TestAttentionDropoutArguments(t *testing.T) {
	q := tensor.Zeros(tensor.CPU, nil, 1, 2, 3, 4)
	for _, c := range []struct {
		p    float32
		gen  tensor.RandomSource
		want string
	}{
		{1.5, tensor.NewGenerator(1), "outside [0, 1]"},
		{-0.1, tensor.NewGenerator(1), "outside [0, 1]"},
		{0.2, nil, "needs a RandomSource"},
	} {
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(r.(string), c.want) {
					t.Errorf("p %v, gen %v: panic %v; want one naming %q", c.p, c.gen, r, c.want)
				}
			}()
			tensor.ScaledDotProductAttentionDropout(q, q, q, true, 0, c.p, c.gen)
		}()
	}
	// p = 0 needs no generator.
	if y := tensor.ScaledDotProductAttentionDropout(q, q, q, true, 0, 0, nil); !slices.Equal(y.Shape(), q.Shape()) {
		t.Errorf("shape %v", y.Shape())
	}
}
