package cuda

import (
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// TestRecordedClassLoss runs the general CrossEntropyLoss forward and
// backward on the recorder, in both layouts (the row kernel for [7, 5], the
// column kernel for [3, 11, 4, 2]), with and without a gradient, and once
// with the loss scaled inside a graph: every launch is checked against its
// kernel's signature and the allocated memory, each loss is the three
// launches of ClassLoss, and nothing is copied (no Download, so the loss
// can be captured in a CUDA graph).
func TestRecordedClassLoss(t *testing.T) {
	b, rec := newRecordingBackend(t)
	opt := tensor.CrossEntropyOptions{LabelSmoothing: 0.1, Ignore: true, IgnoreIndex: -100}
	for _, c := range []struct {
		shape  []int
		kernel string
	}{{[]int{7, 5}, "ember_class_loss_rows"}, {[]int{3, 11, 4, 2}, "ember_class_loss_cols"}, {[]int{2, 3, 5000}, "ember_class_loss_cols"}} {
		for _, grad := range []bool{true, false} {
			for _, scaled := range []bool{false, true} {
				s := tensor.NewScope()
				n := 1
				for _, d := range c.shape {
					n *= d
				}
				logits := tensor.Zeros(b, s, c.shape...).SetRequiresGrad(grad)
				labels := tensor.FromInt32(b, s, make([]int32, n/c.shape[1]), append([]int{c.shape[0]}, c.shape[2:]...)...)
				factor := tensor.Full(b, s, 0.5, 1)
				rec.reset()
				loss := tensor.CrossEntropyLoss(logits, labels, opt)
				if scaled {
					loss = tensor.Mul(loss, factor)
				}
				if grad {
					loss.Backward()
				}
				for _, k := range []string{"ember_class_loss_count", c.kernel, "ember_class_loss_final"} {
					if rec.launches[k] != 1 {
						t.Errorf("logits %v grad=%v scaled=%v: %d launches of %s, want 1", c.shape, grad, scaled, rec.launches[k], k)
					}
				}
				if rec.copies != 0 {
					t.Errorf("logits %v grad=%v scaled=%v: %d copies, want none (no Download)", c.shape, grad, scaled, rec.copies)
				}
				s.Release()
			}
		}
	}
	// No targets: a memset of the loss and no launch.
	s := tensor.NewScope()
	defer s.Release()
	loss, logits, labels := tensor.Empty(b, s, 1), tensor.Empty(b, s, 1), tensor.FromInt32(b, s, []int32{0}, 1)
	rec.reset()
	b.ClassLoss(loss.Buffer(), tensor.Buffer{}, logits.Buffer(), labels.Buffer().Slice(0, 0), tensor.ClassLossSpec{Outer: 0, Classes: 1, Inner: 1})
	if rec.kernelLaunches() != 0 || rec.memsets != 1 {
		t.Errorf("no targets: %d launches and %d memsets, want 0 and 1", rec.kernelLaunches(), rec.memsets)
	}
	if err := b.Synchronize(); err != nil {
		t.Errorf("Synchronize: %v", err)
	}
}
