package nn_test

import (
	"testing"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// countingReducer is one rank alone that counts its all-reduces.
type countingReducer struct{ calls *int }

func (r countingReducer) SumOverRanks(*tensor.Tensor) { *r.calls++ }
func (r countingReducer) Ranks() int                  { return 1 }
func (r countingReducer) Rank() int                   { return 0 }

// TestSyncBatchNormEvalNoRunningStats: a synchronised layer without
// running statistics normalises by the batch's statistics in evaluation
// too, but by this rank's alone: evaluation runs on rank 0 only, where an
// all-reduce would wait for the other ranks forever.
func TestSyncBatchNormEvalNoRunningStats(t *testing.T) {
	b := tensor.CPU
	bn := nn.NewBatchNorm2dWith(b, 3, nn.BatchNormOptions{NoRunningStats: true})
	calls := 0
	if n := nn.SetSyncBatchNorm(bn, countingReducer{&calls}); n != 1 {
		t.Fatalf("SetSyncBatchNorm found %d layers, want 1", n)
	}
	x := tensor.Full(b, nil, 2, 4, 3, 2, 2)
	defer x.Release()
	bn.SetTraining(false)
	y := bn.Forward(x)
	y.Release()
	if calls != 0 {
		t.Errorf("evaluation: %d all-reduces, want none", calls)
	}
	bn.SetTraining(true)
	y = bn.Forward(x)
	y.Release()
	if calls != 1 {
		t.Errorf("training: %d all-reduces, want 1", calls)
	}
}
