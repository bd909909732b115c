package tensor

func (*cpuBackend) Softmax(y, x Buffer, outer, n, inner int, log bool) {
	panic("tensor: cpu: Softmax not implemented yet")
}

func (*cpuBackend) SoftmaxBackward(dx, dy, y Buffer, outer, n, inner int, log, accumulate bool) {
	panic("tensor: cpu: SoftmaxBackward not implemented yet")
}
