package models

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// Config is what a registered model is built from: the shape of one input
// example (without the batch dimension, [1, 28, 28] for MNIST), the number
// of classes, and the seed of its initial weights. The shape and classes
// are written into checkpoints (Metadata), so that a program given only
// the model file builds the same architecture again.
type Config struct {
	InputShape []int  `json:"input_shape"`
	Classes    int    `json:"classes"`
	Seed       uint64 `json:"-"` // initial weights only: a checkpoint holds the weights
}

// Constructor builds a registered model on b, or says why cfg does not
// suit it.
type Constructor func(b tensor.Backend, cfg Config) (nn.Module, error)

// registry holds the models that train and predict know by name. Adding a
// model is one entry here: its name and a constructor that refuses the
// configurations it cannot take.
var registry = map[string]Constructor{
	"lenet": func(b tensor.Backend, cfg Config) (nn.Module, error) {
		if !slices.Equal(cfg.InputShape, []int{1, Side, Side}) || cfg.Classes != 10 {
			return nil, fmt.Errorf("models: lenet takes %dx%d grey images ([1, %d, %d]) and 10 classes, not %v and %d classes", Side, Side, Side, Side, cfg.InputShape, cfg.Classes)
		}
		return NewLeNet(b, cfg.Seed), nil
	},
	"mlp": func(b tensor.Backend, cfg Config) (nn.Module, error) {
		in, err := cfg.inputSize()
		if err != nil {
			return nil, err
		}
		return NewMLP(b, cfg.Seed, in, cfg.Classes), nil
	},
	// The zoo's image classifiers take [C, H, W] images: ResNet-9 any size
	// its three poolings leave at least 1x1, airbench 32x32 colour.
	"resnet9": func(b tensor.Backend, cfg Config) (nn.Module, error) {
		if len(cfg.InputShape) != 3 || cfg.InputShape[0] < 1 || cfg.InputShape[1] < 8 || cfg.InputShape[2] < 8 || cfg.Classes < 1 {
			return nil, fmt.Errorf("models: resnet9 takes [C, H, W] images of at least 8x8 and at least one class, not %v and %d classes", cfg.InputShape, cfg.Classes)
		}
		c := DefaultResNet9Config()
		c.InChannels, c.Classes = cfg.InputShape[0], cfg.Classes
		return NewResNet9(b, cfg.Seed, c), nil
	},
	"airbench": func(b tensor.Backend, cfg Config) (nn.Module, error) {
		if !slices.Equal(cfg.InputShape, []int{3, 32, 32}) || cfg.Classes != 10 {
			return nil, fmt.Errorf("models: airbench takes 32x32 colour images ([3, 32, 32]) and 10 classes, not %v and %d classes", cfg.InputShape, cfg.Classes)
		}
		return NewAirbench(b, cfg.Seed, DefaultAirbenchConfig()), nil
	},
	// The GPT's "input shape" is its context [T] and its "classes" the
	// vocabulary.
	"gpt": func(b tensor.Backend, cfg Config) (nn.Module, error) {
		if len(cfg.InputShape) != 1 || cfg.InputShape[0] < 1 || cfg.Classes < 1 {
			return nil, fmt.Errorf("models: gpt takes a context length [T] and a vocabulary size, not %v and %d", cfg.InputShape, cfg.Classes)
		}
		c := DefaultGPTConfig(cfg.Classes)
		c.Context = cfg.InputShape[0]
		return NewGPT(b, cfg.Seed, c), nil
	},
}

// inputSize is the number of values of one example, checking the shape
// and the classes.
func (c Config) inputSize() (int, error) {
	n := 1
	for _, d := range c.InputShape {
		if d < 1 {
			return 0, fmt.Errorf("models: input shape %v: want positive sizes", c.InputShape)
		}
		n *= d
	}
	if len(c.InputShape) == 0 || c.Classes < 1 {
		return 0, fmt.Errorf("models: input shape %v and %d classes: want a shape and at least one class", c.InputShape, c.Classes)
	}
	return n, nil
}

// Names lists the registered models, sorted.
func Names() []string {
	var ns []string
	for n := range registry {
		ns = append(ns, n)
	}
	slices.Sort(ns)
	return ns
}

// New builds the registered model name on b. An unknown name or a
// configuration the model cannot take is an error saying what is known or
// expected; a device error (out of memory) is returned too.
func New(name string, b tensor.Backend, cfg Config) (m nn.Module, err error) {
	ctor, ok := registry[name]
	if !ok {
		return nil, fmt.Errorf("models: unknown model %q; want one of %s", name, strings.Join(Names(), ", "))
	}
	if gerr := tensor.Guard(func() { m, err = ctor(b, cfg) }); gerr != nil {
		return nil, fmt.Errorf("models: %s on %s: %w", name, b.Name(), gerr)
	}
	return m, err
}

// Model file metadata keys written by Metadata.
const (
	MetaModel       = "ember.model"
	MetaModelConfig = "ember.model_config"
)

// Metadata is the model file metadata that names the architecture (name
// and configuration); pass it as nn.TrainingState.ModelMetadata.
func Metadata(name string, cfg Config) map[string]string {
	js, _ := json.Marshal(cfg) // a struct of ints cannot fail to marshal
	return map[string]string{MetaModel: name, MetaModelConfig: string(js)}
}

// FromMetadata reads the architecture back from a model file's metadata.
// A file without it (one written before models were registered, or by
// PyTorch) is LeNet for MNIST.
func FromMetadata(meta map[string]string) (name string, cfg Config, err error) {
	name, ok := meta[MetaModel]
	if !ok {
		return "lenet", Config{InputShape: []int{1, Side, Side}, Classes: 10}, nil
	}
	if _, known := registry[name]; !known {
		return "", Config{}, fmt.Errorf("the model is a %q, which this program does not know (it knows %s)", name, strings.Join(Names(), ", "))
	}
	dec := json.NewDecoder(strings.NewReader(meta[MetaModelConfig]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		return "", Config{}, fmt.Errorf("metadata %q is %q, want the model's configuration as JSON: %v", MetaModelConfig, meta[MetaModelConfig], err)
	}
	return name, cfg, nil
}

// LoadModelAs is LoadModel for a file that names no architecture (a
// state dict PyTorch saved): it builds the registered model name with cfg
// and loads the file into it strictly. A file that names its architecture
// must name this one.
func LoadModelAs(path string, b tensor.Backend, name string, cfg Config) (nn.Module, error) {
	meta, err := nn.ReadSafetensorsMetadata(path)
	if err != nil {
		return nil, err
	}
	if got, ok := meta[MetaModel]; ok && got != name {
		return nil, &nn.CheckpointError{File: path, Problem: fmt.Sprintf("holds a %q, not a %q", got, name)}
	}
	m, err := New(name, b, cfg)
	if err != nil {
		return nil, &nn.CheckpointError{File: path, Problem: err.Error(), Err: err}
	}
	if err := nn.LoadFile(path, m); err != nil {
		release(m)
		return nil, err
	}
	return m, nil
}

// LoadModel builds the model that the file at path was saved from (named
// in its metadata, see Metadata; LeNet when there is none) on b and loads
// its parameters strictly. Errors are one line and name the file.
func LoadModel(path string, b tensor.Backend) (nn.Module, string, error) {
	meta, err := nn.ReadSafetensorsMetadata(path)
	if err != nil {
		return nil, "", err
	}
	name, cfg, err := FromMetadata(meta)
	if err != nil {
		return nil, "", &nn.CheckpointError{File: path, Problem: err.Error()}
	}
	m, err := New(name, b, cfg)
	if err != nil {
		return nil, "", &nn.CheckpointError{File: path, Problem: err.Error(), Err: err}
	}
	if err := nn.LoadFile(path, m); err != nil {
		release(m)
		return nil, "", err
	}
	return m, name, nil
}
