// Package nn holds the layers of a network and their checkpoints.
//
// A model is any type with Forward and Parameters (Module). The layers here
// (Conv2d, MaxPool2d, Linear, ReLU, Flatten, Sequential) are initialised as
// PyTorch's and name their parameters as a PyTorch state_dict does, so that
// SaveFile writes a safetensors file that torch's load_state_dict accepts
// with strict=True, and LoadFile reads one written by PyTorch.
//
// Where to start: module.go (Module, Parameter), one file per layer, then
// safetensors.go (the file format, validated before anything is loaded) and
// state.go (the training state saved beside a model for resuming).
package nn
