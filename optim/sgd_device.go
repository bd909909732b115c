package optim

import (
	"fmt"
	"math"

	"github.com/ember-ml/ember/tensor"
)

// deviceSGD is SGD's learning rate, momentum, dampening and weight decay as
// a small device buffer (tensor.SGDLR, ...), read by the update kernel
// (tensor.OptimBackend.SGDDevice) instead of passed with the launch, so
// that a captured step replays with the values a schedule set.
type deviceSGD struct {
	buf      *tensor.Tensor
	uploaded [tensor.NumSGDScalars]float64 // the values in buf
}

// values are the hyper-parameters in the buffer's layout.
func (s *SGD) values() [tensor.NumSGDScalars]float64 {
	var v [tensor.NumSGDScalars]float64
	v[tensor.SGDLR], v[tensor.SGDMomentum], v[tensor.SGDDampening], v[tensor.SGDWeightDecay] = s.LR, s.Momentum, s.Dampening, s.WeightDecay
	return v
}

// onDevice switches the SGD to the device-scalar path (once).
func (s *SGD) onDevice() {
	if s.dev == nil {
		s.dev = &deviceSGD{buf: tensor.Zeros(s.flatP.Backend(), nil, tensor.NumSGDScalars)}
		for i := range s.dev.uploaded {
			s.dev.uploaded[i] = math.NaN() // nothing uploaded yet
		}
	}
}

// SetLR sets the learning rate and switches the SGD to the device-scalar
// path: the learning rate, momentum, dampening and weight decay are
// uploaded to a small device buffer (only when one of them changed) before
// a step, and the update kernel reads them there. Schedules drive the
// optimiser through SetLR (and SetMomentum); results are bit for bit those
// of the host path (the same float32 values, the same operations).
// Assigning the fields directly keeps working on either path.
//
// With a captured step, call Prepare before each replay: the upload is not
// part of the graph.
func (s *SGD) SetLR(lr float64) {
	s.LR = lr
	s.onDevice()
	s.Prepare()
}

// SetMomentum sets the momentum (what a one-cycle schedule cycles) and
// switches to the device-scalar path, as SetLR. An SGD built with momentum
// 0 has no momentum buffer (as torch's, whose first step with momentum
// would create it); its captured step could not start using one, so a
// non-zero momentum is an error there: build it with the momentum the
// schedule starts from.
func (s *SGD) SetMomentum(m float64) error {
	switch {
	case math.IsNaN(m) || math.IsInf(m, 0) || m < 0:
		return fmt.Errorf("optim: SGD: momentum %g, want a finite value >= 0", m)
	case m != 0 && s.momentum == nil:
		return fmt.Errorf("optim: SGD: momentum %g set on an SGD built without momentum (no momentum buffer); build it with a non-zero momentum", m)
	case s.Nesterov && m == 0:
		return fmt.Errorf("optim: SGD: momentum 0 with nesterov; nesterov needs momentum > 0")
	}
	s.Momentum = m
	s.onDevice()
	s.Prepare()
	return nil
}

// SetWeightDecay sets the weight decay and switches to the device-scalar
// path, as SetLR.
func (s *SGD) SetWeightDecay(wd float64) error {
	if math.IsNaN(wd) || math.IsInf(wd, 0) || wd < 0 {
		return fmt.Errorf("optim: SGD: weight decay %g, want a finite value >= 0", wd)
	}
	s.WeightDecay = wd
	s.onDevice()
	s.Prepare()
	return nil
}

// SetDampening sets the dampening and switches to the device-scalar path,
// as SetLR. Nesterov momentum needs zero dampening.
func (s *SGD) SetDampening(d float64) error {
	switch {
	case math.IsNaN(d) || math.IsInf(d, 0):
		return fmt.Errorf("optim: SGD: dampening %g, want a finite value", d)
	case s.Nesterov && d != 0:
		return fmt.Errorf("optim: SGD: dampening %g with nesterov; nesterov needs zero dampening", d)
	}
	s.Dampening = d
	s.onDevice()
	s.Prepare()
	return nil
}

// Prepare uploads the current hyper-parameters for the device-scalar path
// if one changed since the last upload (nothing on the host path).
func (s *SGD) Prepare() {
	d := s.dev
	if d == nil {
		return
	}
	v := s.values()
	if v == d.uploaded {
		return
	}
	var f [tensor.NumSGDScalars]float32
	for i, x := range v {
		f[i] = float32(x)
	}
	d.buf.CopyFrom(f[:])
	d.uploaded = v
}

// stepDevice queues the update with the hyper-parameters from the device
// buffer; a backend without tensor.OptimBackend takes the host path.
func (s *SGD) stepDevice(v tensor.Buffer, h tensor.SGDStep) {
	b := s.flatP.Backend()
	ob, ok := b.(tensor.OptimBackend)
	if !ok {
		tensor.Complete(b).SGD(s.flatP.Buffer(), s.flatG.Buffer(), v, h)
		return
	}
	s.Prepare()
	ob.SGDDevice(s.flatP.Buffer(), s.flatG.Buffer(), v, s.dev.buf.Buffer(), h)
}

// Gradients is the packed gradient buffer (what ClipGradNorm scales), with
// the zeros of any gradient still cleared written.
func (s *SGD) Gradients() *tensor.Tensor {
	settleGrads(s.params)
	return s.flatG
}
