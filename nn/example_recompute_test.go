package nn_test

import (
	"fmt"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// Two transformer blocks whose activations are computed again in the
// backward pass: the forward pass keeps each block's input, middle and
// output (tensor.CountingCPU counts what a step holds, as a GPU's allocator
// would), and the state dict keys are those of the plain Sequential.
func ExampleRecomputeBlocks() {
	c := tensor.NewCountingCPU()
	m := nn.NewSequential(nn.NewTransformerBlock(c, nil, 32, 2, 0), nn.NewTransformerBlock(c, nil, 32, 2, 0))
	defer func() {
		for _, p := range nn.StateTensors(m) {
			p.Tensor.Release()
		}
	}()
	held := func() int {
		s := tensor.NewScope()
		defer s.Release()
		start := c.Live()
		y := m.Forward(tensor.Zeros(c, s, 4, 64, 32))
		defer tensor.Sum(y).Backward()
		return c.Live() - start
	}
	plain := held()
	fmt.Println("blocks wrapped:", nn.RecomputeBlocks(m))
	fmt.Println("first key:", nn.StateDict(m)[0].Name)
	fmt.Printf("forward pass holds %.0f%% of the plain one's memory\n", 100*float64(held())/float64(plain))
	// Output:
	// blocks wrapped: 2
	// first key: 0.ln1.weight
	// forward pass holds 8% of the plain one's memory
}
