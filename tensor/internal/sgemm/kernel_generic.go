package sgemm

import "unsafe"

// kernelGeneric is the pure-Go micro-kernel, with the same contract as
// kernel6x16: the whole 6×16 tile is computed, only its first rows rows
// are stored. It walks the tile in 2×4 sub-tiles so that the eight
// accumulators of each can stay in registers while it runs over k.
func kernelGeneric(kc, rows int, a, b *float32, bstride int, c *float32, ldc int, alpha, beta float32) {
	var acc [mr * nr]float32
	if kc > 0 {
		for r := 0; r < mr; r += 2 {
			for j := 0; j < nr; j += 4 {
				var c00, c01, c02, c03, c10, c11, c12, c13 float32
				bp := unsafe.Add(unsafe.Pointer(b), 4*j)
				pa := unsafe.Add(unsafe.Pointer(a), 4*r)
				for p := 0; p < kc; p++ {
					ak := (*[2]float32)(unsafe.Add(pa, p*4*mr))
					bk := (*[4]float32)(unsafe.Add(bp, p*bstride))
					a0, a1 := ak[0], ak[1]
					b0 := bk[0]
					c00 += a0 * b0
					c10 += a1 * b0
					b1 := bk[1]
					c01 += a0 * b1
					c11 += a1 * b1
					b2 := bk[2]
					c02 += a0 * b2
					c12 += a1 * b2
					b3 := bk[3]
					c03 += a0 * b3
					c13 += a1 * b3
				}
				t0 := (*[4]float32)(acc[r*nr+j:])
				t1 := (*[4]float32)(acc[(r+1)*nr+j:])
				*t0 = [4]float32{c00, c01, c02, c03}
				*t1 = [4]float32{c10, c11, c12, c13}
			}
		}
	}
	cs := unsafe.Slice(c, (rows-1)*ldc+nr)
	for r := 0; r < rows; r++ {
		row := (*[nr]float32)(cs[r*ldc:])
		t := (*[nr]float32)(acc[r*nr:])
		if beta == 0 {
			for j := range row {
				row[j] = alpha * t[j]
			}
		} else {
			for j := range row {
				row[j] = alpha*t[j] + beta*row[j]
			}
		}
	}
}
