package cuda

import (
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// TestRecordedDropout launches the fused dropout, at a host seed and from
// device state, on the recording backend: argument checks against the
// kernels' signatures and pointers inside allocated memory (the values are
// checked by the conformance suite on a GPU).
func TestRecordedDropout(t *testing.T) {
	b, rec := newRecordingBackend(t)
	f := func(n int) tensor.Buffer {
		buf, err := b.Alloc(n, tensor.Float32)
		if err != nil {
			t.Fatal(err)
		}
		return buf
	}
	state, err := b.Alloc(4, tensor.Int32)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{4099, 1, 0} {
		b.Dropout(f(n), f(n), f(n), 7, 1<<32-3, 0.8, 1.25)
		b.DropoutAt(f(n), f(n), f(n), state, 0.8, 1.25)
	}
	if rec.launches["ember_dropout"] != 2 || rec.launches["ember_dropout_state"] != 2 || rec.launches["ember_random_advance"] != 2 {
		t.Errorf("launches: %d ember_dropout, %d ember_dropout_state, %d ember_random_advance; want 2 each (none for 0 elements)",
			rec.launches["ember_dropout"], rec.launches["ember_dropout_state"], rec.launches["ember_random_advance"])
	}
	defer func() {
		if recover() == nil {
			t.Error("Dropout into a short mask did not panic")
		}
	}()
	b.Dropout(f(8), f(7), f(8), 0, 0, 0.5, 2)
}
