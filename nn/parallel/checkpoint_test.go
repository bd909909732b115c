package parallel

import (
	"errors"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

func TestOnMain(t *testing.T) {
	var ran atomic.Int32
	errs := onRanks(3, 10*time.Second, func(c *FakeComm) error {
		return OnMain(c, func() error { ran.Add(1); return nil })
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	if ran.Load() != 1 {
		t.Errorf("fn ran %d times, want once (rank 0)", ran.Load())
	}
	// Rank 0 failing fails every rank: its own error there, a line naming
	// rank 0 elsewhere.
	diskFull := errors.New("no space left on device")
	errs = onRanks(3, 10*time.Second, func(c *FakeComm) error {
		return OnMain(c, func() error { return diskFull })
	})
	if !errors.Is(errs[0], diskFull) {
		t.Errorf("rank 0: %v", errs[0])
	}
	for r := 1; r < 3; r++ {
		if errs[r] == nil || !strings.Contains(errs[r].Error(), "rank 0 failed to write the checkpoint") {
			t.Errorf("rank %d: %v", r, errs[r])
		}
	}
	if err := OnMain(nil, func() error { return diskFull }); !errors.Is(err, diskFull) {
		t.Errorf("OnMain(nil): %v", err)
	}
}

// Four ranks with different weights save: only rank 0 writes, so the file
// holds rank 0's weights (a write by any other rank would leave its own).
// Then two ranks, whose models start elsewhere, resume from it (another
// world size): both hold rank 0's saved weights.
func TestCheckpointRank0AndResumeElsewhere(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.safetensors")
	newModel := func(seed uint64) (*mlp, *optim.SGD) {
		rng := rand.New(rand.NewPCG(seed, 1))
		m := &mlp{Hidden: nn.NewLinear(tensor.CPU, rng, 3, 4), Out: nn.NewLinear(tensor.CPU, rng, 4, 2)}
		opt, err := optim.NewSGD(nn.Parameters(m), optim.SGDConfig{LR: 0.1})
		if err != nil {
			t.Fatal(err)
		}
		return m, opt
	}
	saved, _ := newModel(5)
	want := saved.Out.Weight.Float32s()
	errs := onRanks(4, 10*time.Second, func(c *FakeComm) error {
		m, _ := newModel(uint64(5 + c.Rank())) // rank 0's is `saved`'s twin
		return SaveCheckpoint(c, path, m, &nn.TrainingState{Epoch: 1, Step: 3, GlobalStep: 9, Seed: 5})
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	errs = onRanks(2, 10*time.Second, func(c *FakeComm) error {
		m, _ := newModel(uint64(100 + c.Rank()))
		dp, err := NewDataParallel(c, nn.Parameters(m), DataParallelOptions{})
		if err != nil {
			return err
		}
		st, err := LoadCheckpoint(dp, path, m)
		if err != nil {
			return err
		}
		if st.GlobalStep != 9 {
			return errors.New("wrong training state")
		}
		got := m.Out.Weight.Float32s()
		for i := range want {
			if got[i] != want[i] {
				return errors.New("loaded weights differ from rank 0's saved ones")
			}
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("resume, rank %d: %v", r, err)
		}
	}
}

func TestAgreeToStop(t *testing.T) {
	got := make([]bool, 3)
	errs := onRanks(3, 10*time.Second, func(c *FakeComm) error {
		var err error
		// Only rank 2 was interrupted; everyone stops.
		got[c.Rank()], err = AgreeToStop(c, c.Rank() == 2)
		return err
	})
	for r := range 3 {
		if errs[r] != nil || !got[r] {
			t.Errorf("rank %d: stop %v, %v; want true", r, got[r], errs[r])
		}
	}
	errs = onRanks(2, 10*time.Second, func(c *FakeComm) error {
		stop, err := AgreeToStop(c, false)
		if stop {
			t.Errorf("rank %d stops though no rank asked", c.Rank())
		}
		return err
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}
