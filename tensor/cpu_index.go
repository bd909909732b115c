package tensor

import (
	"fmt"

	"github.com/ember-ml/ember/tensor/internal/sgemm"
)

func (*cpuBackend) IndexSelect(dst, src, idx Buffer, outer, n, inner int) {
	d, s, ix := f32(dst), f32(src), i32(idx)
	m := len(ix)
	checkIndexDims("IndexSelect", dst, src, outer, n, m, inner)
	for o := 0; o < outer; o++ {
		for i, k := range ix {
			if k < 0 || int(k) >= n {
				panic(fmt.Sprintf("tensor: cpu: IndexSelect: index %d at %d outside [0, %d)", k, i, n))
			}
			copy(d[(o*m+i)*inner:(o*m+i+1)*inner], s[(o*n+int(k))*inner:(o*n+int(k)+1)*inner])
		}
	}
}

// IndexAdd adds in the order of idx, so that the sums of repeated indices
// are reproducible.
func (*cpuBackend) IndexAdd(dst, src, idx Buffer, outer, n, inner int) {
	d, s, ix := f32(dst), f32(src), i32(idx)
	m := len(ix)
	checkIndexDims("IndexAdd", src, dst, outer, n, m, inner)
	for o := 0; o < outer; o++ {
		for i, k := range ix {
			if k < 0 || int(k) >= n {
				panic(fmt.Sprintf("tensor: cpu: IndexAdd: index %d at %d outside [0, %d)", k, i, n))
			}
			row := d[(o*n+int(k))*inner : (o*n+int(k)+1)*inner]
			for r, v := range s[(o*m+i)*inner : (o*m+i+1)*inner] {
				row[r] += v
			}
		}
	}
}

// checkIndexDims panics unless the gathered buffer holds [outer, m, inner]
// and the full one [outer, n, inner].
func checkIndexDims(op string, gathered, full Buffer, outer, n, m, inner int) {
	if outer < 0 || n < 0 || inner < 0 || gathered.Len != outer*m*inner || full.Len != outer*n*inner {
		panic(fmt.Sprintf("tensor: cpu: %s of [%d, %d, %d] with %d indices: buffers of %d and %d elements",
			op, outer, n, inner, m, full.Len, gathered.Len))
	}
}

// MatMulBatched runs one SGEMM per matrix, the matrices spread over the
// cores (each SGEMM also splits itself when it is large).
func (c *cpuBackend) MatMulBatched(cb, ab, bb Buffer, batch, m, n, k int, strideA, strideB, strideC int, transA, transB bool, alpha, beta float32) {
	if batch < 0 || m < 0 || n < 0 || k < 0 || strideA < 0 || strideB < 0 || (batch > 1 && strideC < m*n) {
		panic(fmt.Sprintf("tensor: cpu: MatMulBatched batch=%d m=%d n=%d k=%d strides %d, %d, %d", batch, m, n, k, strideA, strideB, strideC))
	}
	if batch == 0 {
		return
	}
	need := func(what string, b Buffer, stride, size int) {
		if b.Len < (batch-1)*stride+size {
			panic(fmt.Sprintf("tensor: cpu: MatMulBatched: %s has %d elements, need %d", what, b.Len, (batch-1)*stride+size))
		}
	}
	need("a", ab, strideA, m*k)
	need("b", bb, strideB, k*n)
	need("c", cb, strideC, m*n)
	if batch == 1 {
		c.MatMul(cb.Slice(0, m*n), ab.Slice(0, m*k), bb.Slice(0, k*n), m, n, k, transA, transB, alpha, beta)
		return
	}
	lda, ldb := k, n
	if transA {
		lda = m
	}
	if transB {
		ldb = k
	}
	a, b, out := f32(ab), f32(bb), f32(cb)
	parallelFor(batch, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			ci := out[i*strideC : i*strideC+m*n]
			if k == 0 {
				for j := range ci {
					if beta == 0 {
						ci[j] = 0
					} else {
						ci[j] *= beta
					}
				}
				continue
			}
			sgemm.Sgemm(transA, transB, m, n, k, alpha, a[i*strideA:i*strideA+m*k], lda, b[i*strideB:i*strideB+k*n], ldb, beta, ci, n)
		}
	})
}
