package cuda

import (
	"errors"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// TestGPUCaptureRefusesUpload: a step that uploads from the host cannot be
// captured (its replay would read freed host memory); Capture says so, and
// the backend works eagerly afterwards.
func TestGPUCaptureRefusesUpload(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	x := tensor.Zeros(b, nil, 4)
	defer x.Release()
	_, err := b.Capture(func() { x.CopyFrom([]float32{1, 2, 3, 4}) })
	if !errors.Is(err, ErrUploadInCapture) {
		t.Fatalf("Capture of an upload: %v, want ErrUploadInCapture", err)
	}
	x.CopyFrom([]float32{5, 6, 7, 8})
	if got := x.Float32s(); got[3] != 8 {
		t.Errorf("after the failed capture: %v", got)
	}
}
