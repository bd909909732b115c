package sgemm

import (
	"math/rand/v2"
	"testing"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// BenchmarkSgemm times the LeNet products and 512³ with this package
// ("ember"), its pure-Go fallback ("ember-go") and gonum's Sgemm ("gonum"),
// reporting GFLOP/s (2mnk per product).
func BenchmarkSgemm(b *testing.B) {
	shapes := append(append([]shape(nil), lenetShapes...), shape{false, false, 512, 512, 512})
	trans := func(t bool) blas.Transpose {
		if t {
			return blas.Trans
		}
		return blas.NoTrans
	}
	impls := []struct {
		name string
		f    func(*problem)
	}{
		{"ember", func(p *problem) {
			Sgemm(p.transA, p.transB, p.m, p.n, p.k, p.alpha, p.a, p.lda, p.b, p.ldb, p.beta, p.c, p.ldc)
		}},
		{"ember-go", func(p *problem) {
			saved := useAsm
			useAsm = false
			Sgemm(p.transA, p.transB, p.m, p.n, p.k, p.alpha, p.a, p.lda, p.b, p.ldb, p.beta, p.c, p.ldc)
			useAsm = saved
		}},
		{"gonum", func(p *problem) {
			gonum.Implementation{}.Sgemm(trans(p.transA), trans(p.transB), p.m, p.n, p.k, p.alpha, p.a, p.lda, p.b, p.ldb, p.beta, p.c, p.ldc)
		}},
	}
	rng := rand.New(rand.NewPCG(1, 1))
	for _, s := range shapes {
		p := newProblem(rng, s, 1, 0, 0)
		for _, impl := range impls {
			b.Run(s.String()+"/"+impl.name, func(b *testing.B) {
				for b.Loop() {
					impl.f(p)
				}
				b.ReportMetric(2*float64(s.m*s.n*s.k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}

// BenchmarkKernel times the assembly micro-kernel alone on L1-resident
// panels (kc = 256): the single-core ceiling of the whole algorithm.
func BenchmarkKernel(b *testing.B) {
	if !hasAVX2FMA {
		b.Skip("no assembly kernel")
	}
	rng := rand.New(rand.NewPCG(1, 1))
	ap := aligned(mr * kc)
	bp := aligned(nr * kc)
	copy(ap, randSlice(rng, len(ap)))
	copy(bp, randSlice(rng, len(bp)))
	c := aligned(mr * nr)
	for b.Loop() {
		kernel6x16(kc, mr, &ap[0], &bp[0], 4*nr, &c[0], nr, 1, 1)
	}
	b.ReportMetric(2*float64(mr*nr*kc)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

// BenchmarkKernelGeneric is BenchmarkKernel for the pure-Go micro-kernel.
func BenchmarkKernelGeneric(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	ap := aligned(mr * kc)
	bp := aligned(nr * kc)
	copy(ap, randSlice(rng, len(ap)))
	copy(bp, randSlice(rng, len(bp)))
	c := aligned(mr * nr)
	for b.Loop() {
		kernelGeneric(kc, mr, &ap[0], &bp[0], 4*nr, &c[0], nr, 1, 1)
	}
	b.ReportMetric(2*float64(mr*nr*kc)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}
