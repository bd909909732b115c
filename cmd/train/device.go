package main

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/ember-ml/ember/cuda"
	"github.com/ember-ml/ember/nn/trainer"
	"github.com/ember-ml/ember/tensor"
)

// device is the backend the run uses, with what the command reports of it.
type device struct {
	backend     tensor.Backend
	description string
	gpu         *cuda.Backend      // nil on the CPU
	memory      *trainer.GPUMemory // nil on the CPU
}

// openDevice picks the backend --device asks for. auto takes the GPU when
// one is usable and says why not otherwise.
func openDevice(o *options) (*device, error) {
	limit := o.memoryLimitBytes
	if o.device == "cpu" {
		return &device{backend: tensor.CPU, description: "cpu (--device cpu)"}, nil
	}
	reason := cuda.Available()
	if reason == nil {
		// An ordinal out of range is the user's mistake, not a reason to
		// fall back to the CPU.
		if n, err := cuda.DeviceCount(); err == nil && o.gpu >= n {
			return nil, usageError{fmt.Errorf("--gpu %d: out of range, %d GPU(s) visible (ordinals 0 to %d)", o.gpu, n, n-1)}
		}
		opt, err := cuda.OptionsFromEnv(cuda.BackendOptions{MemoryLimit: limit, TF32: o.tf32})
		if err != nil {
			return nil, usageError{err}
		}
		g, err := cuda.NewBackend(o.gpu, opt)
		if err == nil {
			d := g.Device()
			maj, min := d.ComputeCapability()
			desc := fmt.Sprintf("%s (%s, compute capability %d.%d, %.0f GiB)", g.Name(), d.Name(), maj, min, float64(d.TotalMemory())/(1<<30))
			switch o.prec {
			case tensor.TF32:
				desc += ", TF32 on"
			case tensor.BF16:
				desc += ", bfloat16 autocast"
			}
			return &device{backend: g, description: desc, gpu: g, memory: trainer.NewGPUMemory(g)}, nil
		}
		reason = err
	}
	if o.device == "cuda" {
		return nil, usageError{fmt.Errorf("--device cuda: %v", oneLine(reason))}
	}
	desc := "cpu (auto: no usable GPU: " + oneLine(reason) + ")"
	var unused []string
	if o.set["gpu"] {
		unused = append(unused, fmt.Sprintf("--gpu %d", o.gpu))
	}
	if o.memoryLimit != "" {
		unused = append(unused, "--memory-limit "+o.memoryLimit)
	}
	switch len(unused) {
	case 1:
		desc += "; " + unused[0] + " does not apply on the CPU"
	case 2:
		desc += "; " + strings.Join(unused, " and ") + " do not apply on the CPU"
	}
	return &device{backend: tensor.CPU, description: desc}, nil
}

func (d *device) close() {
	if d.gpu != nil {
		d.gpu.Close()
	}
}

func isOutOfMemory(err error) bool {
	var oom *cuda.OutOfMemoryError
	return errors.As(err, &oom)
}

// parseBytes reads sizes such as 512MiB, 2GiB, 64MB or a plain byte count.
func parseBytes(s string) (int, error) {
	if s == "" {
		return 0, nil
	}
	units := []struct {
		suffix string
		mult   float64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1}}
	num, mult := strings.TrimSpace(s), 1.0
	for _, u := range units {
		if strings.HasSuffix(num, u.suffix) {
			num, mult = strings.TrimSpace(strings.TrimSuffix(num, u.suffix)), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(num, 64)
	// 1 PiB is far above any GPU's memory and keeps the product an int.
	if err != nil || math.IsNaN(v) || v*mult < 1 || v*mult > 1<<50 {
		return 0, fmt.Errorf("want a positive size such as 64MiB or 1GiB")
	}
	return int(v * mult), nil
}
