package nn

import (
	"fmt"

	"github.com/ember-ml/ember/tensor"
)

// Dropout zeroes each element with probability P in training and scales
// the others by 1/(1-P), as nn.Dropout; in evaluation it returns its
// input. The masks are drawn from Source, or when it is nil from
// DefaultRandomSource.
type Dropout struct {
	P float32
	// Source is where the masks come from. A tensor.Generator keeps its
	// offset on the host: a CUDA graph captured around the step would
	// replay the masks of the capture; give a captured model a
	// tensor.DeviceGenerator (SetRandomSource sets one for every layer).
	Source tensor.RandomSource

	evaluating bool // torch's modules start in training mode
}

// DefaultRandomSource is the generator of the layers that draw random
// numbers and were given none (torch's default generator). Replace it, or
// call SetRandomSource on a model, for other seeds.
var DefaultRandomSource tensor.RandomSource = tensor.NewGenerator(1)

// NewDropout returns a dropout layer of probability p in [0, 1] (torch's
// default is 0.5). A p outside it is a mistake of the calling program: it
// panics saying so.
func NewDropout(p float32) *Dropout {
	if !(p >= 0 && p <= 1) {
		panic(fmt.Sprintf("nn: Dropout probability %v; want a value in [0, 1]", p))
	}
	return &Dropout{P: p}
}

// Forward applies dropout in training; in evaluation it returns x.
func (d *Dropout) Forward(x *tensor.Tensor) *tensor.Tensor {
	return tensor.Dropout(x, d.P, !d.evaluating, d.source())
}

// ForwardAdd returns r + Forward(x), a residual connection after the
// dropout, in one pass where the backend has one (tensor.DropoutAdd).
func (d *Dropout) ForwardAdd(r, x *tensor.Tensor) *tensor.Tensor {
	return tensor.DropoutAdd(r, x, d.P, !d.evaluating, d.source())
}

// source is the layer's RandomSource, or DefaultRandomSource.
func (d *Dropout) source() tensor.RandomSource {
	if d.Source == nil {
		return DefaultRandomSource
	}
	return d.Source
}

// SetTraining switches dropout on (training) or off (evaluation).
func (d *Dropout) SetTraining(on bool) { d.evaluating = !on }

// Training reports the mode.
func (d *Dropout) Training() bool { return !d.evaluating }

// RandomUser is a layer that draws random numbers (Dropout).
type RandomUser interface {
	SetRandomSource(src tensor.RandomSource)
}

// SetRandomSource makes src the generator of the layer.
func (d *Dropout) SetRandomSource(src tensor.RandomSource) { d.Source = src }

// SetRandomSource gives src to every layer of m that draws random numbers,
// so that a model's dropout masks follow one seed (a tensor.Generator) or
// are drawn on the device, new on every replay of a captured CUDA graph
// (a tensor.DeviceGenerator).
func SetRandomSource(m any, src tensor.RandomSource) {
	walk(m, "", func(_ string, v any) bool {
		if r, ok := v.(RandomUser); ok {
			r.SetRandomSource(src)
		}
		return true
	}, func(string, *tensor.Tensor) {})
}
