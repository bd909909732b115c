package models

import (
	"testing"

	"github.com/ember-ml/ember/data"
)

// A recorded normalisation round-trips through the metadata and applies
// as the training gather's multiply-add; none recorded is MNIST's, exactly
// data.Normalize; a malformed one is an error naming the file.
func TestNormalizationMetadata(t *testing.T) {
	n := Normalization{Mean: 0.286, Std: 0.353}
	got, err := NormalizationFromMetadata("f", NormalizationMetadata(nil, n))
	if err != nil || got != n {
		t.Fatalf("round trip: %v, %v; want %v", got, err, n)
	}
	px := []uint8{0, 17, 128, 255}
	dst := make([]float32, 4)
	n.Apply(dst, px)
	scale, shift := n.ScaleShift()
	for i, p := range px {
		if dst[i] != float32(p)*scale+shift {
			t.Errorf("pixel %d: %v, want %v", p, dst[i], float32(p)*scale+shift)
		}
	}
	def, err := NormalizationFromMetadata("f", map[string]string{})
	want := make([]float32, 4)
	data.Normalize(want, px)
	def.Apply(dst, px)
	if err != nil || def != MNISTNormalization || dst[2] != want[2] {
		t.Errorf("no metadata: %v, %v", def, err)
	}
	for _, bad := range []string{"0.5", "a,b", "0.5,0", "0.5,-1", "NaN,1"} {
		if _, err := NormalizationFromMetadata("f.safetensors", map[string]string{MetaNormalization: bad}); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
