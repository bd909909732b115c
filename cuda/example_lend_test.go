package cuda_test

import (
	"fmt"

	"github.com/ember-ml/ember/cuda"
	"github.com/ember-ml/ember/tensor"
)

// Work between the replays of a captured step, here an evaluation-like
// sum, runs under Lend: its tensors take the graph's idle blocks (the
// step's transient tensors) before the cache reserves more, and it frees
// them before the next replay. Without a GPU NewBackend fails first; the
// example has no fixed output.
func ExampleBackend_Lend() {
	b, err := cuda.NewBackend(0, cuda.BackendOptions{})
	if err != nil {
		fmt.Println("no GPU:", err)
		return
	}
	defer b.Close()
	x := tensor.Full(b, nil, 1, 1<<20)
	defer x.Release()
	var loss *tensor.Tensor
	g, err := b.Capture(func() {
		y := tensor.Mul(x, x) // transient: freed inside the step
		loss = tensor.Sum(y)  // the step's output stays
		y.Release()
	})
	if err != nil {
		fmt.Println("eager:", err)
		return
	}
	defer g.Close()
	defer loss.Release()
	if err := g.Replay(); err != nil {
		fmt.Println(err)
		return
	}
	s := tensor.NewNoGradScope()
	var sum float32
	kept := b.Lend(func() {
		defer s.Release() // before the next replay
		sum = tensor.Sum(tensor.Add(s.Borrow(x), s.Borrow(x))).Item()
	})
	fmt.Println(loss.Item(), sum, kept) // 1.048576e+06 2.097152e+06 0
}
