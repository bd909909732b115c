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

// ArithmeticBackend is implemented by backends with kernels for dense
// float32 buffers that skip the strided machinery of the core: the
// arithmetic of gradient accumulation and of LeNet's layers. Without it
// (Complete) each is one or two core operations: Binary, Unary, CopyView
// through a view that repeats a one-element buffer, UnaryBackward, Reduce.
type ArithmeticBackend interface {
	// Add sets dst = a + b elementwise (dst may alias a or b).
	Add(dst, a, b Buffer)
	// Mul sets dst = a * b elementwise (dst may alias a or b).
	Mul(dst, a, b Buffer)
	// Axpy sets dst += alpha * x.
	Axpy(dst Buffer, alpha float32, x Buffer)
	// ScaleBy sets dst = x * s[0] (+ dst if accumulate), s a 1-element
	// buffer that stays on the device (dst may alias x).
	ScaleBy(dst, x, s Buffer, accumulate bool)
	// Sum sets dst[0] = sum(x).
	Sum(dst, x Buffer)
	// Broadcast sets dst[i] = s[0] for every i (+ dst if accumulate).
	Broadcast(dst, s Buffer, accumulate bool)
	// ReLU sets y = max(x, 0).
	ReLU(y, x Buffer)
	// ReLUBackward sets dx = dy where y > 0, else 0.
	ReLUBackward(dx, dy, y Buffer, accumulate bool)
	// Argmax sets dst[r] (int32) to the column of the row maximum of x
	// [rows, cols] (the first of equal maxima).
	Argmax(dst, x Buffer, rows, cols int)
}
