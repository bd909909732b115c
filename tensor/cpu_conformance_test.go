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
