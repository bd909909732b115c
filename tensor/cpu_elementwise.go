package tensor

func (*cpuBackend) Unary(op UnaryOp, dst Buffer, x View, shape []int, a, b float32) {
	panic("tensor: cpu: Unary not implemented yet")
}

func (*cpuBackend) UnaryBackward(op UnaryOp, dx, dy, x Buffer, n int, a, b float32, accumulate bool) {
	panic("tensor: cpu: UnaryBackward not implemented yet")
}

func (*cpuBackend) Binary(op BinaryOp, dst Buffer, x, y View, shape []int) {
	panic("tensor: cpu: Binary not implemented yet")
}

func (*cpuBackend) Where(dst Buffer, cond, x, y View, shape []int) {
	panic("tensor: cpu: Where not implemented yet")
}

func (*cpuBackend) CopyView(dst, src View, shape []int, accumulate bool) {
	panic("tensor: cpu: CopyView not implemented yet")
}
