package optim_test

import (
	"math"
	"path/filepath"
	"testing"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// trainSteps runs n steps of a linear layer on fixed data with opt.
func trainSteps(l *nn.Linear, opt optim.Optimizer, n int) {
	x := tensor.FromFloat32(tensor.CPU, nil, []float32{1, -2, 3, 0.5, 0, -1}, 2, 3)
	for i := 0; i < n; i++ {
		tensor.Sum(tensor.Mul(l.Forward(x), l.Forward(x))).Backward()
		opt.StepAndZeroGrad()
	}
}

func bitsEqual(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: element %d is %v, want %v (bit for bit)", what, i, got[i], want[i])
		}
	}
}

// An optimiser restored from the State of another (through a checkpoint
// on disk) continues exactly: after 3 more steps both give the same bits.
// SGD keeps its checkpoint format (tensor optimizer.momentum).
func TestStateRoundTrip(t *testing.T) {
	makers := map[string]func(ps []nn.Parameter) (optim.Optimizer, error){
		"adam": func(ps []nn.Parameter) (optim.Optimizer, error) { return optim.NewAdam(ps, optim.DefaultAdamConfig()) },
		"adamw amsgrad": func(ps []nn.Parameter) (optim.Optimizer, error) {
			c := optim.DefaultAdamWConfig()
			c.AMSGrad = true
			return optim.NewAdamW(ps, c)
		},
		"sgd momentum": func(ps []nn.Parameter) (optim.Optimizer, error) {
			return optim.NewSGD(ps, optim.SGDConfig{LR: 0.01, Momentum: 0.9, Dampening: 0.1})
		},
	}
	for name, mk := range makers {
		la := nn.NewLinear(tensor.CPU, nil, 3, 2)
		a, err := mk(la.Parameters())
		if err != nil {
			t.Fatal(err)
		}
		trainSteps(la, a, 2)
		path := filepath.Join(t.TempDir(), "m.safetensors")
		ts := &nn.TrainingState{GlobalStep: 2, Flags: map[string]string{}}
		optim.SaveTraining(ts, a.State())
		if name == "sgd momentum" && (ts.Momentum == nil || ts.OptimizerBuffers != nil) {
			t.Errorf("%s: SaveTraining changed SGD's format: momentum %v, other buffers %v", name, ts.Momentum != nil, ts.OptimizerBuffers)
		}
		if err := nn.SaveCheckpoint(path, la, ts); err != nil {
			t.Fatal(err)
		}
		short := *ts
		short.OptimizerBuffers = map[string][]float32{"exp_avg": make([]float32, 3)}
		if err := nn.SaveCheckpoint(filepath.Join(t.TempDir(), "s.safetensors"), la, &short); err == nil {
			t.Errorf("%s: SaveCheckpoint of an optimiser buffer of 3 values for 8 parameters: no error", name)
		}
		lb := nn.NewLinear(tensor.CPU, nil, 3, 2)
		loaded, err := nn.LoadCheckpoint(path, lb)
		if err != nil {
			t.Fatal(err)
		}
		b, err := mk(lb.Parameters())
		if err != nil {
			t.Fatal(err)
		}
		st := optim.LoadTraining(loaded)
		if err := b.LoadState(st); err != nil {
			t.Fatalf("%s: LoadState: %v", name, err)
		}
		if b.Steps() != 2 {
			t.Errorf("%s: restored steps %d, want 2", name, b.Steps())
		}
		for k, v := range a.State().Buffers {
			bitsEqual(t, name+" restored "+k, b.State().Buffers[k], v)
		}
		trainSteps(la, a, 3)
		trainSteps(lb, b, 3)
		bitsEqual(t, name+" weights after resuming", lb.Weight.Float32s(), la.Weight.Float32s())
		bitsEqual(t, name+" biases after resuming", lb.Bias.Float32s(), la.Bias.Float32s())

		// A state of the wrong size or kind is refused.
		bad := optim.State{Steps: 1, Buffers: map[string][]float32{}}
		for k, v := range st.Buffers {
			bad.Buffers[k] = v[:len(v)-1]
		}
		if err := b.LoadState(bad); err == nil {
			t.Errorf("%s: LoadState of short buffers: no error", name)
		}
		bad.Buffers = map[string][]float32{"nonsense": make([]float32, 8)}
		if err := b.LoadState(bad); err == nil {
			t.Errorf("%s: LoadState of foreign buffers: no error", name)
		}
	}
}

// SetLR switches SGD to the device learning rate; the results are bit for
// bit those of the host path, with the rate changing between steps.
func TestSGDDeviceLRMatchesHost(t *testing.T) {
	run := func(device bool) []float32 {
		l := nn.NewLinear(tensor.CPU, nil, 3, 2)
		opt, err := optim.NewSGD(l.Parameters(), optim.SGDConfig{LR: 0.1, Momentum: 0.9, WeightDecay: 0.01, Nesterov: true})
		if err != nil {
			t.Fatal(err)
		}
		sched := optim.CosineAnnealingLR{BaseLR: 0.1, TMax: 4}
		x := tensor.FromFloat32(tensor.CPU, nil, []float32{1, -2, 3, 0.5, 0, -1}, 2, 3)
		for step := 0; step < 4; step++ {
			if device {
				opt.SetLR(sched.LR(step))
			} else {
				opt.LR = sched.LR(step)
			}
			tensor.Sum(l.Forward(x)).Backward()
			opt.StepAndZeroGrad()
		}
		return append(l.Weight.Float32s(), l.Bias.Float32s()...)
	}
	host, dev := run(false), run(true)
	bitsEqual(t, "SGD with the device learning rate", dev, host)
}
