package models_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/ember-ml/ember/cuda"
	"github.com/ember-ml/ember/models"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// Checkpoints that go both ways between ember and PyTorch, checked by
// their logits. With EMBER_TORCH_INTEROP_DIR=DIR:
//
//  1. go test ./models -run TestTorchInteropWrite writes, for resnet9,
//     airbench and gpt, our checkpoint DIR/ember_NAME.safetensors and
//     DIR/ember_NAME_io.safetensors holding a fixed input ("inputs"; the
//     GPT's token ids as whole float32 numbers) and our logits for it in
//     evaluation mode ("logits");
//  2. python3 docs/bench/torch_interop.py DIR loads each checkpoint into
//     zoo.py's PyTorch module with strict=True, compares the logits, and
//     writes a checkpoint PyTorch initialised and trained for a few steps
//     (torch_NAME.safetensors, torch_NAME_io.safetensors);
//  3. go test ./models -run TestTorchInteropLoad loads those into our
//     networks and compares our logits with PyTorch's.
//
// Both run on the GPU when there is one, else on the CPU. Logits agree
// within interopTolerance times the largest |logit| (plus interopFloor):
// float32 throughout (the script turns TF32 off), with sums in other
// orders, which differ in the last bits of each layer's outputs.
const (
	interopTolerance = 2e-3
	interopFloor     = 1e-5
)

type interopCase struct {
	name string
	// build makes the network with its weights drawn from seed: the load
	// test starts from another seed than the write test, so that only the
	// loaded weights can give the file's logits.
	build func(b tensor.Backend, seed uint64) nn.Module
	// input is the fixed input of the case and its shape; images are
	// N(0, 1), token ids uniform over the vocabulary.
	input func(rng *rand.Rand) ([]float32, []int)
	ids   bool
}

const interopVocab = 65

var interopCases = []interopCase{
	{"resnet9", func(b tensor.Backend, seed uint64) nn.Module {
		return models.NewResNet9(b, seed, models.DefaultResNet9Config())
	},
		func(rng *rand.Rand) ([]float32, []int) { return normals(rng, 4*28*28), []int{4, 1, 28, 28} }, false},
	{"airbench", func(b tensor.Backend, seed uint64) nn.Module {
		return models.NewAirbench(b, seed, models.DefaultAirbenchConfig())
	},
		func(rng *rand.Rand) ([]float32, []int) { return normals(rng, 4*3*32*32), []int{4, 3, 32, 32} }, false},
	{"gpt", func(b tensor.Backend, seed uint64) nn.Module {
		return models.NewGPT(b, seed, models.DefaultGPTConfig(interopVocab))
	},
		func(rng *rand.Rand) ([]float32, []int) {
			ids := make([]float32, 2*256)
			for i := range ids {
				ids[i] = float32(rng.IntN(interopVocab))
			}
			return ids, []int{2, 256}
		}, true},
}

// interopSetup returns the directory and the backend, or skips.
func interopSetup(t *testing.T) (string, tensor.Backend) {
	dir := os.Getenv("EMBER_TORCH_INTEROP_DIR")
	if dir == "" {
		t.Skip("EMBER_TORCH_INTEROP_DIR is not set")
	}
	if cuda.Available() != nil {
		return dir, tensor.CPU
	}
	b, err := cuda.NewBackend(0, cuda.BackendOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return dir, b
}

// interopLogits runs m in evaluation mode on the input x of shape shape.
func interopLogits(b tensor.Backend, m nn.Module, c interopCase, x []float32, shape []int) []float32 {
	nn.SetTraining(m, false)
	defer nn.SetTraining(m, true)
	s := tensor.NewNoGradScope()
	defer s.Release()
	var in *tensor.Tensor
	if c.ids {
		ids := make([]int32, len(x))
		for i, v := range x {
			ids[i] = int32(v)
		}
		in = tensor.FromInt32(b, s, ids, shape...)
	} else {
		in = tensor.FromFloat32(b, s, x, shape...)
	}
	return m.Forward(in).Float32s()
}

func releaseModel(m nn.Module) {
	if r, ok := m.(interface{ Release() }); ok {
		r.Release()
	}
}

func TestTorchInteropWrite(t *testing.T) {
	dir, b := interopSetup(t)
	for _, c := range interopCases {
		t.Run(c.name, func(t *testing.T) {
			m := c.build(b, 1)
			defer releaseModel(m)
			rng := rand.New(rand.NewPCG(11, 1))
			x, shape := c.input(rng)
			// Two forward passes in training mode move the BatchNorm
			// statistics off their initial values (and count two
			// batches), so that the buffers are compared too. (The GPT
			// has none: its training passes would only draw dropout.)
			for i := 0; i < 2 && !c.ids; i++ {
				warm, _ := c.input(rng)
				s := tensor.NewNoGradScope()
				m.Forward(tensor.FromFloat32(b, s, warm, shape...))
				s.Release()
			}
			logits := interopLogits(b, m, c, x, shape)
			if err := nn.SaveFile(filepath.Join(dir, "ember_"+c.name+".safetensors"), m, nil); err != nil {
				t.Fatal(err)
			}
			ioPath := filepath.Join(dir, "ember_"+c.name+"_io.safetensors")
			if err := writeIO(ioPath, x, shape, logits); err != nil {
				t.Fatal(err)
			}
			t.Logf("wrote %s and %s", "ember_"+c.name+".safetensors", filepath.Base(ioPath))
		})
	}
}

func writeIO(path string, x []float32, shape []int, logits []float32) error {
	ls := append([]int{shape[0]}, len(logits)/shape[0])
	if len(shape) == 2 { // token ids [B, T]: logits [B, T, V]
		ls = []int{shape[0], shape[1], len(logits) / (shape[0] * shape[1])}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	werr := nn.WriteSafetensors(f, []nn.NamedTensor{{Name: "inputs", Shape: shape, Data: x}, {Name: "logits", Shape: ls, Data: logits}},
		map[string]string{"format": "pt"})
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	return werr
}

func TestTorchInteropLoad(t *testing.T) {
	dir, b := interopSetup(t)
	for _, c := range interopCases {
		t.Run(c.name, func(t *testing.T) {
			model := filepath.Join(dir, "torch_"+c.name+".safetensors")
			ioPath := filepath.Join(dir, "torch_"+c.name+"_io.safetensors")
			if _, err := os.Stat(model); err != nil {
				t.Skipf("%s: %v (run docs/bench/torch_interop.py %s first)", model, err, dir)
			}
			m := c.build(b, 7)
			defer releaseModel(m)
			if err := nn.LoadFile(model, m); err != nil {
				t.Fatal(err)
			}
			f, err := nn.ReadSafetensorsFile(ioPath)
			if err != nil {
				t.Fatal(err)
			}
			x, err := f.Float32s("inputs")
			if err != nil {
				t.Fatal(err)
			}
			want, err := f.Float32s("logits")
			if err != nil {
				t.Fatal(err)
			}
			in, _ := f.Lookup("inputs")
			got := interopLogits(b, m, c, x, in.Shape)
			if err := closeLogits(got, want); err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
		})
	}
}

// closeLogits checks that every logit is within interopTolerance·(the
// largest |want|) + interopFloor of PyTorch's.
func closeLogits(got, want []float32) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d logits, PyTorch's %d", len(got), len(want))
	}
	scale := 0.0
	for _, w := range want {
		scale = math.Max(scale, math.Abs(float64(w)))
	}
	tol := interopTolerance*scale + interopFloor
	if d := maxAbsDiff(got, want); !(d <= tol) {
		return fmt.Errorf("logits differ from PyTorch's by up to %g (largest logit %g, tolerance %g)", d, scale, tol)
	}
	return nil
}
