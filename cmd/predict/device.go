package main

import (
	"fmt"

	"github.com/ember-ml/ember/cuda"
	"github.com/ember-ml/ember/tensor"
)

// openBackend returns the backend --device names and a description of it
// for the log: "auto" takes the first GPU when one is usable and otherwise
// the CPU, saying why.
func openBackend(name string) (tensor.Backend, string, error) {
	switch name {
	case "cpu":
		return tensor.CPU, "cpu", nil
	case "auto", "cuda":
		reason := cuda.Available()
		if reason == nil {
			opt, err := cuda.OptionsFromEnv(cuda.BackendOptions{})
			if err != nil {
				return nil, "", err
			}
			b, err := cuda.NewBackend(0, opt)
			if err == nil {
				return b, b.Name() + " (" + b.Device().Name() + ")", nil
			}
			reason = err
		}
		if name == "cuda" {
			return nil, "", fmt.Errorf("no usable GPU: %v", reason)
		}
		return tensor.CPU, fmt.Sprintf("cpu (auto: no usable GPU: %v)", reason), nil
	}
	return nil, "", fmt.Errorf("unknown device %q; want auto, cpu or cuda", name)
}
