//go:build !amd64 || purego

package sgemm

// hasAVX2FMA is false where there is no assembly micro-kernel.
const hasAVX2FMA = false

// The assembly routines are never called when hasAVX2FMA is false; these
// stand-ins let the driver compile unchanged everywhere.

func kernel6x16(kc, rows int, a, b *float32, bstride int, c *float32, ldc int, alpha, beta float32) {
	panic("sgemm: no assembly")
}

func kernel4x16(kc, rows int, a, b *float32, bstride int, c *float32, ldc int, alpha, beta float32) {
	panic("sgemm: no assembly")
}

func packBN(kb, np int, src *float32, ldb int, dst *float32) { panic("sgemm: no assembly") }

func packB16T(kb int, src *float32, ldb int, dst *float32) { panic("sgemm: no assembly") }

func packA6N(kb int, src *float32, lda int, dst *float32) { panic("sgemm: no assembly") }
