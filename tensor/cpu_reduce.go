package tensor

func (*cpuBackend) Reduce(op ReduceOp, dst, x Buffer, outer, n, inner int, accumulate bool) {
	panic("tensor: cpu: Reduce not implemented yet")
}
