// Command sequential trains models written as a plain nn.Sequential on
// MNIST with a training loop of its own: the README's loop, whose step is
// turned into a replayed CUDA graph by trainer.CaptureStep and whose
// layers the Sequential fuses by itself (nn's fusion: convolution + ReLU +
// pooling, Linear + ReLU, the last Linear with the loss). It prints the
// seconds of every epoch, the mean training loss and the test accuracy,
// so that the speed of such a model can be compared with the hand-written
// LeNet of `train` and with PyTorch.
//
//	go run ./examples/sequential -data MNIST_DIR                  # LeNet and the MLP
//	go run ./examples/sequential -data MNIST_DIR -model mlp -no-fusion -no-graph
//
// Exit status: 0 success, 1 a failure while training, 2 a usage or input
// error (a bad flag, missing data, -device cuda without a usable GPU).
package main

import (
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/ember-ml/ember/cuda"
	"github.com/ember-ml/ember/data"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/nn/trainer"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// lenet is LeNet as a Sequential: the same layers and state dict keys as
// models.LeNet (conv1.*, conv2.*, fc1.*, fc2.*) and torch's Net.
func lenet(b tensor.Backend, rng *rand.Rand) *nn.Sequential {
	pool := nn.NewMaxPool2d(2)
	return &nn.Sequential{Layers: []nn.Layer{
		{Name: "conv1", Module: nn.NewConv2d(b, rng, 1, 20, 5)}, {Name: "relu1", Module: nn.ReLU{}}, {Name: "pool1", Module: pool},
		{Name: "conv2", Module: nn.NewConv2d(b, rng, 20, 50, 5)}, {Name: "relu2", Module: nn.ReLU{}}, {Name: "pool2", Module: pool},
		{Name: "flatten", Module: nn.Flatten{}},
		{Name: "fc1", Module: nn.NewLinear(b, rng, 800, 500)}, {Name: "relu3", Module: nn.ReLU{}},
		{Name: "fc2", Module: nn.NewLinear(b, rng, 500, 10)},
	}}
}

// mlp is the 784-1024-1024-10 MLP with ReLUs, torch's
// nn.Sequential(nn.Flatten(), nn.Linear(784, 1024), nn.ReLU(), ...).
func mlp(b tensor.Backend, rng *rand.Rand) *nn.Sequential {
	return nn.NewSequential(nn.Flatten{},
		nn.NewLinear(b, rng, 784, 1024), nn.ReLU{},
		nn.NewLinear(b, rng, 1024, 1024), nn.ReLU{},
		nn.NewLinear(b, rng, 1024, 10))
}

type options struct {
	models                  []string
	dataDir, device         string
	epochs, batch, limit    int
	lr, momentum            float64
	seed                    uint64
	noFusion, noGraph, tf32 bool
}

func main() {
	var o options
	models := flag.String("model", "lenet,mlp", "comma-separated models to train: lenet, mlp")
	flag.StringVar(&o.dataDir, "data", os.Getenv("MNIST_DIR"), "directory of the four MNIST files (default $MNIST_DIR)")
	flag.StringVar(&o.device, "device", "cuda", "cuda or cpu")
	flag.IntVar(&o.epochs, "epochs", 2, "epochs per model")
	flag.IntVar(&o.batch, "batch-size", 64, "images per step")
	flag.IntVar(&o.limit, "limit", 0, "train on the first N images (0: all)")
	flag.Float64Var(&o.lr, "lr", 0.01, "SGD learning rate")
	flag.Float64Var(&o.momentum, "momentum", 0.9, "SGD momentum")
	flag.Uint64Var(&o.seed, "seed", 1, "seed of the initialisation and the shuffling")
	flag.BoolVar(&o.noFusion, "no-fusion", false, "run every layer on its own (nn.SetFusion(model, false))")
	flag.BoolVar(&o.noGraph, "no-graph", false, "launch the step eagerly instead of replaying a CUDA graph")
	flag.BoolVar(&o.tf32, "tf32", false, "TF32 matrix products")
	flag.Parse()
	o.models = strings.Split(*models, ",")
	if err := o.check(); err != nil {
		fmt.Fprintln(os.Stderr, "sequential:", err)
		os.Exit(2)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "sequential:", err)
		var ue usageError
		if errors.As(err, &ue) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

type usageError struct{ error }

func (o options) check() error {
	for _, m := range o.models {
		if m != "lenet" && m != "mlp" {
			return fmt.Errorf("-model %q: want lenet, mlp or both (lenet,mlp)", m)
		}
	}
	switch {
	case o.dataDir == "":
		return errors.New("-data: the directory of the MNIST files is needed (or set MNIST_DIR)")
	case o.device != "cuda" && o.device != "cpu":
		return fmt.Errorf("-device %q: want cuda or cpu", o.device)
	case o.epochs < 1:
		return fmt.Errorf("-epochs %d: want at least 1", o.epochs)
	case o.batch < 1:
		return fmt.Errorf("-batch-size %d: want at least 1", o.batch)
	case o.limit < 0:
		return fmt.Errorf("-limit %d: want 0 (all) or more", o.limit)
	case !(o.lr > 0) || o.lr > 1e6:
		return fmt.Errorf("-lr %v: want a positive finite rate", o.lr)
	case !(o.momentum >= 0 && o.momentum < 1):
		return fmt.Errorf("-momentum %v: want 0 <= momentum < 1", o.momentum)
	}
	return nil
}

func run(o options) error {
	b, err := backend(o)
	if err != nil {
		return usageError{err}
	}
	train, test, err := data.LoadMNIST(o.dataDir)
	if err != nil {
		return usageError{fmt.Errorf("-data %s: %w", o.dataDir, err)}
	}
	if o.limit > 0 && o.limit < train.N {
		t := *train
		t.N, t.Images, t.Labels = o.limit, t.Images[:o.limit*t.ImageSize()], t.Labels[:o.limit]
		train = &t
	}
	if o.batch > train.N {
		return usageError{fmt.Errorf("-batch-size %d: more than the %d training images", o.batch, train.N)}
	}
	fmt.Printf("device %s, batch %d, lr %g, momentum %g, fusion %v, graph %v\n", b.Name(), o.batch, o.lr, o.momentum, !o.noFusion, !o.noGraph)
	for _, name := range o.models {
		if err := trainOne(b, name, train, test, o); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}

func backend(o options) (tensor.Backend, error) {
	if o.device == "cpu" {
		return tensor.CPU, nil
	}
	if err := cuda.Available(); err != nil {
		return nil, fmt.Errorf("-device cuda: %v", err)
	}
	opt, err := cuda.OptionsFromEnv(cuda.BackendOptions{TF32: o.tf32})
	if err != nil {
		return nil, err
	}
	return cuda.NewBackend(0, opt)
}

// trainOne is the README's loop with the data on the device: each step
// uploads the batch's indices and labels (Images.Load) and replays the
// captured step, which gathers the images, runs the model's fused loss,
// back-propagates and updates the weights.
func trainOne(b tensor.Backend, name string, train, test *data.Dataset, o options) (err error) {
	rng := rand.New(rand.NewPCG(o.seed, 0x5e9))
	var model *nn.Sequential
	if name == "lenet" {
		model = lenet(b, rng)
	} else {
		model = mlp(b, rng)
	}
	defer func() {
		for _, p := range nn.Parameters(model) {
			p.Tensor.Release()
		}
	}()
	nn.SetFusion(model, !o.noFusion)
	fmt.Printf("%s: %d parameters; runs as %s\n", name, nn.NumParameters(model), strings.Join(model.FusionPlan(), ", "))

	src, err := trainer.NewImages(b, train, o.batch, trainer.MNISTScale, trainer.MNISTShift)
	if err != nil {
		return err
	}
	defer src.Release()
	sgd, err := optim.NewSGD(nn.Parameters(model), optim.SGDConfig{LR: o.lr, Momentum: o.momentum})
	if err != nil {
		return err
	}
	defer sgd.Release()
	sum := tensor.Zeros(b, nil, 1) // the epoch's loss total, on the device
	defer sum.Release()

	step, err := trainer.CaptureStep(b, func(s *tensor.Scope) *tensor.Tensor {
		batch := src.Batch(s)
		loss := model.LossSum(batch.Inputs, batch.Labels, sum)
		loss.Backward()
		sgd.StepAndZeroGrad()
		return loss
	}, trainer.StepOptions{Optimizer: sgd, Eager: o.noGraph, ZeroesGrads: true, // the step ends with StepAndZeroGrad
		Logf: func(f string, a ...any) { fmt.Printf("  "+f+"\n", a...) }})
	if err != nil {
		return err
	}
	defer step.Close()
	sgd.ZeroGrad()

	steps := train.N / o.batch // the last partial batch is dropped, as torch's drop_last
	for epoch := range o.epochs {
		sum.CopyFrom([]float32{0})
		perm := data.Permutation(train.N, o.seed, epoch)
		start := time.Now()
		for i := range steps {
			src.Load(perm[i*o.batch : (i+1)*o.batch])
			if _, err := step.Run(o.batch, train.NumChannels(), train.Rows, train.Cols); err != nil {
				return err
			}
		}
		mean := sum.Item() / float32(steps) // waits for the epoch's last step
		secs := time.Since(start).Seconds()
		if err := b.Synchronize(); err != nil {
			return err
		}
		fmt.Printf("%s epoch %d: %.4f s, %.0f images/s, mean training loss %.4f\n", name, epoch+1, secs, float64(steps*o.batch)/secs, mean)
	}
	return evaluate(b, model, test)
}

// evaluate prints the accuracy on the test set.
func evaluate(b tensor.Backend, model nn.Module, test *data.Dataset) error {
	ev, err := trainer.NewImages(b, test, 0, trainer.MNISTScale, trainer.MNISTShift)
	if err != nil {
		return err
	}
	defer ev.Release()
	loss, acc, err := ev.Evaluate(model, 1000)
	if err != nil {
		return err
	}
	fmt.Printf("  test loss %.4f, test accuracy %.2f%%\n", loss, acc)
	return nil
}
