package trainer

import (
	"fmt"

	"github.com/ember-ml/ember/data"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// Batch is one step's inputs and integer class labels, on the device.
type Batch struct {
	Inputs, Labels *tensor.Tensor
}

// Source is the training set as the trainer draws from it: Len examples
// in a fixed order that the trainer shuffles by index. A step's batch is
// formed in two halves so that the step can be captured and replayed:
// Load, on the host before the step, writes the chosen examples' indices
// (and whatever else changes per step) into device tensors that stay the
// same; Batch, inside the step, computes the inputs from those tensors
// without waiting for the host.
type Source interface {
	// Len is the number of training examples.
	Len() int
	// BatchSize is the number of examples per batch.
	BatchSize() int
	// Load uploads the batch of the examples at indices (BatchSize of
	// them) for the next Batch.
	Load(indices []int32)
	// Batch builds the loaded batch's tensors in s.
	Batch(s *tensor.Scope) Batch
}

// EpochSetter is a Source whose batches depend on the epoch (augmentation
// draws): Run tells it each epoch before its first batch.
type EpochSetter interface {
	SetEpoch(epoch int)
}

// Images is a Source of a whole image data set held on the device as
// bytes (data.Dataset's uint8 pixels), normalised into float32 batches
// [B, channels, rows, cols] by one gather per step (tensor.GatherNormalize:
// x·scale + shift). It is how an MNIST-sized set trains without a host
// transfer per step other than the batch's indices and labels.
type Images struct {
	set          *data.Dataset
	aug          *Augmentation
	augNorm      *tensor.Tensor // float32 [2, C]: the per-channel scale and shift
	augState     *tensor.Tensor // int32 [4]: seed and epoch offset, on the device
	pixels       *tensor.Tensor // uint8 [N, channels·rows·cols]
	idx, labels  *tensor.Tensor // int32 [B] each, views of batch
	batch        *tensor.Tensor // idx and labels packed: one upload per step
	host         []int32        // the indices, then the labels
	scale, shift float32
	autocast     tensor.DType // Evaluate's (SetAutocast)
}

// SetAutocast sets the autocast Evaluate runs the model under
// (tensor.Scope.SetAutocast): the training's, as torch evaluates inside
// its autocast region, so that evaluation takes bfloat16 products and
// convolutions and, on the GPU, holds a convolution net's activations in
// bfloat16 (half the memory). Float32, the default, evaluates in
// float32.
func (im *Images) SetAutocast(dt tensor.DType) { im.autocast = dt }

// Augmentation is the per-sample augmentation of an Images source, run in
// the batch gather on the device (tensor.AugmentGatherAt): a random crop of
// the image padded by Pad pixels (a translation), a horizontal flip with
// probability FlipProb, and a Cutout-sided square zeroed; the pixels are
// normalised by Mean and Std per channel (0-1 scale). Draws depend on
// (Seed, epoch, sample) only, the same bits on every backend.
type Augmentation struct {
	Pad      int
	FlipProb float32
	Cutout   int
	Mean     []float32
	Std      []float32
	Seed     uint64
}

// SetAugmentation makes the training batches augmented as a says; nil
// turns augmentation off. Call it before training.
func (im *Images) SetAugmentation(a *Augmentation) error {
	if im.augNorm != nil {
		im.augNorm.Release()
		im.augState.Release()
		im.augNorm, im.augState = nil, nil
	}
	im.aug = a
	if a == nil {
		return nil
	}
	d := im.set
	if len(a.Mean) != d.NumChannels() || len(a.Std) != d.NumChannels() {
		return fmt.Errorf("trainer: augmentation with %d means and %d deviations for %d channels", len(a.Mean), len(a.Std), d.NumChannels())
	}
	spec := im.spec()
	if err := spec.Check(); err != nil {
		return err
	}
	b := im.pixels.Backend()
	return tensor.Guard(func() {
		im.augNorm = tensor.AugmentNorm(b, nil, a.Mean, a.Std)
		im.augState = tensor.NewAugmentState(b, nil, a.Seed, 0)
	})
}

func (im *Images) spec() tensor.AugmentSpec {
	d, a := im.set, im.aug
	return tensor.AugmentSpec{C: d.NumChannels(), H: d.Rows, W: d.Cols, Pad: a.Pad, FlipProb: a.FlipProb, Cutout: a.Cutout, Seed: a.Seed}
}

// SetEpoch gives each epoch its own augmentation draws (an upload of the
// epoch's counter offset, which a replayed graph reads on the device).
func (im *Images) SetEpoch(epoch int) {
	if im.aug != nil {
		tensor.SetAugmentState(im.augState, im.aug.Seed, tensor.AugmentOffset(epoch, im.set.N))
	}
}

// MNISTScale and MNISTShift are the scale and shift of (x/255 - data.Mean)/data.Std
// as one multiply-add on bytes, the normalisation of MNIST.
var (
	MNISTScale = float32(1 / (255 * data.Std))
	MNISTShift = float32(-data.Mean / data.Std)
)

// NewImages uploads set to b and draws batches of batchSize images from
// it, normalised as x·scale + shift; a batch size of 0 makes a set for
// Evaluate only. Release frees the device copy.
func NewImages(b tensor.Backend, set *data.Dataset, batchSize int, scale, shift float32) (*Images, error) {
	if batchSize < 0 || batchSize > set.N {
		return nil, fmt.Errorf("trainer: batch size %d for %d images; want at most %d", batchSize, set.N, set.N)
	}
	im := &Images{set: set, scale: scale, shift: shift, host: make([]int32, 2*batchSize)}
	err := tensor.Guard(func() {
		im.pixels = tensor.FromUint8(b, nil, set.Images, set.N, set.ImageSize())
		if batchSize == 0 {
			return
		}
		im.idx = tensor.EmptyOf(b, nil, tensor.Int32, batchSize)
		im.labels = tensor.EmptyOf(b, nil, tensor.Int32, batchSize)
		im.batch = tensor.Pack([]*tensor.Tensor{im.idx, im.labels})
	})
	if err != nil {
		im.Release()
		return nil, err
	}
	return im, nil
}

// Len is the number of images.
func (im *Images) Len() int { return im.set.N }

// BatchSize is the number of images per batch (0 for a set made for
// Evaluate only).
func (im *Images) BatchSize() int { return len(im.host) / 2 }

// Bytes is the size of the pixels on the device.
func (im *Images) Bytes() int { return len(im.set.Images) }

// Load uploads the indices and labels of the next batch.
func (im *Images) Load(indices []int32) {
	n := im.BatchSize()
	if len(indices) != n {
		panic(fmt.Sprintf("trainer: Images.Load of %d indices, batch size %d", len(indices), n))
	}
	copy(im.host, indices)
	for i, j := range indices {
		im.host[n+i] = int32(im.set.Labels[j])
	}
	im.batch.Backend().Upload(im.batch.Buffer(), im.host)
}

// Batch gathers and normalises the loaded images.
func (im *Images) Batch(s *tensor.Scope) Batch {
	d := im.set
	if im.aug != nil {
		images := im.pixels.Reshape(d.N, d.NumChannels(), d.Rows, d.Cols)
		x := tensor.AugmentGatherAt(s, images, im.idx, im.augNorm, im.augState, im.spec())
		return Batch{Inputs: x, Labels: im.labels}
	}
	x := tensor.GatherNormalize(s, im.pixels, im.idx, im.scale, im.shift).Reshape(im.BatchSize(), d.NumChannels(), d.Rows, d.Cols)
	return Batch{Inputs: x, Labels: im.labels}
}

// Evaluate returns the mean cross entropy and the accuracy in percent of
// m on all the images, in batches of at most batch images, without
// recording a graph.
func (im *Images) Evaluate(m nn.Module, batch int) (loss, accuracy float64, err error) {
	err = tensor.Guard(func() { loss, accuracy = im.evaluate(m, batch) })
	return loss, accuracy, err
}

func (im *Images) evaluate(m nn.Module, batch int) (loss, accuracy float64) {
	d := im.set
	b := im.pixels.Backend()
	batch = max(1, min(batch, d.N))
	idx := make([]int32, batch)
	labels := make([]int32, batch)
	var lossSum float64
	correct := 0
	for start := 0; start < d.N; start += batch {
		n := min(batch, d.N-start)
		for i := 0; i < n; i++ {
			idx[i] = int32(start + i)
			labels[i] = int32(d.Labels[start+i])
		}
		s := tensor.NewNoGradScope()
		s.SetReleaseInBackward(true) // layers may hand back each input once the next is done (tensor.ReleaseInput)
		if im.autocast == tensor.BFloat16 {
			s.SetAutocast(im.autocast)
		}
		ix := tensor.FromInt32(b, s, idx[:n], n)
		var x *tensor.Tensor
		if im.aug != nil {
			// The set's per-channel normalisation, without the random
			// crop, flip and cutout: evaluation sees what training saw,
			// un-augmented.
			spec := im.spec()
			spec.Pad, spec.FlipProb, spec.Cutout = 0, 0, 0
			x = tensor.AugmentGather(s, im.pixels.Reshape(d.N, d.NumChannels(), d.Rows, d.Cols), ix, im.augNorm, spec)
		} else {
			x = tensor.GatherNormalize(s, im.pixels, ix, im.scale, im.shift).Reshape(n, d.NumChannels(), d.Rows, d.Cols)
		}
		y := tensor.FromInt32(b, s, labels[:n], n)
		logits := m.Forward(x)
		lossSum += float64(tensor.CrossEntropy(logits, y).Item()) * float64(n)
		for i, p := range tensor.Argmax(logits).Int32s() {
			if p == labels[i] {
				correct++
			}
		}
		s.Release()
	}
	return lossSum / float64(d.N), 100 * float64(correct) / float64(d.N)
}

// Release frees the device copy of the images and the batch tensors.
func (im *Images) Release() {
	for _, t := range []*tensor.Tensor{im.pixels, im.batch, im.augNorm, im.augState} {
		if t != nil {
			t.Release()
		}
	}
	im.pixels, im.batch, im.augNorm, im.augState = nil, nil, nil, nil
}
