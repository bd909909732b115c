package main

import (
	"fmt"

	"github.com/ember-ml/ember/tensor"
)

// openBackend returns the backend --device names and a description of it
// for the log. predict runs on the CPU for now: "auto" picks it, and
// "cuda" is refused until the CUDA backend is wired in here.
func openBackend(name string) (tensor.Backend, string, error) {
	switch name {
	case "cpu":
		return tensor.CPU, "cpu", nil
	case "auto":
		return tensor.CPU, "cpu (auto)", nil
	case "cuda":
		return nil, "", fmt.Errorf("not supported by predict yet; use --device cpu")
	}
	return nil, "", fmt.Errorf("unknown device %q; want auto, cpu or cuda", name)
}
