package optim

import (
	"github.com/ember-ml/ember/tensor"
)

// deviceLR is SGD's learning rate as a one-element device buffer, read by
// the update kernel (tensor.OptimBackend.SGDDeviceLR) instead of passed
// with the launch, so that a captured step replays with a scheduled rate.
type deviceLR struct {
	buf      *tensor.Tensor
	uploaded float64 // the value in buf
}

// SetLR sets the learning rate and switches the SGD to the device-scalar
// path: the rate is uploaded to a one-element device buffer (only when it
// changed) before a step, and the update kernel reads it there. Schedules
// drive the optimiser through SetLR; results are bit for bit those of the
// host path (the same float32 rate, the same operations). Assigning the LR
// field directly keeps working on either path.
//
// With a captured step, call SetLR (or Prepare) before each replay: the
// upload is not part of the graph.
func (s *SGD) SetLR(lr float64) {
	s.LR = lr
	if s.lrDev == nil {
		s.lrDev = &deviceLR{buf: tensor.Zeros(s.flatP.Backend(), nil, 1)}
	}
	s.Prepare()
}

// Prepare uploads the current learning rate for the device-scalar path if
// it changed since the last upload (nothing on the host path).
func (s *SGD) Prepare() {
	if d := s.lrDev; d != nil && d.uploaded != s.LR {
		d.buf.CopyFrom([]float32{float32(s.LR)})
		d.uploaded = s.LR
	}
}

// stepDeviceLR queues the update with the learning rate from the device
// buffer; a backend without tensor.OptimBackend takes the host path.
func (s *SGD) stepDeviceLR(v tensor.Buffer, h tensor.SGDStep) {
	b := s.flatP.Backend()
	ob, ok := b.(tensor.OptimBackend)
	if !ok {
		tensor.Complete(b).SGD(s.flatP.Buffer(), s.flatG.Buffer(), v, h)
		return
	}
	s.Prepare()
	ob.SGDDeviceLR(s.flatP.Buffer(), s.flatG.Buffer(), v, s.lrDev.buf.Buffer(), h)
}

// Gradients is the packed gradient buffer (what ClipGradNorm scales).
func (s *SGD) Gradients() *tensor.Tensor { return s.flatG }
