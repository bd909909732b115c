package tensor

// The elementwise family of the Backend core: one strided kernel per
// operation class, selected by an op code, so that a new pointwise
// operation is a new code (and a line in each backend's switch), not a new
// Backend method.

// View is a strided window of a Buffer: element (i0, i1, ...) of a shape is
// at Buf.Off + Σ ik·Strides[k]. A stride of 0 repeats the element along
// that axis, which is how broadcasting reaches the backends. Strides are in
// elements and never negative.
type View struct {
	Buf     Buffer
	Strides []int
}

// Dense returns the view of a dense row-major buffer of the given shape.
func Dense(b Buffer, shape []int) View { return View{Buf: b, Strides: contiguousStrides(shape)} }

// UnaryOp selects the function of Backend.Unary. The parameters a and b of
// Unary are used by the operations whose comment names them.
type UnaryOp uint8

const (
	OpIdentity  UnaryOp = iota // x (a strided copy)
	OpNeg                      // -x
	OpAbs                      // |x|
	OpExp                      // e^x
	OpLog                      // ln x
	OpSqrt                     // √x
	OpRsqrt                    // 1/√x
	OpRecip                    // 1/x
	OpSquare                   // x²
	OpTanh                     // tanh x
	OpSigmoid                  // 1/(1+e^-x)
	OpReLU                     // max(x, 0); NaN stays NaN
	OpLeakyReLU                // x if x > 0 else a·x
	OpGELU                     // x·Φ(x), Φ the normal CDF (erf form)
	OpGELUTanh                 // the tanh approximation of GELU
	OpSiLU                     // x·sigmoid(x)
	OpClamp                    // min(max(x, a), b)
	OpPowScalar                // x^a
	OpAddScalar                // x + a
	OpMulScalar                // x · a
	OpAffine                   // x·a + b
	OpSin                      // sin x
	OpCos                      // cos x
	NumUnaryOps                // the number of unary codes
)

// BinaryOp selects the function of Backend.Binary.
type BinaryOp uint8

const (
	OpAdd        BinaryOp = iota // x + y
	OpSub                        // x - y
	OpMul                        // x · y
	OpDiv                        // x / y
	OpPow                        // x^y
	OpMaximum                    // max(x, y); NaN if either is NaN, as torch.maximum
	OpMinimum                    // min(x, y); NaN if either is NaN
	OpEq                         // 1 where x == y, else 0
	OpNe                         // 1 where x != y
	OpLt                         // 1 where x < y
	OpLe                         // 1 where x <= y
	OpGt                         // 1 where x > y
	OpGe                         // 1 where x >= y
	NumBinaryOps                 // the number of binary codes
)

// Elementwise is the pointwise part of the Backend core. dst is always dense
// (row-major, shape's element count) unless it is a View; the inputs are
// Views, so that transposed, sliced and broadcast operands need no copy.
type Elementwise interface {
	// Unary sets dst = f(x) for the function op (parameters a and b where
	// the op names them) over shape.
	Unary(op UnaryOp, dst Buffer, x View, shape []int, a, b float32)
	// UnaryBackward sets dx = dy · f'(x) (+ dx when accumulate) for dense
	// dx, dy and x of n elements, x the input of the forward Unary.
	UnaryBackward(op UnaryOp, dx, dy, x Buffer, n int, a, b float32, accumulate bool)
	// Binary sets dst = op(x, y) over shape (x and y broadcast through
	// zero strides).
	Binary(op BinaryOp, dst Buffer, x, y View, shape []int)
	// Where sets dst = x where cond != 0, else y (cond float32).
	Where(dst Buffer, cond, x, y View, shape []int)
	// CopyView copies src into the strided dst over shape (dst += src when
	// accumulate). dst's strides must not make two elements alias. It is
	// what concatenation, padding and the backward passes of slices use.
	CopyView(dst, src View, shape []int, accumulate bool)
}
