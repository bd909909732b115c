package cuda

import (
	"fmt"

	"github.com/ember-ml/ember/tensor"
)

// The strided elementwise core (kernels/strided.cu). Every operand's view
// is merged with the others (size-1 dimensions dropped, dimensions that
// are contiguous in every operand fused) so that the common cases reach
// the fast kernels: all operands dense, or dense with broadcast scalars,
// run a 1-D loop (four elements a load where aligned); the rest run the
// six-dimensional strided kernels.

// smallIndex: below it, the strided kernels index in 32-bit arithmetic
// (as common.cu's EMBER_SMALL_INDEX).
const smallIndex = 1 << 30

// stridedOperands is the merged form of a shape and the strides of its
// operands, padded on the left to maxStridedRank dimensions.
type stridedOperands struct {
	n       int
	rank    int
	small   bool
	shape   [maxStridedRank]int64
	strides [][maxStridedRank]int64
}

// mergeOperands drops size-1 dimensions and fuses each dimension with the
// next inner one where every operand is contiguous across the two.
func mergeOperands(shape []int, strides [][]int) (s []int, t [][]int) {
	t = make([][]int, len(strides))
	for k, d := range shape {
		if d == 1 {
			continue
		}
		if m := len(s); m > 0 {
			fuse := true
			for j := range strides {
				if t[j][m-1] != strides[j][k]*d {
					fuse = false
					break
				}
			}
			if fuse {
				s[m-1] *= d
				for j := range strides {
					t[j][m-1] = strides[j][k]
				}
				continue
			}
		}
		s = append(s, d)
		for j := range strides {
			t[j] = append(t[j], strides[j][k])
		}
	}
	if len(s) == 0 {
		s = []int{1}
		for j := range t {
			t[j] = []int{0}
		}
	}
	return s, t
}

// viewPtr checks a view of shape (strides of its rank, none negative, the
// last element inside the buffer) and returns its address.
func (b *Backend) viewPtr(op, what string, v tensor.View, shape []int, n int) uintptr {
	if len(v.Strides) != len(shape) {
		panic(fmt.Sprintf("cuda: %s: %s strides %v for shape %v", op, what, v.Strides, shape))
	}
	last := 0
	for k, d := range shape {
		if v.Strides[k] < 0 {
			panic(fmt.Sprintf("cuda: %s: %s has a negative stride in %v", op, what, v.Strides))
		}
		if n > 0 {
			last += (d - 1) * v.Strides[k]
		}
	}
	if n > 0 && last >= v.Buf.Len {
		panic(fmt.Sprintf("cuda: %s: %s view of shape %v strides %v reaches element %d of a buffer of %d", op, what, shape, v.Strides, last, v.Buf.Len))
	}
	return b.f32(op, v.Buf)
}

func elementCount(op string, shape []int) int {
	n := 1
	for _, d := range shape {
		if d < 0 {
			panic(fmt.Sprintf("cuda: %s: negative dimension in shape %v", op, shape))
		}
		n *= d
	}
	return n
}

// strided merges the operands' strides over shape for the kernels.
func strided(op string, shape []int, strides ...[]int) stridedOperands {
	s, t := mergeOperands(shape, strides)
	if len(s) > maxStridedRank {
		panic(fmt.Sprintf("cuda: %s: shape %v is %d-D after merging (strides %v); the kernels take at most %d", op, shape, len(s), strides, maxStridedRank))
	}
	o := stridedOperands{n: elementCount(op, shape), rank: len(s), strides: make([][maxStridedRank]int64, len(t))}
	pad := maxStridedRank - len(s)
	o.small = o.n < smallIndex
	for k := range o.shape {
		o.shape[k] = 1
	}
	for k := range s {
		o.shape[pad+k] = int64(s[k])
		for j := range t {
			o.strides[j][pad+k] = int64(t[j][k])
			if int64(s[k]-1)*int64(t[j][k]) >= smallIndex/maxStridedRank {
				o.small = false
			}
		}
	}
	return o
}

// dense1 reports whether the merged operands are one dimension with every
// stride 0 or 1 (the dense kernels' case), and the strides.
func (o stridedOperands) dense1() (bool, []int32) {
	if o.rank != 1 {
		return false, nil
	}
	st := make([]int32, len(o.strides))
	for j, t := range o.strides {
		v := t[maxStridedRank-1]
		if v != 0 && v != 1 {
			return false, nil
		}
		st[j] = int32(v)
	}
	return true, st
}

// args appends the merged shape and strides to a kernel's arguments.
func (o stridedOperands) args(head ...any) []any {
	a := append(head, int32(o.rank), flag(o.small))
	for _, v := range o.shape {
		a = append(a, v)
	}
	for _, t := range o.strides {
		for _, v := range t {
			a = append(a, v)
		}
	}
	return a
}

func (b *Backend) Unary(op tensor.UnaryOp, dst tensor.Buffer, x tensor.View, shape []int, a, c float32) {
	const name = "unary"
	if op >= tensor.NumUnaryOps {
		panic(fmt.Sprintf("cuda: %s: unknown op %d", name, op))
	}
	n := elementCount(name, shape)
	need(name, "dst", dst, n)
	pd, px := b.f32(name, dst), b.viewPtr(name, "x", x, shape, n)
	if n == 0 {
		return
	}
	o := strided(name, shape, tensorStrides(shape), x.Strides)
	if ok, st := o.dense1(); ok && st[0] == 1 && st[1] == 1 {
		b.launch4(name, b.kernel("ember_unary_dense"), n, (pd|px)%16 == 0, pd, px, int64(n), int32(op), a, c)
		return
	}
	b.launch(name, b.kernel("ember_unary_strided"), n, o.argsOf(1, pd, px, int64(n), int32(op), a, c)...)
}

// argsOf is args with the first skip operands' strides left out (dst's,
// which the kernels know to be dense).
func (o stridedOperands) argsOf(skip int, head ...any) []any {
	o.strides = o.strides[skip:]
	return o.args(head...)
}

func tensorStrides(shape []int) []int {
	st := make([]int, len(shape))
	s := 1
	for k := len(shape) - 1; k >= 0; k-- {
		st[k] = s
		s *= shape[k]
	}
	return st
}

func (b *Backend) UnaryBackward(op tensor.UnaryOp, dx, dy, x tensor.Buffer, n int, p, q float32, accumulate bool) {
	const name = "unary_backward"
	if op >= tensor.NumUnaryOps {
		panic(fmt.Sprintf("cuda: %s: unknown op %d", name, op))
	}
	need(name, "dx", dx, n)
	need(name, "dy", dy, n)
	need(name, "x", x, n)
	pdx, pdy, px := b.f32(name, dx), b.f32(name, dy), b.f32(name, x)
	b.launch4(name, b.kernel("ember_unary_backward"), n, (pdx|pdy|px)%16 == 0, pdx, pdy, px, int64(n), int32(op), p, q, flag(accumulate))
}

func (b *Backend) Binary(op tensor.BinaryOp, dst tensor.Buffer, x, y tensor.View, shape []int) {
	const name = "binary"
	if op >= tensor.NumBinaryOps {
		panic(fmt.Sprintf("cuda: %s: unknown op %d", name, op))
	}
	n := elementCount(name, shape)
	need(name, "dst", dst, n)
	pd, px, py := b.f32(name, dst), b.viewPtr(name, "x", x, shape, n), b.viewPtr(name, "y", y, shape, n)
	if n == 0 {
		return
	}
	o := strided(name, shape, tensorStrides(shape), x.Strides, y.Strides)
	if ok, st := o.dense1(); ok && st[0] == 1 {
		vec := pd%16 == 0 && (st[1] == 0 || px%16 == 0) && (st[2] == 0 || py%16 == 0)
		b.launch4(name, b.kernel("ember_binary_dense"), n, vec, pd, px, py, int64(n), int32(op), st[1], st[2])
		return
	}
	if c, ok := o.channel(); ok {
		pdense, pch := px, py
		if !c.chIsY {
			pdense, pch = py, px
		}
		vec := c.inner%4 == 0 && (pd|pdense)&15 == 0
		inner := c.inner
		if vec {
			inner /= 4
		}
		di, dc := newDivider(inner), newDivider(c.c)
		b.launch4(name, b.kernel("ember_binary_channel"), n, vec, pd, pdense, pch, int32(n), int32(op), int32(c.c),
			int32(di.mul), int32(di.shift), int32(dc.mul), int32(dc.shift), flag(c.chIsY), flag(vec))
		return
	}
	b.launch(name, b.kernel("ember_binary_strided"), n, o.argsOf(1, pd, px, py, int64(n), int32(op))...)
}

// channelOperands is the per-channel case of a binary operation: one
// operand dense, the other one value for each of c channels, each channel
// inner consecutive elements (a bias over NCHW: [outer, c, inner]).
type channelOperands struct {
	c, inner int
	chIsY    bool // the channel operand is y (else x)
}

// channel reports whether the merged operands (dst, x, y) of a binary
// operation are a dense operand and a channel operand: strides those of a
// dense tensor for one, a single dimension of stride 1 and the others 0
// for the other, and fewer than smallIndex elements (32-bit indices).
func (o stridedOperands) channel() (channelOperands, bool) {
	if len(o.strides) != 3 || !o.dense(0) {
		return channelOperands{}, false
	}
	if o.dense(1) {
		c, ok := o.channelOf(2)
		c.chIsY = true
		return c, ok
	}
	if o.dense(2) {
		return o.channelOf(1)
	}
	return channelOperands{}, false
}

// dense reports whether operand j's merged strides are those of a dense
// tensor.
func (o stridedOperands) dense(j int) bool {
	s := int64(1)
	for k := maxStridedRank - 1; k >= maxStridedRank-o.rank; k-- {
		if o.strides[j][k] != s {
			return false
		}
		s *= o.shape[k]
	}
	return true
}

// channelOf reports whether operand j is one value per channel: a single
// merged dimension of stride 1, the others 0, with fewer than smallIndex
// elements in all (32-bit indices) and at least two merged dimensions.
func (o stridedOperands) channelOf(j int) (channelOperands, bool) {
	if o.n >= smallIndex || o.rank < 2 {
		return channelOperands{}, false
	}
	t := o.strides[j]
	at := -1
	for k := maxStridedRank - o.rank; k < maxStridedRank; k++ {
		switch {
		case t[k] == 1 && at < 0:
			at = k
		case t[k] != 0:
			return channelOperands{}, false
		}
	}
	if at < 0 {
		return channelOperands{}, false
	}
	inner := int64(1)
	for k := at + 1; k < maxStridedRank; k++ {
		inner *= o.shape[k]
	}
	return channelOperands{c: int(o.shape[at]), inner: int(inner)}, true
}

func (b *Backend) Where(dst tensor.Buffer, cond, x, y tensor.View, shape []int) {
	const name = "where"
	n := elementCount(name, shape)
	need(name, "dst", dst, n)
	pd, pc := b.f32(name, dst), b.viewPtr(name, "cond", cond, shape, n)
	px, py := b.viewPtr(name, "x", x, shape, n), b.viewPtr(name, "y", y, shape, n)
	if n == 0 {
		return
	}
	o := strided(name, shape, tensorStrides(shape), cond.Strides, x.Strides, y.Strides)
	b.launch(name, b.kernel("ember_where_strided"), n, o.argsOf(1, pd, pc, px, py, int64(n))...)
}

func (b *Backend) CopyView(dst, src tensor.View, shape []int, accumulate bool) {
	const name = "copy_view"
	n := elementCount(name, shape)
	pd, ps := b.viewPtr(name, "dst", dst, shape, n), b.viewPtr(name, "src", src, shape, n)
	if n == 0 {
		return
	}
	for k, d := range shape {
		if d > 1 && dst.Strides[k] == 0 {
			panic(fmt.Sprintf("cuda: %s: destination strides %v alias elements of shape %v", name, dst.Strides, shape))
		}
	}
	o := strided(name, shape, dst.Strides, src.Strides)
	if c, ok := o.channelOf(1); ok && o.dense(0) {
		vec := c.inner%4 == 0 && pd&15 == 0
		threads := n
		if vec {
			threads = n / 4
		}
		b.launch(name, b.kernel("ember_copy_channel"), threads, pd, ps, int32(n), int32(c.c), int32(c.inner), flag(accumulate), flag(vec))
		return
	}
	b.launch(name, b.kernel("ember_copy_view"), n, o.args(pd, ps, int64(n), flag(accumulate))...)
}
