package cuda

import (
	"testing"

	"github.com/ember-ml/ember/tensor/tensortest"
)

// TestGPUChannelsLastMatchesCPU: every method of the backend's
// tensor.ChannelsLastBackend against the CPU's on fresh random inputs
// (tensortest.RunChannelsLast states the bounds).
func TestGPUChannelsLastMatchesCPU(t *testing.T) {
	tensortest.RunChannelsLast(t, newGPUBackend(t, BackendOptions{}))
}
