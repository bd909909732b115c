package nn_test

import (
	"fmt"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// A depthwise-separable block as torch's
// Sequential(Conv2d(32, 32, 3, padding=1, groups=32, bias=False),
// BatchNorm2d(32), Conv2d(32, 64, 1)): its state dict keys and shapes.
func ExampleNewConv2dWith() {
	b := tensor.CPU
	m := nn.NewSequential(
		nn.NewConv2dWith(b, nil, 32, 32, nn.Conv2dOptions{Kernel: [2]int{3, 3}, Padding: [2]int{1, 1}, Groups: 32, NoBias: true}),
		nn.NewBatchNorm2d(b, 32),
		nn.NewConv2dWith(b, nil, 32, 64, nn.Conv2dOptions{Kernel: [2]int{1, 1}}),
	)
	defer func() {
		for _, p := range nn.StateTensors(m) {
			p.Tensor.Release()
		}
	}()
	for _, p := range nn.StateDict(m) {
		fmt.Println(p.Name, p.Shape)
	}
	s := tensor.NewNoGradScope()
	defer s.Release()
	fmt.Println(m.Forward(tensor.Zeros(b, s, 2, 32, 8, 8)).Shape())
	// Output:
	// 0.weight [32 1 3 3]
	// 1.weight [32]
	// 1.bias [32]
	// 2.weight [64 32 1 1]
	// 2.bias [64]
	// 1.running_mean [32]
	// 1.running_var [32]
	// 1.num_batches_tracked []
	// [2 64 8 8]
}

// A transformer block over sequences of 64 channels in 4 heads, with the
// state dict keys of the PyTorch GPT block it mirrors; in evaluation mode
// dropout is off.
func ExampleTransformerBlock() {
	b := tensor.CPU
	blk := nn.NewTransformerBlock(b, nil, 64, 4, 0.1)
	defer func() {
		for _, p := range nn.StateTensors(blk) {
			p.Tensor.Release()
		}
	}()
	for _, p := range nn.StateDict(blk) {
		fmt.Println(p.Name, p.Shape)
	}
	nn.SetTraining(blk, false)
	s := tensor.NewNoGradScope()
	defer s.Release()
	x := tensor.Zeros(b, s, 2, 10, 64) // [batch, time, channels]
	fmt.Println(blk.Forward(x).Shape())
	// Output:
	// ln1.weight [64]
	// ln1.bias [64]
	// ln2.weight [64]
	// ln2.bias [64]
	// qkv.weight [192 64]
	// qkv.bias [192]
	// proj.weight [64 64]
	// proj.bias [64]
	// mlp.0.weight [256 64]
	// mlp.0.bias [256]
	// mlp.2.weight [64 256]
	// mlp.2.bias [64]
	// [2 10 64]
}
