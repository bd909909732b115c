package cuda

import (
	"testing"

	"github.com/ember-ml/ember/nn/nntest"
)

// The layers of package nn on the GPU against the CPU backend (forward,
// gradients, running statistics and step counts); skipped without a GPU.
func TestGPULayers(t *testing.T) {
	nntest.RunLayers(t, newGPUBackend(t, BackendOptions{}))
}
