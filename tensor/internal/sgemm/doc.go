// Package sgemm is a single-precision general matrix multiply,
//
//	C = alpha·op(A)·op(B) + beta·C,
//
// for row-major matrices, written for the CPU backend of ember. On amd64
// with AVX2 and FMA it runs an assembly micro-kernel; elsewhere (or with
// the purego build tag) the same algorithm runs with a pure-Go kernel.
//
// # Algorithm
//
// The method is the one of GotoBLAS and BLIS: K. Goto and R. A. van de
// Geijn, "Anatomy of High-Performance Matrix Multiplication", ACM TOMS
// 34(3), 2008, as restated by F. G. Van Zee and R. A. van de Geijn, "BLIS:
// A Framework for Rapidly Instantiating BLAS Functionality", ACM TOMS 41(3),
// 2015. Five loops around a micro-kernel, each tied to a level of the
// memory hierarchy:
//
//	for jc in steps of NC over n:             // B block kc×nc lives in L3
//	  for pc in steps of KC over k:
//	    pack op(B)[pc:pc+kc, jc:jc+nc] into B̃ (micro-panels of NR columns)
//	    for ic in steps of MC over m:         // A block mc×kc lives in L2
//	      pack op(A)[ic:ic+mc, pc:pc+kc] into Ã (micro-panels of MR rows)
//	      for jr in steps of NR over nc:      // B̃ micro-panel kc×NR in L1
//	        for ir in steps of MR over mc:
//	          micro-kernel: C[ir:ir+MR, jr:jr+NR] (+)= Ã panel · B̃ panel
//
// Packing copies each block into the exact order in which the micro-kernel
// reads it, contiguous and 64-byte aligned, so that the kernel's loads are
// sequential whatever the transposes and leading dimensions of A and B.
// On amd64 the packing is assembly too: transposition is done with AVX 8×8
// transposes, and an untransposed B is read eight rows at a time along the
// rows, since reading a micro-panel down its kc rows touches one line per
// row at a stride that is often a power of two. Edges are zero-padded up
// to whole micro-panels, so the kernel always computes a whole tile. At
// the bottom edge it stores only the rows inside C, and panels of at most
// four rows (the last of an m that is not a multiple of 6, as m = 20 or 64)
// use a 4×16 variant of the kernel that skips the padding rows; at the
// right edge the tile goes to a scratch tile and only its inside part is
// merged into C. beta is applied by the first pc block only; later ones
// accumulate with beta = 1, and when beta == 0 C is written without being
// read, so NaNs in it do not propagate.
//
// # Parameters
//
// The micro-tile is MR×NR = 6×16: twelve YMM accumulators (two per row),
// two YMM registers for a 16-wide row of B and two for broadcasts of A, all
// sixteen AVX2 registers. Each k step is 2 loads, 6 broadcasts and 12 FMAs,
// enough independent FMAs (12 ≥ 2 pipes × 4 cycles latency) to keep both
// FMA pipes of a Zen 3 or Haswell-class core busy. The cache blocks are
//
//	KC = 256:  a B̃ micro-panel is 256×16×4 B = 16 KiB, half a 32 KiB L1d,
//	           leaving room for the streaming 6 KiB Ã micro-panel
//	MC = 144:  an Ã block is 144×256×4 B = 144 KiB, well inside a 512 KiB L2
//	NC = 4080: a B̃ block is 256×4080×4 B ≈ 4 MiB, a slice of the L3
//
// These are the single-precision values of BLIS for Zen 3
// (config/zen3/bli_cntx_init_zen3.c, whose micro-kernel is also 6×16); the
// machine this was tuned on is a 2-core Zen 3 EPYC with 32 KiB L1d and
// 512 KiB L2 per core. k, m and n are cut into blocks of equal size no
// larger than these, so that e.g. k = 257 is two blocks of 129 rather than
// 256 and 1.
//
// On one core of that machine the micro-kernel alone (BenchmarkKernel)
// runs at about 83 GFLOP/s, the whole 512³ product at 75-80, and the
// LeNet products at 40-75, lowest where a dimension of 20-64 makes packing
// and edges weigh most. BenchmarkSgemm compares with gonum.
//
// # Parallelism
//
// Products of at least 2·2¹⁷ multiply-adds are split over up to
// runtime.GOMAXPROCS(0) goroutines (one per 2¹⁷). C is cut into a grid of
// blocks of whole micro-tiles, chosen to minimise the work of the largest
// block including the packing each block repeats (its rows of A, its
// columns of B); each block is computed by the serial algorithm above with
// its own packing buffers, so goroutines never wait for each other until
// the end. Where it costs under 4% more packing, there are two or three
// blocks per goroutine, taken in turn from a shared counter, so that a
// goroutine slowed by other load on the machine leaves its share to the
// others. Packing buffers come from a sync.Pool, so steady calls allocate
// only the goroutines (and new buffers after a garbage collection).
package sgemm
