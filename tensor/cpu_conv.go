package tensor

import (
	"sync"

	"github.com/ember-ml/ember/tensor/internal/sgemm"
)

// Convolution on the CPU lowers to one GEMM over the whole batch (im2col):
// col holds, for every output pixel of every image, the C·R·S input values
// under the kernel, so that W [K, C·R·S] · col [C·R·S, N·P] gives the output
// for all images at once (P = OutH·OutW). One large GEMM keeps gonum's
// parallel SGEMM busy where per-image products would be too small.
//
// Dilation only moves where im2col reads. Groups need no other col: the
// rows of group gi's channels are one contiguous block of col, and its
// weights one contiguous block of w, so each group is one GEMM on those
// blocks (the CUDA backend does the same products).

var scratchPool sync.Pool // *[]float32, reused across steps

func getScratch(n int) *[]float32 {
	if p, ok := scratchPool.Get().(*[]float32); ok && cap(*p) >= n {
		*p = (*p)[:n]
		return p
	}
	s := make([]float32, n)
	return &s
}

func putScratch(p *[]float32) { scratchPool.Put(p) }

// im2col fills col [C·R·S, N·P] from x [N, C, H, W].
func im2col(col, x []float32, g ConvGeom) {
	oh, ow := g.OutH(), g.OutW()
	np := g.N * oh * ow
	dh, dw := g.Dilation()
	parallelFor(g.C*g.R*g.S, func(lo, hi int) {
		for row := lo; row < hi; row++ {
			c, r, s := row/(g.R*g.S), row/g.S%g.R, row%g.S
			dst := col[row*np : (row+1)*np]
			j0, j1 := validCols(g, s, ow)
			for n := 0; n < g.N; n++ {
				plane := x[(n*g.C+c)*g.H*g.W:]
				for i := 0; i < oh; i++ {
					h := i*g.StrideH + r*dh - g.PadH
					out := dst[(n*oh+i)*ow : (n*oh+i+1)*ow]
					if h < 0 || h >= g.H {
						clear(out)
						continue
					}
					clear(out[:j0])
					clear(out[j1:])
					row := plane[h*g.W:]
					if g.StrideW == 1 { // a contiguous run of the input row
						copy(out[j0:j1], row[j0+s*dw-g.PadW:])
						continue
					}
					for j := j0; j < j1; j++ {
						out[j] = row[j*g.StrideW+s*dw-g.PadW]
					}
				}
			}
		}
	})
}

// validCols is the range [j0, j1) of output columns whose input column
// j*StrideW + s*DilationW - PadW falls inside the image (the rest read
// padding).
func validCols(g ConvGeom, s, ow int) (j0, j1 int) {
	_, dw := g.Dilation()
	s *= dw
	// smallest j with j*StrideW >= PadW - s
	if d := g.PadW - s; d > 0 {
		j0 = (d + g.StrideW - 1) / g.StrideW
	}
	// largest j with j*StrideW + s - PadW <= W - 1, plus one
	j1 = (g.W-1-s+g.PadW)/g.StrideW + 1
	if g.W-1-s+g.PadW < 0 {
		j1 = 0
	}
	j0, j1 = min(j0, ow), min(j1, ow)
	return j0, max(j1, j0)
}

// col2im adds col [C·R·S, N·P] back into dx [N, C, H, W] (already zeroed).
func col2im(dx, col []float32, g ConvGeom) {
	oh, ow := g.OutH(), g.OutW()
	np := g.N * oh * ow
	dh, dw := g.Dilation()
	// Parallel over channels: rows of one channel only touch that channel.
	parallelFor(g.C, func(lo, hi int) {
		for c := lo; c < hi; c++ {
			for rs := 0; rs < g.R*g.S; rs++ {
				r, s := rs/g.S, rs%g.S
				src := col[(c*g.R*g.S+rs)*np:]
				j0, j1 := validCols(g, s, ow)
				for n := 0; n < g.N; n++ {
					plane := dx[(n*g.C+c)*g.H*g.W:]
					for i := 0; i < oh; i++ {
						h := i*g.StrideH + r*dh - g.PadH
						if h < 0 || h >= g.H {
							continue
						}
						in := src[(n*oh+i)*ow : (n*oh+i+1)*ow]
						row := plane[h*g.W:]
						for j := j0; j < j1; j++ {
							row[j*g.StrideW+s*dw-g.PadW] += in[j]
						}
					}
				}
			}
		}
	})
}

func (c *cpuBackend) Conv2d(y, x, w, bias Buffer, g ConvGeom) {
	p := g.OutH() * g.OutW()
	np, crs := g.N*p, g.C*g.R*g.S
	col := getScratch(crs * np)
	defer putScratch(col)
	im2col(*col, f32(x), g)
	yt := getScratch(g.K * np)
	defer putScratch(yt)
	groupGEMMs(g, np, func(kg, cg, wOff, colOff, yOff int) {
		sgemm.Sgemm(false, false, kg, np, cg, 1, f32(w)[wOff:], cg, (*col)[colOff:], np, 0, (*yt)[yOff:], np)
	})
	// [K, N, P] -> [N, K, P], adding the bias on the way.
	out := f32(y)
	var b []float32
	if !bias.Empty() {
		b = f32(bias)
	}
	for n := 0; n < g.N; n++ {
		for k := 0; k < g.K; k++ {
			src := (*yt)[k*np+n*p : k*np+(n+1)*p]
			dst := out[(n*g.K+k)*p : (n*g.K+k+1)*p]
			var bk float32
			if b != nil {
				bk = b[k]
			}
			for i, v := range src {
				v += bk
				if g.ReLU && !(v > 0) && v == v { // NaN stays NaN, as max(NaN, 0) does in PyTorch
					v = 0
				}
				dst[i] = v
			}
		}
	}
}

func (c *cpuBackend) Conv2dBackward(dx, dw, db, dy, x, w, y Buffer, g ConvGeom) {
	p := g.OutH() * g.OutW()
	np, crs := g.N*p, g.C*g.R*g.S
	grad := f32(dy)
	// dy [N, K, P] -> dyt [K, N, P]
	dyt := getScratch(g.K * np)
	defer putScratch(dyt)
	var out []float32
	if g.ReLU {
		out = f32(y)
	}
	for n := 0; n < g.N; n++ {
		for k := 0; k < g.K; k++ {
			dst, src := (*dyt)[k*np+n*p:k*np+(n+1)*p], grad[(n*g.K+k)*p:(n*g.K+k+1)*p]
			if out == nil {
				copy(dst, src)
				continue
			}
			mask := out[(n*g.K+k)*p : (n*g.K+k+1)*p]
			for i, v := range src {
				if mask[i] <= 0 {
					v = 0
				}
				dst[i] = v
			}
		}
	}
	if !db.Empty() {
		d := f32(db)
		for k := 0; k < g.K; k++ {
			var s float64
			for _, v := range (*dyt)[k*np : (k+1)*np] {
				s += float64(v)
			}
			d[k] += float32(s)
		}
	}
	if !dw.Empty() {
		col := getScratch(crs * np)
		im2col(*col, f32(x), g)
		groupGEMMs(g, np, func(kg, cg, wOff, colOff, yOff int) {
			sgemm.Sgemm(false, true, kg, cg, np, 1, (*dyt)[yOff:], np, (*col)[colOff:], np, 1, f32(dw)[wOff:], cg)
		})
		putScratch(col)
	}
	if !dx.Empty() {
		dcol := getScratch(crs * np)
		defer putScratch(dcol)
		groupGEMMs(g, np, func(kg, cg, wOff, colOff, yOff int) {
			sgemm.Sgemm(true, false, cg, np, kg, 1, f32(w)[wOff:], cg, (*dyt)[yOff:], np, 0, (*dcol)[colOff:], np)
		})
		d := f32(dx)
		clear(d)
		col2im(d, *dcol, g)
	}
}

// groupGEMMs calls gemm once per channel group with the group's sizes (kg
// output channels, cg = C/Groups·R·S rows of col) and the offsets of its
// blocks of w [K, cg], col [C·R·S, N·P] and yt [K, N·P].
func groupGEMMs(g ConvGeom, np int, gemm func(kg, cg, wOff, colOff, yOff int)) {
	groups := g.GroupCount()
	kg, cg := g.K/groups, g.C/groups*g.R*g.S
	for gi := 0; gi < groups; gi++ {
		gemm(kg, cg, gi*kg*cg, gi*cg*np, gi*kg*np)
	}
}
