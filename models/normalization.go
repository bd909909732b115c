package models

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/ember-ml/ember/data"
)

// Normalization is how raw pixels (0-255) become a model's inputs:
// (p/255 - Mean)/Std, computed as p·scale + shift in float32 as the
// training gather does (tensor.GatherNormalize).
type Normalization struct {
	Mean, Std float32
}

// MNISTNormalization is MNIST's: the constants of data.Normalize, which
// checkpoints without a recorded normalisation were trained with.
var MNISTNormalization = Normalization{Mean: float32(data.Mean), Std: float32(data.Std)}

// MetaNormalization is the checkpoint metadata key of the normalisation a
// model was trained with, "mean,std" (absent: MNIST's).
const MetaNormalization = "ember.input_norm"

// ScaleShift returns the multiply-add of the normalisation.
func (n Normalization) ScaleShift() (scale, shift float32) {
	return 1 / (255 * n.Std), -n.Mean / n.Std
}

// Apply normalises src into dst (len(src) values): MNIST's exactly as
// data.Normalize, others as the training gather.
func (n Normalization) Apply(dst []float32, src []uint8) {
	if n == MNISTNormalization {
		data.Normalize(dst, src)
		return
	}
	scale, shift := n.ScaleShift()
	for i, p := range src {
		dst[i] = float32(p)*scale + shift
	}
}

// NormalizationMetadata records n in meta (a new map when nil).
func NormalizationMetadata(meta map[string]string, n Normalization) map[string]string {
	if meta == nil {
		meta = map[string]string{}
	}
	meta[MetaNormalization] = strconv.FormatFloat(float64(n.Mean), 'g', -1, 32) + "," + strconv.FormatFloat(float64(n.Std), 'g', -1, 32)
	return meta
}

// NormalizationFromMetadata reads the normalisation meta records, MNIST's
// when it records none; file names the checkpoint in errors.
func NormalizationFromMetadata(file string, meta map[string]string) (Normalization, error) {
	v, ok := meta[MetaNormalization]
	if !ok {
		return MNISTNormalization, nil
	}
	a, b, found := strings.Cut(v, ",")
	mean, err1 := strconv.ParseFloat(a, 32)
	std, err2 := strconv.ParseFloat(b, 32)
	if !found || err1 != nil || err2 != nil || !(std > 0) || math.IsInf(mean, 0) || math.IsNaN(mean) || math.IsInf(std, 0) {
		return Normalization{}, fmt.Errorf("models: %s: metadata %s is %q; want \"mean,std\" with a positive, finite std", file, MetaNormalization, v)
	}
	return Normalization{Mean: float32(mean), Std: float32(std)}, nil
}
