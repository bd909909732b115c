package tensor

import (
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
)

// Tensor is an n-dimensional array on a Backend, with shape and strides, that
// can record the operations producing it so that Backward can compute
// gradients. Tensors created by operations belong to the Scope of their
// inputs and are freed when that scope is released; see Scope.
type Tensor struct {
	st      *storage
	off     int // element offset of this view into st.buf
	shape   []int
	strides []int
	scope   *Scope

	requiresGrad bool
	grad         *Tensor
	gradCleared  bool // ClearGrad's: grad counts as zero until Backward writes it
	gradWhole    bool // GradWrittenWhole's
	gradFresh    bool // GradWrittenAfresh's
	node         *node
	consumed     bool          // computed, and its node was used up by a Backward
	gradHook     func(*Tensor) // SetGradReadyHook's: called when Backward's gradient is complete
	isOne        bool          // the seed gradient of Backward: all ones
}

// storage is the memory shared by a tensor and its views.
type storage struct {
	b     Backend
	buf   Buffer
	h     *liveness
	moved int // elements Pack has moved out to another storage
	// onesPending marks Backward's seed before its memory is filled with
	// ones: the first read through buffer (of it or a view) fills it.
	onesPending bool
	// cl, when set, says that buf holds a float32 tensor as bfloat16
	// channels-last (channels_last.go); plain reads convert it first.
	cl *channelsLastForm

	// What Backward needs to give the memory back early
	// (Scope.SetReleaseInBackward, release.go): the scope that frees it
	// (nil: long-lived), how many Tensor values were made over it (the
	// tensor, its views, Detach), and whether Retain asked to keep it.
	owner *Scope
	refs  int
	kept  bool
	// byBackward records that Backward gave it back, for the error of a
	// later read.
	byBackward bool
	// readers counts the recorded backward functions that may read this
	// memory (an input's or the output's of their operation; release.go's
	// readsNot takes back those that do not), and internal the views over
	// it that an operation made for its own use and handed to no caller:
	// ReleaseInput frees the memory during the forward pass when both
	// allow.
	// (Atomic: a long-lived parameter's storage is counted by every step
	// that reads it, from whichever goroutine runs the step.)
	readers  atomic.Int32
	internal atomic.Int32
}

// liveness is kept apart from storage so that a cleanup attached to the
// storage can see whether it was released without keeping it reachable.
type liveness struct{ released atomic.Bool }

var leaked atomic.Int64

// Leaks reports how many tensor storages were collected by Go's garbage
// collector without having been released (explicitly or by their Scope).
// Device memory must not wait for the GC: a training loop that releases its
// step scope keeps this at zero.
func Leaks() int64 { return leaked.Load() }

func newStorage(b Backend, n int, dt DType, s *Scope) *storage {
	buf, err := b.Alloc(n, dt)
	if err != nil {
		panic(&Error{Op: "alloc", Err: err})
	}
	st := &storage{b: b, buf: buf, h: &liveness{}, owner: s}
	if s != nil {
		s.own(st)
	} else {
		h := st.h
		runtime.AddCleanup(st, func(buf Buffer) {
			if h.released.CompareAndSwap(false, true) {
				leaked.Add(1)
				b.Free(buf)
			}
		}, buf)
	}
	return st
}

func (st *storage) release() {
	if st.h.released.CompareAndSwap(false, true) {
		st.b.Free(st.buf)
	}
}

// Error is a failure of a device operation (out of memory, a driver error).
// Operations panic with *Error; Guard recovers it into a returned error.
type Error struct {
	Op  string
	Err error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Guard runs f and returns the device error f panicked with, if any. Other
// panics (programming errors such as shape mismatches) pass through.
func Guard(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			if e, ok := r.(*Error); ok {
				err = e
				return
			}
			panic(r)
		}
	}()
	f()
	return nil
}

func contiguousStrides(shape []int) []int {
	strides := make([]int, len(shape))
	s := 1
	for i := len(shape) - 1; i >= 0; i-- {
		strides[i] = s
		s *= shape[i]
	}
	return strides
}

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		if d < 0 {
			panic(fmt.Sprintf("tensor: negative dimension in shape %v", shape))
		}
		n *= d
	}
	return n
}

func newTensor(b Backend, dt DType, s *Scope, shape ...int) *Tensor {
	shape = append([]int(nil), shape...)
	st := newStorage(b, numel(shape), dt, s)
	st.refs = 1
	return &Tensor{
		st:      st,
		shape:   shape,
		strides: contiguousStrides(shape),
		scope:   s,
	}
}

// Empty returns an uninitialised float32 tensor on b. s may be nil for a
// tensor that outlives any step (parameters); release it with Release.
func Empty(b Backend, s *Scope, shape ...int) *Tensor {
	return newTensor(b, Float32, s, shape...)
}

// Zeros returns a float32 tensor of zeros on b.
func Zeros(b Backend, s *Scope, shape ...int) *Tensor {
	t := newTensor(b, Float32, s, shape...)
	b.Fill(t.buffer(), 0)
	return t
}

// Full returns a float32 tensor filled with v.
func Full(b Backend, s *Scope, v float32, shape ...int) *Tensor {
	t := newTensor(b, Float32, s, shape...)
	b.Fill(t.buffer(), v)
	return t
}

// FromFloat32 copies data into a new float32 tensor of the given shape.
func FromFloat32(b Backend, s *Scope, data []float32, shape ...int) *Tensor {
	checkLen(len(data), shape)
	t := newTensor(b, Float32, s, shape...)
	b.Upload(t.buffer(), data)
	return t
}

// FromInt32 copies data into a new int32 tensor (labels, indices).
func FromInt32(b Backend, s *Scope, data []int32, shape ...int) *Tensor {
	checkLen(len(data), shape)
	t := newTensor(b, Int32, s, shape...)
	b.Upload(t.buffer(), data)
	return t
}

// FromUint8 copies data into a new uint8 tensor (raw images).
func FromUint8(b Backend, s *Scope, data []uint8, shape ...int) *Tensor {
	checkLen(len(data), shape)
	t := newTensor(b, Uint8, s, shape...)
	b.Upload(t.buffer(), data)
	return t
}

// EmptyOf returns an uninitialised tensor of any element type.
func EmptyOf(b Backend, s *Scope, dt DType, shape ...int) *Tensor {
	return newTensor(b, dt, s, shape...)
}

func checkLen(n int, shape []int) {
	if n != numel(shape) {
		panic(fmt.Sprintf("tensor: %d values for shape %v (%d elements)", n, shape, numel(shape)))
	}
}

// Shape returns a copy of the dimensions.
func (t *Tensor) Shape() []int { return append([]int(nil), t.shape...) }

// Strides returns a copy of the strides, in elements.
func (t *Tensor) Strides() []int { return append([]int(nil), t.strides...) }

// Dim returns dimension i; negative i counts from the end.
func (t *Tensor) Dim(i int) int {
	if i < 0 {
		i += len(t.shape)
	}
	return t.shape[i]
}

// Len is the number of elements.
func (t *Tensor) Len() int { return numel(t.shape) }

// DType is the element type.
func (t *Tensor) DType() DType {
	if t.st.cl != nil {
		return Float32
	}
	return t.st.buf.DType
}

// Backend is the device the tensor lives on.
func (t *Tensor) Backend() Backend { return t.st.b }

// Scope is the scope that frees this tensor, nil for a long-lived tensor.
func (t *Tensor) Scope() *Scope { return t.scope }

// IsContiguous reports whether the elements are dense in row-major order.
func (t *Tensor) IsContiguous() bool {
	s := 1
	for i := len(t.shape) - 1; i >= 0; i-- {
		if t.shape[i] != 1 && t.strides[i] != s {
			return false
		}
		s *= t.shape[i]
	}
	return true
}

// Buffer exposes the tensor's memory to a Backend: the window of a
// contiguous tensor. It panics for a strided view (call Contiguous first)
// or a released tensor.
func (t *Tensor) Buffer() Buffer { return t.buffer() }

func (t *Tensor) buffer() Buffer {
	t.mustBeLive()
	if !t.IsContiguous() {
		panic("tensor: operation needs a contiguous tensor; call Contiguous")
	}
	t.fillPendingOnes()
	return t.st.buf.Slice(t.off, t.Len())
}

// mustBeLive panics when t's memory has been freed, saying by whom when
// it was Backward.
func (t *Tensor) mustBeLive() {
	if !t.st.h.released.Load() {
		return
	}
	if t.st.byBackward {
		panic("tensor: use of a tensor whose memory was given back early, by Backward or ReleaseInput (its scope releases in backward, Scope.SetReleaseInBackward): call Retain on it first to read it later")
	}
	panic("tensor: use of a released tensor")
}

// fillPendingOnes readies t's memory for a plain read: it fills
// Backward's seed on its first read, and turns memory held channels-last
// into plain float32.
func (t *Tensor) fillPendingOnes() {
	t.st.materialize()
	if t.st.onesPending {
		t.st.onesPending = false
		t.st.b.Fill(t.st.buf, 1)
	}
}

// Released reports whether the tensor's memory has been freed.
func (t *Tensor) Released() bool { return t.st.h.released.Load() }

// Release frees the tensor's memory now (and that of every view sharing it).
func (t *Tensor) Release() { t.st.release() }

// Float32s copies the tensor to a new host slice (row-major); a bfloat16
// tensor (contiguous) is widened to float32 on the host.
func (t *Tensor) Float32s() []float32 {
	if t.DType() == BFloat16 {
		out := make([]float32, t.Len())
		for i, h := range t.BFloat16s() {
			out[i] = BFloat16Float32(h)
		}
		return out
	}
	c := t.Contiguous()
	out := make([]float32, c.Len())
	c.st.b.Download(out, c.buffer())
	if c != t && c.scope == nil {
		c.Release()
	}
	return out
}

// Int32s copies an int32 tensor to a new host slice.
func (t *Tensor) Int32s() []int32 {
	out := make([]int32, t.Len())
	t.st.b.Download(out, t.buffer())
	return out
}

// Uint8s copies a uint8 tensor to a new host slice.
func (t *Tensor) Uint8s() []uint8 {
	out := make([]uint8, t.Len())
	t.st.b.Download(out, t.buffer())
	return out
}

// Item returns the single value of a one-element float32 tensor.
func (t *Tensor) Item() float32 {
	if t.Len() != 1 {
		panic(fmt.Sprintf("tensor: Item of a tensor of shape %v", t.shape))
	}
	return t.Float32s()[0]
}

// CopyFrom overwrites a contiguous float32 tensor with host data.
func (t *Tensor) CopyFrom(data []float32) {
	checkLen(len(data), t.shape)
	t.st.b.Upload(t.buffer(), data)
}

// CopyTensor overwrites dst with the values of src (same shape); both on the
// same backend. Between float32 and bfloat16 it converts as Cast does (as
// torch's copy_ does), on a backend with low-precision support; a data set
// kept in bfloat16 fills a float32 batch this way without a temporary.
func CopyTensor(dst, src *Tensor) {
	mustSameShape("CopyTensor", dst, src)
	sameBackend(dst, src)
	from, to := src.DType(), dst.DType()
	if from == to {
		dst.st.b.Copy(dst.buffer(), src.Contiguous().buffer())
		return
	}
	lb, ok := dst.st.b.(LowPrecisionBackend)
	switch {
	case !(from == Float32 && to == BFloat16) && !(from == BFloat16 && to == Float32):
		panic(fmt.Sprintf("tensor: CopyTensor of %v into %v: only float32 and bfloat16 convert", from, to))
	case !ok:
		panic(fmt.Sprintf("tensor: CopyTensor of %v into %v: backend %s has no low-precision support", from, to, dst.st.b.Name()))
	case !src.IsContiguous() && from != Float32:
		panic("tensor: CopyTensor from a strided bfloat16 view; copy from a contiguous tensor")
	}
	lb.Cast(dst.buffer(), src.Contiguous().buffer())
}

func (t *Tensor) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Tensor(%s %v on %s", t.DType(), t.shape, t.st.b.Name())
	if t.requiresGrad {
		b.WriteString(", requires grad")
	}
	b.WriteString(")")
	return b.String()
}

func mustSameShape(op string, a, b *Tensor) {
	if !sameShape(a.shape, b.shape) {
		panic(fmt.Sprintf("tensor: %s: shapes %v and %v differ", op, a.shape, b.shape))
	}
}

func sameShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func sameBackend(ts ...*Tensor) {
	for _, t := range ts[1:] {
		if t.st.b != ts[0].st.b {
			panic(fmt.Sprintf("tensor: operands on different devices (%s and %s)", ts[0].st.b.Name(), t.st.b.Name()))
		}
	}
}
