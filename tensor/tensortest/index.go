package tensortest

import "math"

// indexShapes are [outer, n, inner, m]: m indices into n rows, rows of one
// element or many, more indices than rows (repeats certain) and fewer.
var indexShapes = [][4]int{{1, 1, 1, 1}, {1, 10, 1, 7}, {1, 50, 33, 200}, {3, 7, 5, 4}, {2, 1000, 1, 3000}, {4, 3, 257, 9}, {1, 5, 1000, 2}, {2, 4, 3, 0}}

// indices returns m indices in [0, n); when few, some repeat on purpose.
func (e *env) indices(m, n int) []int32 {
	ix := make([]int32, m)
	for i := range ix {
		ix[i] = int32(e.rng.IntN(n))
	}
	if m >= 3 {
		ix[m-1] = ix[0] // a repeat even when m < n
	}
	return ix
}

// IndexSelect copies rows: exact.
func testIndexSelect(e *env) {
	for _, s := range indexShapes {
		outer, n, inner, m := s[0], s[1], s[2], s[3]
		e.tcase("outer=%d n=%d inner=%d m=%d", outer, n, inner, m)(func() {
			src := e.normal(outer*n*inner, 1)
			ix := e.indices(m, n)
			want := make([]float32, outer*m*inner)
			for o := 0; o < outer; o++ {
				for i, k := range ix {
					for r := 0; r < inner; r++ {
						want[(o*m+i)*inner+r] = src[(o*n+int(k))*inner+r]
					}
				}
			}
			dst := e.nanOut("dst", len(want))
			e.b.IndexSelect(dst.win, e.in("src", src), e.i32("idx", ix, true).win, outer, n, inner)
			e.exactF("IndexSelect", dims(outer, m, inner), e.getF(dst), want)
		})
	}
}

// IndexAdd adds rows into dst, repeated indices summing; tolAcc of the sum
// of the magnitudes of the terms (dst's own included), as the order of the
// sums is not specified.
func testIndexAdd(e *env) {
	for _, s := range indexShapes {
		outer, n, inner, m := s[0], s[1], s[2], s[3]
		e.tcase("outer=%d n=%d inner=%d m=%d", outer, n, inner, m)(func() {
			src := e.normal(outer*m*inner, 1)
			d0 := e.normal(outer*n*inner, 1)
			ix := e.indices(m, n)
			want, bound := f64(d0), make([]float64, len(d0))
			for i, v := range d0 {
				bound[i] = math.Abs(float64(v))
			}
			for o := 0; o < outer; o++ {
				for i, k := range ix {
					for r := 0; r < inner; r++ {
						v := float64(src[(o*m+i)*inner+r])
						want[(o*n+int(k))*inner+r] += v
						bound[(o*n+int(k))*inner+r] += math.Abs(v)
					}
				}
			}
			dst := e.f32("dst", d0, false)
			e.b.IndexAdd(dst.win, e.in("src", src), e.i32("idx", ix, true).win, outer, n, inner)
			e.near("IndexAdd", dims(outer, n, inner), e.getF(dst), want, bound, tolAcc)
		})
	}
}

// MatMulBatched: every transpose combination, operands broadcast by a zero
// stride, strides larger than a matrix (views of a larger batch), beta 0
// (NaN output not read) and 1; refMatMul per matrix, tolAcc.
func testMatMulBatched(e *env) {
	type bcase struct {
		batch, m, n, k int
		bcastA, bcastB bool
		gap            int // extra elements between matrices of c
	}
	cases := []bcase{
		{1, 7, 5, 3, false, false, 0}, {3, 7, 33, 257, false, false, 0}, {5, 1, 1, 1, false, false, 2},
		{4, 16, 10, 64, true, false, 0}, {6, 9, 11, 13, false, true, 3}, {2, 65, 33, 100, true, true, 0},
		{7, 2, 3, 0, false, false, 1}, {33, 8, 8, 8, false, false, 0},
	}
	for _, c := range cases {
		for _, ta := range []bool{false, true} {
			for _, tb := range []bool{false, true} {
				for _, ab := range [][2]float32{{1, 0}, {-0.5, 1}} {
					alpha, beta := ab[0], ab[1]
					e.tcase("batch=%d m=%d n=%d k=%d broadcast a=%v b=%v gap=%d transA=%v transB=%v alpha=%g beta=%g",
						c.batch, c.m, c.n, c.k, c.bcastA, c.bcastB, c.gap, ta, tb, alpha, beta)(func() {
						sa, sb, sc := c.m*c.k, c.k*c.n, c.m*c.n+c.gap
						na, nb := c.batch, c.batch
						if c.bcastA {
							sa, na = 0, 1
						}
						if c.bcastB {
							sb, nb = 0, 1
						}
						a, b := e.normal(na*c.m*c.k, 1), e.normal(nb*c.k*c.n, 1)
						cn := (c.batch-1)*sc + c.m*c.n
						c0 := e.normal(cn, 1)
						var out *dbuf
						if beta == 0 {
							out = e.nanOut("c", cn)
						} else {
							out = e.f32("c", c0, false)
						}
						// Gap elements are not written: they keep what they held.
						got0 := e.getF(out)
						want, bound := make([]float64, cn), make([]float64, cn)
						for i := range want {
							want[i], bound[i] = float64(got0[i]), 0
						}
						for i := 0; i < c.batch; i++ {
							var ci []float32
							if beta != 0 {
								ci = c0[i*sc : i*sc+c.m*c.n]
							}
							w, bd := refMatMul(a[i*sa:i*sa+c.m*c.k], b[i*sb:i*sb+c.k*c.n], ci, c.m, c.n, c.k, ta, tb, float64(alpha), float64(beta))
							copy(want[i*sc:], w)
							copy(bound[i*sc:], bd)
						}
						e.b.MatMulBatched(out.win, e.in("a", a), e.in("b", b), c.batch, c.m, c.n, c.k, sa, sb, sc, ta, tb, alpha, beta)
						got := e.getF(out)
						for i := range got { // the gaps must hold what they held, bit for bit
							if i%sc >= c.m*c.n {
								if math.Float32bits(got[i]) != math.Float32bits(got0[i]) {
									e.fail("MatMulBatched wrote element %d, between two matrices of c", i)
								}
								got[i], want[i] = 0, 0
							}
						}
						e.near("MatMulBatched", dims(cn), got, want, bound, tolAcc)
					})
				}
			}
		}
	}
}
