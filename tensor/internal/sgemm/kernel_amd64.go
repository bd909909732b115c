//go:build amd64 && !purego

package sgemm

import "golang.org/x/sys/cpu"

// hasAVX2FMA reports whether the assembly micro-kernel can run here
// (golang.org/x/sys/cpu also checks that the OS saves the YMM state).
var hasAVX2FMA = cpu.X86.HasAVX2 && cpu.X86.HasFMA

// kernel6x16 computes the 6×16 tile
//
//	C[r][j] = alpha * sum_p a[6p+r] * b[p*bstride/4 + j] + beta*C[r][j]
//
// for j < 16, p < kc and r < rows (1 <= rows <= 6; the other rows are
// computed but not stored), where row r of C starts at c + r*ldc. a is a
// packed A micro-panel; consecutive k steps of b are bstride bytes apart.
// When beta == 0, C is only written, never read. It needs AVX2 and FMA.
//
//go:noescape
func kernel6x16(kc, rows int, a, b *float32, bstride int, c *float32, ldc int, alpha, beta float32)

// kernel4x16 is kernel6x16 for the first four rows of the tile only (the A
// micro-panel is still packed six wide), with 1 <= rows <= 4: the edge
// kernel for panels of up to four rows, a third cheaper than computing six.
//
//go:noescape
func kernel4x16(kc, rows int, a, b *float32, bstride int, c *float32, ldc int, alpha, beta float32)

// packBN packs np whole micro-panels of a B that is not transposed: kb
// rows of 16·np floats, ldb apart in src, into dst as np blocks of kb rows
// of 16. It needs AVX.
//
//go:noescape
func packBN(kb, np int, src *float32, ldb int, dst *float32)

// packB16T transposes the 16×kb block of src (rows ldb apart) into dst as
// kb rows of 16: one micro-panel of a transposed B. kb must be a multiple of
// 8. It needs AVX.
//
//go:noescape
func packB16T(kb int, src *float32, ldb int, dst *float32)

// packA6N transposes the 6×kb block of src (rows lda apart) into dst as kb
// groups of 6: one micro-panel of an A that is not transposed. kb must be
// a multiple of 8. It needs AVX.
//
//go:noescape
func packA6N(kb int, src *float32, lda int, dst *float32)
