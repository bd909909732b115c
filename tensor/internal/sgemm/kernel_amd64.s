//go:build !purego

#include "textflag.h"

// The AVX2+FMA micro-kernels. Register use:
//
//	Y0..Y11  the accumulator tile: row r is Y(2r) (columns 0-7) and
//	         Y(2r+1) (columns 8-15)
//	Y12,Y13  one k step of the B micro-panel (16 floats)
//	Y14,Y15  broadcast elements of the A micro-panel
//	AX       A micro-panel (packed: 6 floats per k step)
//	BX       B micro-panel (16 floats per k step, R8 bytes apart)
//	CX, DX   loop counters
//	DI       C, R9 = ldc in bytes, R11 = rows of C still to write

// HALF_STEP loads one k step of B and multiplies it by A rows 0..3.
#define HALF_STEP(AOFF) \
	VMOVUPS      (BX), Y12; \
	VMOVUPS      32(BX), Y13; \
	ADDQ         R8, BX; \
	VBROADCASTSS (AOFF+0)(AX), Y14; \
	VBROADCASTSS (AOFF+4)(AX), Y15; \
	VFMADD231PS  Y12, Y14, Y0; \
	VFMADD231PS  Y13, Y14, Y1; \
	VFMADD231PS  Y12, Y15, Y2; \
	VFMADD231PS  Y13, Y15, Y3; \
	VBROADCASTSS (AOFF+8)(AX), Y14; \
	VBROADCASTSS (AOFF+12)(AX), Y15; \
	VFMADD231PS  Y12, Y14, Y4; \
	VFMADD231PS  Y13, Y14, Y5; \
	VFMADD231PS  Y12, Y15, Y6; \
	VFMADD231PS  Y13, Y15, Y7

// STEP6 is one k step of the 6×16 kernel: acc[r][0:16] += a[r]*b[0:16]
// for r = 0..5. AOFF is the byte offset of the step's A elements from AX.
#define STEP6(AOFF) \
	HALF_STEP(AOFF); \
	VBROADCASTSS (AOFF+16)(AX), Y14; \
	VBROADCASTSS (AOFF+20)(AX), Y15; \
	VFMADD231PS  Y12, Y14, Y8; \
	VFMADD231PS  Y13, Y14, Y9; \
	VFMADD231PS  Y12, Y15, Y10; \
	VFMADD231PS  Y13, Y15, Y11

// STEP4 is one k step of the 4×16 kernel (rows 0..3 of a 6-wide A panel).
#define STEP4(AOFF) HALF_STEP(AOFF)

// PROLOGUE loads the arguments, warms the first rows of the C tile (two
// lines per row, as rows need not be aligned) and clears Y0..Y11.
#define PROLOGUE \
	MOVQ       kc+0(FP), CX; \
	MOVQ       rows+8(FP), R11; \
	MOVQ       a+16(FP), AX; \
	MOVQ       b+24(FP), BX; \
	MOVQ       bstride+32(FP), R8; \
	MOVQ       c+40(FP), DI; \
	MOVQ       ldc+48(FP), R9; \
	SHLQ       $2, R9; \
	MOVQ       DI, R10; \
	PREFETCHT0 (R10); \
	PREFETCHT0 63(R10); \
	ADDQ       R9, R10; \
	PREFETCHT0 (R10); \
	PREFETCHT0 63(R10); \
	ADDQ       R9, R10; \
	PREFETCHT0 (R10); \
	PREFETCHT0 63(R10); \
	ADDQ       R9, R10; \
	PREFETCHT0 (R10); \
	PREFETCHT0 63(R10); \
	VXORPS     Y0, Y0, Y0; \
	VXORPS     Y1, Y1, Y1; \
	VXORPS     Y2, Y2, Y2; \
	VXORPS     Y3, Y3, Y3; \
	VXORPS     Y4, Y4, Y4; \
	VXORPS     Y5, Y5, Y5; \
	VXORPS     Y6, Y6, Y6; \
	VXORPS     Y7, Y7, Y7; \
	VXORPS     Y8, Y8, Y8; \
	VXORPS     Y9, Y9, Y9; \
	VXORPS     Y10, Y10, Y10; \
	VXORPS     Y11, Y11, Y11

// C row = alpha*acc (beta == 0: C is not read); stop after R11 rows.
#define STORE(LO, HI, END) \
	VMULPS  Y12, LO, LO; \
	VMULPS  Y12, HI, HI; \
	VMOVUPS LO, (DI); \
	VMOVUPS HI, 32(DI); \
	ADDQ    R9, DI; \
	DECQ    R11; \
	JZ      END

// C row = alpha*acc + beta*C; stop after R11 rows.
#define UPDATE(LO, HI, END) \
	VMULPS      Y12, LO, LO; \
	VMULPS      Y12, HI, HI; \
	VFMADD231PS (DI), Y13, LO; \
	VFMADD231PS 32(DI), Y13, HI; \
	VMOVUPS     LO, (DI); \
	VMOVUPS     HI, 32(DI); \
	ADDQ        R9, DI; \
	DECQ        R11; \
	JZ          END

// func kernel6x16(kc, rows int, a, b *float32, bstride int, c *float32, ldc int, alpha, beta float32)
TEXT ·kernel6x16(SB), NOSPLIT, $0-64
	PROLOGUE
	PREFETCHT0 (R10)(R9*1)
	PREFETCHT0 63(R10)(R9*1)
	PREFETCHT0 (R10)(R9*2)
	PREFETCHT0 63(R10)(R9*2)

	MOVQ CX, DX
	SHRQ $2, DX
	JZ   tail6

loop6:
	STEP6(0)
	STEP6(24)
	STEP6(48)
	STEP6(72)
	ADDQ $96, AX
	DECQ DX
	JNZ  loop6

tail6:
	ANDQ $3, CX
	JZ   done6

loop6x1:
	STEP6(0)
	ADDQ $24, AX
	DECQ CX
	JNZ  loop6x1

done6:
	VBROADCASTSS alpha+56(FP), Y12

	// beta == 0 (either sign) means C is write-only, even if it holds NaN.
	MOVL beta+60(FP), R10
	ANDL $0x7fffffff, R10
	JZ   store6

	VBROADCASTSS beta+60(FP), Y13
	UPDATE(Y0, Y1, ret6)
	UPDATE(Y2, Y3, ret6)
	UPDATE(Y4, Y5, ret6)
	UPDATE(Y6, Y7, ret6)
	UPDATE(Y8, Y9, ret6)
	UPDATE(Y10, Y11, ret6)
	JMP  ret6

store6:
	STORE(Y0, Y1, ret6)
	STORE(Y2, Y3, ret6)
	STORE(Y4, Y5, ret6)
	STORE(Y6, Y7, ret6)
	STORE(Y8, Y9, ret6)
	STORE(Y10, Y11, ret6)

ret6:
	VZEROUPPER
	RET

// func kernel4x16(kc, rows int, a, b *float32, bstride int, c *float32, ldc int, alpha, beta float32)
TEXT ·kernel4x16(SB), NOSPLIT, $0-64
	PROLOGUE

	MOVQ CX, DX
	SHRQ $2, DX
	JZ   tail4

loop4:
	STEP4(0)
	STEP4(24)
	STEP4(48)
	STEP4(72)
	ADDQ $96, AX
	DECQ DX
	JNZ  loop4

tail4:
	ANDQ $3, CX
	JZ   done4

loop4x1:
	STEP4(0)
	ADDQ $24, AX
	DECQ CX
	JNZ  loop4x1

done4:
	VBROADCASTSS alpha+56(FP), Y12
	MOVL         beta+60(FP), R10
	ANDL         $0x7fffffff, R10
	JZ           store4

	VBROADCASTSS beta+60(FP), Y13
	UPDATE(Y0, Y1, ret4)
	UPDATE(Y2, Y3, ret4)
	UPDATE(Y4, Y5, ret4)
	UPDATE(Y6, Y7, ret4)
	JMP  ret4

store4:
	STORE(Y0, Y1, ret4)
	STORE(Y2, Y3, ret4)
	STORE(Y4, Y5, ret4)
	STORE(Y6, Y7, ret4)

ret4:
	VZEROUPPER
	RET
