package main

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/ember-ml/ember/cuda"
	"github.com/ember-ml/ember/tensor"
)

// device is the backend the run uses, with what the command reports of it.
type device struct {
	backend     tensor.Backend
	description string
	gpu         *cuda.Backend // nil on the CPU

	// dataset* is what the allocator had reserved and allocated once the
	// uint8 training and test sets were uploaded; trainingPeak* the peaks
	// while training (evaluation excluded). Memory figures "without the data
	// set" subtract the data set's own bytes from the peaks.
	trainingPeakReserved  int
	trainingPeakAllocated int
	datasetAllocated      int // data set + cuBLAS workspace
	dataset               int
	freeAtStart           int // device free memory once the backend was open
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
			if o.tf32 {
				desc += ", TF32 on"
			}
			dev := &device{backend: g, description: desc, gpu: g}
			dev.freeAtStart, _, _ = d.MemGetInfo()
			return dev, nil
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

func (d *device) emptyCache() {
	if d.gpu != nil {
		d.gpu.Allocator().EmptyCache()
		d.gpu.Allocator().ResetPeakStats()
	}
}

func (d *device) resetPeak() {
	if d.gpu != nil {
		d.gpu.Allocator().ResetPeakStats()
	}
}

func (d *device) driverAllocs() int64 {
	if d.gpu == nil {
		return 0
	}
	return int64(d.gpu.MemoryStats().DriverAllocs)
}

// markDataset records the bytes of the uint8 data set just uploaded and of
// cuBLAS's workspace: the training figures subtract exactly these, and the
// lines name them apart.
func (d *device) markDataset(bytes int) {
	if d.gpu != nil {
		d.datasetAllocated = bytes + d.gpu.BLASWorkspace()
		d.dataset = bytes
	}
}

func (d *device) markTrainingPeak() {
	if d.gpu != nil {
		s := d.gpu.MemoryStats()
		d.trainingPeakReserved = max(d.trainingPeakReserved, s.Reserved.Peak)
		d.trainingPeakAllocated = max(d.trainingPeakAllocated, s.Allocated.Peak)
	}
}

// memoryLine is the GPU memory part of the end-of-epoch line: the peak
// reserved and allocated while training, without the uint8 data set that
// stays on the device for the whole run.
func (d *device) memoryLine() string {
	if d.gpu == nil {
		return ""
	}
	s := d.gpu.MemoryStats()
	return fmt.Sprintf(", GPU memory: training peak reserved %s, allocated %s (plus %s data set, %s cuBLAS workspace); reserved now %s",
		mib(d.trainingPeakReserved-d.datasetAllocated), mib(d.trainingPeakAllocated-d.datasetAllocated),
		mib(d.dataset), mib(d.gpu.BLASWorkspace()), mib(s.Reserved.Current))
}

func (d *device) benchRows(logf func(string, ...any), steps int, stepAllocs int64) {
	if d.gpu == nil {
		return
	}
	s := d.gpu.MemoryStats()
	logf("| GPU memory reserved, training peak, without data set and cuBLAS workspace | %s |", mib(d.trainingPeakReserved-d.datasetAllocated))
	logf("| GPU memory allocated, training peak, without data set and cuBLAS workspace | %s |", mib(d.trainingPeakAllocated-d.datasetAllocated))
	logf("| uint8 data set on the GPU (train + test) | %s |", mib(d.dataset))
	logf("| cuBLAS workspace (from the allocator) | %s |", mib(d.gpu.BLASWorkspace()))
	logf("| GPU memory reserved at the end (with evaluation) | %s |", mib(s.Reserved.Current))
	if free, _, err := d.gpu.Device().MemGetInfo(); err == nil && d.freeAtStart > 0 {
		// What the device lost since the backend opened: our reserved
		// memory plus what libraries (cuBLAS's workspace) took themselves.
		logf("| device memory taken since the backend opened, with its cuBLAS workspace (cuMemGetInfo) | %s |", mib(d.freeAtStart-free+d.gpu.BLASWorkspace()))
	}
	if steps > 1 {
		logf("| driver allocations by training steps after the first | %d (%.4f per step) |",
			stepAllocs, float64(stepAllocs)/float64(steps-1))
	}
}

func mib(b int) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

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
