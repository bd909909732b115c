package tensor

func (*cpuBackend) Reduce(op ReduceOp, dst, x Buffer, outer, n, inner int, accumulate bool) {
	panic("tensor: cpu: Reduce not implemented yet")
}

func (*cpuBackend) Softmax(y, x Buffer, outer, n, inner int, log bool) {
	panic("tensor: cpu: Softmax not implemented yet")
}

func (*cpuBackend) SoftmaxBackward(dx, dy, y Buffer, outer, n, inner int, log, accumulate bool) {
	panic("tensor: cpu: SoftmaxBackward not implemented yet")
}
