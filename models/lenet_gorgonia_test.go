package models_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ember-ml/ember/models"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
	G "gorgonia.org/gorgonia"
	gt "gorgonia.org/tensor"
)

// TestLeNetAgainstGorgonia computes LeNet's mean cross-entropy loss and the
// gradients of all 8 parameters twice: with our tensors on the CPU (float32)
// and with gorgonia's symbolic differentiation (G.Grad + a TapeMachine) in
// float64, from the same weights (models.NewLeNet(tensor.CPU, 1)) and the
// same batch. gorgonia is an independent implementation: its own im2col
// convolution (NCHW input, [out,in,kh,kw] kernel, as ours), max pooling
// (MaxPool2D(x, kernel, pad, stride)), ReLU (Rectify), matrix products and
// broadcasting. Its LogSumExp is not usable (it adds the maximum before
// taking the log), so the log-softmax is built here from Max, Exp, Sum and
// Log, stably: log p = (z − m) − log Σ exp(z − m).
//
// Agreement is measured per tensor as max|ours − gorgonia| / max|gorgonia|
// and must be below 1e-4: our float32 computation carries relative errors
// of about 1e-6 (accumulations of at most 800 terms), far below that.
func TestLeNetAgainstGorgonia(t *testing.T) {
	const n = 4
	rng := rand.New(rand.NewPCG(7, 7))
	images := make([]float32, n*28*28)
	for i := range images {
		images[i] = float32(rng.NormFloat64())
	}
	labels := make([]int32, n)
	for i := range labels {
		labels[i] = int32(rng.IntN(10))
	}

	// Ours.
	m := models.NewLeNet(tensor.CPU, 1)
	params := nn.Parameters(m)
	defer func() {
		for _, p := range params {
			if g := p.Tensor.Grad(); g != nil {
				g.Release()
			}
			p.Tensor.Release()
		}
	}()
	s := tensor.NewScope()
	defer s.Release()
	x := tensor.FromFloat32(tensor.CPU, s, images, n, 1, 28, 28)
	loss := tensor.CrossEntropy(m.Forward(x), tensor.FromInt32(tensor.CPU, s, labels, n))
	loss.Backward()
	ourLoss := float64(loss.Item())

	// gorgonia, float64.
	g := G.NewGraph()
	node := func(name string, shape []int, data []float32) *G.Node {
		v := make([]float64, len(data))
		for i, f := range data {
			v[i] = float64(f)
		}
		return G.NewTensor(g, gt.Float64, len(shape), G.WithShape(shape...), G.WithName(name),
			G.WithValue(gt.New(gt.WithShape(shape...), gt.WithBacking(v))))
	}
	// Biases are given the broadcastable shapes (1,K,1,1) and (1,out).
	shapes := map[string][]int{
		"conv1.weight": {20, 1, 5, 5}, "conv1.bias": {1, 20, 1, 1},
		"conv2.weight": {50, 20, 5, 5}, "conv2.bias": {1, 50, 1, 1},
		"fc1.weight": {500, 800}, "fc1.bias": {1, 500},
		"fc2.weight": {10, 500}, "fc2.bias": {1, 10},
	}
	nodes := make([]*G.Node, len(params))
	byName := map[string]*G.Node{}
	for i, p := range params {
		shape, ok := shapes[p.Name]
		if !ok {
			t.Fatalf("unexpected parameter %q", p.Name)
		}
		nodes[i] = node(p.Name, shape, p.Tensor.Float32s())
		byName[p.Name] = nodes[i]
	}
	onehot := make([]float32, n*10)
	for i, y := range labels {
		onehot[i*10+int(y)] = 1.0 / n // the mean over the batch folded in
	}
	gx := node("x", []int{n, 1, 28, 28}, images)
	gy := node("onehot/n", []int{n, 10}, onehot)

	must := func(nd *G.Node, err error) *G.Node {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return nd
	}
	conv := func(in *G.Node, layer string) *G.Node {
		c := must(G.Conv2d(in, byName[layer+".weight"], gt.Shape{5, 5}, []int{0, 0}, []int{1, 1}, []int{1, 1}))
		return must(G.BroadcastAdd(c, byName[layer+".bias"], nil, []byte{0, 2, 3}))
	}
	linear := func(in *G.Node, layer string) *G.Node {
		xw := must(G.Mul(in, must(G.Transpose(byName[layer+".weight"]))))
		return must(G.BroadcastAdd(xw, byName[layer+".bias"], nil, []byte{0}))
	}
	pool := func(in *G.Node) *G.Node {
		return must(G.MaxPool2D(in, gt.Shape{2, 2}, []int{0, 0}, []int{2, 2}))
	}
	h := pool(must(G.Rectify(conv(gx, "conv1"))))         // [n,20,12,12]
	h = pool(must(G.Rectify(conv(h, "conv2"))))           // [n,50,4,4]
	h = must(G.Reshape(h, gt.Shape{n, 800}))              // flatten
	h = must(G.Rectify(linear(h, "fc1")))                 // [n,500]
	z := linear(h, "fc2")                                 // [n,10]
	mx := must(G.Max(z, 1))                               // [n]
	zs := must(G.BroadcastSub(z, mx, nil, []byte{1}))     // z − m
	lse := must(G.Log(must(G.Sum(must(G.Exp(zs)), 1))))   // log Σ exp(z − m)
	logp := must(G.BroadcastSub(zs, lse, nil, []byte{1})) // log softmax
	cost := must(G.Neg(must(G.Sum(must(G.HadamardProd(logp, gy))))))
	if _, err := G.Grad(cost, nodes...); err != nil {
		t.Fatal(err)
	}
	vm := G.NewTapeMachine(g)
	defer vm.Close()
	if err := vm.RunAll(); err != nil {
		t.Fatal(err)
	}

	refLoss := cost.Value().Data().(float64)
	if d := math.Abs(ourLoss-refLoss) / math.Abs(refLoss); d > 1e-4 {
		t.Errorf("loss: ours %.8g, gorgonia %.8g (relative difference %.2g)", ourLoss, refLoss, d)
	}
	t.Logf("loss: ours %.8g, gorgonia %.8g", ourLoss, refLoss)
	for i, p := range params {
		gv, err := nodes[i].Grad()
		if err != nil {
			t.Fatalf("%s: gorgonia gradient: %v", p.Name, err)
		}
		want := gv.Data().([]float64)
		if p.Tensor.Grad() == nil {
			t.Fatalf("%s: no gradient", p.Name)
		}
		got := p.Tensor.Grad().Float32s()
		if len(got) != len(want) {
			t.Fatalf("%s: %d gradient values, gorgonia %d", p.Name, len(got), len(want))
		}
		var maxDiff, maxRef float64
		worst := 0
		for j := range want {
			if d := math.Abs(float64(got[j]) - want[j]); d > maxDiff {
				maxDiff, worst = d, j
			}
			maxRef = math.Max(maxRef, math.Abs(want[j]))
		}
		rel := maxDiff / maxRef
		msg := fmt.Sprintf("%-13s max|ours−gorgonia| / max|gorgonia| = %.2g (max|gorgonia| %.3g)", p.Name, rel, maxRef)
		if maxRef == 0 || rel > 1e-4 {
			t.Errorf("%s; worst element %d: ours %.8g, gorgonia %.8g", msg, worst, got[worst], want[worst])
		} else {
			t.Log(msg)
		}
	}
}
