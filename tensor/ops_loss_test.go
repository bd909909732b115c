package tensor_test

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// syncCounter is the CPU backend counting the calls that wait for the
// device (Download, Synchronize). It hides the CPU's ClassLossBackend, so
// CrossEntropyLoss takes the composed path; syncCounterLoss forwards it.
type syncCounter struct {
	tensor.CompleteBackend
	downloads, syncs int
}

func (c *syncCounter) Download(dst any, src tensor.Buffer) {
	c.downloads++
	c.CompleteBackend.Download(dst, src)
}

func (c *syncCounter) Synchronize() error {
	c.syncs++
	return c.CompleteBackend.Synchronize()
}

type syncCounterLoss struct{ *syncCounter }

func (c syncCounterLoss) ClassLoss(loss, dlogits, logits, labels tensor.Buffer, s tensor.ClassLossSpec) {
	c.CompleteBackend.(tensor.ClassLossBackend).ClassLoss(loss, dlogits, logits, labels, s)
}

// TestCrossEntropyLossNoSync runs the general CrossEntropyLoss forward and
// backward, for both layouts and a loss scaled inside a graph, on a backend
// with ClassLossBackend: nothing may wait for the device until the result
// is read. The same on a backend without it must wait (the composed path
// reads the labels), which shows that the counter sees the waits.
func TestCrossEntropyLossNoSync(t *testing.T) {
	opts := []tensor.CrossEntropyOptions{
		{LabelSmoothing: 0.1},
		{Reduction: tensor.LossSum, Ignore: true, IgnoreIndex: 2},
		{LabelSmoothing: 0.1, Ignore: true, IgnoreIndex: -100},
	}
	run := func(be tensor.Backend, shape []int, opt tensor.CrossEntropyOptions, scaled bool) {
		s := tensor.NewScope()
		defer s.Release()
		n := 1
		for _, d := range shape {
			n *= d
		}
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(math.Sin(float64(i)))
		}
		lab := make([]int32, n/shape[1])
		for i := range lab {
			lab[i] = int32(i % shape[1])
		}
		logits := tensor.FromFloat32(be, s, x, shape...).SetRequiresGrad(true)
		labels := tensor.FromInt32(be, s, lab, append([]int{shape[0]}, shape[2:]...)...)
		loss := tensor.CrossEntropyLoss(logits, labels, opt)
		if scaled {
			loss = tensor.Mul(loss, tensor.Full(be, s, 0.5, 1))
		}
		loss.Backward()
	}
	for _, shape := range [][]int{{7, 5}, {3, 11, 4, 2}} {
		for _, opt := range opts {
			for _, scaled := range []bool{false, true} {
				c := &syncCounter{CompleteBackend: tensor.Complete(tensor.CPU)}
				run(syncCounterLoss{c}, shape, opt, scaled)
				if c.downloads != 0 || c.syncs != 0 {
					t.Errorf("logits %v %+v scaled=%v: %d Downloads and %d Synchronizes with ClassLossBackend, want none",
						shape, opt, scaled, c.downloads, c.syncs)
				}
			}
		}
	}
	c := &syncCounter{CompleteBackend: tensor.Complete(tensor.CPU)}
	run(c, []int{7, 5}, opts[0], false)
	if c.downloads == 0 {
		t.Errorf("the composed CrossEntropyLoss did not Download its labels: the counter sees nothing")
	}
}

// TestCrossEntropyLossAllIgnored: the mean over no counted target is NaN,
// as torch's, but the gradient is zero (torch's is too: ignored targets
// contribute nothing), on the fused and the composed path alike; the sum is
// 0.
func TestCrossEntropyLossAllIgnored(t *testing.T) {
	for _, be := range []tensor.Backend{tensor.CPU, &syncCounter{CompleteBackend: tensor.Complete(tensor.CPU)}} {
		for _, red := range []tensor.LossReduction{tensor.LossMean, tensor.LossSum} {
			s := tensor.NewScope()
			logits := tensor.FromFloat32(be, s, []float32{1, 2, 3, 4, 5, 6}, 2, 3).SetRequiresGrad(true)
			labels := tensor.FromInt32(be, s, []int32{-100, -100}, 2)
			loss := tensor.CrossEntropyLoss(logits, labels, tensor.CrossEntropyOptions{Reduction: red, LabelSmoothing: 0.1, Ignore: true, IgnoreIndex: -100})
			loss.Backward()
			got := loss.Float32s()[0]
			if (red == tensor.LossMean && !math.IsNaN(float64(got))) || (red == tensor.LossSum && got != 0) {
				t.Errorf("%T reduction %d: loss %g, want NaN for the mean, 0 for the sum", be, red, got)
			}
			if _, fused := be.(tensor.ClassLossBackend); fused || red == tensor.LossSum {
				for i, g := range logits.Grad().Float32s() {
					if g != 0 {
						t.Errorf("%T reduction %d: gradient %d is %g, want 0", be, red, i, g)
					}
				}
			}
			s.Release()
		}
	}
}

// TestClassLossBadLabel: a label outside [0, classes) that is not ignored
// panics on the CPU with a message naming it.
func TestClassLossBadLabel(t *testing.T) {
	for _, bad := range []int32{-1, 3, -100} {
		msg := func() (msg string) {
			defer func() { msg = fmt.Sprint(recover()) }()
			s := tensor.NewScope()
			defer s.Release()
			logits := tensor.FromFloat32(tensor.CPU, s, make([]float32, 6), 2, 3)
			labels := tensor.FromInt32(tensor.CPU, s, []int32{0, bad}, 2)
			tensor.CrossEntropyLoss(logits, labels, tensor.CrossEntropyOptions{LabelSmoothing: 0.1, Ignore: true, IgnoreIndex: 7})
			return ""
		}()
		if !strings.Contains(msg, fmt.Sprintf("label %d", bad)) || !strings.Contains(msg, "outside [0, 3)") {
			t.Errorf("label %d: panic %q, want one naming the label and the range", bad, msg)
		}
	}
}
