package modelstest

import (
	"math"
	"testing"

	"github.com/ember-ml/ember/tensor"
	"github.com/ember-ml/ember/tensor/tensortest"
)

// TestCoreOnlyTrainingCurve trains LeNet on the CPU's core alone
// (tensortest.CoreOnly: every optional interface hidden, so every layer,
// the loss and the optimiser take the fallbacks composed from the core)
// and on the CPU itself from the same seed: every step's loss must agree
// within 1e-3 relative, the bound the GPU's curve is held to (see
// TrainingCurve for why it is meaningful over this many steps).
func TestCoreOnlyTrainingCurve(t *testing.T) {
	steps := 20
	if testing.Short() {
		steps = 8
	}
	core, err := TrainingCurve(tensortest.CoreOnly(tensor.CPU), steps, 1)
	if err != nil {
		t.Fatalf("core-only training: %v", err)
	}
	cpu, err := TrainingCurve(tensor.CPU, steps, 1)
	if err != nil {
		t.Fatalf("CPU training: %v", err)
	}
	if len(core) != steps || len(cpu) != steps {
		t.Fatalf("got %d core-only and %d CPU losses, want %d", len(core), len(cpu), steps)
	}
	worst := 0.0
	for i := range cpu {
		rel := math.Abs(float64(core[i])-float64(cpu[i])) / math.Abs(float64(cpu[i]))
		worst = max(worst, rel)
		if !(rel <= 1e-3) {
			t.Errorf("step %d: core-only loss %.7g, CPU loss %.7g (relative difference %.2g > 1e-3)", i, core[i], cpu[i], rel)
		}
	}
	t.Logf("loss %.5g -> %.5g (CPU %.5g -> %.5g); largest relative difference %.2g", core[0], core[steps-1], cpu[0], cpu[steps-1], worst)
	if cpu[steps-1] >= cpu[0] {
		t.Errorf("the CPU loss did not decrease (%g -> %g): the comparison proves little", cpu[0], cpu[steps-1])
	}
}
