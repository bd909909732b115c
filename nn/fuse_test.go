package nn_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// fusableNet has every pattern of the fusion table and layers that look
// like them but must not be fused: a pooling with overlapping windows, a
// padded one, a dilated convolution (fused with its ReLU only), a Linear
// followed by another activation.
func fusableNet(b tensor.Backend, rng *rand.Rand) *nn.Sequential {
	return &nn.Sequential{Layers: []nn.Layer{
		{"conv1", nn.NewConv2d(b, rng, 2, 4, 3)}, // 12 -> 10
		{"relu1", nn.ReLU{}},
		{"pool1", nn.NewMaxPool2d(2)}, // -> 5
		{"conv2", nn.NewConv2dWith(b, rng, 4, 6, nn.Conv2dOptions{Kernel: [2]int{3, 3}, Padding: [2]int{1, 1}})}, // -> 5
		{"relu2", &nn.ReLU{}},
		{"pool2", nn.NewMaxPool2dWith(tensor.PoolOptions{Kernel: [2]int{3, 3}, Stride: [2]int{2, 2}})}, // overlapping: -> 2
		{"conv3", nn.NewConv2dWith(b, rng, 6, 6, nn.Conv2dOptions{Kernel: [2]int{1, 1}, Dilation: [2]int{2, 2}, Groups: 2})},
		{"relu3", nn.ReLU{}},
		{"pool3", nn.NewMaxPool2dWith(tensor.PoolOptions{Kernel: [2]int{2, 2}, Padding: [2]int{1, 1}})}, // padded: -> 2
		{"flat", nn.Flatten{}},
		{"fc1", nn.NewLinear(b, rng, 24, 16)},
		{"relu4", nn.ReLU{}},
		{"fc2", nn.NewLinear(b, rng, 16, 12)},
		{"tanh", nn.Tanh{}},
		{"fc3", nn.NewLinear(b, rng, 12, 5)},
		{"ln", nn.NewLayerNorm(b, 5)},
		{"fc4", nn.NewLinear(b, rng, 5, 5)},
	}}
}

func TestFusionPlan(t *testing.T) {
	m := fusableNet(tensor.CPU, rand.New(rand.NewPCG(1, 1)))
	defer releaseState(m)
	want := []string{
		"conv1+relu1+pool1 (conv2d+relu+maxpool2d)",
		"conv2+relu2 (conv2d+relu)",
		"pool2",
		"conv3+relu3 (conv2d+relu)",
		"pool3",
		"flat",
		"fc1+relu4 (linear+relu)",
		"fc2",
		"tanh+fc3 (act+linear)",
		"ln+fc4 (layernorm+linear)",
	}
	if got := m.FusionPlan(); !slices.Equal(got, want) {
		t.Errorf("plan\n%q\nwant\n%q", got, want)
	}
	nn.SetFusion(m, false)
	if got := m.FusionPlan(); len(got) != len(m.Layers) || got[0] != "conv1" {
		t.Errorf("plan with fusion off: %q; want every layer on its own", got)
	}
}

// TestFusionSameResults runs fusableNet fused and unfused on the same
// inputs and parameters: outputs, losses and every gradient must agree to
// 1e-5 (float32 sums in other orders, over at most a few hundred terms;
// a wrong window, a skipped layer or a lost bias is off by far more).
// The backend counts its fused Linear+ReLU calls, so that a plan that
// silently runs nothing fused fails too.
func TestFusionSameResults(t *testing.T) {
	be := &biasReLUCounter{CompleteBackend: tensor.Complete(tensor.CPU)}
	rng := rand.New(rand.NewPCG(7, uint64(len(t.Name()))))
	m := fusableNet(be, rng)
	defer releaseState(m)
	const n = 3
	xs := layerNormals(rng, n*2*12*12)
	labels := make([]int32, n)
	for i := range labels {
		labels[i] = int32(rng.IntN(5))
	}
	type result struct {
		out, loss []float32
		grads     [][]float32
	}
	run := func(fused bool, how string) result {
		nn.SetFusion(m, fused)
		s := tensor.NewScope()
		defer s.Release()
		x := tensor.FromFloat32(be, s, xs, n, 2, 12, 12).SetRequiresGrad(true)
		y := tensor.FromInt32(be, s, labels, n)
		var r result
		r.out = m.Forward(x).Float32s()
		nn.ZeroGrad(m)
		var loss *tensor.Tensor
		switch how {
		case "loss":
			loss = m.CrossEntropyLoss(x, y)
		case "sum":
			sum := tensor.Zeros(be, s, 1)
			sum.CopyFrom([]float32{0.5})
			loss = m.LossSum(x, y, sum)
			if got, want := sum.Float32s()[0], 0.5+loss.Item(); got != want {
				t.Errorf("fused %v: LossSum's running sum is %v, want 0.5 + the loss = %v", fused, got, want)
			}
		}
		r.loss = loss.Float32s()
		loss.Backward()
		r.grads = append(r.grads, x.Grad().Float32s())
		for _, p := range nn.Parameters(m) {
			r.grads = append(r.grads, p.Tensor.Grad().Float32s())
		}
		return r
	}
	for _, how := range []string{"loss", "sum"} {
		be.calls = 0
		want := run(false, how)
		if be.calls != 0 {
			t.Fatalf("%d fused Linear+ReLU calls with fusion off", be.calls)
		}
		got := run(true, how)
		if be.calls != 2 { // one forward pass, one loss: fc1+relu4 in each
			t.Errorf("%s: %d fused Linear+ReLU calls, want 2", how, be.calls)
		}
		sameValues(t, how+": output", got.out, want.out, 1e-5)
		sameValues(t, how+": loss", got.loss, want.loss, 1e-5)
		names := []string{"input"}
		for _, p := range nn.Parameters(m) {
			names = append(names, p.Name)
		}
		for i := range want.grads {
			sameValues(t, how+": gradient of "+names[i], got.grads[i], want.grads[i], 1e-5)
		}
	}
	// The loss is the cross entropy of the output.
	nn.SetFusion(m, true)
	s := tensor.NewScope()
	defer s.Release()
	x := tensor.FromFloat32(be, s, xs, n, 2, 12, 12)
	y := tensor.FromInt32(be, s, labels, n)
	sameValues(t, "CrossEntropyLoss against CrossEntropy(Forward)", m.CrossEntropyLoss(x, y).Float32s(), nn.CrossEntropyLoss(m.Forward(x), y).Float32s(), 1e-6)
}

// TestFusionKeepsState: fusion changes nothing a checkpoint holds.
func TestFusionKeepsState(t *testing.T) {
	m := fusableNet(tensor.CPU, rand.New(rand.NewPCG(1, 1)))
	defer releaseState(m)
	before := stateKeys(m)
	nn.SetFusion(m, false)
	if after := stateKeys(m); !slices.Equal(before, after) {
		t.Errorf("state dict with fusion off %q, on %q", after, before)
	}
	if before[0] != "conv1.weight [4,2,3,3]" || len(before) != 16 {
		t.Errorf("state dict %q", before)
	}
}

// TestNestedFusion: a Sequential inside another is planned by itself and
// its last Linear still takes the fused loss.
func TestNestedFusion(t *testing.T) {
	be := &biasReLUCounter{CompleteBackend: tensor.Complete(tensor.CPU)}
	rng := rand.New(rand.NewPCG(3, 3))
	inner := nn.NewSequential(nn.NewLinear(be, rng, 6, 8), nn.ReLU{}, nn.NewLinear(be, rng, 8, 3))
	m := nn.NewSequential(nn.Flatten{}, inner)
	defer releaseState(m)
	s := tensor.NewScope()
	defer s.Release()
	x := tensor.FromFloat32(be, s, layerNormals(rng, 4*6), 4, 2, 3)
	y := tensor.FromInt32(be, s, []int32{0, 2, 1, 2}, 4)
	got := m.CrossEntropyLoss(x, y).Float32s()
	if be.calls != 1 {
		t.Errorf("%d fused Linear+ReLU calls in the nested Sequential, want 1", be.calls)
	}
	nn.SetFusion(m, false)
	if inner.FusionPlan()[0] != "0" {
		t.Errorf("SetFusion did not reach the inner Sequential: %q", inner.FusionPlan())
	}
	sameValues(t, "nested loss", got, m.CrossEntropyLoss(x, y).Float32s(), 1e-6)
}

// biasReLUCounter is the CPU with a fused bias + ReLU (composed of its own
// operations) that counts its forward calls.
type biasReLUCounter struct {
	tensor.CompleteBackend
	calls int
}

func (c *biasReLUCounter) AddBiasReLU(y, bias tensor.Buffer, outer, channels int) {
	c.calls++
	c.CompleteBackend.AddBias(y, bias, outer, channels, 1)
	c.CompleteBackend.ReLU(y, y)
}

func (c *biasReLUCounter) BiasReLUBackward(g, db, dy, y tensor.Buffer, outer, channels int, accumulate bool) {
	c.CompleteBackend.ReLUBackward(g, dy, y, false)
	if !db.Empty() {
		c.CompleteBackend.BiasGrad(db, g, outer, channels, 1, accumulate)
	}
}

// TestPointwiseFusion: activations in a row run as one generated
// expression (on the CPU, tensor.Fused's composed programs: other code
// than the layers' own operations), and a Residual adds its skip
// connection in it; outputs and gradients must match the layers one by
// one to 1e-5.
func TestPointwiseFusion(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	b := tensor.CPU
	block := nn.NewSequential(nn.NewLinear(b, rng, 6, 6), nn.SiLU{}, nn.GELU{Tanh: true})
	m := &nn.Sequential{Layers: []nn.Layer{
		{"fc1", nn.NewLinear(b, rng, 6, 6)},
		{"silu", nn.SiLU{}}, {"tanh", &nn.Tanh{}}, {"gelu", nn.GELU{Tanh: true}}, {"sigmoid", nn.Sigmoid{}}, {"id", nn.Identity{}},
		{"erf", nn.GELU{}}, // exact GELU: not an expression, alone
		{"res", nn.NewResidual(block)},
		{"res2", nn.NewResidual(nn.NewSequential(nn.NewLinear(b, rng, 6, 6), nn.ReLU{}))}, // taken by linear+relu: a plain add
		{"fc2", nn.NewLinear(b, rng, 6, 4)},
	}}
	defer releaseState(m)
	want := []string{"fc1", "silu+tanh+gelu+sigmoid+id (pointwise)", "erf", "res", "res2", "fc2"}
	if got := m.FusionPlan(); !slices.Equal(got, want) {
		t.Errorf("plan %q, want %q", got, want)
	}
	if got := block.FusionPlan(); !slices.Equal(got, []string{"0", "1+2 (pointwise)"}) {
		t.Errorf("block plan %q", got)
	}
	xs := layerNormals(rng, 5*6)
	run := func(fused bool) [][]float32 {
		nn.SetFusion(m, fused)
		s := tensor.NewScope()
		defer s.Release()
		x := tensor.FromFloat32(b, s, xs, 5, 6).SetRequiresGrad(true)
		y := m.Forward(x)
		nn.ZeroGrad(m)
		w := tensor.FromFloat32(b, s, layerNormals(rand.New(rand.NewPCG(9, 9)), y.Len()), y.Shape()...)
		tensor.Sum(tensor.Mul(y, w)).Backward()
		out := [][]float32{y.Float32s(), x.Grad().Float32s()}
		for _, p := range nn.Parameters(m) {
			out = append(out, p.Tensor.Grad().Float32s())
		}
		return out
	}
	ref := run(false)
	got := run(true)
	what := []string{"output", "input gradient"}
	for _, p := range nn.Parameters(m) {
		what = append(what, "gradient of "+p.Name)
	}
	for i := range ref {
		sameValues(t, what[i], got[i], ref[i], 1e-5)
	}
}

// A network none of this package's fusions were written for (a token
// mixer: layer norm, a SiLU MLP, a dropout and a residual block around a
// tanh MLP) trains under autocast to the same bits with fusion on and
// off: the layer norm's and the activations' bfloat16 operands are the
// casts the unfused products make, and the loss and every gradient agree
// exactly over three steps of SGD.
func TestFusionAutocastUnseenNet(t *testing.T) {
	build := func() *nn.Sequential {
		rng := rand.New(rand.NewPCG(21, 22))
		return nn.NewSequential(
			nn.NewLayerNorm(tensor.CPU, 24),
			nn.NewLinear(tensor.CPU, rng, 24, 48),
			nn.SiLU{},
			nn.NewLinear(tensor.CPU, rng, 48, 24),
			nn.NewDropout(0.25),
			nn.NewResidual(nn.NewSequential(nn.NewLinear(tensor.CPU, rng, 24, 32), nn.Tanh{}, nn.NewLinear(tensor.CPU, rng, 32, 24))),
			nn.NewLinear(tensor.CPU, rng, 24, 5),
		)
	}
	rng := rand.New(rand.NewPCG(23, 24))
	xs := layerNormals(rng, 6*7*24)
	labels := make([]int32, 6*7)
	for i := range labels {
		labels[i] = int32(rng.IntN(5))
	}
	run := func(fused bool) (losses []float32, grads [][]float32) {
		m := build()
		defer releaseState(m)
		nn.SetFusion(m, fused)
		nn.SetRandomSource(m, tensor.NewGenerator(3))
		if plan := m.FusionPlan(); fused && (plan[0] != "0+1 (layernorm+linear)" || plan[1] != "2+3 (act+linear)") {
			t.Fatalf("plan %q; want layer norm and the SiLU each fused with the linear layer after it", plan)
		}
		for range 3 {
			s := tensor.NewScope()
			s.SetAutocast(tensor.BFloat16)
			s.SetReleaseInBackward(true)
			nn.ZeroGrad(m)
			x := tensor.FromFloat32(tensor.CPU, s, xs, 6, 7, 24)
			logits := m.Forward(x).Reshape(6*7, 5)
			loss := nn.CrossEntropyLoss(logits, tensor.FromInt32(tensor.CPU, s, labels, 6*7))
			losses = append(losses, loss.Item())
			loss.Backward()
			grads = grads[:0]
			for _, p := range nn.Parameters(m) {
				g := p.Tensor.Grad().Float32s()
				grads = append(grads, g)
				w := p.Tensor.Float32s()
				for i := range w {
					w[i] -= 0.1 * g[i]
				}
				p.Tensor.CopyFrom(w)
			}
			s.Release()
		}
		return losses, grads
	}
	wantLoss, wantGrads := run(false)
	gotLoss, gotGrads := run(true)
	sameValues(t, "losses", gotLoss, wantLoss, 0)
	for i := range wantGrads {
		sameValues(t, fmt.Sprintf("gradient %d", i), gotGrads[i], wantGrads[i], 0)
	}
}

// TestMaxPoolBatchNormFusion: a max pooling with the batch norm after it
// (and its GELU, or none) runs as one operation
// (tensor.MaxPoolBatchNormAct), under autocast's channels-last form and
// without it; the outputs, the running statistics and every gradient are
// those of the same layers with an Identity between the pooling and the
// batch norm (which keeps them apart, batch norm and its GELU still one
// operation), bit for bit, over two training steps.
func TestMaxPoolBatchNormFusion(t *testing.T) {
	b := tensor.CPU
	rng := rand.New(rand.NewPCG(31, 32))
	conv, conv2 := nn.NewConv2d(b, rng, 3, 8, 3), nn.NewConv2d(b, rng, 8, 16, 3)
	conv.Padding, conv2.Padding = 1, 1
	pool1, bn1, pool2, bn2 := nn.NewMaxPool2d(2), nn.NewBatchNorm2d(b, 8), nn.NewMaxPool2d(3), nn.NewBatchNorm2d(b, 16)
	fc := nn.NewLinear(b, rng, 16, 4)
	m := &nn.Sequential{Layers: []nn.Layer{
		{"conv", conv}, {"pool1", pool1}, {"bn1", bn1}, {"gelu", nn.GELU{}},
		{"conv2", conv2}, {"pool2", pool2}, {"bn2", bn2}, {"flat", nn.Flatten{}}, {"fc", fc},
	}}
	apart := &nn.Sequential{Layers: []nn.Layer{
		{"conv", conv}, {"pool1", pool1}, {"id1", nn.Identity{}}, {"bn1", bn1}, {"gelu", nn.GELU{}},
		{"conv2", conv2}, {"pool2", pool2}, {"id2", nn.Identity{}}, {"bn2", bn2}, {"flat", nn.Flatten{}}, {"fc", fc},
	}}
	defer releaseState(m)
	want := []string{"conv", "pool1+bn1+gelu (maxpool2d+batchnorm+act)", "conv2", "pool2+bn2 (maxpool2d+batchnorm+act)", "flat", "fc"}
	if got := m.FusionPlan(); !slices.Equal(got, want) {
		t.Errorf("plan %q, want %q", got, want)
	}
	if got := apart.FusionPlan(); got[3] != "bn1+gelu (batchnorm+act)" {
		t.Errorf("the reference's plan %q does not keep batch norm and GELU one operation", got)
	}
	xs := layerNormals(rng, 4*3*7*7)
	state := nn.StateTensors(m)
	initial := make([][]float32, len(state))
	for i, p := range state {
		initial[i] = p.Tensor.Float32s()
	}
	for _, autocast := range []bool{false, true} {
		run := func(net *nn.Sequential) [][]float32 {
			for i, p := range state {
				b.Upload(p.Tensor.Buffer(), initial[i])
			}
			var out [][]float32
			for step := range 2 {
				s := tensor.NewScope()
				if autocast {
					s.SetAutocast(tensor.BFloat16)
				}
				x := tensor.FromFloat32(b, s, xs, 4, 3, 7, 7).SetRequiresGrad(true)
				y := net.Forward(x)
				nn.ZeroGrad(net)
				w := tensor.FromFloat32(b, s, layerNormals(rand.New(rand.NewPCG(9, uint64(step))), y.Len()), y.Shape()...)
				tensor.Sum(tensor.Mul(y, w)).Backward()
				out = append(out, y.Float32s(), x.Grad().Float32s())
				for _, p := range nn.Parameters(net) {
					out = append(out, p.Tensor.Grad().Float32s())
				}
				s.Release()
			}
			for _, p := range state {
				out = append(out, p.Tensor.Float32s()) // the running statistics and counts
			}
			return out
		}
		ref, got := run(apart), run(m)
		for i := range ref {
			if !slices.Equal(got[i], ref[i]) {
				t.Errorf("autocast %v: result %d differs fused (%v...) from apart (%v...)", autocast, i, got[i][:min(3, len(got[i]))], ref[i][:min(3, len(ref[i]))])
			}
		}
	}
}
