package models_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ember-ml/ember/cuda"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// gaussianRegressor is a model none of the package's models is: an MLP
// that predicts a mean for each of k outputs, with one learned log-variance
// an output broadcast over the batch, trained by the Gaussian negative log
// likelihood mean(d²·e^(-logvar) + logvar) plus an L2 penalty on the first
// layer's weight, all written with the core's operators. Its loss is a
// whole-tensor mean and sum, whose gradients travel uniform (unfilled)
// through the broadcast Add, Mul and the penalty.
type gaussianRegressor struct {
	l1, l2 *nn.Linear
	logvar *tensor.Tensor // [1, k]
}

func newGaussianRegressor(b tensor.Backend, in, hidden, k int) *gaussianRegressor {
	rng := rand.New(rand.NewPCG(21, 23))
	lv := make([]float32, k)
	for i := range lv {
		lv[i] = float32(0.1 * rng.NormFloat64())
	}
	return &gaussianRegressor{l1: nn.NewLinear(b, rng, in, hidden), l2: nn.NewLinear(b, rng, hidden, k),
		logvar: tensor.FromFloat32(b, nil, lv, 1, k).SetRequiresGrad(true)}
}

func (m *gaussianRegressor) parameters() []nn.Parameter {
	return append(append(nn.Prefixed("l1", m.l1.Parameters()), nn.Prefixed("l2", m.l2.Parameters())...),
		nn.Parameter{Name: "logvar", Tensor: m.logvar})
}

func (m *gaussianRegressor) loss(x, y *tensor.Tensor) *tensor.Tensor {
	s := x.Scope()
	mu := m.l2.Forward(tensor.GELU(m.l1.Forward(x), false))
	d := tensor.Sub(mu, y)
	lv := s.Borrow(m.logvar)
	nll := tensor.MeanAxes(tensor.Add(tensor.Mul(tensor.Mul(d, d), tensor.Exp(tensor.Neg(lv))), lv), []int{0, 1}, false)
	w := s.Borrow(m.l1.Weight)
	return tensor.Add(nll, tensor.MulScalar(tensor.Sum(tensor.Mul(w, w)), 1e-3))
}

// TestUnseenRegressionGPU: gaussianRegressor's loss and every gradient on
// the GPU against the CPU's from the same weights and batch (within 1e-5
// and 1e-4 of each gradient's largest magnitude), and 40 SGD steps on the
// GPU lower its loss by half.
func TestUnseenRegressionGPU(t *testing.T) {
	requireGPU(t)
	b := newGPU(t, cuda.BackendOptions{})
	defer b.Close()
	testRegression(t, b)
}

// TestUnseenRegressionCPU is the same model trained on the CPU alone, and
// its log-variance's gradient (a uniform gradient summed over the batch for
// a broadcast operand) against central differences of the loss: step
// 1e-2, within 1e-3 of the largest.
func TestUnseenRegressionCPU(t *testing.T) {
	testRegression(t, nil)
	const n, in, hidden, k = 64, 12, 48, 5
	rng := rand.New(rand.NewPCG(10, 11))
	x, y := tensor.FromFloat32(tensor.CPU, nil, normals(rng, n*in), n, in), tensor.FromFloat32(tensor.CPU, nil, normals(rng, n*k), n, k)
	m := newGaussianRegressor(tensor.CPU, in, hidden, k)
	s := tensor.NewScope()
	defer s.Release()
	m.loss(s.Borrow(x), s.Borrow(y)).Backward()
	got := m.logvar.Grad().Float32s()
	lv := m.logvar.Float32s()
	var scale, worst float64
	for i := range lv {
		at := func(h float32) float64 {
			v := append([]float32(nil), lv...)
			v[i] += h
			tensor.CopyTensor(m.logvar, tensor.FromFloat32(tensor.CPU, s, v, 1, k))
			ng := tensor.NewNoGradScope()
			defer ng.Release()
			return float64(m.loss(ng.Borrow(x), ng.Borrow(y)).Item())
		}
		const h = 1e-2
		fd := (at(h) - at(-h)) / (2 * h)
		scale = math.Max(scale, math.Abs(fd))
		worst = math.Max(worst, math.Abs(fd-float64(got[i])))
		tensor.CopyTensor(m.logvar, tensor.FromFloat32(tensor.CPU, s, lv, 1, k))
	}
	if worst > 1e-3*math.Max(scale, 1) {
		t.Errorf("logvar's gradient %v differs from central differences by %g (largest %g)", got, worst, scale)
	}
}

func testRegression(t *testing.T, gpu tensor.Backend) {
	const n, in, hidden, k = 256, 12, 48, 5
	rng := rand.New(rand.NewPCG(8, 9))
	xv, noise := normals(rng, n*in), normals(rng, n*k)
	yv := make([]float32, n*k)
	for i := range yv { // a smooth function of the inputs, with noise of another scale an output
		r, c := i/k, i%k
		yv[i] = float32(math.Sin(float64(xv[r*in+c]))+0.5*float64(xv[r*in+c+1])) + float32(c+1)*0.1*noise[i]
	}
	run := func(b tensor.Backend, m *gaussianRegressor) (float32, [][]float32) {
		s := tensor.NewScope()
		defer s.Release()
		for _, p := range m.parameters() {
			p.Tensor.ClearGrad()
		}
		loss := m.loss(tensor.FromFloat32(b, s, xv, n, in), tensor.FromFloat32(b, s, yv, n, k))
		loss.Backward()
		var grads [][]float32
		for _, p := range m.parameters() {
			grads = append(grads, p.Tensor.Grad().Float32s())
		}
		return loss.Item(), grads
	}
	b := tensor.Backend(tensor.CPU)
	m := newGaussianRegressor(b, in, hidden, k)
	if gpu != nil {
		wantLoss, want := run(tensor.CPU, m)
		b = gpu
		m = newGaussianRegressor(b, in, hidden, k)
		loss, got := run(b, m)
		if d := math.Abs(float64(loss - wantLoss)); d > 1e-5*math.Abs(float64(wantLoss)) {
			t.Errorf("loss %v on the GPU, %v on the CPU", loss, wantLoss)
		}
		for i, p := range m.parameters() {
			var scale float64
			for _, v := range want[i] {
				scale = math.Max(scale, math.Abs(float64(v)))
			}
			if d := maxAbsDiff(got[i], want[i]); d > 1e-4*scale {
				t.Errorf("%s's gradient differs by %g (largest magnitude %g)", p.Name, d, scale)
			}
		}
	}
	sgd, err := optim.NewSGD(m.parameters(), optim.SGDConfig{LR: 0.05, Momentum: 0.9})
	if err != nil {
		t.Fatal(err)
	}
	defer sgd.Release()
	first, _ := run(b, m)
	loss := first
	for range 40 {
		sgd.Step()
		loss, _ = run(b, m)
	}
	t.Logf("loss %.5f, %.5f after 40 steps", first, loss)
	if !(float64(loss) < float64(first)-0.5*math.Abs(float64(first))) {
		t.Errorf("loss %v after 40 steps from %v: the regressor does not learn", loss, first)
	}
}
