package cuda

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ember-ml/ember/models"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// gridRandom returns n multiples of 1/4 in [-2, 2]: products of two are
// multiples of 1/16, so sums of up to 2^18 of them are exact in float32 in
// any order, and two ways of computing a convolution must agree bit for
// bit.
func gridRandom(n int, seed uint32) []float32 {
	return xorshiftValues(n, seed, func(x uint32) float32 { return float32(int32(x%17)-8) / 4 })
}

// TestGPUConvRTMatchesGEMMPath runs the register-tiled kernels (conv_rt.cu)
// and the im2col + GEMM path on the same inputs, on the GPU, at LeNet's
// conv2 with batch 64 and 1024 (where the grids loop over images and the
// weight gradient is split in 128 groups) and at a padded 3x3 layer, and
// wants the same bits: the inputs make every sum exact.
func TestGPUConvRTMatchesGEMMPath(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	h := &gpuCPU{t: t, g: b}
	defer h.free()
	for _, g := range []tensor.ConvGeom{
		{N: 64, C: 20, H: 12, W: 12, K: 50, R: 5, S: 5, StrideH: 1, StrideW: 1},
		{N: 1024, C: 20, H: 12, W: 12, K: 50, R: 5, S: 5, StrideH: 1, StrideW: 1},
		{N: 37, C: 11, H: 10, W: 9, K: 21, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
		{N: 300, C: 8, H: 6, W: 6, K: 40, R: 3, S: 3, StrideH: 1, StrideW: 1}, // 4 lanes per sum
		{N: 5, C: 9, H: 12, W: 13, K: 7, R: 3, S: 3, StrideH: 1, StrideW: 1},  // odd pooled width and height
		{N: 8, C: 8, H: 16, W: 16, K: 12, R: 5, S: 5, StrideH: 1, StrideW: 1}, // the input gradient's warps loop (16 tasks, 9 warps)
	} {
		p := tensor.PoolGeom{N: g.N, C: g.K, H: g.OutH(), W: g.OutW(), KH: 2, KW: 2, StrideH: 2, StrideW: 2}
		c := convShapeOf("test", g)
		if b.rtDW(c, true) == nil || b.rtDX(c, true) == nil || b.rtDW(c, false) == nil || b.rtDX(c, false) == nil || b.rtForward(c, convPoolShapeOf("test", g, p)) == nil {
			t.Fatalf("%s: the register-tiled kernels do not take this geometry", geomName(g))
		}
		yLen := g.N * g.K * p.OutH() * p.OutW()
		gx, _ := h.f32(gridRandom(c.xLen, 1))
		gw, _ := h.f32(gridRandom(c.wLen, 2))
		gbias, _ := h.f32(gridRandom(g.K, 3))
		gdy, _ := h.f32(gridRandom(yLen, 4))
		gdyc, _ := h.f32(gridRandom(c.yLen, 5))
		type result struct {
			y, dx, dw, db, cdx, cdw []float32
			argmax                  []int32
		}
		run := func(off bool) result {
			// The other path is im2col + cuBLAS: cuDNN's sums go in
			// another order.
			dnn := b.dnn
			b.noConvRT = off
			if off {
				b.dnn = nil
			}
			defer func() { b.noConvRT, b.dnn = false, dnn }()
			gy, _ := h.f32(make([]float32, yLen))
			ga, _ := h.i32(make([]int32, yLen))
			b.Conv2dReLUMaxPool(gy, ga, gx, gw, gbias, g, p)
			gdx, _ := h.f32(make([]float32, c.xLen))
			gdw, _ := h.f32(gridRandom(c.wLen, 6)) // dw accumulates
			gdb, _ := h.f32(make([]float32, g.K))
			b.Conv2dReLUMaxPoolBackward(gdx, gdw, gdb, gdy, gx, gw, gy, ga, g, p)
			cdx, _ := h.f32(make([]float32, c.xLen))
			cdw, _ := h.f32(make([]float32, c.wLen))
			b.Conv2dBackward(cdx, cdw, tensor.Buffer{}, gdyc, gx, gw, tensor.Buffer{}, g)
			return result{downloadF(b, gy), downloadF(b, gdx), downloadF(b, gdw), downloadF(b, gdb),
				downloadF(b, cdx), downloadF(b, cdw), downloadI(b, ga)}
		}
		rt, gemm := run(false), run(true)
		for _, cmp := range []struct {
			name string
			a, b []float32
		}{{"y", rt.y, gemm.y}, {"fused dx", rt.dx, gemm.dx}, {"fused dw", rt.dw, gemm.dw}, {"fused db", rt.db, gemm.db},
			{"Conv2dBackward dx", rt.cdx, gemm.cdx}, {"Conv2dBackward dw", rt.cdw, gemm.cdw}} {
			if !sameBits(cmp.a, cmp.b) {
				i := firstDiff(cmp.a, cmp.b)
				t.Errorf("%s: %s differs from the GEMM path: [%d] %g, want %g", geomName(g), cmp.name, i, cmp.a[i], cmp.b[i])
			}
		}
		if !equalI(rt.argmax, gemm.argmax) {
			t.Errorf("%s: argmax differs from the GEMM path", geomName(g))
		}
		h.free()
	}
}

// TestGPUConvRTForwardOneChannel does the same for the forward with one
// input channel (LeNet's conv1), which has no register-tiled backward.
func TestGPUConvRTForwardOneChannel(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	h := &gpuCPU{t: t, g: b}
	defer h.free()
	for _, g := range []tensor.ConvGeom{
		{N: 1024, C: 1, H: 28, W: 28, K: 20, R: 5, S: 5, StrideH: 1, StrideW: 1},
		{N: 300, C: 1, H: 9, W: 10, K: 20, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
	} {
		p := tensor.PoolGeom{N: g.N, C: g.K, H: g.OutH(), W: g.OutW(), KH: 2, KW: 2, StrideH: 2, StrideW: 2}
		c := convShapeOf("test", g)
		if b.rtForward(c, convPoolShapeOf("test", g, p)) == nil {
			t.Fatalf("%s: the register-tiled forward does not take this geometry", geomName(g))
		}
		yLen := g.N * g.K * p.OutH() * p.OutW()
		gx, _ := h.f32(gridRandom(c.xLen, 7))
		gw, _ := h.f32(gridRandom(c.wLen, 8))
		gbias, _ := h.f32(gridRandom(g.K, 9))
		run := func(off bool) ([]float32, []int32) {
			b.noConvRT = off
			defer func() { b.noConvRT = false }()
			gy, _ := h.f32(make([]float32, yLen))
			ga, _ := h.i32(make([]int32, yLen))
			b.Conv2dReLUMaxPool(gy, ga, gx, gw, gbias, g, p)
			return downloadF(b, gy), downloadI(b, ga)
		}
		y1, a1 := run(false)
		y2, a2 := run(true)
		if !sameBits(y1, y2) {
			i := firstDiff(y1, y2)
			t.Errorf("%s: y differs from the fixed kernels: [%d] %g, want %g", geomName(g), i, y1[i], y2[i])
		}
		if !equalI(a1, a2) {
			t.Errorf("%s: argmax differs from the fixed kernels", geomName(g))
		}
		h.free()
	}
}

func firstDiff(a, b []float32) int {
	for i := range a {
		if !sameBits(a[i:i+1], b[i:i+1]) {
			return i
		}
	}
	return 0
}

func geomName(g tensor.ConvGeom) string {
	return "x [" + itoa(g.N) + "," + itoa(g.C) + "," + itoa(g.H) + "," + itoa(g.W) + "] w [" +
		itoa(g.K) + "," + itoa(g.C) + "," + itoa(g.R) + "," + itoa(g.S) + "] pad " + itoa(g.PadH)
}

// TestGPUCapturedStepMatchesEager trains LeNet for a few steps twice,
// eagerly and by replaying one captured step (in which fc2's and conv2's
// weight gradients, and at batch 512 the finish of fc1's bias gradient, run
// on the side stream, parallel branches of the graph),
// and wants the same parameters bit for bit, at batch 64 and at 512 (where
// fc1 goes through cuBLAS). The same for the MLP 784-1024-1024-10 at batch
// 64, where fc3's gradients and fc2's weight gradient (beside its input
// gradient, weightGradsBeside) run on the side stream. Each also as
// trainer.CaptureStep runs it: a first step eager, then the step captured
// with its memory placed by a plan from a rehearsal (CapturePlanned), which
// must follow the plan without a miss; and so again with the update
// StepAndZeroGrad and the gradients cleared after the rehearsal (as the
// trainer runs it; the MLP's are then written over rather than added to
// zeros), against eager steps that clear them the same way, which match
// the first eager steps within float32 roundings.
func TestGPUCapturedStepMatchesEager(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	if b.side == nil {
		t.Log("EMBER_SIDE_STREAM=0: the captured step has no parallel branch")
	}
	lenet := stepNet{name: "LeNet", make: func(b tensor.Backend) (func(x, lab *tensor.Tensor) *tensor.Tensor, []nn.Parameter) {
		m := models.NewLeNet(b, 1)
		return m.Loss, m.Parameters()
	}}
	for _, batch := range []int{64, 512} {
		// fc2's weight gradient, and conv2's backward pass; above 128
		// rows also the finish of fc1's bias gradient.
		lenet.forks = 2
		if batch > 128 {
			lenet.forks = 3
		}
		capturedStepMatchesEager(t, b, batch, lenet)
	}
	// fc3's gradients; fc2's weight gradient beside its input gradient;
	// fc2's bias gradient (its output gradient came masked from fc3's
	// cross entropy).
	mlp := stepNet{name: "MLP", forks: 3, clears: true, make: func(b tensor.Backend) (func(x, lab *tensor.Tensor) *tensor.Tensor, []nn.Parameter) {
		m := models.NewMLP(b, 1, 28*28, 10)
		return func(x, lab *tensor.Tensor) *tensor.Tensor {
			h := m.FC2.ForwardReLU(m.FC1.ForwardReLU(x.Reshape(x.Dim(0), 28*28)))
			return tensor.LinearCrossEntropy(h, m.FC3.Weight, m.FC3.Bias, lab)
		}, m.Parameters()
	}}
	calls := b.ltCalls.Load()
	capturedStepMatchesEager(t, b, 64, mlp)
	if b.lt != nil && b.ltCalls.Load() == calls {
		t.Error("MLP: no cuBLASLt product in its steps")
	}
}

// stepNet is a model for capturedStepMatchesEager: make builds it on a
// backend (its loss and parameters); forks is the number of branches its
// captured step forks to the side stream.
type stepNet struct {
	name  string
	make  func(b tensor.Backend) (func(x, lab *tensor.Tensor) *tensor.Tensor, []nn.Parameter)
	forks int64
	// clears: every gradient is written whole, so that a step whose
	// update is StepAndZeroGrad leaves them cleared (optim's grads.go).
	clears bool
}

func capturedStepMatchesEager(t *testing.T, b *Backend, batch int, net stepNet) {
	const steps, m = 5, 512
	rng := rand.New(rand.NewPCG(5, 6))
	pix := make([]uint8, m*28*28)
	for i := range pix {
		pix[i] = uint8(rng.IntN(256))
	}
	images := tensor.FromUint8(b, nil, pix, m, 1, 28, 28)
	defer images.Release()
	idxs, labs := make([][]int32, steps), make([][]int32, steps)
	for s := range steps {
		idxs[s], labs[s] = make([]int32, batch), make([]int32, batch)
		for i := range batch {
			idxs[s][i], labs[s][i] = int32(rng.IntN(m)), int32(rng.IntN(10))
		}
	}
	// clearedRun is plannedRun as the trainer runs it: StepAndZeroGrad,
	// and the gradients cleared after the rehearsal where its backward
	// pass showed that they are written whole.
	// eagerClearedRun is eagerRun as clearedRun updates.
	const eagerRun, capturedRun, plannedRun, clearedRun, eagerClearedRun = 0, 1, 2, 3, 4
	run := func(mode int) [][]float32 {
		loss, params := net.make(b)
		opt, err := optim.NewSGD(params, optim.SGDConfig{LR: 0.05, Momentum: 0.9})
		if err != nil {
			t.Fatal(err)
		}
		idx := tensor.EmptyOf(b, nil, tensor.Int32, batch)
		lab := tensor.EmptyOf(b, nil, tensor.Int32, batch)
		defer idx.Release()
		defer lab.Release()
		scope := tensor.NewScope()
		defer scope.Release()
		step := func() {
			scope.Reset()
			x := tensor.GatherNormalize(scope, images, idx, 1/(255*0.3081), -0.1307/0.3081)
			l := loss(x, lab)
			if mode >= clearedRun {
				// As the trainer: the update zeroes the gradients, or
				// clears them (optim's grads.go).
				l.Backward()
				opt.StepAndZeroGrad()
				return
			}
			opt.ZeroGrad()
			l.Backward()
			opt.Step()
		}
		if mode >= clearedRun {
			opt.ZeroGrad()
		}
		var g *StepGraph
		for s := range steps {
			b.Upload(idx.Buffer(), idxs[s])
			b.Upload(lab.Buffer(), labs[s])
			if mode == eagerRun || mode == eagerClearedRun || (mode >= plannedRun && s == 0) {
				step()
				if mode == eagerClearedRun && s == 0 {
					opt.ClearGrad() // as clearedRun's capture does
				}
				continue
			}
			if g == nil {
				var forks int64
				if b.side != nil {
					forks = b.side.forks.Load()
				}
				rehearsal := int64(0)
				if mode == capturedRun {
					g, err = b.Capture(step)
				} else {
					g, err = b.CapturePlanned(step, func() {
						if b.side != nil {
							rehearsal = b.side.forks.Load() - forks
							forks += rehearsal // count the real capture's alone
						}
						scope.Reset()
						opt.Rewind()
						if mode == clearedRun {
							for _, p := range params {
								p.Tensor.RestoreGradCleared(false) // as before the rehearsal
							}
							opt.ClearGrad()
						}
					})
				}
				if err != nil {
					t.Fatalf("Capture: %v", err)
				}
				defer g.Close()
				if mode >= plannedRun {
					span, misses, err := g.Planned()
					t.Logf("%s batch %d: planned capture: span %.1f MiB, %d misses, %v", net.name, batch, float64(span)/(1<<20), misses, err)
					if b.PlansGraphMemory() && (err != nil || misses != 0) {
						t.Errorf("%s batch %d: the planned capture: %v, %d requests off the plan; want a plan, no miss", net.name, batch, err, misses)
					}
				}
				if b.side != nil && b.side.forks.Load()-forks != net.forks {
					t.Errorf("%s batch %d (planned %v): the captured step forked %d branches to the side stream, want %d (the rehearsal: %d)",
						net.name, batch, mode == plannedRun, b.side.forks.Load()-forks, net.forks, rehearsal)
				}
			}
			if err := g.Replay(); err != nil {
				t.Fatalf("Replay: %v", err)
			}
			opt.Replayed()
		}
		var out [][]float32
		for _, p := range params {
			out = append(out, downloadF(b, p.Tensor.Buffer()))
			if mode >= clearedRun && p.Tensor.GradCleared() != net.clears {
				t.Errorf("%s batch %d: %s's gradient cleared %v after the replays, want %v", net.name, batch, p.Name, p.Tensor.GradCleared(), net.clears)
			}
		}
		return out
	}
	eager := run(eagerRun)
	eagerCleared := run(eagerClearedRun)
	for i := range eager {
		// Products that write rather than add to zeros may take other
		// algorithms: the same parameters within float32 roundings.
		for j, v := range eager[i] {
			if d := math.Abs(float64(eagerCleared[i][j] - v)); d > 1e-5*(1+math.Abs(float64(v))) {
				t.Errorf("%s batch %d: parameter %d [%d] is %g with the gradients cleared, %g zeroed", net.name, batch, i, j, eagerCleared[i][j], v)
				break
			}
		}
	}
	for _, mode := range []int{capturedRun, plannedRun, clearedRun} {
		replayed := run(mode)
		eager := eager
		if mode == clearedRun {
			eager = eagerCleared
		}
		for i := range eager {
			if !sameBits(eager[i], replayed[i]) {
				j := firstDiff(eager[i], replayed[i])
				t.Errorf("%s batch %d (mode %d): parameter %d after %d steps: replayed [%d] %g, eager %g", net.name, batch, mode, i, steps, j, replayed[i][j], eager[i][j])
			}
		}
	}
}
