package models_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/ember-ml/ember/data"
	"github.com/ember-ml/ember/models"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// ExamplePredict saves a LeNet (untrained, from a fixed seed), loads it
// back, and classifies a synthetic image with both.
func ExamplePredict() {
	dir, err := os.MkdirTemp("", "lenet-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "lenet.safetensors")

	m := models.NewLeNet(tensor.CPU, 1)
	if err := nn.SaveFile(path, m, map[string]string{"note": "untrained"}); err != nil {
		panic(err)
	}
	loaded, err := models.LoadLeNet(path, tensor.CPU)
	if err != nil {
		panic(err)
	}

	// A "1": a vertical stroke, light on dark like MNIST.
	pixels := make([]uint8, 28*28)
	for y := 4; y < 24; y++ {
		pixels[y*28+13], pixels[y*28+14] = 255, 200
	}
	x := make([]float32, len(pixels))
	data.Normalize(x, pixels)
	img := tensor.FromFloat32(tensor.CPU, nil, x, 1, 1, 28, 28)
	defer img.Release()

	classes, probs, err := models.Predict(loaded, img)
	if err != nil {
		panic(err)
	}
	before, probsBefore, err := models.Predict(m, img)
	if err != nil {
		panic(err)
	}
	fmt.Printf("predicted %d with probability %.2f\n", classes[0], probs[0][classes[0]])
	fmt.Println("same as before saving:", classes[0] == before[0] && slices.Equal(probs[0], probsBefore[0]))
	// Output:
	// predicted 6 with probability 0.12
	// same as before saving: true
}
