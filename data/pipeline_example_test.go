package data_test

import (
	"context"
	"fmt"

	"github.com/ember-ml/ember/data"
)

// A pipeline of batches built on the host by two workers, at most four
// ahead of the training loop, which takes them in order.
func ExamplePipeline() {
	ds := &data.Dataset{N: 10, Rows: 1, Cols: 2, Images: make([]uint8, 20), Labels: []uint8{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}}
	const batch = 4
	batches := (ds.N + batch - 1) / batch
	p, err := data.NewPipeline(context.Background(), batches, data.PipelineOptions{Workers: 2, Depth: 4},
		func(ctx context.Context, i int) ([]uint8, error) {
			return ds.Labels[i*batch : min((i+1)*batch, ds.N)], nil // a real build gathers and augments the images
		})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close()
	for labels, ok := p.Next(); ok; labels, ok = p.Next() {
		fmt.Println(labels)
	}
	if err := p.Err(); err != nil {
		fmt.Println(err)
	}
	// Output:
	// [0 1 2 3]
	// [4 5 6 7]
	// [8 9]
}
