package models_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/ember-ml/ember/cuda"
	"github.com/ember-ml/ember/nn/trainer"
	"github.com/ember-ml/ember/tensor"
)

// TestStepLendGPU: work run under trainer.Step.Lend between replays (an
// evaluation) that frees what it makes leaves the captured graph in
// place; work that keeps a tensor gets the graph dropped, said once, and
// the step captured again at its next Run, with the same loss. It skips
// without a GPU, and fails instead with EMBER_REQUIRE_GPU=1.
func TestStepLendGPU(t *testing.T) {
	requireGPU(t)
	b, err := cuda.NewBackend(0, cuda.BackendOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const n = 1 << 20
	x := tensor.Full(b, nil, 1, n) // the step's fixed input
	defer x.Release()
	var logs []string
	st, err := trainer.CaptureStep(b, func(s *tensor.Scope) *tensor.Tensor {
		y := tensor.Add(s.Borrow(x), s.Borrow(x))
		z := tensor.Mul(y, y)
		w := tensor.Add(z, y)
		loss := tensor.Sum(w) // (4+2)·n
		for _, t := range []*tensor.Tensor{w, z, y} {
			t.Release() // transient, as a backward pass frees them
		}
		return loss
	}, trainer.StepOptions{Logf: func(f string, a ...any) { logs = append(logs, fmt.Sprintf(f, a...)) }})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const want = float32(6 * n)
	run := func(what string) {
		t.Helper()
		l, err := st.Run(n)
		if err != nil {
			t.Fatal(err)
		}
		if got := l.Item(); got != want {
			t.Errorf("%s: loss %v, want %v", what, got, want)
		}
	}
	for i := range 3 { // an eager warm-up where cuDNN is, then the capture
		run(fmt.Sprintf("step %d", i))
	}
	if !st.Captured(n) {
		t.Fatalf("the step is not replayed: %s", st.Reason())
	}
	e := tensor.NewScope()
	defer e.Release()
	var got float32
	if err := st.Lend(func() error {
		defer e.Reset()
		got = tensor.Sum(tensor.Mul(e.Borrow(x), tensor.Full(b, e, 3, n))).Item()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got != 3*n || !st.Captured(n) {
		t.Errorf("an evaluation that frees its tensors: %v (want %v), graph kept %v (want true)", got, 3*n, st.Captured(n))
	}
	run("replay after the evaluation")
	var kept *tensor.Tensor
	if err := st.Lend(func() error { kept = tensor.Full(b, nil, 2, n); return nil }); err != nil {
		t.Fatal(err)
	}
	if st.Captured(n) || !strings.Contains(strings.Join(logs, "\n"), "captured again") {
		t.Errorf("an evaluation that keeps a tensor: graph kept %v (want false), log %q", st.Captured(n), logs)
	}
	run("the step captured again")
	if !st.Captured(n) {
		t.Errorf("the step was not captured again: %s", st.Reason())
	}
	kept.Release()
	run("replay after the kept tensor's release")
}
