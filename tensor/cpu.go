package tensor

import (
	"fmt"
	"math"
	"runtime"
	"sync"

	"github.com/ember-ml/ember/tensor/internal/sgemm"
)

// CPU is the host backend: plain Go loops, with GEMM (and so convolution and
// linear layers) done by the blocked AVX2/FMA SGEMM of tensor/internal/sgemm
// across all cores (not gonum's, which is far slower on LeNet's shapes:
// docs/performance.md). It is always available and is the reference the
// CUDA backend is tested against.
var CPU Backend = &cpuBackend{}

// The CPU backend has every optional interface (cpu*.go).
var (
	_ CompleteBackend         = (*cpuBackend)(nil)
	_ LowPrecisionConvBackend = (*cpuBackend)(nil)
)

type cpuBackend struct{}

// cpuMem is host memory of one of the element types (h: bfloat16 bit
// patterns).
type cpuMem struct {
	f []float32
	i []int32
	u []uint8
	h []uint16
}

func (m *cpuMem) Bytes() int { return 4*len(m.f) + 4*len(m.i) + len(m.u) + 2*len(m.h) }

func (*cpuBackend) Name() string { return "cpu" }

func (*cpuBackend) Alloc(n int, dt DType) (Buffer, error) {
	m := &cpuMem{}
	switch dt {
	case Float32:
		m.f = make([]float32, n)
	case Int32:
		m.i = make([]int32, n)
	case Uint8:
		m.u = make([]uint8, n)
	case BFloat16:
		m.h = make([]uint16, n)
	default:
		return Buffer{}, fmt.Errorf("tensor: cpu: unknown dtype %v", dt)
	}
	return Buffer{Mem: m, Len: n, DType: dt}, nil
}

func (*cpuBackend) Free(Buffer) {} // Go's collector owns host memory.

func f32(b Buffer) []float32 {
	if b.DType != Float32 {
		panic(fmt.Sprintf("tensor: cpu: want a float32 buffer, have %v", b.DType))
	}
	return b.Mem.(*cpuMem).f[b.Off : b.Off+b.Len]
}

func i32(b Buffer) []int32 {
	if b.DType != Int32 {
		panic(fmt.Sprintf("tensor: cpu: want an int32 buffer, have %v", b.DType))
	}
	return b.Mem.(*cpuMem).i[b.Off : b.Off+b.Len]
}

func u8(b Buffer) []uint8 {
	if b.DType != Uint8 {
		panic(fmt.Sprintf("tensor: cpu: want a uint8 buffer, have %v", b.DType))
	}
	return b.Mem.(*cpuMem).u[b.Off : b.Off+b.Len]
}

func bf16(b Buffer) []uint16 {
	if b.DType != BFloat16 {
		panic(fmt.Sprintf("tensor: cpu: want a bfloat16 buffer, have %v", b.DType))
	}
	return b.Mem.(*cpuMem).h[b.Off : b.Off+b.Len]
}

func (*cpuBackend) Upload(dst Buffer, src any) {
	switch s := src.(type) {
	case []float32:
		copyExact(f32(dst), s)
	case []int32:
		copyExact(i32(dst), s)
	case []uint8:
		copyExact(u8(dst), s)
	case []uint16:
		copyExact(bf16(dst), s)
	default:
		panic(fmt.Sprintf("tensor: cpu: cannot upload %T", src))
	}
}

func (*cpuBackend) Download(dst any, src Buffer) {
	switch d := dst.(type) {
	case []float32:
		copyExact(d, f32(src))
	case []int32:
		copyExact(d, i32(src))
	case []uint8:
		copyExact(d, u8(src))
	case []uint16:
		copyExact(d, bf16(src))
	default:
		panic(fmt.Sprintf("tensor: cpu: cannot download into %T", dst))
	}
}

func copyExact[T any](dst, src []T) {
	if len(dst) != len(src) {
		panic(fmt.Sprintf("tensor: copy of %d elements into %d", len(src), len(dst)))
	}
	copy(dst, src)
}

func (*cpuBackend) Synchronize() error { return nil }

func (*cpuBackend) Fill(dst Buffer, v float32) {
	if dst.DType == Int32 {
		d := i32(dst)
		for i := range d {
			d[i] = int32(v)
		}
		return
	}
	d := f32(dst)
	for i := range d {
		d[i] = v
	}
}

func (*cpuBackend) Copy(dst, src Buffer) {
	switch dst.DType {
	case Float32:
		copyExact(f32(dst), f32(src))
	case Int32:
		copyExact(i32(dst), i32(src))
	case BFloat16:
		copyExact(bf16(dst), bf16(src))
	default:
		copyExact(u8(dst), u8(src))
	}
}

func (*cpuBackend) CopyStrided(dst, src Buffer, shape, strides []int) {
	d := f32(dst)
	s := src.Mem.(*cpuMem).f
	idx := make([]int, len(shape))
	for i := range d {
		off := src.Off
		for k := range shape {
			off += idx[k] * strides[k]
		}
		d[i] = s[off]
		for k := len(shape) - 1; k >= 0; k-- {
			idx[k]++
			if idx[k] < shape[k] {
				break
			}
			idx[k] = 0
		}
	}
}

func (*cpuBackend) Add(dst, a, b Buffer) {
	d, x, y := f32(dst), f32(a), f32(b)
	for i := range d {
		d[i] = x[i] + y[i]
	}
}

func (*cpuBackend) Mul(dst, a, b Buffer) {
	d, x, y := f32(dst), f32(a), f32(b)
	for i := range d {
		d[i] = x[i] * y[i]
	}
}

func (*cpuBackend) Axpy(dst Buffer, alpha float32, x Buffer) {
	d, s := f32(dst), f32(x)
	for i := range d {
		d[i] += alpha * s[i]
	}
}

func (*cpuBackend) ScaleBy(dst, x, s Buffer, accumulate bool) {
	d, v, k := f32(dst), f32(x), f32(s)[0]
	for i := range d {
		if accumulate {
			d[i] += v[i] * k
		} else {
			d[i] = v[i] * k
		}
	}
}

func (*cpuBackend) Sum(dst, x Buffer) {
	var s float64
	for _, v := range f32(x) {
		s += float64(v)
	}
	f32(dst)[0] = float32(s)
}

func (*cpuBackend) Broadcast(dst, s Buffer, accumulate bool) {
	d, v := f32(dst), f32(s)[0]
	for i := range d {
		if accumulate {
			d[i] += v
		} else {
			d[i] = v
		}
	}
}

func (*cpuBackend) ReLU(y, x Buffer) {
	d, s := f32(y), f32(x)
	for i, v := range s {
		d[i] = max(v, 0)
	}
}

func (*cpuBackend) ReLUBackward(dx, dy, y Buffer, accumulate bool) {
	d, g, out := f32(dx), f32(dy), f32(y)
	for i := range d {
		v := g[i]
		if out[i] <= 0 {
			v = 0
		}
		if accumulate {
			d[i] += v
		} else {
			d[i] = v
		}
	}
}

func (c *cpuBackend) MatMul(cb, ab, bb Buffer, m, n, k int, transA, transB bool, alpha, beta float32) {
	lda, ldb := k, n
	if transA {
		lda = m
	}
	if transB {
		ldb = k
	}
	out := f32(cb)
	if k == 0 { // c = beta*c, where beta 0 ignores what c held (NaN too)
		for i := range out {
			if beta == 0 {
				out[i] = 0
			} else {
				out[i] *= beta
			}
		}
		return
	}
	sgemm.Sgemm(transA, transB, m, n, k, alpha, f32(ab), lda, f32(bb), ldb, beta, out, n)
}

func (*cpuBackend) AddBias(y, bias Buffer, outer, channels, inner int) {
	d, b := f32(y), f32(bias)
	for o := 0; o < outer; o++ {
		for c := 0; c < channels; c++ {
			row := d[(o*channels+c)*inner : (o*channels+c+1)*inner]
			for i := range row {
				row[i] += b[c]
			}
		}
	}
}

func (*cpuBackend) BiasGrad(db, dy Buffer, outer, channels, inner int, accumulate bool) {
	d, g := f32(db), f32(dy)
	for c := 0; c < channels; c++ {
		var s float64
		for o := 0; o < outer; o++ {
			for _, v := range g[(o*channels+c)*inner : (o*channels+c+1)*inner] {
				s += float64(v)
			}
		}
		if accumulate {
			d[c] += float32(s)
		} else {
			d[c] = float32(s)
		}
	}
}

func (*cpuBackend) MaxPool2d(y, argmax, x Buffer, g PoolGeom) {
	out, idx, in := f32(y), i32(argmax), f32(x)
	oh, ow := g.OutH(), g.OutW()
	parallelFor(g.N*g.C, func(lo, hi int) {
		for p := lo; p < hi; p++ {
			plane := in[p*g.H*g.W : (p+1)*g.H*g.W]
			if g.KH == 2 && g.KW == 2 && g.StrideH == 2 && g.StrideW == 2 && g.PadH == 0 && g.PadW == 0 && !g.CeilMode {
				maxPool2x2(out[p*oh*ow:(p+1)*oh*ow], idx[p*oh*ow:(p+1)*oh*ow], plane, g.W, oh, ow)
				continue
			}
			for i := 0; i < oh; i++ {
				for j := 0; j < ow; j++ {
					best, at := float32(math.Inf(-1)), -1
					// Padding and the part of a ceil-mode window past the
					// edge are -inf: skipped, they never win.
					for r := 0; r < g.KH; r++ {
						h := i*g.StrideH - g.PadH + r
						if h < 0 || h >= g.H {
							continue
						}
						for s := 0; s < g.KW; s++ {
							w := j*g.StrideW - g.PadW + s
							if w < 0 || w >= g.W {
								continue
							}
							// A NaN wins, as in PyTorch, so that it propagates.
							if v := plane[h*g.W+w]; at < 0 || v > best || v != v {
								best, at = v, h*g.W+w
							}
						}
					}
					o := p*oh*ow + i*ow + j
					out[o], idx[o] = best, int32(at)
				}
			}
		}
	})
}

// maxPool2x2 is MaxPool2d's common case (2×2 windows, stride 2) for one
// plane, with the same tie and NaN rules as the general loop.
func maxPool2x2(out []float32, idx []int32, plane []float32, w, oh, ow int) {
	for i := 0; i < oh; i++ {
		r0, r1 := plane[2*i*w:], plane[(2*i+1)*w:]
		o, x := out[i*ow:(i+1)*ow], idx[i*ow:(i+1)*ow]
		for j := range o {
			best, at := r0[2*j], 2*i*w+2*j
			if v := r0[2*j+1]; v > best || v != v {
				best, at = v, 2*i*w+2*j+1
			}
			if v := r1[2*j]; v > best || v != v {
				best, at = v, (2*i+1)*w+2*j
			}
			if v := r1[2*j+1]; v > best || v != v {
				best, at = v, (2*i+1)*w+2*j+1
			}
			o[j], x[j] = best, int32(at)
		}
	}
}

func (*cpuBackend) MaxPool2dBackward(dx, dy, argmax Buffer, g PoolGeom, accumulate bool) {
	d, grad, idx := f32(dx), f32(dy), i32(argmax)
	if !accumulate {
		clear(d)
	}
	plane, outPlane := g.H*g.W, g.OutH()*g.OutW()
	for p := 0; p < g.N*g.C; p++ {
		for o := 0; o < outPlane; o++ {
			d[p*plane+int(idx[p*outPlane+o])] += grad[p*outPlane+o]
		}
	}
}

func (*cpuBackend) CrossEntropy(loss, dlogits, logits, labels Buffer, n, classes int) {
	z, lab := f32(logits), i32(labels)
	var dz []float32
	if !dlogits.Empty() {
		dz = f32(dlogits)
	}
	var total float64
	for r := 0; r < n; r++ {
		row := z[r*classes : (r+1)*classes]
		y := int(lab[r])
		if y < 0 || y >= classes {
			panic(fmt.Sprintf("tensor: CrossEntropy: label %d of row %d outside [0,%d)", y, r, classes))
		}
		m := row[0]
		for _, v := range row {
			m = max(m, v)
		}
		var se float64
		for _, v := range row {
			se += math.Exp(float64(v - m))
		}
		lse := float64(m) + math.Log(se)
		total += lse - float64(row[y])
		if dz != nil {
			for c, v := range row {
				p := math.Exp(float64(v)-lse) / float64(n)
				if c == y {
					p -= 1 / float64(n)
				}
				dz[r*classes+c] = float32(p)
			}
		}
	}
	f32(loss)[0] = float32(total / float64(n))
}

func (*cpuBackend) Argmax(dst, x Buffer, rows, cols int) {
	d, z := i32(dst), f32(x)
	for r := 0; r < rows; r++ {
		best := 0
		for c := 1; c < cols; c++ {
			if z[r*cols+c] > z[r*cols+best] {
				best = c
			}
		}
		d[r] = int32(best)
	}
}

func (*cpuBackend) SGD(pb, gb, vb Buffer, h SGDStep) {
	p, g := f32(pb), f32(gb)
	var v []float32
	if h.Momentum != 0 {
		v = f32(vb)
	}
	for i := range p {
		d := g[i]
		if h.WeightDecay != 0 {
			d += h.WeightDecay * p[i]
		}
		if h.Momentum != 0 {
			if h.FirstStep {
				v[i] = d
			} else {
				v[i] = h.Momentum*v[i] + (1-h.Dampening)*d
			}
			if h.Nesterov {
				d += h.Momentum * v[i]
			} else {
				d = v[i]
			}
		}
		p[i] -= h.LR * d
		if h.ZeroGrad {
			g[i] = 0
		}
	}
}

func (*cpuBackend) GatherNormalize(dst, src, idx Buffer, rowLen int, scale, shift float32) {
	d, s, ix := f32(dst), u8(src), i32(idx)
	for i, r := range ix {
		row := s[int(r)*rowLen : (int(r)+1)*rowLen]
		out := d[i*rowLen : (i+1)*rowLen]
		for j, v := range row {
			out[j] = float32(v)*scale + shift
		}
	}
}

// parallelFor splits [0,n) over the available cores.
func parallelFor(n int, body func(lo, hi int)) {
	workers := min(runtime.GOMAXPROCS(0), n)
	if workers <= 1 || n < 8 {
		body(0, n)
		return
	}
	var wg sync.WaitGroup
	chunk := (n + workers - 1) / workers
	for lo := 0; lo < n; lo += chunk {
		wg.Add(1)
		go func(lo, hi int) {
			defer wg.Done()
			body(lo, hi)
		}(lo, min(lo+chunk, n))
	}
	wg.Wait()
}
