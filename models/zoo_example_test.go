package models_test

import (
	"fmt"

	"github.com/ember-ml/ember/models"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// A ResNet-9 for CIFAR-100's colour images, its state dict keys those of
// the PyTorch Sequential, and a training loss on a batch.
func ExampleNewResNet9() {
	cfg := models.DefaultResNet9Config()
	cfg.InChannels, cfg.Classes = 3, 100
	cfg.Width = 16 // a quarter of the benchmark's width, for a quick example
	m := models.NewResNet9(tensor.CPU, 1, cfg)
	defer m.Release()
	params, buffers := nn.Parameters(m), nn.Buffers(m)
	fmt.Println(len(params), "parameters:", params[0].Name, params[1].Name, "...", params[len(params)-1].Name)
	fmt.Println(len(buffers), "buffers:", buffers[0].Name, buffers[1].Name, buffers[2].Name, "...")

	s := tensor.NewScope()
	defer s.Release()
	x := tensor.Zeros(tensor.CPU, s, 2, 3, 32, 32)
	labels := tensor.FromInt32(tensor.CPU, s, []int32{3, 97}, 2)
	fmt.Println("logits", m.Logits(x).Shape())
	loss := m.Loss(x, labels) // cross entropy of logits·0.125, label smoothing 0.1
	loss.Backward()
	fmt.Println("loss is a scalar:", len(loss.Shape()) == 0 || loss.Len() == 1)
	// Output:
	// 25 parameters: 0.0.weight 0.1.weight ... 11.weight
	// 24 buffers: 0.1.running_mean 0.1.running_var 0.1.num_batches_tracked ...
	// logits [2 100]
	// loss is a scalar: true
}

// GPT maps token ids [B, T] to next-token logits [B, T, Vocab].
func ExampleNewGPT() {
	cfg := models.GPTConfig{Layers: 2, Heads: 2, Channels: 32, Context: 16, Vocab: 20, Dropout: 0.2}
	m := models.NewGPT(tensor.CPU, 1, cfg)
	defer m.Release()
	nn.SetTraining(m, false) // no dropout
	s := tensor.NewNoGradScope()
	defer s.Release()
	ids := tensor.FromInt32(tensor.CPU, s, []int32{1, 2, 3, 4, 5, 6, 7, 8}, 2, 4)
	fmt.Println(m.Forward(ids).Shape(), nn.NumParameters(m))
	// Output:
	// [2 4 20] 27264
}
