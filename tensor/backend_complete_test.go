package tensor_test

import (
	"math"
	"testing"

	"github.com/ember-ml/ember/tensor"
	"github.com/ember-ml/ember/tensor/tensortest"
)

// arithOnly is the CPU's core with the CPU's ArithmeticBackend and none of
// CompleteBackend's other parts, counting its calls of Add.
type arithOnly struct {
	tensor.Backend
	tensor.ArithmeticBackend
	adds *int
}

func (a arithOnly) Add(dst, x, y tensor.Buffer) {
	*a.adds++
	a.ArithmeticBackend.Add(dst, x, y)
}

// Complete hands back a backend that has every part unwrapped, and for one
// with some parts runs its own implementation of those and the fallbacks
// of the others.
func TestCompleteUsesTheBackendsOwnParts(t *testing.T) {
	if c := tensor.Complete(tensor.CPU); c != tensor.CPU.(tensor.CompleteBackend) {
		t.Errorf("Complete(CPU) wraps the CPU backend")
	}
	adds := 0
	b := arithOnly{tensortest.CoreOnly(tensor.CPU), tensor.Complete(tensor.CPU), &adds}
	if _, ok := tensor.Backend(b).(tensor.CompleteBackend); ok {
		t.Fatal("arithOnly implements CompleteBackend")
	}
	s := tensor.NewScope()
	defer s.Release()
	x := tensor.FromFloat32(b, s, []float32{1, 2, 3, 4, 5, 6}, 2, 3)
	bias := tensor.FromFloat32(b, s, []float32{10, 20, 30}, 3)
	c := tensor.Complete(b)
	c.Add(x.Buffer(), x.Buffer(), x.Buffer())
	c.AddBias(x.Buffer(), bias.Buffer(), 2, 3, 1) // the fallback: BiasBackend is absent
	if adds != 1 {
		t.Errorf("Complete ran the backend's own Add %d times, want 1", adds)
	}
	want := []float32{12, 24, 36, 18, 30, 42}
	for i, v := range x.Float32s() {
		if v != want[i] {
			t.Fatalf("Add then AddBias: %v, want %v", x.Float32s(), want)
		}
	}
}

// The composed CrossEntropy keeps a -Inf logit of another class out of the
// loss (the CPU kernel's loss is finite there), and gives the kernel's
// loss and gradient.
func TestCompleteCrossEntropyNegativeInfinity(t *testing.T) {
	inf := float32(math.Inf(-1))
	logits := []float32{2, inf, 0.5, -1, 3, inf}
	labels := []int32{0, 1}
	run := func(b tensor.Backend) (float32, []float32) {
		c := tensor.Complete(b)
		s := tensor.NewScope()
		defer s.Release()
		z := tensor.FromFloat32(b, s, logits, 2, 3)
		lab := tensor.FromInt32(b, s, labels, 2)
		loss, dz := tensor.Zeros(b, s, 1), tensor.Zeros(b, s, 2, 3)
		c.CrossEntropy(loss.Buffer(), dz.Buffer(), z.Buffer(), lab.Buffer(), 2, 3)
		return loss.Float32s()[0], dz.Float32s()
	}
	got, gotD := run(tensortest.CoreOnly(tensor.CPU))
	want, wantD := run(tensor.CPU)
	if math.IsNaN(float64(got)) || math.Abs(float64(got-want)) > 1e-6*math.Abs(float64(want)) {
		t.Errorf("composed loss %v, CPU kernel %v", got, want)
	}
	for i := range wantD {
		if math.Abs(float64(gotD[i]-wantD[i])) > 1e-6 {
			t.Errorf("composed dlogits %v, CPU kernel %v", gotD, wantD)
			break
		}
	}
}
