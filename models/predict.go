package models

import (
	"fmt"
	"math"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// LoadLeNet builds a LeNet on b and loads its parameters from the
// safetensors file at path (strictly: exactly LeNet's tensors, F32, of
// LeNet's shapes). Errors are one line and name the file.
func LoadLeNet(path string, b tensor.Backend) (*LeNet, error) {
	var m *LeNet
	if err := tensor.Guard(func() { m = NewLeNet(b, 0) }); err != nil {
		return nil, fmt.Errorf("models: LeNet on %s: %w", b.Name(), err)
	}
	if err := nn.LoadFile(path, m); err != nil {
		release(m)
		return nil, err
	}
	return m, nil
}

// release frees the parameters of m now rather than when the collector
// finds them (device memory is not the collector's to manage).
func release(m nn.Module) {
	for _, p := range nn.Parameters(m) {
		p.Tensor.Release()
	}
}

// InputChecker is implemented by models that can say whether they fit a
// batch (LeNet.CheckInput); Predict and Evaluate ask them first.
type InputChecker interface {
	CheckInput(x *tensor.Tensor) error
}

// Predict runs m on a batch of normalised images (float32 [N, 1, 28, 28] for
// LeNet, on m's backend) without recording a graph, and returns for each
// image the class of the largest logit and the softmax probabilities of all
// classes. A batch the model does not take (wrong dtype, or a shape an
// InputChecker refuses) is an error saying what was expected, and so is a
// model that gives other than one row of logits per image. The
// intermediate tensors live in a no-grad scope released before Predict
// returns; images itself is left alone.
func Predict(m nn.Module, images *tensor.Tensor) (classes []int, probs [][]float32, err error) {
	if images.DType() != tensor.Float32 {
		return nil, nil, fmt.Errorf("models: Predict of %s images; want normalised float32 (see data.Normalize)", images.DType())
	}
	if c, ok := m.(InputChecker); ok {
		if err := c.CheckInput(images); err != nil {
			return nil, nil, err
		}
	}
	if len(images.Shape()) == 0 || images.Dim(0) < 1 {
		return nil, nil, fmt.Errorf("models: Predict of images %v; want a batch of at least one", images.Shape())
	}
	s := tensor.NewNoGradScope()
	defer s.Release()
	x := tensor.Empty(images.Backend(), s, images.Shape()...)
	tensor.CopyTensor(x, images)
	logits := m.Forward(x)
	if len(logits.Shape()) != 2 || logits.Dim(0) != images.Dim(0) {
		return nil, nil, fmt.Errorf("models: the model gave logits %v for %d images; want one row per image", logits.Shape(), images.Dim(0))
	}
	n, k := logits.Dim(0), logits.Dim(1)
	vals := logits.Float32s()
	classes = make([]int, n)
	probs = make([][]float32, n)
	for i := range n {
		classes[i], probs[i] = softmax(vals[i*k : (i+1)*k])
	}
	return classes, probs, nil
}

// softmax returns the index of the largest value (the first of equal ones,
// as torch.argmax) and the softmax of row, computed in float64.
func softmax(row []float32) (int, []float32) {
	best := 0
	for j, v := range row {
		if v > row[best] {
			best = j
		}
	}
	maxv := float64(row[best])
	e := make([]float64, len(row))
	var sum float64
	for j, v := range row {
		e[j] = math.Exp(float64(v) - maxv)
		sum += e[j]
	}
	p := make([]float32, len(row))
	for j := range e {
		p[j] = float32(e[j] / sum)
	}
	return best, p
}

// Evaluate runs m on backend b over n images of raw pixels (uint8,
// image after image, square, 28×28 for LeNet) with their labels, in batches
// of batch images (1000 if batch <= 0), and returns the fraction classified
// correctly and the mean cross-entropy loss. Pixels are normalised with
// data.Normalize, as in training. Each batch runs in a no-grad scope that
// is reset before the next one, so memory stays that of one batch. Sizes
// that disagree, and images the model does not take (an InputChecker's
// word), are an error saying what was expected.
func Evaluate(m nn.Module, b tensor.Backend, images []uint8, labels []uint8, n, batch int) (accuracy, meanLoss float64, err error) {
	return EvaluateNormalized(m, b, images, labels, n, batch, MNISTNormalization)
}

// EvaluateNormalized is Evaluate with the pixels normalised by norm (the
// one a checkpoint records: NormalizationFromMetadata).
func EvaluateNormalized(m nn.Module, b tensor.Backend, images []uint8, labels []uint8, n, batch int, norm Normalization) (accuracy, meanLoss float64, err error) {
	if n <= 0 {
		return 0, 0, nil
	}
	size := len(images) / n
	side := int(math.Round(math.Sqrt(float64(size))))
	if size*n != len(images) || side*side != size || len(labels) < n {
		return 0, 0, fmt.Errorf("models: Evaluate of %d images in %d bytes with %d labels; want n square images and n labels", n, len(images), len(labels))
	}
	if batch <= 0 {
		batch = 1000
	}
	batch = min(batch, n)
	x := make([]float32, batch*size)
	y := make([]int32, batch)
	s := tensor.NewNoGradScope()
	defer s.Release()
	correct := 0
	var loss float64
	for lo := 0; lo < n; lo += batch {
		hi := min(lo+batch, n)
		bs := hi - lo
		norm.Apply(x, images[lo*size:hi*size])
		for i := range bs {
			y[i] = int32(labels[lo+i])
		}
		xt := tensor.FromFloat32(b, s, x[:bs*size], bs, 1, side, side)
		if c, ok := m.(InputChecker); ok {
			if err := c.CheckInput(xt); err != nil {
				return 0, 0, err
			}
		}
		yt := tensor.FromInt32(b, s, y[:bs], bs)
		logits := m.Forward(xt)
		if len(logits.Shape()) != 2 || logits.Dim(0) != bs {
			return 0, 0, fmt.Errorf("models: the model gave logits %v for %d images; want one row per image", logits.Shape(), bs)
		}
		loss += float64(tensor.CrossEntropy(logits, yt).Item()) * float64(bs)
		for i, c := range tensor.Argmax(logits).Int32s() {
			if c == y[i] {
				correct++
			}
		}
		s.Reset()
	}
	return float64(correct) / float64(n), loss / float64(n), nil
}
