package tensor_test

import (
	"testing"

	"github.com/ember-ml/ember/tensor"
	"github.com/ember-ml/ember/tensor/tensortest"
)

func TestCPUConformance(t *testing.T) {
	tensortest.RunBackend(t, tensor.CPU)
	tensortest.RunAutograd(t, tensor.CPU)
}

// TestCoreOnlyConformance checks the fallbacks on the CPU's core alone:
// Complete's operations (RunComplete) and the tensor layer with every
// optional interface hidden (RunAutograd), against the float64 references
// with the CPU kernels' tolerances. Cases that need an interface without a
// fallback skip, naming it.
func TestCoreOnlyConformance(t *testing.T) {
	b := tensortest.CoreOnly(tensor.CPU)
	if _, ok := b.(tensor.CompleteBackend); ok {
		t.Fatal("CoreOnly(CPU) still implements CompleteBackend")
	}
	tensortest.RunComplete(t, b)
	tensortest.RunAutograd(t, b)
}
