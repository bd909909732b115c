package cuda

// Average and adaptive pooling (tensor.PoolBackend; kernels/pool.cu): one
// launch each way, one thread per output forward and one per input element
// backward (gathers, no atomics), so that results are deterministic and
// equal the CPU backend's.

import (
	"fmt"

	"github.com/ember-ml/ember/tensor"
)

var _ tensor.PoolBackend = (*Backend)(nil)

// avgPoolArgs are the geometry arguments of the average pooling kernels:
// H, W, KH, KW, SH, SW, PH, PW, OH, OW, excludePad, divisor.
func avgPoolArgs(op string, g tensor.AvgPoolGeom) (s poolShape, args []any) {
	if g.Divisor < 0 {
		panic(fmt.Sprintf("cuda: %s: invalid divisor %d", op, g.Divisor))
	}
	s = poolShapeOf(op, g.PoolGeom)
	for _, d := range s.dims {
		args = append(args, d)
	}
	return s, append(args, flag(g.ExcludePad), i32arg(op, g.Divisor))
}

// AvgPool2d implements tensor.PoolBackend.
func (b *Backend) AvgPool2d(y, x tensor.Buffer, g tensor.AvgPoolGeom) {
	const op = "avgpool2d"
	s, dims := avgPoolArgs(op, g)
	need(op, "y", y, s.yLen)
	need(op, "x", x, s.xLen)
	args := append(append([]any{b.f32(op, y), b.f32(op, x)}, dims...), int64(s.yLen), int64(s.xLen))
	b.launch(op, b.kernel("ember_avgpool2d"), s.yLen, args...)
}

// AvgPool2dBackward implements tensor.PoolBackend.
func (b *Backend) AvgPool2dBackward(dx, dy tensor.Buffer, g tensor.AvgPoolGeom, accumulate bool) {
	const op = "avgpool2d_backward"
	s, dims := avgPoolArgs(op, g)
	need(op, "dx", dx, s.xLen)
	need(op, "dy", dy, s.yLen)
	args := append(append([]any{b.f32(op, dx), b.f32(op, dy)}, dims...), int64(s.xLen), int64(s.yLen), flag(accumulate))
	b.launch(op, b.kernel("ember_avgpool2d_backward"), s.xLen, args...)
}

// adaptiveShape is a validated AdaptivePoolGeom: lengths and the kernels'
// H, W, OH, OW.
type adaptiveShape struct {
	xLen, yLen int
	dims       []any
}

func adaptiveShapeOf(op string, g tensor.AdaptivePoolGeom) adaptiveShape {
	if g.N < 0 || g.C < 0 || g.H < 1 || g.W < 1 || g.OutH < 1 || g.OutW < 1 {
		panic(fmt.Sprintf("cuda: %s: invalid geometry %+v", op, g))
	}
	if g.H*g.W > 1<<31-1 || g.OutH*g.OutW > 1<<31-1 {
		panic(fmt.Sprintf("cuda: %s: a %dx%d plane does not fit int32 indices", op, g.H, g.W))
	}
	return adaptiveShape{xLen: g.N * g.C * g.H * g.W, yLen: g.N * g.C * g.OutH * g.OutW,
		dims: []any{i32arg(op, g.H), i32arg(op, g.W), i32arg(op, g.OutH), i32arg(op, g.OutW)}}
}

// AdaptiveAvgPool2d implements tensor.PoolBackend.
func (b *Backend) AdaptiveAvgPool2d(y, x tensor.Buffer, g tensor.AdaptivePoolGeom) {
	const op = "adaptive_avgpool2d"
	s := adaptiveShapeOf(op, g)
	need(op, "y", y, s.yLen)
	need(op, "x", x, s.xLen)
	args := append(append([]any{b.f32(op, y), b.f32(op, x)}, s.dims...), int64(s.yLen), int64(s.xLen))
	b.launch(op, b.kernel("ember_adaptive_avgpool2d"), s.yLen, args...)
}

// AdaptiveMaxPool2d implements tensor.PoolBackend.
func (b *Backend) AdaptiveMaxPool2d(y, argmax, x tensor.Buffer, g tensor.AdaptivePoolGeom) {
	const op = "adaptive_maxpool2d"
	s := adaptiveShapeOf(op, g)
	need(op, "y", y, s.yLen)
	need(op, "argmax", argmax, s.yLen)
	need(op, "x", x, s.xLen)
	args := append(append([]any{b.f32(op, y), b.i32(op, argmax), b.f32(op, x)}, s.dims...), int64(s.yLen), int64(s.xLen))
	b.launch(op, b.kernel("ember_adaptive_maxpool2d"), s.yLen, args...)
}

// AdaptiveAvgPool2dBackward implements tensor.PoolBackend.
func (b *Backend) AdaptiveAvgPool2dBackward(dx, dy tensor.Buffer, g tensor.AdaptivePoolGeom, accumulate bool) {
	b.adaptiveBackward("adaptive_avgpool2d_backward", dx, dy, tensor.Buffer{}, g, accumulate)
}

// AdaptiveMaxPool2dBackward implements tensor.PoolBackend.
func (b *Backend) AdaptiveMaxPool2dBackward(dx, dy, argmax tensor.Buffer, g tensor.AdaptivePoolGeom, accumulate bool) {
	const op = "adaptive_maxpool2d_backward"
	need(op, "argmax", argmax, adaptiveShapeOf(op, g).yLen)
	b.adaptiveBackward(op, dx, dy, argmax, g, accumulate)
}

// adaptiveBackward queues ember_adaptive_pool2d_backward: the average's
// gradient when argmax is empty, else the maximum's.
func (b *Backend) adaptiveBackward(op string, dx, dy, argmax tensor.Buffer, g tensor.AdaptivePoolGeom, accumulate bool) {
	s := adaptiveShapeOf(op, g)
	need(op, "dx", dx, s.xLen)
	need(op, "dy", dy, s.yLen)
	var pa uintptr
	if !argmax.Empty() {
		pa = b.i32(op, argmax)
	}
	args := append(append([]any{b.f32(op, dx), b.f32(op, dy), pa}, s.dims...), int64(s.xLen), int64(s.yLen), flag(accumulate))
	b.launch(op, b.kernel("ember_adaptive_pool2d_backward"), s.xLen, args...)
}
