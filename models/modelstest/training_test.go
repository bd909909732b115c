package modelstest

import (
	"math"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// TestCPUTrainingCurve checks that TrainingCurve runs on the CPU, is
// deterministic (the same seed gives bit-identical losses), depends on the
// seed, and learns: the first loss is about log(10) ≈ 2.303 (a freshly
// initialised LeNet) and the synthetic task is easy enough that it falls
// by more than 0.15 within 6 steps (2.29 → 2.09 at seed 1; it levels off
// near 1.5 after ~20 steps because of the label noise).
func TestCPUTrainingCurve(t *testing.T) {
	const steps = 6
	a, err := TrainingCurve(tensor.CPU, steps, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != steps {
		t.Fatalf("TrainingCurve returned %d losses, want %d", len(a), steps)
	}
	t.Logf("losses: %v", a)
	b, err := TrainingCurve(tensor.CPU, 3, 1)
	if err != nil {
		t.Fatal(err)
	}
	for i := range b {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			t.Fatalf("TrainingCurve is not deterministic: step %d loss %v then %v", i, a[i], b[i])
		}
	}
	if math.Abs(float64(a[0])-math.Log(10)) > 0.2 {
		t.Errorf("initial loss %v, want about log(10) = 2.303 for a freshly initialised LeNet", a[0])
	}
	if a[steps-1] > a[0]-0.15 {
		t.Errorf("loss did not fall: %v", a)
	}
	c, err := TrainingCurve(tensor.CPU, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if c[0] == a[0] {
		t.Errorf("seeds 1 and 2 give the same first loss %v", c[0])
	}
	if _, err := TrainingCurve(tensor.CPU, -1, 1); err == nil {
		t.Errorf("TrainingCurve with -1 steps: no error")
	}
	if l, err := TrainingCurve(tensor.CPU, 0, 1); err != nil || len(l) != 0 {
		t.Errorf("TrainingCurve with 0 steps: %v, %v", l, err)
	}
}
