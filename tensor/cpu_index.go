package tensor

func (*cpuBackend) IndexSelect(dst, src, idx Buffer, outer, n, inner int) {
	panic("tensor: cpu: IndexSelect not implemented yet")
}

func (*cpuBackend) IndexAdd(dst, src, idx Buffer, outer, n, inner int) {
	panic("tensor: cpu: IndexAdd not implemented yet")
}

func (*cpuBackend) MatMulBatched(c, a, b Buffer, batch, m, n, k int, strideA, strideB, strideC int, transA, transB bool, alpha, beta float32) {
	panic("tensor: cpu: MatMulBatched not implemented yet")
}
