package cuda

import "github.com/ember-ml/ember/tensor"

func (b *Backend) Unary(op tensor.UnaryOp, dst tensor.Buffer, x tensor.View, shape []int, a, c float32) {
	panic("cuda: Unary not implemented yet")
}

func (b *Backend) UnaryBackward(op tensor.UnaryOp, dx, dy, x tensor.Buffer, n int, p, q float32, accumulate bool) {
	panic("cuda: UnaryBackward not implemented yet")
}

func (b *Backend) Binary(op tensor.BinaryOp, dst tensor.Buffer, x, y tensor.View, shape []int) {
	panic("cuda: Binary not implemented yet")
}

func (b *Backend) Where(dst tensor.Buffer, cond, x, y tensor.View, shape []int) {
	panic("cuda: Where not implemented yet")
}

func (b *Backend) CopyView(dst, src tensor.View, shape []int, accumulate bool) {
	panic("cuda: CopyView not implemented yet")
}
