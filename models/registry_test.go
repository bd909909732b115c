package models

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

var mnistConfig = Config{InputShape: []int{1, Side, Side}, Classes: 10, Seed: 4}

// TestRegistryBuildsEachModel: every registered image classifier builds
// for a shape it takes and maps a batch to one row of logits per image (the
// GPT maps token ids to logits per position); lenet is exactly NewLeNet,
// and the MLP has the state dict of the PyTorch module.
func TestRegistryBuildsEachModel(t *testing.T) {
	shapes := map[string][]int{"airbench": {3, 32, 32}}
	for _, name := range Names() {
		cfg := mnistConfig
		if sh, ok := shapes[name]; ok {
			cfg.InputShape = sh
		}
		s := tensor.NewNoGradScope()
		var x *tensor.Tensor
		want := []int{3, 10}
		if name == "gpt" {
			cfg = Config{InputShape: []int{8}, Classes: 11, Seed: 4}
			x = tensor.FromInt32(tensor.CPU, s, make([]int32, 3*8), 3, 8)
			want = []int{3, 8, 11}
		} else {
			n := 3 * cfg.InputShape[0] * cfg.InputShape[1] * cfg.InputShape[2]
			x = tensor.FromFloat32(tensor.CPU, s, make([]float32, n), append([]int{3}, cfg.InputShape...)...)
		}
		m, err := New(name, tensor.CPU, cfg)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := m.Forward(x).Shape(); !slices.Equal(got, want) {
			t.Errorf("%s: logits %v, want %v", name, got, want)
		}
		s.Release()
		release(m)
	}
	m, _ := New("lenet", tensor.CPU, mnistConfig)
	want := NewLeNet(tensor.CPU, mnistConfig.Seed)
	for i, p := range nn.Parameters(m) {
		if !slices.Equal(p.Tensor.Float32s(), nn.Parameters(want)[i].Tensor.Float32s()) {
			t.Errorf("lenet's %s is not NewLeNet's", p.Name)
		}
	}
	mlp, _ := New("mlp", tensor.CPU, mnistConfig)
	var names []string
	for _, p := range nn.Parameters(mlp) {
		names = append(names, p.Name+fmt.Sprint(p.Tensor.Shape()))
	}
	wantNames := []string{"fc1.weight[1024 784]", "fc1.bias[1024]", "fc2.weight[1024 1024]", "fc2.bias[1024]", "fc3.weight[10 1024]", "fc3.bias[10]"}
	if !slices.Equal(names, wantNames) {
		t.Errorf("mlp parameters %v, want %v", names, wantNames)
	}
}

// TestRegistryRefuses: an unknown name and a configuration a model cannot
// take are errors saying what is expected.
func TestRegistryRefuses(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
		want string
	}{
		{"resnet", mnistConfig, `unknown model "resnet"; want one of airbench, gpt, lenet, mlp, resnet9`},
		{"lenet", Config{InputShape: []int{3, 32, 32}, Classes: 10}, "lenet takes 28x28 grey images"},
		{"lenet", Config{InputShape: []int{1, 28, 28}, Classes: 100}, "and 10 classes"},
		{"mlp", Config{InputShape: []int{1, 0, 28}, Classes: 10}, "want positive sizes"},
		{"mlp", Config{InputShape: []int{784}, Classes: 0}, "at least one class"},
	}
	for _, c := range cases {
		if _, err := New(c.name, tensor.CPU, c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%q, %v): %v, want an error containing %q", c.name, c.cfg, err, c.want)
		}
	}
}

// TestLoadModelFromMetadata: a checkpoint of an MLP carries its name and
// configuration, and LoadModel rebuilds it with the same weights; a file
// without them is LeNet; a file naming an unknown model is refused by name.
func TestLoadModelFromMetadata(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{InputShape: []int{1, 8, 8}, Classes: 3, Seed: 2}
	m, err := New("mlp", tensor.CPU, cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "mlp.safetensors")
	if err := SaveCheckpoint(path, m, &TrainingState{ModelMetadata: Metadata("mlp", cfg)}); err != nil {
		t.Fatal(err)
	}
	got, name, err := LoadModel(path, tensor.CPU)
	if err != nil {
		t.Fatal(err)
	}
	if name != "mlp" || got.(*MLP).in != 64 {
		t.Fatalf("loaded a %s", name)
	}
	for i, p := range nn.Parameters(got) {
		if !slices.Equal(p.Tensor.Float32s(), nn.Parameters(m)[i].Tensor.Float32s()) {
			t.Errorf("%s differs after loading", p.Name)
		}
	}

	plain := filepath.Join(dir, "plain.safetensors")
	if err := nn.SaveFile(plain, NewLeNet(tensor.CPU, 1), nil); err != nil {
		t.Fatal(err)
	}
	if _, name, err := LoadModel(plain, tensor.CPU); err != nil || name != "lenet" {
		t.Errorf("a file without metadata: %s, %v; want lenet", name, err)
	}

	other := filepath.Join(dir, "other.safetensors")
	rng := rand.New(rand.NewPCG(1, 1))
	if err := nn.SaveFile(other, nn.NewLinear(tensor.CPU, rng, 4, 2), map[string]string{MetaModel: "transformer"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadModel(other, tensor.CPU); err == nil || !strings.Contains(err.Error(), other+`: the model is a "transformer", which this program does not know`) {
		t.Errorf("unknown model: %v", err)
	}
	bad := filepath.Join(dir, "bad.safetensors")
	if err := nn.SaveFile(bad, m, map[string]string{MetaModel: "mlp", MetaModelConfig: "{"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadModel(bad, tensor.CPU); err == nil || !strings.Contains(err.Error(), `metadata "ember.model_config" is "{"`) {
		t.Errorf("broken configuration: %v", err)
	}
}
