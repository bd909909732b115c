package nn

import (
	"fmt"

	"github.com/ember-ml/ember/tensor"
)

// AvgPool2d averages over sliding windows, as nn.AvgPool2d: Options holds
// the window, stride (zero: the window), padding (zeros, counted in each
// window's divisor unless ExcludePad), ceil mode and divisor override.
type AvgPool2d struct{ Options tensor.AvgPoolOptions }

// NewAvgPool2d returns an average pooling over disjoint k×k windows, as
// nn.AvgPool2d(k).
func NewAvgPool2d(k int) *AvgPool2d {
	return NewAvgPool2dWith(tensor.AvgPoolOptions{PoolOptions: tensor.PoolOptions{Kernel: [2]int{k, k}}})
}

// NewAvgPool2dWith returns an average pooling with the options o.
func NewAvgPool2dWith(o tensor.AvgPoolOptions) *AvgPool2d { return &AvgPool2d{Options: o} }

// Forward applies the pooling.
func (p *AvgPool2d) Forward(x *tensor.Tensor) *tensor.Tensor { return tensor.AvgPool2d(x, p.Options) }

// AdaptiveAvgPool2d averages [N, C, H, W] input down to Out = (height,
// width) whatever its size, as nn.AdaptiveAvgPool2d (windows of torch's
// adaptive rule). Out {1, 1} is global average pooling.
type AdaptiveAvgPool2d struct{ Out [2]int }

// NewAdaptiveAvgPool2d returns a pooling to an h×w output.
func NewAdaptiveAvgPool2d(h, w int) *AdaptiveAvgPool2d {
	checkAdaptive("AdaptiveAvgPool2d", h, w)
	return &AdaptiveAvgPool2d{Out: [2]int{h, w}}
}

// Forward applies the pooling.
func (p *AdaptiveAvgPool2d) Forward(x *tensor.Tensor) *tensor.Tensor {
	return tensor.AdaptiveAvgPool2d(x, p.Out[0], p.Out[1])
}

// AdaptiveMaxPool2d takes maxima of [N, C, H, W] input over the windows
// of torch's adaptive rule to an Out = (height, width) output, as
// nn.AdaptiveMaxPool2d.
type AdaptiveMaxPool2d struct{ Out [2]int }

// NewAdaptiveMaxPool2d returns a pooling to an h×w output.
func NewAdaptiveMaxPool2d(h, w int) *AdaptiveMaxPool2d {
	checkAdaptive("AdaptiveMaxPool2d", h, w)
	return &AdaptiveMaxPool2d{Out: [2]int{h, w}}
}

// Forward applies the pooling.
func (p *AdaptiveMaxPool2d) Forward(x *tensor.Tensor) *tensor.Tensor {
	return tensor.AdaptiveMaxPool2d(x, p.Out[0], p.Out[1])
}

func checkAdaptive(layer string, h, w int) {
	if h < 1 || w < 1 {
		panic(fmt.Sprintf("nn: %s output %dx%d; want both sizes >= 1", layer, h, w))
	}
}
