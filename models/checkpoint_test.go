package models

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// TestLeNetStateDictLayout checks the names, shapes and dtypes of a saved
// LeNet against PyTorch's state_dict of the same module.
func TestLeNetStateDictLayout(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lenet.safetensors")
	if err := nn.SaveFile(path, NewLeNet(tensor.CPU, 1), nil); err != nil {
		t.Fatal(err)
	}
	f, err := nn.ReadSafetensorsFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		name  string
		shape []int
	}{
		{"conv1.weight", []int{20, 1, 5, 5}}, {"conv1.bias", []int{20}},
		{"conv2.weight", []int{50, 20, 5, 5}}, {"conv2.bias", []int{50}},
		{"fc1.weight", []int{500, 800}}, {"fc1.bias", []int{500}},
		{"fc2.weight", []int{10, 500}}, {"fc2.bias", []int{10}},
	}
	if len(f.Tensors) != len(want) {
		t.Fatalf("%d tensors, want %d", len(f.Tensors), len(want))
	}
	for i, w := range want {
		got := f.Tensors[i]
		if got.Name != w.name || !slices.Equal(got.Shape, w.shape) || got.DType != "F32" {
			t.Errorf("tensor %d: %s %s %v, want %s F32 %v", i, got.Name, got.DType, got.Shape, w.name, w.shape)
		}
	}
}

// lenetStep runs one SGD step of LeNet on a fixed batch of two images.
func lenetStep(m *LeNet, opt *optim.SGD) {
	s := tensor.NewScope()
	defer s.Release()
	img := make([]float32, 2*28*28)
	for i := range img {
		img[i] = float32(i%29)/29 - 0.3
	}
	x := tensor.FromFloat32(tensor.CPU, s, img, 2, 1, 28, 28)
	y := tensor.FromInt32(tensor.CPU, s, []int32{3, 7}, 2)
	opt.ZeroGrad()
	nn.CrossEntropyLoss(m.Forward(x), y).Backward()
	opt.Step()
}

// TestLeNetCheckpointResume saves a LeNet and its SGD state mid-training,
// resumes into a fresh model and optimiser as cmd/train does, and checks
// that one more step gives the same weights on both.
func TestLeNetCheckpointResume(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lenet.safetensors")
	cfg := optim.SGDConfig{LR: 0.05, Momentum: 0.9}
	a := NewLeNet(tensor.CPU, 1)
	optA, err := optim.NewSGD(a.Parameters(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	lenetStep(a, optA)
	lenetStep(a, optA)
	st := &TrainingState{
		Epoch: 0, Step: 2, GlobalStep: 2, Seed: 1, OptimizerSteps: optA.Steps(),
		Momentum: optA.MomentumBuffer().Float32s(),
		Flags:    map[string]string{"lr": "0.05", "momentum": "0.9"},
	}
	if err := SaveCheckpoint(path, a, st); err != nil {
		t.Fatal(err)
	}

	b := NewLeNet(tensor.CPU, 2)
	optB, err := optim.NewSGD(b.Parameters(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	got, err := LoadCheckpoint(path, b)
	if err != nil {
		t.Fatal(err)
	}
	if err := optB.SetState(got.OptimizerSteps, got.Momentum); err != nil {
		t.Fatal(err)
	}
	if got.GlobalStep != 2 || got.Flags["lr"] != "0.05" {
		t.Errorf("state %+v", got)
	}
	lenetStep(a, optA)
	lenetStep(b, optB)
	pa, pb := a.Parameters(), b.Parameters()
	for i := range pa {
		if !slices.Equal(pa[i].Tensor.Float32s(), pb[i].Tensor.Float32s()) {
			t.Fatalf("%s differs after a resumed step", pa[i].Name)
		}
	}
	if StatePath(path) != filepath.Join(filepath.Dir(path), "lenet.state.safetensors") {
		t.Error(StatePath(path))
	}
}
