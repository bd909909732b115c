package tensortest

import (
	"math"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// The suite tests itself: a backend that is the CPU behind a wrapper (so
// that RunAutograd takes its compare-with-the-CPU path) must pass, and
// backends with one deliberate, realistic bug each must fail, with a
// message naming the operation.

// wrapped is the CPU backend under another identity.
type wrapped struct{ tensor.CompleteBackend }

func (wrapped) Name() string { return "wrapped-cpu" }

func TestWrappedCPUPassesAutograd(t *testing.T) {
	RunAutograd(t, wrapped{tensor.Complete(tensor.CPU)})
}

// fusedLinear is the CPU behind a tensor.LinearBackend and a
// tensor.LinearCrossEntropyBackend made of its parts, so that the paths of
// tensor.Linear and tensor.LinearCrossEntropy for such backends (the CUDA
// backend's) run here too: their gradients must reach the same buffers with
// the same accumulate flags.
type fusedLinear struct{ tensor.CompleteBackend }

func (fusedLinear) Name() string { return "cpu-fused-linear" }

func (f fusedLinear) Linear(y, x, w, bias tensor.Buffer, n, in, out int, relu bool) {
	f.MatMul(y, x, w, n, out, in, false, true, 1, 0)
	if !bias.Empty() {
		f.AddBias(y, bias, n, out, 1)
	}
	if relu {
		f.ReLU(y, y)
	}
}

func (f fusedLinear) LinearGrads(dx, dw, db, g, y, x, w tensor.Buffer, n, in, out int, accX, accW, accB bool) {
	beta := func(acc bool) float32 {
		if acc {
			return 1
		}
		return 0
	}
	if !y.Empty() {
		gm, err := f.Alloc(n*out, tensor.Float32)
		if err != nil {
			panic(err)
		}
		defer f.Free(gm)
		f.ReLUBackward(gm, g, y, false)
		g = gm
	}
	if !dx.Empty() {
		f.MatMul(dx, g, w, n, in, out, false, false, 1, beta(accX))
	}
	if !dw.Empty() {
		f.MatMul(dw, g, x, out, in, n, true, false, 1, beta(accW))
	}
	if !db.Empty() {
		f.BiasGrad(db, g, n, out, 1, accB)
	}
}

// LinearCrossEntropy as its parts, for up to 32 classes (beyond, the
// operation's fallback runs).
func (f fusedLinear) LinearCrossEntropy(loss, lossSum, dlogits, dx, x, w, bias, labels tensor.Buffer, n, in, classes int, reluX bool) bool {
	if classes > 32 {
		return false
	}
	z, err := f.Alloc(n*classes, tensor.Float32)
	if err != nil {
		panic(err)
	}
	defer f.Free(z)
	f.Linear(z, x, w, bias, n, in, classes, false)
	f.CrossEntropy(loss, dlogits, z, labels, n, classes)
	if !lossSum.Empty() {
		f.Axpy(lossSum, 1, loss)
	}
	if !dlogits.Empty() && !dx.Empty() {
		f.MatMul(dx, dlogits, w, n, in, classes, false, false, 1, 0)
		if reluX {
			f.ReLUBackward(dx, dx, x, false)
		}
	}
	return true
}

func TestFusedLinearPassesAutograd(t *testing.T) {
	RunAutograd(t, fusedLinear{tensor.Complete(tensor.CPU)})
}

// mutant is the CPU backend with the bug named by bug.
type mutant struct {
	tensor.CompleteBackend
	bug string
}

func (m mutant) Name() string { return "mutant:" + m.bug }

func dl(b tensor.Buffer) []float32 {
	out := make([]float32, b.Len)
	tensor.CPU.Download(out, b)
	return out
}

func (m mutant) Download(dst any, src tensor.Buffer) {
	if m.bug == "download-ignores-offset" && src.Off > 0 {
		src.Off = 0
	}
	m.CompleteBackend.Download(dst, src)
}

func (m mutant) Fill(dst tensor.Buffer, v float32) {
	if m.bug == "fill-one-past-end" && dst.Len > 1 {
		dst.Len++ // writes the guard element after the window
	}
	m.CompleteBackend.Fill(dst, v)
}

func (m mutant) ReLUBackward(dx, dy, y tensor.Buffer, acc bool) {
	if m.bug != "relu-backward-at-zero" {
		m.CompleteBackend.ReLUBackward(dx, dy, y, acc)
		return
	}
	d, g, out := dl(dx), dl(dy), dl(y)
	for i := range d {
		v := g[i]
		if out[i] < 0 { // passes the gradient where y == 0
			v = 0
		}
		if acc {
			d[i] += v
		} else {
			d[i] = v
		}
	}
	tensor.CPU.Upload(dx, d)
}

// tf32 keeps 10 bits of mantissa, as a TF32 tensor core does.
func tf32(s []float32) []float32 {
	out := make([]float32, len(s))
	for i, v := range s {
		out[i] = math.Float32frombits(math.Float32bits(v) &^ 0x1fff)
	}
	return out
}

func (m mutant) MatMul(c, a, b tensor.Buffer, mm, n, k int, ta, tb bool, alpha, beta float32) {
	switch m.bug {
	case "matmul-beta0-reads-c":
		if beta == 0 {
			beta = math.SmallestNonzeroFloat32
		}
	case "matmul-tf32":
		ta32, _ := tensor.CPU.Alloc(a.Len, tensor.Float32)
		tb32, _ := tensor.CPU.Alloc(b.Len, tensor.Float32)
		tensor.CPU.Upload(ta32, tf32(dl(a)))
		tensor.CPU.Upload(tb32, tf32(dl(b)))
		a, b = ta32, tb32
	}
	m.CompleteBackend.MatMul(c, a, b, mm, n, k, ta, tb, alpha, beta)
}

func (m mutant) BiasGrad(db, dy tensor.Buffer, outer, ch, inner int, acc bool) {
	if m.bug == "biasgrad-overwrites" {
		acc = false
	}
	m.CompleteBackend.BiasGrad(db, dy, outer, ch, inner, acc)
}

func (m mutant) Conv2d(y, x, w, bias tensor.Buffer, g tensor.ConvGeom) {
	if m.bug == "conv-square-padding" {
		g.PadW = g.PadH // assumes equal padding on both axes
	}
	if m.bug == "conv-relu-ignored" {
		g.ReLU = false
	}
	m.CompleteBackend.Conv2d(y, x, w, bias, g)
}

func (m mutant) Conv2dBackward(dx, dw, db, dy, x, w, y tensor.Buffer, g tensor.ConvGeom) {
	if m.bug == "conv-backward-dx-accumulates" && !dx.Empty() {
		tmp, _ := tensor.CPU.Alloc(dx.Len, tensor.Float32)
		m.CompleteBackend.Conv2dBackward(tmp, dw, db, dy, x, w, y, g)
		tensor.Complete(tensor.CPU).Axpy(dx, 1, tmp)
		return
	}
	if m.bug == "conv-relu-mask-ignored" {
		g.ReLU = false
	}
	m.CompleteBackend.Conv2dBackward(dx, dw, db, dy, x, w, y, g)
}

func (m mutant) MaxPool2d(y, argmax, x tensor.Buffer, g tensor.PoolGeom) {
	if m.bug != "maxpool-last-tie" {
		m.CompleteBackend.MaxPool2d(y, argmax, x, g)
		return
	}
	in := dl(x)
	oh, ow := g.OutH(), g.OutW()
	out, idx := make([]float32, y.Len), make([]int32, y.Len)
	for p := 0; p < g.N*g.C; p++ {
		for i := 0; i < oh; i++ {
			for j := 0; j < ow; j++ {
				best, at := float32(math.Inf(-1)), 0
				for r := 0; r < g.KH; r++ {
					for s := 0; s < g.KW; s++ {
						pos := (i*g.StrideH+r)*g.W + j*g.StrideW + s
						if v := in[p*g.H*g.W+pos]; v >= best {
							best, at = v, pos
						}
					}
				}
				out[(p*oh+i)*ow+j], idx[(p*oh+i)*ow+j] = best, int32(at)
			}
		}
	}
	tensor.CPU.Upload(y, out)
	tensor.CPU.Upload(argmax, idx)
}

func (m mutant) CrossEntropy(loss, dlogits, logits, labels tensor.Buffer, n, classes int) {
	switch m.bug {
	case "crossentropy-unstable":
		z := dl(logits)
		lab := make([]int32, n)
		tensor.CPU.Download(lab, labels)
		var total float32
		var dz []float32
		if !dlogits.Empty() {
			dz = make([]float32, n*classes)
		}
		for r := 0; r < n; r++ {
			var se float32
			for _, v := range z[r*classes : (r+1)*classes] {
				se += float32(math.Exp(float64(v))) // no max subtracted
			}
			total += float32(math.Log(float64(se))) - z[r*classes+int(lab[r])]
			for c := 0; dz != nil && c < classes; c++ {
				p := float32(math.Exp(float64(z[r*classes+c]))) / se
				if c == int(lab[r]) {
					p--
				}
				dz[r*classes+c] = p / float32(n)
			}
		}
		tensor.CPU.Upload(loss, []float32{total / float32(n)})
		if dz != nil {
			tensor.CPU.Upload(dlogits, dz)
		}
		return
	case "crossentropy-grad-not-mean":
		m.CompleteBackend.CrossEntropy(loss, dlogits, logits, labels, n, classes)
		if !dlogits.Empty() && n > 1 {
			d := dl(dlogits)
			for i := range d {
				d[i] *= float32(n)
			}
			tensor.CPU.Upload(dlogits, d)
		}
		return
	}
	m.CompleteBackend.CrossEntropy(loss, dlogits, logits, labels, n, classes)
}

func (m mutant) Argmax(dst, x tensor.Buffer, rows, cols int) {
	if m.bug != "argmax-last-tie" {
		m.CompleteBackend.Argmax(dst, x, rows, cols)
		return
	}
	z := dl(x)
	out := make([]int32, rows)
	for r := range out {
		for c := 1; c < cols; c++ {
			if z[r*cols+c] >= z[r*cols+int(out[r])] {
				out[r] = int32(c)
			}
		}
	}
	tensor.CPU.Upload(dst, out)
}

func (m mutant) SGD(p, g, v tensor.Buffer, h tensor.SGDStep) {
	if m.bug == "sgd-dampens-first-step" && h.FirstStep && h.Momentum != 0 {
		tensor.CPU.Fill(v, 0) // v = m·0 + (1 − dampening)·d
		h.FirstStep = false
	}
	m.CompleteBackend.SGD(p, g, v, h)
}

func (m mutant) ScaleBy(dst, x, s tensor.Buffer, acc bool) {
	if m.bug == "scaleby-ignores-scale" {
		one, _ := tensor.CPU.Alloc(1, tensor.Float32)
		tensor.CPU.Fill(one, 1)
		s = one
	}
	m.CompleteBackend.ScaleBy(dst, x, s, acc)
}

// TestMutantHelper runs the suite on the mutant named by
// TENSORTEST_MUTANT; it is run in a subprocess by TestSuiteCatchesBugs.
func TestMutantHelper(t *testing.T) {
	bug := os.Getenv("TENSORTEST_MUTANT")
	if bug == "" {
		t.Skip("run by TestSuiteCatchesBugs")
	}
	b := mutant{tensor.Complete(tensor.CPU), bug}
	if os.Getenv("TENSORTEST_MUTANT_AUTOGRAD") != "" {
		RunAutograd(t, b)
	} else {
		RunBackend(t, b)
	}
}

func TestSuiteCatchesBugs(t *testing.T) {
	if testing.Short() {
		t.Skip("subprocesses")
	}
	cases := []struct {
		bug, subtest, message string
		autograd              bool
	}{
		{"download-ignores-offset", "AllocUploadDownload", "round trip", false},
		{"fill-one-past-end", "Fill", "outside the window", false},
		{"relu-backward-at-zero", "ReLUBackward", "ReLUBackward", false},
		{"matmul-beta0-reads-c", "MatMul", "beta=0", false},
		{"matmul-tf32", "MatMul", "out of tolerance", false},
		{"biasgrad-overwrites", "BiasGrad", "accumulate=true", false},
		{"conv-square-padding", "Conv2d", "pad 2,0", false},
		{"conv-backward-dx-accumulates", "Conv2dBackward", "Conv2dBackward dx", false},
		{"conv-relu-mask-ignored", "Conv2dBackward", "Conv2dBackward", false},
		{"conv-relu-ignored", "Conv2d", "Conv2d y", false},
		{"maxpool-last-tie", "MaxPool2d", "ties", false},
		{"crossentropy-unstable", "CrossEntropy", "±300", false},
		{"crossentropy-grad-not-mean", "CrossEntropy", "dlogits", false},
		{"argmax-last-tie", "Argmax", "ties=true", false},
		{"sgd-dampens-first-step", "SGD", "Dampening:0.1", false},
		{"scaleby-ignores-scale", "CrossEntropy/weighted", "gradient of input 0", true},
	}
	for _, c := range cases {
		t.Run(c.bug, func(t *testing.T) {
			group := "Backend"
			if c.autograd {
				group = "Autograd"
			}
			sub := "^" + strings.ReplaceAll(c.subtest, "/", "$/^") + "$"
			cmd := exec.Command(os.Args[0], "-test.run=^TestMutantHelper$/^"+group+"$/"+sub, "-test.count=1")
			cmd.Env = append(os.Environ(), "TENSORTEST_MUTANT="+c.bug)
			if c.autograd {
				cmd.Env = append(cmd.Env, "TENSORTEST_MUTANT_AUTOGRAD=1")
			}
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a backend with bug %q:\n%s", c.bug, out)
			}
			if !strings.Contains(string(out), c.message) || !strings.Contains(string(out), "seed") {
				t.Errorf("bug %q: failure output lacks %q or the seed:\n%s", c.bug, c.message, out)
			}
			if testing.Verbose() {
				lines := strings.Split(string(out), "\n")
				for _, l := range lines {
					if strings.Contains(l, "seed ") && !strings.Contains(l, "tensortest:") {
						t.Logf("caught: %s", strings.TrimSpace(l))
						break
					}
				}
			}
		})
	}
}

// LinearCrossEntropySum adds the loss into its running sum, on the fused
// path and on the fallback, and returns the loss LinearCrossEntropy gives.
func TestLinearCrossEntropySum(t *testing.T) {
	for _, b := range []tensor.Backend{fusedLinear{tensor.Complete(tensor.CPU)}, tensor.CPU} {
		s := tensor.NewScope()
		x := tensor.FromFloat32(b, s, []float32{1, 2, -1, 0.5, 0, 3}, 2, 3)
		w := tensor.FromFloat32(b, s, []float32{0.1, -0.2, 0.3, 0.4, 0.5, -0.6}, 2, 3)
		bias := tensor.FromFloat32(b, s, []float32{0.05, -0.05}, 2)
		labels := tensor.FromInt32(b, s, []int32{1, 0}, 2)
		sum := tensor.FromFloat32(b, s, []float32{1.5}, 1)
		want := tensor.LinearCrossEntropy(x, w, bias, labels).Item()
		got := tensor.LinearCrossEntropySum(x, w, bias, labels, sum).Item()
		if got != want {
			t.Errorf("%s: loss %g, LinearCrossEntropy %g", b.Name(), got, want)
		}
		if total := sum.Item(); total != 1.5+want {
			t.Errorf("%s: running sum %g, want 1.5 + %g", b.Name(), total, want)
		}
		s.Release()
	}
}

// maskTrace is fusedLinear recording, for each LinearGrads, whether it was
// given the ReLU's output to mask with, and for each LinearCrossEntropy
// whether it was asked to mask dx.
type maskTrace struct {
	fusedLinear
	gradsMasks, xentMasks *[]bool
}

func (m maskTrace) LinearGrads(dx, dw, db, g, y, x, w tensor.Buffer, n, in, out int, accX, accW, accB bool) {
	*m.gradsMasks = append(*m.gradsMasks, !y.Empty())
	m.fusedLinear.LinearGrads(dx, dw, db, g, y, x, w, n, in, out, accX, accW, accB)
}

func (m maskTrace) LinearCrossEntropy(loss, lossSum, dlogits, dx, x, w, bias, labels tensor.Buffer, n, in, classes int, reluX bool) bool {
	*m.xentMasks = append(*m.xentMasks, reluX)
	return m.fusedLinear.LinearCrossEntropy(loss, lossSum, dlogits, dx, x, w, bias, labels, n, in, classes, reluX)
}

// An MLP's tail, LinearCrossEntropy(LinearReLU(...)), masks the ReLU's
// gradient once: in the cross entropy's pass, LinearReLU's backward then
// without its output. When another operation adds an unmasked part to the
// ReLU output's gradient, LinearReLU masks again (the gradients' values are
// RunAutograd's reluXentCase; this checks which path ran).
func TestReLUMaskAppliedOnce(t *testing.T) {
	for _, c := range []struct {
		name     string
		extraSum bool
		want     bool // LinearReLU's backward given its output
	}{{"the cross entropy alone", false, false}, {"and a sum of the ReLU's output", true, true}} {
		var gradsMasks, xentMasks []bool
		b := maskTrace{fusedLinear{tensor.Complete(tensor.CPU)}, &gradsMasks, &xentMasks}
		s := tensor.NewScope()
		x := tensor.FromFloat32(b, s, []float32{1, 2, -1, 0.5, 0, 3}, 2, 3)
		w1 := tensor.FromFloat32(b, s, []float32{0.1, -0.2, 0.3, 0.4, 0.5, -0.6, -1, 1, 0.25}, 3, 3).SetRequiresGrad(true)
		b1 := tensor.FromFloat32(b, s, []float32{0.05, -0.05, 0}, 3).SetRequiresGrad(true)
		w2 := tensor.FromFloat32(b, s, []float32{0.3, -0.1, 0.2, 0.7, 0.1, -0.4}, 2, 3).SetRequiresGrad(true)
		labels := tensor.FromInt32(b, s, []int32{1, 0}, 2)
		h := tensor.LinearReLU(x, w1, b1)
		loss := tensor.LinearCrossEntropy(h, w2, nil, labels)
		if c.extraSum {
			loss = tensor.Add(loss, tensor.Sum(h))
		}
		loss.Backward()
		if len(xentMasks) != 1 || !xentMasks[0] {
			t.Errorf("%s: LinearCrossEntropy asked to mask dx: %v, want [true]", c.name, xentMasks)
		}
		// The last call is LinearReLU's (the cross entropy's own is first).
		if len(gradsMasks) != 2 || gradsMasks[1] != c.want {
			t.Errorf("%s: LinearGrads given the ReLU's output: %v, want [false %v]", c.name, gradsMasks, c.want)
		}
		s.Release()
	}
}

// TestCPUChannelsLastAgainstItself runs RunChannelsLast on the CPU, the
// reference itself: every check must hold with nothing rounded apart,
// which keeps the harness's own code running where there is no GPU.
func TestCPUChannelsLastAgainstItself(t *testing.T) {
	RunChannelsLast(t, tensor.CPU)
}
