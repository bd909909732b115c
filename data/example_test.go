package data_test

import (
	"fmt"
	"log"

	"github.com/ember-ml/ember/data"
)

// A Loader over a tiny in-memory data set: five 1x2 images, batches of two,
// shuffled by seed and epoch.
func ExampleNewLoader() {
	ds := &data.Dataset{
		Images: []uint8{0, 0, 255, 255, 0, 255, 255, 0, 128, 128},
		Labels: []uint8{3, 1, 4, 1, 5},
		N:      5, Rows: 1, Cols: 2,
	}
	l, err := data.NewLoader(ds, data.LoaderOptions{BatchSize: 2, Shuffle: true, Seed: 7, Normalize: true})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	fmt.Println("batches per epoch:", l.NumBatches())
	it := l.Epoch(0)
	for b, ok := it.Next(); ok; b, ok = it.Next() {
		fmt.Printf("batch %d: examples %v labels %v first pixel %.3f\n", b.Index, b.Indices, b.Labels, b.Images[0])
	}
	// The same (Seed, epoch) always gives the same order.
	fmt.Println("epoch 0 order:", data.Permutation(ds.N, 7, 0))
	// Output:
	// batches per epoch: 3
	// batch 0: examples [2 0] labels [4 3] first pixel -0.424
	// batch 1: examples [4 1] labels [5 1] first pixel 1.205
	// batch 2: examples [3] labels [1] first pixel 2.821
	// epoch 0 order: [2 0 4 1 3]
}

// The usual start of a training program: find MNIST, say where it came
// from, load it and iterate over shuffled, normalised batches. (Not run as
// a test: it needs the real data.)
func Example_mnist() {
	src, err := data.Locate("") // the value of a --data flag, if any
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(src.Describe())
	train, test, err := data.LoadMNIST(src.Dir)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(train.N, test.N, train.Rows, train.Cols)

	l, err := data.NewLoader(train, data.LoaderOptions{BatchSize: 64, Shuffle: true, Seed: 1, Prefetch: 2, Normalize: true})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	for epoch := range 2 {
		it := l.Epoch(epoch)
		for b, ok := it.Next(); ok; b, ok = it.Next() {
			_ = b.Images // 64*28*28 float32, ready for a tensor
			_ = b.Labels
		}
	}
}
