//go:build !purego

#include "textflag.h"

// func packBN(kb, np int, src *float32, ldb int, dst *float32)
//
// dst[q*16*kb + 16p + j] = src[p*ldb + 16q + j] for p < kb, q < np, j < 16:
// np whole micro-panels of a B that is not transposed. It goes through B
// eight rows at a time, each row from left to right, so that the reads are
// eight sequential streams rather than kb rows with a large stride (often a
// power of two, which would also alias in the caches). Needs AVX.
TEXT ·packBN(SB), NOSPLIT, $0-40
	MOVQ kb+0(FP), CX
	MOVQ src+16(FP), SI
	MOVQ ldb+24(FP), DX
	MOVQ dst+32(FP), DI
	SHLQ $2, DX
	MOVQ CX, R11
	SHLQ $6, R11 // bytes per packed micro-panel

chunk:
	TESTQ   CX, CX
	JZ      done
	MOVQ    $8, BX
	CMPQ    CX, BX
	CMOVQLT CX, BX        // rows in this chunk: min(8, rows left)
	MOVQ    np+8(FP), R10 // panels left
	MOVQ    SI, R8        // row p0, column 16q of src
	MOVQ    DI, R9        // row p0 of panel q of dst

panel:
	MOVQ R8, AX
	MOVQ R9, R13
	MOVQ BX, R12

row:
	VMOVUPS (AX), Y0
	VMOVUPS 32(AX), Y1
	VMOVUPS Y0, (R13)
	VMOVUPS Y1, 32(R13)
	ADDQ    DX, AX
	ADDQ    $64, R13
	DECQ    R12
	JNZ     row

	ADDQ $64, R8
	ADDQ R11, R9
	DECQ R10
	JNZ  panel

	SUBQ  BX, CX
	MOVQ  BX, AX
	IMULQ DX, AX
	ADDQ  AX, SI // down BX rows of src
	SHLQ  $6, BX
	ADDQ  BX, DI // down BX rows of every panel
	JMP   chunk

done:
	VZEROUPPER
	RET

// TRANSPOSE8 transposes the 8×8 matrix whose rows are Y0..Y7 into
// Y8..Y15 (Y8 = column 0, ...), destroying Y0..Y7.
#define TRANSPOSE8 \
	VUNPCKLPS  Y1, Y0, Y8; \
	VUNPCKHPS  Y1, Y0, Y9; \
	VUNPCKLPS  Y3, Y2, Y10; \
	VUNPCKHPS  Y3, Y2, Y11; \
	VUNPCKLPS  Y5, Y4, Y12; \
	VUNPCKHPS  Y5, Y4, Y13; \
	VUNPCKLPS  Y7, Y6, Y14; \
	VUNPCKHPS  Y7, Y6, Y15; \
	VSHUFPS    $0x44, Y10, Y8, Y0; \
	VSHUFPS    $0xEE, Y10, Y8, Y1; \
	VSHUFPS    $0x44, Y11, Y9, Y2; \
	VSHUFPS    $0xEE, Y11, Y9, Y3; \
	VSHUFPS    $0x44, Y14, Y12, Y4; \
	VSHUFPS    $0xEE, Y14, Y12, Y5; \
	VSHUFPS    $0x44, Y15, Y13, Y6; \
	VSHUFPS    $0xEE, Y15, Y13, Y7; \
	VPERM2F128 $0x20, Y4, Y0, Y8; \
	VPERM2F128 $0x20, Y5, Y1, Y9; \
	VPERM2F128 $0x20, Y6, Y2, Y10; \
	VPERM2F128 $0x20, Y7, Y3, Y11; \
	VPERM2F128 $0x31, Y4, Y0, Y12; \
	VPERM2F128 $0x31, Y5, Y1, Y13; \
	VPERM2F128 $0x31, Y6, Y2, Y14; \
	VPERM2F128 $0x31, Y7, Y3, Y15

// LOAD8 loads eight consecutive floats at byte offset OFF from each of the
// eight rows starting at R (stride DX bytes, R9 = 3*DX, R10 = 5*DX,
// R11 = 7*DX) into Y0..Y7.
#define LOAD8(R, OFF) \
	VMOVUPS OFF(R), Y0; \
	VMOVUPS OFF(R)(DX*1), Y1; \
	VMOVUPS OFF(R)(DX*2), Y2; \
	VMOVUPS OFF(R)(R9*1), Y3; \
	VMOVUPS OFF(R)(DX*4), Y4; \
	VMOVUPS OFF(R)(R10*1), Y5; \
	VMOVUPS OFF(R)(R9*2), Y6; \
	VMOVUPS OFF(R)(R11*1), Y7

// STORE8 writes the eight columns in Y8..Y15 to OFF(DI), OFF+64(DI), ...
#define STORE8(OFF) \
	VMOVUPS Y8, (OFF+0)(DI); \
	VMOVUPS Y9, (OFF+64)(DI); \
	VMOVUPS Y10, (OFF+128)(DI); \
	VMOVUPS Y11, (OFF+192)(DI); \
	VMOVUPS Y12, (OFF+256)(DI); \
	VMOVUPS Y13, (OFF+320)(DI); \
	VMOVUPS Y14, (OFF+384)(DI); \
	VMOVUPS Y15, (OFF+448)(DI)

// func packB16T(kb int, src *float32, ldb int, dst *float32)
//
// dst[16p + j] = src[j*ldb + p] for p < kb, j < 16: a micro-panel of a
// transposed B, whose sixteen columns are rows of src. kb must be a
// multiple of 8. Needs AVX.
TEXT ·packB16T(SB), NOSPLIT, $0-32
	MOVQ kb+0(FP), CX
	MOVQ src+8(FP), SI
	MOVQ ldb+16(FP), DX
	MOVQ dst+24(FP), DI
	SHLQ $2, DX
	LEAQ (DX)(DX*2), R9  // 3 rows
	LEAQ (DX)(DX*4), R10 // 5 rows
	LEAQ (R9)(DX*4), R11 // 7 rows
	LEAQ (SI)(DX*8), BX  // rows 8..15
	MOVQ CX, R8
	SHRQ $4, CX
	JZ   tail

	// Sixteen k steps (64 bytes of each of the sixteen rows) at a time,
	// rows 0-7 finished before rows 8-15 are touched: with rows a power of
	// two apart, all sixteen lines fall in one 8-way L1 set.
loop:
	LOAD8(SI, 0)
	TRANSPOSE8
	STORE8(0)
	LOAD8(SI, 32)
	TRANSPOSE8
	STORE8(512)
	LOAD8(BX, 0)
	TRANSPOSE8
	STORE8(32)
	LOAD8(BX, 32)
	TRANSPOSE8
	STORE8(544)
	ADDQ $64, SI
	ADDQ $64, BX
	ADDQ $1024, DI
	DECQ CX
	JNZ  loop

tail:
	TESTQ $8, R8
	JZ    done
	LOAD8(SI, 0)
	TRANSPOSE8
	STORE8(0)
	LOAD8(BX, 0)
	TRANSPOSE8
	STORE8(32)

done:
	VZEROUPPER
	RET

// func packA6N(kb int, src *float32, lda int, dst *float32)
//
// dst[6p + r] = src[r*lda + p] for p < kb, r < 6: a micro-panel of an A
// that is not transposed. kb must be a multiple of 8. Needs AVX.
TEXT ·packA6N(SB), NOSPLIT, $0-32
	MOVQ kb+0(FP), CX
	MOVQ src+8(FP), SI
	MOVQ lda+16(FP), DX
	MOVQ dst+24(FP), DI
	SHLQ $2, DX
	LEAQ (DX)(DX*2), R9  // 3 rows
	LEAQ (DX)(DX*4), R10 // 5 rows
	SHRQ $3, CX
	JZ   done

loop:
	VMOVUPS (SI), Y0
	VMOVUPS (SI)(DX*1), Y1
	VMOVUPS (SI)(DX*2), Y2
	VMOVUPS (SI)(R9*1), Y3
	VMOVUPS (SI)(DX*4), Y4
	VMOVUPS (SI)(R10*1), Y5
	VXORPS  Y6, Y6, Y6
	VXORPS  Y7, Y7, Y7
	TRANSPOSE8

	// Column p holds six useful floats; write it as eight, in increasing
	// order so that each store's last two overwrite nothing yet written
	// but the next column's first two. The last column stays inside.
	VMOVUPS      Y8, (DI)
	VMOVUPS      Y9, 24(DI)
	VMOVUPS      Y10, 48(DI)
	VMOVUPS      Y11, 72(DI)
	VMOVUPS      Y12, 96(DI)
	VMOVUPS      Y13, 120(DI)
	VMOVUPS      Y14, 144(DI)
	VMOVUPS      X15, 168(DI)
	VEXTRACTF128 $1, Y15, X15
	VMOVSD       X15, 184(DI)
	ADDQ         $32, SI
	ADDQ         $192, DI
	DECQ         CX
	JNZ          loop

done:
	VZEROUPPER
	RET
