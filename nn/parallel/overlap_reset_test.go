package parallel

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// TestOverlapAfterAbortedPass: a backward pass that never reached
// FinishGradients (a captured step that failed mid-backward and is run
// again eagerly) leaves nothing to the next pass once BeginGradients
// starts it: every bucket starts again during the pass and the ranks end
// with the same averaged gradients.
func TestOverlapAfterAbortedPass(t *testing.T) {
	const n, local = 2, 8
	g := NewFakeGroup(n, 20*time.Second)
	grads := make([][][]float32, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			grads[r], errs[r] = func() ([][]float32, error) {
				b := tensor.CPU
				rng := rand.New(rand.NewPCG(uint64(1+r), 2))
				m := &mlp{Hidden: nn.NewLinear(b, rng, ddpFeatures, 16), Out: nn.NewLinear(b, rng, 16, ddpClasses)}
				params := nn.Parameters(m)
				opt, err := optim.NewSGD(params, optim.SGDConfig{LR: 0.1})
				if err != nil {
					return nil, err
				}
				dp, err := NewDataParallel(g.Comm(r, b), params, DataParallelOptions{BucketBytes: 64})
				if err != nil {
					return nil, err
				}
				if err := dp.BroadcastParameters(); err != nil {
					return nil, err
				}
				if err := dp.Overlap(); err != nil {
					return nil, err
				}
				defer dp.StopOverlap()
				x, y := ddpData()
				pass := func(k int) {
					s := tensor.NewScope()
					defer s.Release()
					o := (r*2 + k) * local // each rank and pass its own samples
					loss := nn.CrossEntropyLoss(m.Forward(tensor.FromFloat32(b, s, x[o*ddpFeatures:(o+local)*ddpFeatures], local, ddpFeatures)), tensor.FromInt32(b, s, y[o:o+local], local))
					dp.BeginGradients()
					loss.Backward()
				}
				opt.ZeroGrad()
				pass(0) // aborted: no FinishGradients
				opt.ZeroGrad()
				pass(1)
				if dp.Launched() != len(dp.Buckets()) {
					return nil, fmt.Errorf("%d of %d buckets started during the pass after the aborted one", dp.Launched(), len(dp.Buckets()))
				}
				if err := dp.FinishGradients(); err != nil {
					return nil, err
				}
				var out [][]float32
				for _, p := range params {
					out = append(out, p.Tensor.Grad().Float32s())
				}
				return out, nil
			}()
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for i := range grads[0] {
		if !slices.Equal(grads[0][i], grads[1][i]) {
			t.Fatalf("gradient of parameter %d differs between the ranks: not averaged after the aborted pass", i)
		}
	}
}
