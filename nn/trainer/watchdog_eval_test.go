package trainer_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/nn/parallel"
	"github.com/ember-ml/ember/nn/trainer"
)

// TestParallelLongEvaluationIsNotAHang: rank 0's evaluation after each
// epoch, longer than the watchdog's step deadline, while the other rank
// waits for it (in the save's collective, or without a checkpoint before
// the next epoch), is not taken for a hung peer.
func TestParallelLongEvaluationIsNotAHang(t *testing.T) {
	const world, global = 2, 32
	for _, ckpt := range []string{"", filepath.Join(t.TempDir(), "model.safetensors")} {
		runs := make([]*rankRun, world)
		for r := range runs {
			runs[r] = newRankRun(t, r, world, global, ckpt)
			runs[r].cfg.Evaluate = func(nn.Module) (float64, float64, error) {
				time.Sleep(time.Second)
				return 1, 50, nil
			}
		}
		errs := onFakeRanks(world, func(c parallel.Communicator) error {
			rr := runs[c.Rank()]
			rr.cfg.Parallel = &trainer.Parallel{Comm: c, StepTimeout: 300 * time.Millisecond}
			_, err := trainer.Run(context.Background(), rr.cfg)
			return err
		})
		for r, err := range errs {
			if err != nil {
				t.Errorf("checkpoint %q: rank %d: %v", ckpt, r, err)
			}
		}
	}
}
