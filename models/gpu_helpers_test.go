package models_test

import (
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/ember-ml/ember/cuda"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/nn/trainer"
	"github.com/ember-ml/ember/tensor"
)

// requireGPU skips t without a usable CUDA device, and fails it instead
// when EMBER_REQUIRE_GPU=1 (so a GPU run cannot pass by skipping).
func requireGPU(t *testing.T) {
	t.Helper()
	if err := cuda.Available(); err != nil {
		if os.Getenv("EMBER_REQUIRE_GPU") == "1" {
			t.Fatalf("EMBER_REQUIRE_GPU=1 but: %v", err)
		}
		t.Skipf("no CUDA device: %v", err)
	}
}

// newGPUWithoutCuDNN is a fresh backend for runs that must issue the same
// kernels each time: without cuDNN, whose searches could pick other
// algorithms in each run (a capture takes the heuristic's choice where an
// eager step times the candidates); im2col + cuBLAS issue the same kernels
// either way. The caller closes it.
func newGPUWithoutCuDNN(t *testing.T) *cuda.Backend {
	t.Helper()
	return newGPU(t, cuda.BackendOptions{NoCuDNN: true})
}

// newGPU is a fresh backend on device 0 with opt and the EMBER_* variables'
// settings (cuda.OptionsFromEnv). The caller closes it.
func newGPU(t *testing.T, opt cuda.BackendOptions) *cuda.Backend {
	t.Helper()
	opt, err := cuda.OptionsFromEnv(opt)
	if err != nil {
		t.Fatal(err)
	}
	b, err := cuda.NewBackend(0, opt)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// randomBatches draws steps batches of bs one-channel side x side images
// (standard normal) and their labels (0-9) from a generator seeded seed.
func randomBatches(seed uint64, steps, bs, side int) ([]float32, []int32) {
	rng := rand.New(rand.NewPCG(seed, seed))
	images := make([]float32, steps*bs*side*side)
	for i := range images {
		images[i] = float32(rng.NormFloat64())
	}
	labels := make([]int32, steps*bs)
	for i := range labels {
		labels[i] = int32(rng.IntN(10))
	}
	return images, labels
}

// flatWeights is every parameter of m, in nn.Parameters' order, as one
// slice read back from the device.
func flatWeights(m any) []float32 {
	var w []float32
	for _, p := range nn.Parameters(m) {
		w = append(w, p.Tensor.Float32s()...)
	}
	return w
}

// runCapturedSteps makes step a trainer.CaptureStep on b with opt (eager
// when opt.Eager), runs it steps times at batch bs, before(i) (when not
// nil: the host's uploads) ahead of step i, and returns the steps' peak
// of allocated bytes. It fails t on a NaN loss, and on a step that was not
// captured unless eager.
func runCapturedSteps(t *testing.T, b *cuda.Backend, step func(*tensor.Scope) *tensor.Tensor, opt trainer.StepOptions, bs, steps int, before func(i int)) int {
	t.Helper()
	st, err := trainer.CaptureStep(b, step, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := b.Synchronize(); err != nil {
		t.Fatal(err)
	}
	b.Allocator().ResetPeakStats()
	for i := range steps {
		if before != nil {
			before(i)
		}
		loss, err := st.Run(bs)
		if err != nil {
			t.Fatal(err)
		}
		if l := loss.Item(); math.IsNaN(float64(l)) {
			t.Fatalf("step %d: loss NaN", i)
		}
	}
	if !opt.Eager && !st.Captured(bs) {
		t.Fatalf("the step was not captured: %s", st.Reason())
	}
	return b.MemoryStats().Allocated.Peak
}

// sameWeightsLowerPeak checks that a step run two ways (a base and a
// variant that should only save memory) ends with the same weights bit
// for bit, and that the variant's steps peaked lower; the phrases name
// the two ways in the messages ("with recomputed blocks" / "without").
func sameWeightsLowerPeak(t *testing.T, eager bool, base, variant []float32, basePeak, variantPeak int, withBase, withVariant string) {
	t.Helper()
	for i := range base {
		if math.Float32bits(base[i]) != math.Float32bits(variant[i]) {
			t.Fatalf("eager %v: weight %d is %v %s, %v %s", eager, i, variant[i], withVariant, base[i], withBase)
		}
	}
	t.Logf("eager %v: steps' peak allocated %.1f MiB %s, %.1f MiB %s", eager, float64(basePeak)/(1<<20), withBase, float64(variantPeak)/(1<<20), withVariant)
	if variantPeak >= basePeak {
		t.Errorf("eager %v: peak allocated %d B %s, %d B %s", eager, variantPeak, withVariant, basePeak, withBase)
	}
}
