package optim_test

import (
	"math"
	"path/filepath"
	"strings"
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

// A one-cycle schedule through SetLR and SetMomentum (the device-scalar
// path, which a captured step replays) gives bit for bit the weights of the
// host path, where the fields are assigned before each launch: torch's
// OneCycleLR with cycle_momentum on torch.optim.SGD, the rate rising and
// falling while the momentum falls and rises.
func TestSGDOneCycleDeviceMatchesHost(t *testing.T) {
	const steps = 12
	sched := optim.NewOneCycleLR(0.2, steps)
	sched.PctStart, sched.AnnealLinear = 0.25, true
	run := func(device bool) []float32 {
		l := nn.NewLinear(tensor.CPU, nil, 3, 2)
		opt, err := optim.NewSGD(l.Parameters(), optim.SGDConfig{LR: 0.2, Momentum: 0.9, WeightDecay: 5e-4, Nesterov: true})
		if err != nil {
			t.Fatal(err)
		}
		defer opt.Release()
		x := tensor.FromFloat32(tensor.CPU, nil, []float32{1, -2, 3, 0.5, 0, -1}, 2, 3)
		seen := map[float64]bool{}
		for step := range steps {
			m, ok := sched.MomentumAt(step)
			if !ok {
				t.Fatal("NewOneCycleLR does not cycle the momentum")
			}
			seen[m] = true
			if device {
				opt.SetLR(sched.LR(step))
				if err := opt.SetMomentum(m); err != nil {
					t.Fatal(err)
				}
			} else {
				opt.LR, opt.Momentum = sched.LR(step), m
			}
			tensor.Sum(l.Forward(x)).Backward()
			opt.StepAndZeroGrad()
		}
		if len(seen) < steps/2 {
			t.Fatalf("the schedule used %d momenta over %d steps; want it to change them", len(seen), steps)
		}
		return append(l.Weight.Float32s(), l.Bias.Float32s()...)
	}
	host, dev := run(false), run(true)
	bitsEqual(t, "SGD under OneCycleLR with device scalars", dev, host)
}

// SetMomentum refuses what the step could not apply: a momentum on an SGD
// built without a momentum buffer, a negative or NaN one, zero with
// nesterov; and Adam's beta1 outside [0, 1).
func TestSetMomentumErrors(t *testing.T) {
	l := nn.NewLinear(tensor.CPU, nil, 3, 2)
	plain, err := optim.NewSGD(l.Parameters(), optim.SGDConfig{LR: 0.1})
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.SetMomentum(0.9); err == nil || !strings.Contains(err.Error(), "without momentum") {
		t.Errorf("SetMomentum(0.9) on an SGD without momentum: %v", err)
	}
	if err := plain.SetMomentum(0); err != nil {
		t.Errorf("SetMomentum(0) on an SGD without momentum: %v", err)
	}
	plain.Release()
	nest, err := optim.NewSGD(l.Parameters(), optim.SGDConfig{LR: 0.1, Momentum: 0.9, Nesterov: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []float64{-0.1, math.NaN(), 0} {
		if err := nest.SetMomentum(m); err == nil {
			t.Errorf("SetMomentum(%g) with nesterov: no error", m)
		}
	}
	if err := nest.SetDampening(0.1); err == nil {
		t.Error("SetDampening(0.1) with nesterov: no error")
	}
	if err := nest.SetWeightDecay(-1); err == nil {
		t.Error("SetWeightDecay(-1): no error")
	}
	nest.Release()
	adam, err := optim.NewAdam(l.Parameters(), optim.DefaultAdamConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer adam.Release()
	for _, b := range []float64{1, -0.5, math.NaN()} {
		if err := adam.SetMomentum(b); err == nil {
			t.Errorf("Adam SetMomentum(%g): no error", b)
		}
	}
}
