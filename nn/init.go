package nn

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/ember-ml/ember/tensor"
)

// Weight initialisation as torch.nn.init does it: the same fans, gains and
// bounds, so that a Go model starts from the same distribution as its
// PyTorch twin (not the same numbers: the generators differ). Values are
// drawn on the host with rng (nil: a generator seeded with 1) and copied
// into t, which must be a contiguous float32 tensor.

// Fans returns the fan-in and fan-out of a weight of the given shape, as
// torch.nn.init._calculate_fan_in_and_fan_out: [out, in, k...] has fan-in
// in·Πk and fan-out out·Πk; a 1-D shape has fan-in and fan-out its length.
func Fans(shape []int) (fanIn, fanOut int) {
	switch len(shape) {
	case 0:
		return 1, 1
	case 1:
		return shape[0], shape[0]
	}
	field := 1
	for _, d := range shape[2:] {
		field *= d
	}
	return shape[1] * field, shape[0] * field
}

// Gain is torch.nn.init.calculate_gain: the factor that keeps activations'
// variance through a nonlinearity ("linear", "conv2d", "sigmoid": 1;
// "tanh": 5/3; "relu": √2; "leaky_relu" with slope a: √(2/(1+a²));
// "selu": 3/4).
func Gain(nonlinearity string, a float64) float64 {
	switch nonlinearity {
	case "linear", "conv1d", "conv2d", "conv3d", "sigmoid", "identity":
		return 1
	case "tanh":
		return 5.0 / 3
	case "relu":
		return math.Sqrt2
	case "leaky_relu":
		return math.Sqrt(2 / (1 + a*a))
	case "selu":
		return 0.75
	}
	panic(fmt.Sprintf("nn: Gain: unknown nonlinearity %q", nonlinearity))
}

// fanOf picks the fan of a kaiming initialiser: "fan_in" (torch's default)
// or "fan_out".
func fanOf(shape []int, mode string) float64 {
	in, out := Fans(shape)
	switch mode {
	case "fan_in", "":
		return float64(in)
	case "fan_out":
		return float64(out)
	}
	panic(fmt.Sprintf("nn: unknown fan mode %q (want fan_in or fan_out)", mode))
}

// KaimingUniform fills t from U(-b, b), b = gain·√(3/fan), as
// torch.nn.init.kaiming_uniform_(t, a, mode, nonlinearity).
func KaimingUniform(t *tensor.Tensor, rng *rand.Rand, a float64, mode, nonlinearity string) {
	b := Gain(nonlinearity, a) * math.Sqrt(3/fanOf(t.Shape(), mode))
	Uniform(t, rng, -b, b)
}

// KaimingNormal fills t from N(0, std²), std = gain/√fan, as
// torch.nn.init.kaiming_normal_.
func KaimingNormal(t *tensor.Tensor, rng *rand.Rand, a float64, mode, nonlinearity string) {
	Normal(t, rng, 0, Gain(nonlinearity, a)/math.Sqrt(fanOf(t.Shape(), mode)))
}

// XavierUniform fills t from U(-b, b), b = gain·√(6/(fan_in+fan_out)), as
// torch.nn.init.xavier_uniform_.
func XavierUniform(t *tensor.Tensor, rng *rand.Rand, gain float64) {
	in, out := Fans(t.Shape())
	b := gain * math.Sqrt(6/float64(in+out))
	Uniform(t, rng, -b, b)
}

// XavierNormal fills t from N(0, std²), std = gain·√(2/(fan_in+fan_out)).
func XavierNormal(t *tensor.Tensor, rng *rand.Rand, gain float64) {
	in, out := Fans(t.Shape())
	Normal(t, rng, 0, gain*math.Sqrt(2/float64(in+out)))
}

// Uniform fills t from U(lo, hi).
func Uniform(t *tensor.Tensor, rng *rand.Rand, lo, hi float64) {
	rng = orDefault(rng)
	fillWith(t, func() float64 { return lo + (hi-lo)*rng.Float64() })
}

// Normal fills t from N(mean, std²).
func Normal(t *tensor.Tensor, rng *rand.Rand, mean, std float64) {
	rng = orDefault(rng)
	fillWith(t, func() float64 { return mean + std*rng.NormFloat64() })
}

// Constant sets every element of t to v (Zeros and Ones are v = 0 and 1).
func Constant(t *tensor.Tensor, v float64) { fillWith(t, func() float64 { return v }) }

func fillWith(t *tensor.Tensor, draw func() float64) {
	data := make([]float32, t.Len())
	for i := range data {
		data[i] = float32(draw())
	}
	t.CopyFrom(data)
}
