package cuda

import "github.com/ember-ml/ember/tensor"

func (b *Backend) IndexSelect(dst, src, idx tensor.Buffer, outer, n, inner int) {
	panic("cuda: IndexSelect not implemented yet")
}

func (b *Backend) IndexAdd(dst, src, idx tensor.Buffer, outer, n, inner int) {
	panic("cuda: IndexAdd not implemented yet")
}

func (b *Backend) MatMulBatched(c, a, bm tensor.Buffer, batch, m, n, k int, strideA, strideB, strideC int, transA, transB bool, alpha, beta float32) {
	panic("cuda: MatMulBatched not implemented yet")
}
