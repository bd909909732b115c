package trainer_test

import (
	"fmt"

	"github.com/ember-ml/ember/data"
	"github.com/ember-ml/ember/nn/trainer"
	"github.com/ember-ml/ember/tensor"
)

// A Text source cuts the tokens into windows; each batch holds the windows
// the trainer picked and, as labels, the tokens that follow them.
func ExampleText() {
	text, err := data.NewText([]byte("abcabcabcab"), "example", data.TextOptions{Level: data.ByteLevel})
	if err != nil {
		panic(err)
	}
	src, err := trainer.NewText(tensor.CPU, text.Train, 4, 1)
	if err != nil {
		panic(err)
	}
	defer src.Release()
	src.Load([]int32{1}) // the second window: tokens 4 to 7
	b := src.Batch(nil)
	fmt.Println(src.Len(), "windows;", b.Inputs.Int32s(), "->", b.Labels.Int32s())
	// Output: 2 windows; [1 2 0 1] -> [2 0 1 2]
}
