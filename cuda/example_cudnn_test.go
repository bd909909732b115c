package cuda_test

import (
	"fmt"

	"github.com/ember-ml/ember/cuda"
)

// A backend says whether its convolutions run through cuDNN, and if not,
// why (it is not installed, too old, or turned off with EMBER_CUDNN=0).
// Without a GPU NewBackend fails first; the example has no fixed output.
func ExampleBackend_CuDNN() {
	opt, err := cuda.OptionsFromEnv(cuda.BackendOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	b, err := cuda.NewBackend(0, opt)
	if err != nil {
		fmt.Println("no GPU:", err)
		return
	}
	defer b.Close()
	if v, err := b.CuDNN(); err != nil {
		fmt.Println("convolutions through im2col + cuBLAS:", err)
	} else {
		fmt.Println("convolutions through cuDNN", v) // 91400 for 9.14.0
	}
}
