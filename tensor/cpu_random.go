package tensor

func (*cpuBackend) Random(dst Buffer, dist Distribution, seed, offset uint64, a, b float32) {
	panic("tensor: cpu: Random not implemented yet")
}
