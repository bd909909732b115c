package models_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// Helpers shared by the tests of the zoo's networks.

// zooKeys lists m's state dict as "name [d0,d1,...]", sorted: torch's
// load_state_dict(strict=True) matches keys, not their order.
func zooKeys(m nn.Module) []string {
	var out []string
	for _, p := range nn.StateTensors(m) {
		out = append(out, p.Name+" "+zooShape(p.Tensor.Shape()))
	}
	slices.Sort(out)
	return out
}

func zooShape(s []int) string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = fmt.Sprint(d)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// sameKeys fails the test, naming the differences, unless got and want
// hold the same entries.
func sameKeys(t *testing.T, what string, got, want []string) {
	t.Helper()
	want = slices.Sorted(slices.Values(want))
	if slices.Equal(got, want) {
		return
	}
	var missing, extra []string
	for _, w := range want {
		if !slices.Contains(got, w) {
			missing = append(missing, w)
		}
	}
	for _, g := range got {
		if !slices.Contains(want, g) {
			extra = append(extra, g)
		}
	}
	t.Errorf("%s: %d state dict entries, want %d; missing %v, unexpected %v", what, len(got), len(want), missing, extra)
}

// batchNormKeys are torch's five BatchNorm entries under prefix.
func batchNormKeys(prefix string, c int) []string {
	s := fmt.Sprintf("[%d]", c)
	return []string{prefix + ".weight " + s, prefix + ".bias " + s, prefix + ".running_mean " + s,
		prefix + ".running_var " + s, prefix + ".num_batches_tracked []"}
}

func normals(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}

func randomLabels(rng *rand.Rand, n, classes int) []int32 {
	v := make([]int32, n)
	for i := range v {
		v[i] = int32(rng.IntN(classes))
	}
	return v
}

func maxAbsDiff(a, b []float32) float64 {
	d := 0.0
	for i := range a {
		d = math.Max(d, math.Abs(float64(a[i])-float64(b[i])))
	}
	return d
}

// mustPanic fails unless f panics with a message containing want.
func mustPanic(t *testing.T, want string, f func()) {
	t.Helper()
	defer func() {
		r := recover()
		if msg, _ := r.(string); !strings.Contains(msg, want) {
			t.Errorf("panic %v; want one saying %q", r, want)
		}
	}()
	f()
}

// countOf reads a BatchNorm's step count (a float32 scalar on the device).
func countOf(n *nn.BatchNorm2d) float32 { return n.NumBatchesTracked.Reshape(1).Float32s()[0] }

// lossAt runs loss and returns its value, releasing the step's tensors.
func lossAt(loss func(s *tensor.Scope) *tensor.Tensor) float32 {
	s := tensor.NewNoGradScope()
	defer s.Release()
	return loss(s).Item()
}
