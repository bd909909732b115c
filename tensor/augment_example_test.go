package tensor_test

import (
	"fmt"

	"github.com/ember-ml/ember/tensor"
)

// A batch of two augmented samples from a data set of 3x3 grey images kept
// as bytes: each image translated by up to one pixel (the padding reads 0),
// flipped half the time and scaled to [0, 1]. The same seed, epoch and
// sample give the same pixels on every backend.
func ExampleAugmentGather() {
	b, s := tensor.CPU, tensor.NewScope()
	defer s.Release()
	images := tensor.FromUint8(b, s, []uint8{
		1, 2, 3, 4, 5, 6, 7, 8, 9, // image 0
		10, 20, 30, 40, 50, 60, 70, 80, 90, // image 1
	}, 2, 1, 3, 3)
	norm := tensor.AugmentNorm(b, s, []float32{0}, []float32{1.0 / 255}) // keep the byte values
	idx := tensor.FromInt32(b, s, []int32{1, 0}, 2)
	spec := tensor.AugmentSpec{Pad: 1, FlipProb: 0.5, Seed: 7, Offset: tensor.AugmentOffset(3, 2)} // epoch 3 of 2 samples
	x := tensor.AugmentGather(s, images, idx, norm, spec)
	fmt.Println(x.Shape()) // sample 1 moved up one row and right one column; sample 0 flipped
	fmt.Println(x.Float32s())
	// Output:
	// [2 1 3 3]
	// [0 40 50 0 70 80 0 0 0 3 2 1 6 5 4 9 8 7]
}
