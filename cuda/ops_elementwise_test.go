package cuda

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// TestStridedOpCodes checks that the op codes #defined by the kernels
// equal tensor's UnaryOp, BinaryOp and ReduceOp values.
func TestStridedOpCodes(t *testing.T) {
	src, err := kernelSource()
	if err != nil {
		t.Fatal(err)
	}
	defs := map[string]int{}
	for _, m := range regexp.MustCompile(`#define (EMBER_(?:OP|R)_\w+) (\d+)\n`).FindAllStringSubmatch(src, -1) {
		v, _ := strconv.Atoi(m[2])
		defs[m[1]] = v
	}
	want := map[string]int{
		"EMBER_OP_IDENTITY": int(tensor.OpIdentity), "EMBER_OP_NEG": int(tensor.OpNeg), "EMBER_OP_ABS": int(tensor.OpAbs),
		"EMBER_OP_EXP": int(tensor.OpExp), "EMBER_OP_LOG": int(tensor.OpLog), "EMBER_OP_SQRT": int(tensor.OpSqrt),
		"EMBER_OP_RSQRT": int(tensor.OpRsqrt), "EMBER_OP_RECIP": int(tensor.OpRecip), "EMBER_OP_SQUARE": int(tensor.OpSquare),
		"EMBER_OP_TANH": int(tensor.OpTanh), "EMBER_OP_SIGMOID": int(tensor.OpSigmoid), "EMBER_OP_RELU": int(tensor.OpReLU),
		"EMBER_OP_LEAKY_RELU": int(tensor.OpLeakyReLU), "EMBER_OP_GELU": int(tensor.OpGELU), "EMBER_OP_GELU_TANH": int(tensor.OpGELUTanh),
		"EMBER_OP_SILU": int(tensor.OpSiLU), "EMBER_OP_CLAMP": int(tensor.OpClamp), "EMBER_OP_POW_SCALAR": int(tensor.OpPowScalar),
		"EMBER_OP_ADD_SCALAR": int(tensor.OpAddScalar), "EMBER_OP_MUL_SCALAR": int(tensor.OpMulScalar), "EMBER_OP_AFFINE": int(tensor.OpAffine),
		"EMBER_OP_SIN": int(tensor.OpSin), "EMBER_OP_COS": int(tensor.OpCos),
		"EMBER_OP_ADD": int(tensor.OpAdd), "EMBER_OP_SUB": int(tensor.OpSub), "EMBER_OP_MUL": int(tensor.OpMul),
		"EMBER_OP_DIV": int(tensor.OpDiv), "EMBER_OP_POW": int(tensor.OpPow), "EMBER_OP_MAXIMUM": int(tensor.OpMaximum),
		"EMBER_OP_MINIMUM": int(tensor.OpMinimum), "EMBER_OP_EQ": int(tensor.OpEq), "EMBER_OP_NE": int(tensor.OpNe),
		"EMBER_OP_LT": int(tensor.OpLt), "EMBER_OP_LE": int(tensor.OpLe), "EMBER_OP_GT": int(tensor.OpGt), "EMBER_OP_GE": int(tensor.OpGe),
		"EMBER_R_SUM": int(tensor.ReduceSum), "EMBER_R_MAX": int(tensor.ReduceMax), "EMBER_R_MIN": int(tensor.ReduceMin),
		"EMBER_R_ARGMAX": int(tensor.ReduceArgmax), "EMBER_R_ARGMIN": int(tensor.ReduceArgmin), "EMBER_R_MEAN": int(tensor.ReduceMean),
	}
	if len(want) != int(tensor.NumUnaryOps)+int(tensor.NumBinaryOps)+int(tensor.NumReduceOps) {
		t.Fatalf("the table lists %d codes; tensor has %d unary, %d binary and %d reduce ops: update it", len(want), tensor.NumUnaryOps, tensor.NumBinaryOps, tensor.NumReduceOps)
	}
	// The dense kernels instantiate one body per code: all of them.
	for _, l := range []struct {
		macro string
		n     int
	}{{"EMBER_UNARY_OPS", int(tensor.NumUnaryOps)}, {"EMBER_BINARY_OPS", int(tensor.NumBinaryOps)}} {
		m := regexp.MustCompile(`#define ` + l.macro + `\(X\)[ \\\n]*([^\n]*)\n`).FindStringSubmatch(src)
		if m == nil {
			t.Errorf("the kernels do not #define %s", l.macro)
			continue
		}
		for k := range l.n {
			if !strings.Contains(m[1]+" ", "X("+strconv.Itoa(k)+") ") {
				t.Errorf("%s does not list code %d: %q", l.macro, k, m[1])
			}
		}
	}
	for name, v := range want {
		got, ok := defs[name]
		if !ok {
			t.Errorf("the kernels do not #define %s", name)
		} else if got != v {
			t.Errorf("%s is %d in the kernels, %d in package tensor", name, got, v)
		}
	}
}

// TestRecordedElementwise runs the strided core and Reduce through the
// recording backend: every path (dense, vectorisable, scalar, strided,
// rows by warp and by block, columns) against the kernels' signatures.
func TestRecordedElementwise(t *testing.T) {
	b, rec := newRecordingBackend(t)
	f := func(n int) tensor.Buffer {
		buf, err := b.Alloc(n, tensor.Float32)
		if err != nil {
			t.Fatal(err)
		}
		return buf
	}
	dense := func(n int) tensor.View { return tensor.Dense(f(n), []int{n}) }
	for op := range tensor.NumUnaryOps {
		b.Unary(op, f(1000), dense(1000), []int{1000}, 0.5, 1)
		b.UnaryBackward(op, f(33), f(33), f(33), 33, 0.5, 1, op%2 == 0)
	}
	b.Unary(tensor.OpExp, f(35), tensor.View{Buf: f(35), Strides: []int{1, 5}}, []int{5, 7}, 0, 0)
	for op := range tensor.NumBinaryOps {
		b.Binary(op, f(1025), dense(1025), dense(1025), []int{1025})
	}
	b.Binary(tensor.OpAdd, f(231), tensor.Dense(f(231), []int{7, 33}), tensor.View{Buf: f(1), Strides: []int{0, 0}}, []int{7, 33})
	b.Binary(tensor.OpMul, f(60), tensor.View{Buf: f(15), Strides: []int{5, 0, 1}}, tensor.View{Buf: f(4), Strides: []int{0, 1, 0}}, []int{3, 4, 5})
	b.Where(f(60), tensor.View{Buf: f(4), Strides: []int{0, 1, 0}}, tensor.View{Buf: f(15), Strides: []int{5, 0, 1}}, tensor.View{Buf: f(1), Strides: []int{0, 0, 0}}, []int{3, 4, 5})
	b.CopyView(tensor.View{Buf: f(80), Strides: []int{20, 1}}, tensor.View{Buf: f(35), Strides: []int{1, 5}}, []int{4, 7}, true)
	b.CopyView(tensor.View{Buf: f(80), Strides: []int{20, 1}}, tensor.View{Buf: f(28), Strides: []int{7, 1}}, []int{4, 7}, false)
	i32 := func(n int) tensor.Buffer {
		buf, err := b.Alloc(n, tensor.Int32)
		if err != nil {
			t.Fatal(err)
		}
		return buf
	}
	for op := range tensor.NumReduceOps {
		dst := f
		if op == tensor.ReduceArgmax || op == tensor.ReduceArgmin {
			dst = i32
		}
		b.Reduce(op, dst(3), f(3*7), 3, 7, 1, false)
		b.Reduce(op, dst(2), f(2*4099), 2, 4099, 1, false)
		b.Reduce(op, dst(35), f(5*33*7), 5, 33, 7, false)
		b.Reduce(op, dst(2*4096), f(2*3*4096), 2, 3, 4096, false)
		b.Reduce(op, dst(3), f(3*40000), 3, 40000, 1, false)
		b.Reduce(op, dst(6), f(2*5000*3), 2, 5000, 3, false)
	}
	b.Reduce(tensor.ReduceSum, f(12), f(0), 4, 0, 3, false)
	b.Reduce(tensor.ReduceSum, f(12), f(4*5*3), 4, 5, 3, true)
	for _, k := range []string{"ember_unary_dense", "ember_unary_strided", "ember_unary_backward", "ember_binary_dense", "ember_binary_strided",
		"ember_where_strided", "ember_copy_view", "ember_reduce_rows_warp", "ember_reduce_rows_block", "ember_reduce_cols", "ember_reduce_cols32",
		"ember_reduce_rows_part", "ember_reduce_rows_join", "ember_reduce_cols_part", "ember_reduce_cols_join"} {
		if rec.launches[k] == 0 {
			t.Errorf("%s was not launched", k)
		}
	}
}

// TestBinaryChannel checks which merged binary operands take the
// per-channel kernel: a dense operand with one value per channel (either
// side, the channel anywhere), and nothing else; then launches it on the
// recorder, with and without the vector path, as Binary and as the
// broadcast CopyView of a sum's gradient.
func TestBinaryChannel(t *testing.T) {
	for _, c := range []struct {
		name    string
		shape   []int
		x, y    []int
		want    channelOperands
		channel bool
	}{
		{"bias over NCHW", []int{512, 64, 28, 28}, []int{50176, 784, 28, 1}, []int{0, 1, 0, 0}, channelOperands{c: 64, inner: 784, chIsY: true}, true},
		{"bias before", []int{8, 3, 5}, []int{0, 1, 0}, []int{15, 5, 1}, channelOperands{c: 3, inner: 5}, true},
		{"[N, C] + [C]", []int{9, 7}, []int{7, 1}, []int{0, 1}, channelOperands{c: 7, inner: 1, chIsY: true}, true},
		{"[C, inner] + [C, 1]", []int{7, 9}, []int{9, 1}, []int{1, 0}, channelOperands{c: 7, inner: 9, chIsY: true}, true},
		{"both broadcast", []int{3, 4, 5}, []int{5, 0, 1}, []int{0, 1, 0}, channelOperands{}, false},
		{"a channel of stride 2", []int{8, 3, 5}, []int{15, 5, 1}, []int{0, 2, 0}, channelOperands{}, false},
		{"[C, W] channel block", []int{4, 3, 5}, []int{15, 5, 1}, []int{0, 5, 1}, channelOperands{c: 15, inner: 1, chIsY: true}, true},
		{"a transposed [W, C] operand", []int{4, 3, 5}, []int{15, 5, 1}, []int{0, 1, 3}, channelOperands{}, false},
		{"transposed dense operand", []int{4, 3, 5}, []int{1, 20, 4}, []int{0, 1, 0}, channelOperands{}, false},
		{"too many elements", []int{1 << 16, 1 << 15}, []int{1 << 15, 1}, []int{1, 0}, channelOperands{}, false},
	} {
		o := strided("binary", c.shape, tensorStrides(c.shape), c.x, c.y)
		got, ok := o.channel()
		if ok != c.channel || (ok && got != c.want) {
			t.Errorf("%s: channel() = %+v, %v; want %+v, %v", c.name, got, ok, c.want, c.channel)
		}
	}
	b, rec := newRecordingBackend(t)
	f := func(n int) tensor.Buffer {
		buf, err := b.Alloc(n, tensor.Float32)
		if err != nil {
			t.Fatal(err)
		}
		return buf
	}
	shape := []int{4, 6, 2, 4}
	b.Binary(tensor.OpAdd, f(192), tensor.Dense(f(192), shape), tensor.View{Buf: f(6), Strides: []int{0, 1, 0, 0}}, shape)
	b.Binary(tensor.OpSub, f(45), tensor.View{Buf: f(5), Strides: []int{0, 1}}, tensor.Dense(f(45), []int{9, 5}), []int{9, 5})
	if rec.launches["ember_binary_channel"] != 2 {
		t.Errorf("%d launches of ember_binary_channel, want 2", rec.launches["ember_binary_channel"])
	}
	for _, acc := range []bool{false, true} {
		b.CopyView(tensor.Dense(f(192), shape), tensor.View{Buf: f(6), Strides: []int{0, 1, 0, 0}}, shape, acc)
		b.CopyView(tensor.Dense(f(45), []int{9, 5}), tensor.View{Buf: f(5), Strides: []int{0, 1}}, []int{9, 5}, acc)
	}
	if rec.launches["ember_copy_channel"] != 4 {
		t.Errorf("%d launches of ember_copy_channel, want 4", rec.launches["ember_copy_channel"])
	}
}
