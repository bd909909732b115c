package nn_test

import (
	"fmt"
	"math/rand/v2"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// MLP is a model defined by a user: a struct of layers with a Forward method;
// its parameters are found from its fields (hidden.weight, ..., out.bias).
type MLP struct {
	Hidden, Out *nn.Linear
}

// Forward is Linear → ReLU → Linear.
func (m *MLP) Forward(x *tensor.Tensor) *tensor.Tensor {
	return m.Out.Forward(tensor.ReLU(m.Hidden.Forward(x)))
}

// A user-defined model trained with SGD on the CPU: each step runs the
// forward pass in a scope, back-propagates, updates the parameters and
// releases the step's tensors.
func Example() {
	rng := rand.New(rand.NewPCG(1, 2))
	var m nn.Module = &MLP{
		Hidden: nn.NewLinear(tensor.CPU, rng, 2, 16),
		Out:    nn.NewLinear(tensor.CPU, rng, 16, 2),
	}
	for _, p := range nn.Parameters(m) {
		fmt.Println(p.Name, p.Tensor.Shape())
	}
	fmt.Println("parameters:", nn.NumParameters(m))

	// Four points; the class is 1 when both coordinates have the same sign.
	points := []float32{1, 1, -1, -1, 1, -1, -1, 1}
	classes := []int32{1, 1, 0, 0}

	opt, err := optim.NewSGD(nn.Parameters(m), optim.SGDConfig{LR: 0.2, Momentum: 0.9})
	if err != nil {
		panic(err)
	}
	// The optimiser's gradients and momentum, and the model's parameters,
	// are freed when done, not left to the garbage collector.
	defer opt.Release()
	defer func() {
		for _, p := range nn.Parameters(m) {
			p.Tensor.Release()
		}
	}()
	var first, last float32
	for step := 0; step < 50; step++ {
		s := tensor.NewScope()
		x := tensor.FromFloat32(tensor.CPU, s, points, 4, 2)
		y := tensor.FromInt32(tensor.CPU, s, classes, 4)
		loss := nn.CrossEntropyLoss(m.Forward(x), y)
		opt.ZeroGrad()
		loss.Backward()
		opt.Step()
		if step == 0 {
			first = loss.Item()
			fmt.Printf("first loss %.2f\n", first)
		}
		last = loss.Item()
		s.Release()
	}
	fmt.Println("loss fell below a tenth:", last < first/10)

	s := tensor.NewNoGradScope()
	defer s.Release()
	pred := tensor.Argmax(m.Forward(tensor.FromFloat32(tensor.CPU, s, points, 4, 2)))
	fmt.Println("predictions:", pred.Int32s())
	// Output:
	// hidden.weight [16 2]
	// hidden.bias [16]
	// out.weight [2 16]
	// out.bias [2]
	// parameters: 82
	// first loss 0.72
	// loss fell below a tenth: true
	// predictions: [1 1 0 0]
}
