package cuda

import "github.com/ember-ml/ember/tensor"

func (b *Backend) Reduce(op tensor.ReduceOp, dst, x tensor.Buffer, outer, n, inner int, accumulate bool) {
	panic("cuda: Reduce not implemented yet")
}
