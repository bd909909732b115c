package cuda

import (
	"fmt"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// TestGPULinearTiledMatchesCuBLAS runs the tiled linear kernels (linear.cu:
// split sums through clusters where the GPU has them, and through the
// workspace and counters) and the cuBLAS path (EMBER_LINEAR_TILED=0's:
// products, then the bias, ReLU and mask passes) on the same inputs and
// wants the same bits: the inputs are multiples of 1/4 and make every sum
// exact in any order. The shapes cover LeNet's fc1 at batch 64 (sums split
// over blocks both ways) and the largest tiled batch, tiles cut by every
// edge, each gradient alone or left out, written or added to, splits that
// get no slices, and sums shorter than one slice. Each tiled launch runs twice: the split sums' counters must be back
// at zero after the first.
func TestGPULinearTiledMatchesCuBLAS(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	h := &gpuCPU{t: t, g: b}
	defer h.free()
	// grads: which of dx, dw, db are wanted; acc: whether each is added to
	// (else written).
	type which struct{ dx, dw, db bool }
	all := which{true, true, true}
	for _, c := range []struct {
		n, in, out int
		relu, bias bool
		grads, acc which
	}{
		{64, 800, 500, true, true, all, which{false, true, true}},
		{256, 800, 500, true, true, all, which{false, true, true}},
		{200, 96, 300, true, true, all, which{true, false, true}},
		{200, 96, 300, false, false, all, which{false, true, false}},
		{70, 130, 90, true, true, which{false, true, true}, all},
		{65, 33, 129, true, true, which{true, false, false}, all},
		{64, 272, 96, true, true, which{false, false, true}, all}, // db alone; 17 slices: empty splits
		{3, 1000, 2, true, false, all, which{}},
		{130, 7, 3, true, true, all, all},
	} {
		name := fmt.Sprintf("%dx%d·%dx%d relu=%v bias=%v grads=%v acc=%v", c.n, c.in, c.in, c.out, c.relu, c.bias, c.grads, c.acc)
		gx, _ := h.f32(gridRandom(c.n*c.in, 1))
		gw, _ := h.f32(gridRandom(c.out*c.in, 2))
		var gbias tensor.Buffer
		if c.bias {
			gbias, _ = h.f32(gridRandom(c.out, 3))
		}
		gg, _ := h.f32(gridRandom(c.n*c.out, 4))
		run := func(off, noClusters bool) [][]float32 {
			b.noLinearTiled, b.noClusters = off, noClusters
			defer func() { b.noLinearTiled, b.noClusters = false, false }()
			gy, _ := h.f32(make([]float32, c.n*c.out))
			b.Linear(gy, gx, gw, gbias, c.n, c.in, c.out, c.relu)
			var mask tensor.Buffer
			if c.relu {
				mask = gy
			}
			// Gradients start from grid values, so that writing and adding
			// differ.
			var gdx, gdw, gdb tensor.Buffer
			if c.grads.dx {
				gdx, _ = h.f32(gridRandom(c.n*c.in, 5))
			}
			if c.grads.dw {
				gdw, _ = h.f32(gridRandom(c.out*c.in, 6))
			}
			if c.grads.db {
				gdb, _ = h.f32(gridRandom(c.out, 7))
			}
			b.LinearGrads(gdx, gdw, gdb, gg, mask, gx, gw, c.n, c.in, c.out, c.acc.dx, c.acc.dw, c.acc.db)
			var out [][]float32
			for _, buf := range []tensor.Buffer{gy, gdx, gdw, gdb} {
				if !buf.Empty() {
					out = append(out, downloadF(b, buf))
				}
			}
			return out
		}
		ref := run(true, false)
		for _, v := range []struct {
			name string
			got  [][]float32
		}{{"tiled", run(false, false)}, {"tiled again", run(false, false)}, {"tiled without clusters", run(false, true)}, {"again without clusters", run(false, true)}} {
			for i := range ref {
				if !sameBits(v.got[i], ref[i]) {
					j := firstDiff(v.got[i], ref[i])
					t.Errorf("%s, %s: result %d (y, dx, dw, db: those wanted) differs from the cuBLAS path: [%d] %g, want %g", name, v.name, i, j, v.got[i][j], ref[i][j])
				}
			}
		}
	}
}

// BenchmarkGPULinear times LeNet's fc1 at batch 64 (64 x in x 500, ReLU)
// on the tiled kernels and on the cuBLAS path, forward and backward (mask,
// dx, dw, db), for several input widths: how the time grows with the sum's
// length separates the launch's fixed cost from the cost per slice. Each
// iteration is queued behind the previous one, so the time per iteration
// is the kernel's (or the launch's, about 4.5 µs, when that is longer).
//
//	go test -run XXX -bench GPULinear ./cuda
func BenchmarkGPULinear(b *testing.B) {
	g := newGPUBackend(b, BackendOptions{})
	const n, out = 64, 500
	for _, in := range []int{128, 256, 512, 800, 1600, 3200} {
		bufs := make([]tensor.Buffer, 8)
		for i, size := range []int{n * in, out * in, out, n * out, n * out, n * in, out * in, out} {
			buf, err := g.Alloc(size, tensor.Float32)
			if err != nil {
				b.Fatal(err)
			}
			g.Upload(buf, gridRandom(size, uint32(i+1)))
			bufs[i] = buf
		}
		x, w, bias, y, dy, dx, dw, db := bufs[0], bufs[1], bufs[2], bufs[3], bufs[4], bufs[5], bufs[6], bufs[7]
		for _, path := range []string{"tiled", "cublas"} {
			g.noLinearTiled = path == "cublas"
			b.Run(fmt.Sprintf("in=%d/%s/forward", in, path), func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					g.Linear(y, x, w, bias, n, in, out, true)
				}
				if err := g.Synchronize(); err != nil {
					b.Fatal(err)
				}
			})
			b.Run(fmt.Sprintf("in=%d/%s/backward", in, path), func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					g.LinearGrads(dx, dw, db, dy, y, x, w, n, in, out, false, true, true)
				}
				if err := g.Synchronize(); err != nil {
					b.Fatal(err)
				}
			})
		}
		g.noLinearTiled = false
		for _, buf := range bufs {
			g.Free(buf)
		}
	}
}
