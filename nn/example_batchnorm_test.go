package nn_test

import (
	"fmt"
	"math/rand/v2"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// Classifier is a user's model with batch normalisation and dropout: its
// fields are its layers, named in the state dict as a PyTorch module with
// the same attributes (fc1, bn1, drop, fc2).
type Classifier struct {
	FC1  *nn.Linear
	BN1  *nn.BatchNorm1d
	Drop *nn.Dropout
	FC2  *nn.Linear
}

// Forward is Linear → BatchNorm → ReLU → Dropout → Linear.
func (m *Classifier) Forward(x *tensor.Tensor) *tensor.Tensor {
	return m.FC2.Forward(m.Drop.Forward(tensor.ReLU(m.BN1.Forward(m.FC1.Forward(x)))))
}

// A model with BatchNorm and Dropout trained on the CPU: nn.SetTraining
// switches both between training (batch statistics, dropout on) and
// evaluation (running statistics, dropout off), as torch's
// model.train() and model.eval().
func Example_batchNorm() {
	rng := rand.New(rand.NewPCG(1, 2))
	m := &Classifier{
		FC1:  nn.NewLinear(tensor.CPU, rng, 2, 16),
		BN1:  nn.NewBatchNorm1d(tensor.CPU, 16),
		Drop: nn.NewDropout(0.1),
		FC2:  nn.NewLinear(tensor.CPU, rng, 16, 2),
	}
	nn.SetRandomSource(m, tensor.NewGenerator(7)) // the dropout masks' seed
	for _, p := range nn.StateDict(m) {
		fmt.Println(p.Name, p.Shape)
	}

	// Eight points; the class is 1 when both coordinates have the same sign.
	points := []float32{1, 1, -1, -1, 1, -1, -1, 1, 2, 1, -1, -2, 1, -2, -2, 1}
	classes := []int32{1, 1, 0, 0, 1, 1, 0, 0}
	evalLoss := func() float32 {
		nn.SetTraining(m, false)
		defer nn.SetTraining(m, true)
		s := tensor.NewNoGradScope()
		defer s.Release()
		x := tensor.FromFloat32(tensor.CPU, s, points, 8, 2)
		return nn.CrossEntropyLoss(m.Forward(x), tensor.FromInt32(tensor.CPU, s, classes, 8)).Item()
	}

	opt, err := optim.NewSGD(nn.Parameters(m), optim.SGDConfig{LR: 0.1, Momentum: 0.9})
	if err != nil {
		panic(err)
	}
	defer opt.Release()
	defer func() {
		for _, p := range nn.StateTensors(m) {
			p.Tensor.Release()
		}
	}()
	before := evalLoss()
	s := tensor.NewScope()
	defer s.Release()
	for range 30 {
		s.Reset()
		x := tensor.FromFloat32(tensor.CPU, s, points, 8, 2)
		loss := nn.CrossEntropyLoss(m.Forward(x), tensor.FromInt32(tensor.CPU, s, classes, 8))
		opt.ZeroGrad()
		loss.Backward()
		opt.Step()
	}
	fmt.Println("batches tracked:", m.BN1.NumBatchesTracked.Item())
	fmt.Println("evaluation loss fell by half:", evalLoss() < before/2)
	// Output:
	// fc1.weight [16 2]
	// fc1.bias [16]
	// bn1.weight [16]
	// bn1.bias [16]
	// fc2.weight [2 16]
	// fc2.bias [2]
	// bn1.running_mean [16]
	// bn1.running_var [16]
	// bn1.num_batches_tracked []
	// batches tracked: 30
	// evaluation loss fell by half: true
}
