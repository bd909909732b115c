package cuda

import (
	"fmt"
	"math"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// TestGPULinearCrossEntropyMatchesUnfused runs ember_linear_xent and the
// unfused path (Linear, CrossEntropy, a product for dx) on the same inputs.
// x and w are multiples of 1/64 and 1/4, so every logit is exact in any
// order of its sum: the logits' gradient must agree bit for bit (the same
// softmax), the loss to rounding (the row losses are added in another
// grouping), dx to a few ulps of its sum. Each fused launch runs twice:
// with several blocks the second must find the blocks' counter back at zero
// and give the same bits. The shapes cover LeNet's fc2 at batch 64 and
// the largest batch taken, one block, 17 and 32 classes, one class, odd
// widths and weights at offsets of 4 and 8 bytes, and rows long enough for
// the kernels that spread a row over a block (the MLP's 1,024 inputs).
func TestGPULinearCrossEntropyMatchesUnfused(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	h := &gpuCPU{t: t, g: b}
	defer h.free()
	for _, c := range []struct {
		n, in, classes, wOff int
		bias                 bool
	}{
		{64, 500, 10, 0, true},
		{1024, 500, 10, 2, true},
		{250, 129, 17, 0, false},
		{8, 64, 32, 1, true},
		{1, 40, 7, 0, true},
		{33, 20, 1, 0, true},
		{70, 130, 10, 2, false},
		// Rows of a block's worth of pieces (ember_linear_xent_c16 and
		// its other forms): float4 pieces, 10 and 20 classes; single
		// floats (w unaligned), 25 classes.
		{64, 1024, 10, 0, true},
		{40, 2048, 20, 0, true},
		{16, 1030, 25, 1, false},
	} {
		name := fmt.Sprintf("%dx%d·%dx%d bias=%v w at +%d", c.n, c.in, c.in, c.classes, c.bias, 4*c.wOff)
		xs := gridRandom(c.n*c.in, 11)
		for i := range xs {
			xs[i] /= 16
		}
		gx, _ := h.f32(xs)
		wAll, _ := h.f32(gridRandom(c.wOff+c.classes*c.in, 12))
		gw := wAll.Slice(c.wOff, c.classes*c.in)
		var gbias tensor.Buffer
		if c.bias {
			gbias, _ = h.f32(gridRandom(c.classes, 13))
		}
		labels := make([]int32, c.n)
		for i := range labels {
			labels[i] = int32((i*7 + 3) % c.classes)
		}
		glab, _ := h.i32(labels)
		fresh := func(n int) tensor.Buffer { buf, _ := h.f32(make([]float32, n)); return buf }

		// Unfused: logits, loss and dlogits, then dx = dlogits·w.
		z, loss, dl, dx := fresh(c.n*c.classes), fresh(1), fresh(c.n*c.classes), fresh(c.n*c.in)
		b.Linear(z, gx, gw, gbias, c.n, c.in, c.classes, false)
		b.CrossEntropy(loss, dl, z, glab, c.n, c.classes)
		b.MatMul(dx, dl, gw, c.n, c.in, c.classes, false, false, 1, 0)
		want := [][]float32{downloadF(b, loss), downloadF(b, dl), downloadF(b, dx)}

		var first []float32
		// Runs 0 and 1 as they are; run 2 with dx through x's ReLU mask.
		for run := 0; run < 3; run++ {
			reluX := run == 2
			floss, fdl, fdx := fresh(1), fresh(c.n*c.classes), fresh(c.n*c.in)
			if !b.LinearCrossEntropy(floss, tensor.Buffer{}, fdl, fdx, gx, gw, gbias, glab, c.n, c.in, c.classes, reluX) {
				t.Fatalf("%s: the fused kernel declined", name)
			}
			got := [][]float32{downloadF(b, floss), downloadF(b, fdl), downloadF(b, fdx)}
			if l, w := got[0][0], want[0][0]; math.Abs(float64(l-w)) > 1e-6*math.Max(1, math.Abs(float64(w))) {
				t.Errorf("%s, run %d: loss %g, unfused %g", name, run, l, w)
			}
			if run == 0 {
				first = got[0]
			} else if !sameBits(got[0], first) {
				t.Errorf("%s: the second launch's loss %g differs from the first's %g", name, got[0][0], first[0])
			}
			if !sameBits(got[1], want[1]) {
				i := firstDiff(got[1], want[1])
				t.Errorf("%s, run %d: dlogits[%d] = %g, unfused %g", name, run, i, got[1][i], want[1][i])
			}
			for i, v := range got[2] {
				w := want[2][i]
				if reluX && !(xs[i] > 0) {
					w = 0
				}
				if math.Abs(float64(v-w)) > 1e-5 || reluX && w == 0 && v != 0 {
					t.Errorf("%s, run %d (reluX %v): dx[%d] = %g, unfused %g", name, run, reluX, i, v, w)
					break
				}
			}
		}
		// Without gradients, added into a running sum: the same loss.
		floss, fsum := fresh(1), fresh(1)
		b.Upload(fsum, []float32{0.5})
		b.LinearCrossEntropy(floss, fsum, tensor.Buffer{}, tensor.Buffer{}, gx, gw, gbias, glab, c.n, c.in, c.classes, false)
		if got := downloadF(b, floss); !sameBits(got, first) {
			t.Errorf("%s: the loss without gradients %g differs from the loss with them %g", name, got[0], first[0])
		}
		if got, want := downloadF(b, fsum)[0], 0.5+first[0]; got != want {
			t.Errorf("%s: running sum 0.5 + loss = %g, want %g", name, got, want)
		}
	}
	// Sizes the kernel does not take.
	one, _ := h.f32([]float32{0})
	if b.LinearCrossEntropy(one, tensor.Buffer{}, tensor.Buffer{}, tensor.Buffer{}, one, one, tensor.Buffer{}, tensor.Buffer{}, 1, 1, narrowOut+1, false) {
		t.Errorf("the fused kernel took %d classes", narrowOut+1)
	}
	if b.LinearCrossEntropy(one, tensor.Buffer{}, tensor.Buffer{}, tensor.Buffer{}, one, one, tensor.Buffer{}, tensor.Buffer{}, xentRows+1, 0, 2, false) {
		t.Errorf("the fused kernel took %d rows", xentRows+1)
	}
}

// TestGPULinearGradsNarrowMatchesCuBLAS runs ember_linear_grads_narrow and
// the general path (ember_linear_grads_small for small layers without a
// ReLU, else cuBLAS) on grid inputs (every sum exact in any order, so the
// results must agree bit for bit): LeNet's fc2 at batch 64 and 256 (and
// 1024 for the weight gradients alone), the ReLU's mask, 17 to 32 outputs,
// each gradient alone or left out, written or added to, and ragged tiles.
func TestGPULinearGradsNarrowMatchesCuBLAS(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	h := &gpuCPU{t: t, g: b}
	defer h.free()
	type which struct{ dx, dw, db bool }
	all := which{true, true, true}
	for _, c := range []struct {
		n, in, out int
		relu       bool
		grads, acc which
	}{
		{64, 500, 10, false, all, which{false, true, true}},
		{256, 500, 10, false, which{false, true, true}, which{}},
		{1024, 500, 10, false, which{false, true, true}, which{false, true, false}},
		{250, 40, 20, true, all, all},
		{7, 33, 32, true, which{true, false, true}, which{true, false, false}},
		{45, 70, 17, false, which{false, false, true}, all},
		{5, 1, 3, true, which{true, true, false}, which{}},
	} {
		name := fmt.Sprintf("%dx%d·%dx%d relu=%v grads=%v acc=%v", c.n, c.in, c.in, c.out, c.relu, c.grads, c.acc)
		gx, _ := h.f32(gridRandom(c.n*c.in, 21))
		gw, _ := h.f32(gridRandom(c.out*c.in, 22))
		gg, _ := h.f32(gridRandom(c.n*c.out, 23))
		var mask tensor.Buffer
		if c.relu {
			mask, _ = h.f32(gridRandom(c.n*c.out, 24))
		}
		if !b.narrowGrads(c.n, c.in, c.out) && c.grads.dx {
			t.Fatalf("%s: not a size linear_grads_narrow takes", name)
		}
		run := func(narrow bool) [][]float32 {
			b.noNarrow, b.noLinearTiled = !narrow, !narrow
			defer func() { b.noNarrow, b.noLinearTiled = false, false }()
			var gdx, gdw, gdb tensor.Buffer
			if c.grads.dx {
				gdx, _ = h.f32(gridRandom(c.n*c.in, 25))
			}
			if c.grads.dw {
				gdw, _ = h.f32(gridRandom(c.out*c.in, 26))
			}
			if c.grads.db {
				gdb, _ = h.f32(gridRandom(c.out, 27))
			}
			b.LinearGrads(gdx, gdw, gdb, gg, mask, gx, gw, c.n, c.in, c.out, c.acc.dx, c.acc.dw, c.acc.db)
			var out [][]float32
			for _, buf := range []tensor.Buffer{gdx, gdw, gdb} {
				if !buf.Empty() {
					out = append(out, downloadF(b, buf))
				}
			}
			return out
		}
		ref, got := run(false), run(true)
		for i := range ref {
			if !sameBits(got[i], ref[i]) {
				j := firstDiff(got[i], ref[i])
				t.Errorf("%s: result %d (dx, dw, db: those wanted) differs from the cuBLAS path: [%d] %g, want %g", name, i, j, got[i][j], ref[i][j])
			}
		}
	}
}

// BenchmarkGPULinearCrossEntropy times ember_linear_xent (loss alone, and
// with the logits' and the input's gradients) and the weight gradients of
// linear_grads_narrow at several batch sizes and widths, launches queued
// back to back: how the time moves with n and in separates fixed costs
// from work.
//
//	go test -run XXX -bench GPULinearCrossEntropy ./cuda
func BenchmarkGPULinearCrossEntropy(b *testing.B) {
	g := newGPUBackend(b, BackendOptions{})
	const classes = 10
	for _, d := range [][2]int{{8, 500}, {64, 16}, {64, 500}, {64, 2000}, {1024, 500}} {
		n, in := d[0], d[1]
		bufs := make([]tensor.Buffer, 7)
		for i, size := range []int{n * in, classes * in, classes, 1, n * classes, n * in, classes * in} {
			buf, err := g.Alloc(size, tensor.Float32)
			if err != nil {
				b.Fatal(err)
			}
			g.Upload(buf, gridRandom(size, uint32(i+1)))
			bufs[i] = buf
		}
		labels, err := g.Alloc(n, tensor.Int32)
		if err != nil {
			b.Fatal(err)
		}
		g.Upload(labels, make([]int32, n))
		x, w, bias, loss, dl, dx, dw := bufs[0], bufs[1], bufs[2], bufs[3], bufs[4], bufs[5], bufs[6]
		for _, c := range []struct {
			name string
			run  func()
		}{
			{"loss", func() {
				g.LinearCrossEntropy(loss, tensor.Buffer{}, tensor.Buffer{}, tensor.Buffer{}, x, w, bias, labels, n, in, classes, false)
			}},
			{"loss+dlogits", func() {
				g.LinearCrossEntropy(loss, tensor.Buffer{}, dl, tensor.Buffer{}, x, w, bias, labels, n, in, classes, false)
			}},
			{"loss+dlogits+dx", func() { g.LinearCrossEntropy(loss, tensor.Buffer{}, dl, dx, x, w, bias, labels, n, in, classes, false) }},
			{"dw+db", func() {
				g.LinearGrads(tensor.Buffer{}, dw, bias, dl, tensor.Buffer{}, x, w, n, in, classes, false, true, true)
			}},
		} {
			b.Run(fmt.Sprintf("n=%d/in=%d/%s", n, in, c.name), func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					c.run()
				}
				if err := g.Synchronize(); err != nil {
					b.Fatal(err)
				}
			})
		}
		for _, buf := range append(bufs, labels) {
			g.Free(buf)
		}
	}
}
