package sgemm

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Blocking parameters; doc.go explains them.
const (
	mr = 6    // rows of a micro-tile (and of a packed A micro-panel)
	nr = 16   // columns of a micro-tile (and of a packed B micro-panel)
	kc = 256  // depth of a packed block: a B micro-panel is kc×nr = 16 KiB, L1-resident
	mc = 144  // rows of a packed A block: mc×kc = 144 KiB, L2-resident
	nc = 4080 // columns of a packed B block: kc×nc ≈ 4 MiB, L3-resident

	// minWork is the least m·n·k (multiply-adds) worth a goroutine of its own.
	minWork = 1 << 17
)

// useAsm selects the assembly micro-kernel. It is a variable so that the
// tests can run the pure-Go path on machines that have AVX2 and FMA.
var useAsm = hasAVX2FMA

// Sgemm computes C = alpha*op(A)*op(B) + beta*C, C m×n with leading dimension ldc,
// op(A) m×k (A is k×m with lda when transA), op(B) k×n (B is n×k with ldb when transB).
// beta == 0 means C's previous contents are ignored (even NaN).
//
// All matrices are row-major. When alpha == 0 or k == 0, A and B are not
// read. Sgemm panics if a dimension is negative, a leading dimension is too
// small or a slice is too short for its matrix. Large products are split
// among runtime.GOMAXPROCS(0) goroutines.
func Sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	if m < 0 || n < 0 || k < 0 {
		panic(fmt.Sprintf("sgemm: negative dimension m=%d n=%d k=%d", m, n, k))
	}
	ar, ac := m, k
	if transA {
		ar, ac = k, m
	}
	br, bc := k, n
	if transB {
		br, bc = n, k
	}
	checkMatrix("A", ar, ac, a, lda)
	checkMatrix("B", br, bc, b, ldb)
	checkMatrix("C", m, n, c, ldc)
	if m == 0 || n == 0 {
		return
	}
	if k == 0 || alpha == 0 {
		scale(m, n, beta, c, ldc)
		return
	}

	p, pm, pn := split(m, n, k)
	if p == 1 {
		gemm(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
		return
	}
	// p goroutines take the pm×pn blocks of C in turn.
	mt, nt := ceilDiv(m, mr), ceilDiv(n, nr)
	var next atomic.Int64
	work := func() {
		for {
			w := int(next.Add(1) - 1)
			if w >= pm*pn {
				return
			}
			wi, wj := w/pn, w%pn
			i0, i1 := min(m, mt*wi/pm*mr), min(m, mt*(wi+1)/pm*mr)
			j0, j1 := min(n, nt*wj/pn*nr), min(n, nt*(wj+1)/pn*nr)
			if i0 >= i1 || j0 >= j1 {
				continue
			}
			var sa, sb []float32
			if transA {
				sa = a[i0:]
			} else {
				sa = a[i0*lda:]
			}
			if transB {
				sb = b[j0*ldb:]
			} else {
				sb = b[j0:]
			}
			gemm(transA, transB, i1-i0, j1-j0, k, alpha, sa, lda, sb, ldb, beta, c[i0*ldc+j0:], ldc)
		}
	}
	var wg sync.WaitGroup
	wg.Add(p - 1)
	for range p - 1 {
		go func() {
			defer wg.Done()
			work()
		}()
	}
	work()
	wg.Wait()
}

func checkMatrix(name string, rows, cols int, s []float32, ld int) {
	if ld < max(1, cols) {
		panic(fmt.Sprintf("sgemm: leading dimension of %s is %d, want >= %d", name, ld, max(1, cols)))
	}
	if rows > 0 && cols > 0 && len(s) < (rows-1)*ld+cols {
		panic(fmt.Sprintf("sgemm: %s has %d elements, want >= %d for %d×%d with stride %d",
			name, len(s), (rows-1)*ld+cols, rows, cols, ld))
	}
}

// split chooses how to share an m×n×k product among goroutines: p of them
// (1 for serial), taking in turn the blocks of a pm×pn grid over C. Each
// block is whole micro-tiles and is computed by the serial algorithm with
// its own packing, so blocks never wait for each other.
//
// There are up to three blocks per goroutine, so that one that is slowed
// down (the machine is shared, or the Go runtime needs the core) leaves
// more of the work to the others rather than holding up the result; but
// only while that repacks little more of A and B than p blocks would.
func split(m, n, k int) (p, pm, pn int) {
	p = min(runtime.GOMAXPROCS(0), max(1, m*n*k/minWork))
	if p == 1 {
		return 1, 1, 1
	}
	pm, pn, total := grid(m, n, p)
	for _, nb := range []int{3 * p, 2 * p} {
		if qm, qn, t := grid(m, n, nb); t <= total+total/25 {
			pm, pn = qm, qn
			break
		}
	}
	return min(p, pm*pn), pm, pn
}

// grid returns the grid of at most nb blocks over an m×n C that minimises
// the cost of its largest block, and the cost of all its blocks. A block's
// cost is its multiply-adds plus the packing it repeats (its rows of A and
// columns of B), counted as 16 multiply-adds per element, all per unit k.
func grid(m, n, nb int) (pm, pn, total int) {
	mt, nt := ceilDiv(m, mr), ceilDiv(n, nr)
	best := -1
	pm, pn = 1, 1
	for qm := 1; qm <= nb; qm++ {
		qn := nb / qm
		if qm > mt || qn > nt {
			continue
		}
		rows, cols := ceilDiv(mt, qm)*mr, ceilDiv(nt, qn)*nr
		cost := rows*cols + 16*(rows*ceilDiv(cols, nc)+cols)
		if best < 0 || cost < best || cost == best && qn > pn {
			best, pm, pn = cost, qm, qn
		}
	}
	return pm, pn, best * pm * pn
}

// scale sets C = beta*C (C = 0 when beta == 0).
func scale(m, n int, beta float32, c []float32, ldc int) {
	if beta == 1 {
		return
	}
	for i := 0; i < m; i++ {
		row := c[i*ldc : i*ldc+n]
		if beta == 0 {
			clear(row)
			continue
		}
		for j := range row {
			row[j] *= beta
		}
	}
}

// workspace holds one goroutine's packing buffers.
type workspace struct {
	a, b []float32
}

var workspaces = sync.Pool{New: func() any { return new(workspace) }}

// aligned returns n zeroed float32s starting on a 64-byte boundary, so that
// each k step of a B micro-panel is exactly one cache line.
func aligned(n int) []float32 {
	s := make([]float32, n+15)
	off := int(-uintptr(unsafe.Pointer(unsafe.SliceData(s))) & 63 / 4)
	return s[off : off+n : off+n]
}

// blocks splits n into the fewest blocks of at most max elements, each a
// multiple of unit except the last, with sizes as equal as that allows.
func blocks(n, max, unit int) int {
	nb := ceilDiv(n, max)
	return min(max, ceilDiv(ceilDiv(n, nb), unit)*unit)
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// gemm is the serial blocked algorithm (Goto & van de Geijn, 2008) on one
// goroutine. Arguments are as for Sgemm with m, n, k > 0 and alpha != 0.
func gemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	kcb := blocks(k, kc, 1)
	mcb := blocks(m, mc, mr)
	ncb := blocks(n, nc, nr)
	sizeA := ceilDiv(mcb, mr) * mr * kcb
	sizeB := ceilDiv(ncb, nr) * nr * kcb

	ws := workspaces.Get().(*workspace)
	if len(ws.a) < sizeA {
		ws.a = aligned(sizeA)
	}
	if len(ws.b) < sizeB {
		ws.b = aligned(sizeB)
	}
	for jc := 0; jc < n; jc += ncb {
		nb := min(ncb, n-jc)
		for pc := 0; pc < k; pc += kcb {
			kb := min(kcb, k-pc)
			packB(transB, b, ldb, pc, jc, kb, nb, ws.b)
			bt := beta
			if pc > 0 {
				bt = 1
			}
			for ic := 0; ic < m; ic += mcb {
				mb := min(mcb, m-ic)
				packA(transA, a, lda, ic, pc, mb, kb, ws.a)
				macroKernel(mb, nb, kb, alpha, bt, ws.a, ws.b, c[ic*ldc+jc:], ldc)
			}
		}
	}
	workspaces.Put(ws)
}

// macroKernel multiplies a packed mb×kb block of A by a packed kb×nb block
// of B into C, one mr×nr micro-tile at a time. The B micro-panel (kb×nr)
// stays in L1 while the loop over ir streams the A block from L2.
func macroKernel(mb, nb, kb int, alpha, beta float32, ap, bp []float32, c []float32, ldc int) {
	var tmp [mr * nr]float32
	for jr := 0; jr < nb; jr += nr {
		cols := min(nr, nb-jr)
		bpan := &bp[jr*kb]
		for ir := 0; ir < mb; ir += mr {
			rows := min(mr, mb-ir)
			apan := &ap[ir*kb]
			if cols == nr {
				_ = c[(ir+rows-1)*ldc+jr+nr-1]
				kernel(kb, rows, apan, bpan, &c[ir*ldc+jr], ldc, alpha, beta)
				continue
			}
			// Right edge: compute the tile into tmp, then merge the
			// part that lies inside C.
			kernel(kb, rows, apan, bpan, &tmp[0], nr, alpha, 0)
			for r := 0; r < rows; r++ {
				row := c[(ir+r)*ldc+jr : (ir+r)*ldc+jr+cols]
				t := tmp[r*nr : r*nr+cols]
				if beta == 0 {
					copy(row, t)
					continue
				}
				for j := range row {
					row[j] = t[j] + beta*row[j]
				}
			}
		}
	}
}

// kernel computes a micro-tile of which only the first rows rows are
// stored, with the 4×16 assembly kernel when that is enough.
func kernel(kb, rows int, a, b *float32, c *float32, ldc int, alpha, beta float32) {
	switch {
	case !useAsm:
		kernelGeneric(kb, rows, a, b, 4*nr, c, ldc, alpha, beta)
	case rows <= 4:
		kernel4x16(kb, rows, a, b, 4*nr, c, ldc, alpha, beta)
	default:
		kernel6x16(kb, rows, a, b, 4*nr, c, ldc, alpha, beta)
	}
}

// packA packs rows ic..ic+mb and columns pc..pc+kb of op(A) into dst as
// micro-panels of mr rows: panel p holds, for each k, the mr elements of
// column k, so dst[p*mr*kb + k*mr + r] = op(A)[ic+p*mr+r][pc+k]. Rows past
// mb are zero.
func packA(transA bool, a []float32, lda, ic, pc, mb, kb int, dst []float32) {
	for ir := 0; ir < mb; ir += mr {
		rows := min(mr, mb-ir)
		d := dst[ir*kb : ir*kb+mr*kb]
		i := ic + ir
		switch {
		case useAsm && !transA && rows == mr:
			o := i*lda + pc
			_ = a[o+(mr-1)*lda+kb-1]
			k8 := kb &^ 7
			if k8 > 0 {
				packA6N(k8, &a[o], lda, &d[0])
			}
			for p := k8; p < kb; p++ {
				t := (*[mr]float32)(d[p*mr:])
				for r := range t {
					t[r] = a[o+r*lda+p]
				}
			}
		case !transA && rows == mr:
			// Six rows of A, read in parallel.
			o := i*lda + pc
			s0 := a[o : o+kb]
			s1 := a[o+lda : o+lda+kb]
			s2 := a[o+2*lda : o+2*lda+kb]
			s3 := a[o+3*lda : o+3*lda+kb]
			s4 := a[o+4*lda : o+4*lda+kb]
			s5 := a[o+5*lda : o+5*lda+kb]
			for p := range s0 {
				t := (*[mr]float32)(d[p*mr:])
				t[0], t[1], t[2], t[3], t[4], t[5] = s0[p], s1[p], s2[p], s3[p], s4[p], s5[p]
			}
		case transA && rows == mr:
			// A is k×m: each k step is mr contiguous elements.
			for p := 0; p < kb; p++ {
				o := (pc+p)*lda + i
				s := a[o : o+mr : o+mr]
				t := (*[mr]float32)(d[p*mr:])
				t[0], t[1], t[2], t[3], t[4], t[5] = s[0], s[1], s[2], s[3], s[4], s[5]
			}
		default:
			clear(d)
			for r := 0; r < rows; r++ {
				for p := 0; p < kb; p++ {
					if transA {
						d[p*mr+r] = a[(pc+p)*lda+i+r]
					} else {
						d[p*mr+r] = a[(i+r)*lda+pc+p]
					}
				}
			}
		}
	}
}

// packB packs rows pc..pc+kb and columns jc..jc+nb of op(B) into dst as
// micro-panels of nr columns: dst[q*nr*kb + k*nr + j] = op(B)[pc+k][jc+q*nr+j].
// Columns past nb are zero.
func packB(transB bool, b []float32, ldb, pc, jc, kb, nb int, dst []float32) {
	jr := 0
	if useAsm && !transB && nb >= nr {
		// All the whole micro-panels at once; the edge one below.
		np := nb / nr
		_ = b[(pc+kb-1)*ldb+jc+np*nr-1]
		_ = dst[np*nr*kb-1]
		packBN(kb, np, &b[pc*ldb+jc], ldb, &dst[0])
		jr = np * nr
	}
	for ; jr < nb; jr += nr {
		cols := min(nr, nb-jr)
		d := dst[jr*kb : jr*kb+nr*kb]
		j := jc + jr
		switch {
		case useAsm && transB && cols == nr:
			o := j*ldb + pc
			_ = b[o+(nr-1)*ldb+kb-1]
			k8 := kb &^ 7
			if k8 > 0 {
				packB16T(k8, &b[o], ldb, &d[0])
			}
			for p := k8; p < kb; p++ {
				t := (*[nr]float32)(d[p*nr:])
				for q := range t {
					t[q] = b[o+q*ldb+p]
				}
			}
		case !transB && cols == nr:
			for p := 0; p < kb; p++ {
				o := (pc+p)*ldb + j
				*(*[nr]float32)(d[p*nr:]) = [nr]float32(b[o : o+nr])
			}
		case transB && cols == nr:
			// B is n×k: column j of op(B) is row j of B. Take four at a
			// time so that each pass writes a quarter of every k step.
			for q := 0; q < nr; q += 4 {
				o := (j+q)*ldb + pc
				s0 := b[o : o+kb]
				s1 := b[o+ldb : o+ldb+kb]
				s2 := b[o+2*ldb : o+2*ldb+kb]
				s3 := b[o+3*ldb : o+3*ldb+kb]
				for p := range s0 {
					t := (*[4]float32)(d[p*nr+q:])
					t[0], t[1], t[2], t[3] = s0[p], s1[p], s2[p], s3[p]
				}
			}
		default:
			clear(d)
			for p := 0; p < kb; p++ {
				for q := 0; q < cols; q++ {
					if transB {
						d[p*nr+q] = b[(j+q)*ldb+pc+p]
					} else {
						d[p*nr+q] = b[(pc+p)*ldb+j+q]
					}
				}
			}
		}
	}
}
