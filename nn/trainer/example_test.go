package trainer_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/nn/trainer"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// A training loop of one's own with CaptureStep: the batch goes into the
// same device tensors every step, the step reads it from there, and Run
// replays a CUDA graph of the step on a GPU (here, on the CPU, it runs
// eagerly and says why once); an evaluation runs under Lend.
func ExampleCaptureStep() {
	b := tensor.CPU
	rng := rand.New(rand.NewPCG(1, 2))
	model := nn.NewLinear(b, rng, 4, 3)
	sgd, err := optim.NewSGD(nn.Parameters(model), optim.SGDConfig{LR: 0.5, Momentum: 0.9})
	if err != nil {
		panic(err)
	}
	defer sgd.Release()

	const n = 32
	x := tensor.Zeros(b, nil, n, 4)
	y := tensor.EmptyOf(b, nil, tensor.Int32, n)
	defer x.Release()
	defer y.Release()
	step, err := trainer.CaptureStep(b, func(s *tensor.Scope) *tensor.Tensor {
		in := tensor.Empty(b, s, n, 4) // the step's tensors live in s
		tensor.CopyTensor(in, x)
		loss := nn.CrossEntropyLoss(model.Forward(in), y)
		loss.Backward()
		sgd.StepAndZeroGrad()
		return loss
	}, trainer.StepOptions{Optimizer: sgd, ZeroesGrads: true, Logf: func(format string, args ...any) { fmt.Printf(format+"\n", args...) }})
	if err != nil {
		panic(err)
	}
	defer step.Close()

	sgd.ZeroGrad() // once: each step zeroes the gradients it read
	xs, ys := make([]float32, n*4), make([]int32, n)
	var first, last float32
	for i := range 100 {
		// The class of a point is its largest of the first three features.
		for j := range n {
			for k := range 4 {
				xs[j*4+k] = float32(rng.NormFloat64())
			}
			ys[j] = 0
			for k := 1; k < 3; k++ {
				if xs[j*4+k] > xs[j*4+int(ys[j])] {
					ys[j] = int32(k)
				}
			}
		}
		x.CopyFrom(xs)
		b.Upload(y.Buffer(), ys)
		loss, err := step.Run(n, 4)
		if err != nil {
			panic(err)
		}
		if i == 0 {
			first = loss.Item()
		}
		last = loss.Item()
	}
	fmt.Println("the loss fell by more than half:", last < first/2)

	// An evaluation between steps, under Lend: on a GPU its tensors take
	// the captured step's idle memory instead of reserving their own.
	correct := 0
	if err := step.Lend(func() error {
		s := tensor.NewNoGradScope()
		defer s.Release() // before the next step replays
		in := tensor.Empty(b, s, n, 4)
		tensor.CopyTensor(in, x)
		for j, p := range tensor.Argmax(model.Forward(in)).Int32s() {
			if p == ys[j] {
				correct++
			}
		}
		return nil
	}); err != nil {
		panic(err)
	}
	fmt.Println("most of the last batch classified right:", correct > n/2)
	// Output:
	// cuda graph: launching eagerly: the cpu backend cannot capture a graph
	// the loss fell by more than half: true
	// most of the last batch classified right: true
}

// Training any model with Run: a data source on the device, an optimiser,
// an evaluation, and a checkpoint after every epoch. Here a small MLP
// learns the synthetic 8×8 task of this package's tests on the CPU.
func ExampleRun() {
	model := newTiny(3)
	src, err := trainer.NewImages(tensor.CPU, syntheticSet(256, 1), 16, 1.0/255, 0)
	if err != nil {
		panic(err)
	}
	defer src.Release()
	sgd, err := optim.NewSGD(nn.Parameters(model), optim.SGDConfig{LR: 0.05, Momentum: 0.9})
	if err != nil {
		panic(err)
	}
	defer sgd.Release()
	dir, err := os.MkdirTemp("", "trainer-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)

	res, err := trainer.Run(context.Background(), trainer.Config{
		Model: model, Optimizer: sgd, Data: src, Epochs: 3, Seed: 1,
		Evaluate:   func(m nn.Module) (float64, float64, error) { return src.Evaluate(m, 64) },
		Checkpoint: filepath.Join(dir, "tiny.safetensors"),
		Schedule:   optim.CosineAnnealingLR{BaseLR: 0.05, TMax: 3 * 256 / 16},
	})
	if err != nil {
		panic(err)
	}
	fmt.Printf("%d steps, saved: %v, accuracy at least 90%%: %v\n", res.Steps, res.Saved, res.Accuracy >= 90)
	// Output:
	// 48 steps, saved: true, accuracy at least 90%: true
}
