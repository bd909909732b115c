package parallel

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// mlp is the small model of the data-parallel tests: Linear, ReLU, Linear.
type mlp struct {
	Hidden, Out *nn.Linear
}

func (m *mlp) Forward(x *tensor.Tensor) *tensor.Tensor {
	return m.Out.Forward(tensor.ReLU(m.Hidden.Forward(x)))
}

const (
	ddpFeatures = 5
	ddpClasses  = 3
	ddpSamples  = 48
	ddpSeed     = 7
)

// ddpData is a fixed random classification set.
func ddpData() (x []float32, y []int32) {
	rng := rand.New(rand.NewPCG(11, 12))
	x = make([]float32, ddpSamples*ddpFeatures)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	y = make([]int32, ddpSamples)
	for i := range y {
		y[i] = int32(rng.IntN(ddpClasses))
	}
	return x, y
}

// trainRank trains the mlp as rank c.Rank() of c.Size() for steps steps of
// the global batch: its model starts from a seed of its own (rank 0's
// wins through BroadcastParameters), it takes batch/size samples of its
// shard per step, and it returns its parameters at the end. c nil is the
// single-process reference.
func trainRank(c Communicator, b tensor.Backend, batch, steps int, bucketBytes int) ([][]float32, error) {
	return trainRankOverlap(c, b, batch, steps, bucketBytes, false)
}

// trainRankOverlap is trainRank, with the all-reduces started from the
// backward pass (DataParallel.Overlap) when overlap is set.
func trainRankOverlap(c Communicator, b tensor.Backend, batch, steps int, bucketBytes int, overlap bool) ([][]float32, error) {
	return trainRankWith(c, b, batch, steps, bucketBytes, overlap, false)
}

// trainRankWith is trainRankOverlap with the model's forward pass run
// through tensor.Recompute when recompute is set (the mid-pass check of
// the buckets is then left out: the parameters' gradients all become final
// when the recomputed pass is through).
func trainRankWith(c Communicator, b tensor.Backend, batch, steps int, bucketBytes int, overlap, recompute bool) ([][]float32, error) {
	rank, world := 0, 1
	if c != nil {
		rank, world = c.Rank(), c.Size()
	}
	seed := uint64(1)
	if rank != 0 {
		seed = uint64(1000 + rank) // different on purpose: the broadcast must fix it
	}
	rng := rand.New(rand.NewPCG(seed, 2))
	m := &mlp{Hidden: nn.NewLinear(b, rng, ddpFeatures, 16), Out: nn.NewLinear(b, rng, 16, ddpClasses)}
	params := nn.Parameters(m)
	opt, err := optim.NewSGD(params, optim.SGDConfig{LR: 0.2, Momentum: 0.9, WeightDecay: 1e-3})
	if err != nil {
		return nil, err
	}
	var dp *DataParallel
	if c != nil {
		if dp, err = NewDataParallel(c, params, DataParallelOptions{BucketBytes: bucketBytes}); err != nil {
			return nil, err
		}
		if err := dp.BroadcastParameters(); err != nil {
			return nil, err
		}
		if overlap {
			if err := dp.Overlap(); err != nil {
				return nil, err
			}
			defer dp.StopOverlap()
		}
	}
	sh, err := NewSharder(ddpSamples, rank, world, ddpSeed)
	if err != nil {
		return nil, err
	}
	x, y := ddpData()
	local := batch / world
	perEpoch := sh.Len() / local
	opt.ZeroGrad()
	for step := range steps {
		epoch, k := step/perEpoch, step%perEpoch
		idx, err := sh.Indices(epoch)
		if err != nil {
			return nil, err
		}
		bx := make([]float32, 0, local*ddpFeatures)
		by := make([]int32, 0, local)
		for _, i := range idx[k*local : (k+1)*local] {
			bx = append(bx, x[i*ddpFeatures:(i+1)*ddpFeatures]...)
			by = append(by, y[i])
		}
		s := tensor.NewScope()
		xb := tensor.FromFloat32(b, s, bx, local, ddpFeatures)
		var logits *tensor.Tensor
		launchedMid := -1
		if recompute {
			logits = tensor.Recompute(func(in ...*tensor.Tensor) *tensor.Tensor { return m.Forward(in[0]) }, xb)
			if dp != nil && overlap {
				dp.BeginGradients()
			}
		} else if dp != nil && overlap {
			// A probe of ones between the layers (exact: the values and
			// gradients are unchanged) whose gradient is ready once the
			// backward pass is through Out and before Hidden: by then
			// Out's buckets have started, Hidden's not.
			probe := tensor.Full(b, s, 1, local, 16).SetRequiresGrad(true)
			probe.SetGradReadyHook(func(*tensor.Tensor) { launchedMid = dp.Launched() })
			logits = m.Out.Forward(tensor.Mul(tensor.ReLU(m.Hidden.Forward(xb)), probe))
			dp.BeginGradients()
		} else {
			logits = m.Forward(xb)
		}
		loss := nn.CrossEntropyLoss(logits, tensor.FromInt32(b, s, by, local))
		loss.Backward()
		s.Release()
		if dp != nil {
			if overlap && !recompute {
				early := outOnlyBuckets(dp, len(nn.Parameters(m.Hidden)))
				if early == 0 && len(dp.Buckets()) > 1 {
					return nil, fmt.Errorf("%d buckets, none of Out's gradients alone: the mid-pass check checks nothing", len(dp.Buckets()))
				}
				if launchedMid != early {
					return nil, fmt.Errorf("step %d: %d of %d buckets started when the backward pass reached Hidden; want the %d holding only Out's gradients", step, launchedMid, len(dp.Buckets()), early)
				}
			}
			if overlap && dp.Launched() != len(dp.Buckets()) {
				return nil, fmt.Errorf("step %d: %d of %d buckets started during the backward pass; all parameters were reached, so all should have", step, dp.Launched(), len(dp.Buckets()))
			}
			if err := dp.FinishGradients(); err != nil {
				return nil, err
			}
		}
		opt.StepAndZeroGrad()
	}
	var out [][]float32
	for _, p := range params {
		out = append(out, p.Tensor.Float32s())
	}
	return out, nil
}

// outOnlyBuckets is the number of leading buckets (in their order) whose
// parameters all come after the first hidden ones: those of the mlp's
// Out layer, final before the backward pass reaches Hidden.
func outOnlyBuckets(dp *DataParallel, hidden int) int {
	n := 0
	for _, b := range dp.Buckets() {
		for _, pi := range b.Params {
			if pi < hidden {
				return n
			}
		}
		n++
	}
	return n
}

// runFake trains on n goroutine ranks of a FakeGroup.
func runFake(t *testing.T, n, batch, steps, bucketBytes int) [][][]float32 {
	t.Helper()
	return runFakeOverlap(t, n, batch, steps, bucketBytes, false)
}

func runFakeOverlap(t *testing.T, n, batch, steps, bucketBytes int, overlap bool) [][][]float32 {
	t.Helper()
	g := NewFakeGroup(n, 20*time.Second)
	out := make([][][]float32, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			out[r], errs[r] = trainRankOverlap(g.Comm(r, tensor.CPU), tensor.CPU, batch, steps, bucketBytes, overlap)
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return out
}

// TestDataParallelMatchesOneRank is the data-parallel contract: N ranks
// with batch B/N each, gradients averaged, take the same steps as one rank
// with batch B.
//
// Why only to a tolerance: the mean loss over B samples is, in exact
// arithmetic, the average over the ranks of the means over their B/N, and
// so are its gradients; in float32 the sums over the batch are grouped
// differently (B/N rows per rank, then N partial results added in rank
// order and divided by N), which moves a gradient element by a few units
// in the last place (relative 6e-8 here). Six steps of SGD with momentum
// carry such differences forward without amplifying them much: the
// parameters differ by at most 6e-8 relative in this test (printed with
// -v). The bound, 1e-6 relative to max(1, |p|), is 16 times that and ten
// thousand times below the change of a parameter in one step (lr 0.2
// times gradients of order 0.05): an unaveraged (summed) gradient or a
// missing broadcast fails it by orders of magnitude. What must hold
// exactly: the ranks end bitwise identical, having applied the same
// averaged gradients to the same broadcast parameters.
func TestDataParallelMatchesOneRank(t *testing.T) {
	const batch, steps = 16, 6 // 48 samples: 3 steps per epoch, 2 epochs
	want, err := trainRank(nil, tensor.CPU, batch, steps, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{2, 4} {
		// A bucket cap of 64 bytes splits the model into several buckets.
		for _, bucketBytes := range []int{0, 64} {
			got := runFake(t, n, batch, steps, bucketBytes)
			for r := 1; r < n; r++ {
				for i := range got[r] {
					for j := range got[r][i] {
						if got[r][i][j] != got[0][i][j] {
							t.Fatalf("N=%d: rank %d parameter %d[%d] = %v, rank 0 has %v: the replicas diverged", n, r, i, j, got[r][i][j], got[0][i][j])
						}
					}
				}
			}
			worst := 0.0
			for i := range want {
				for j := range want[i] {
					d := math.Abs(float64(got[0][i][j]-want[i][j])) / math.Max(1, math.Abs(float64(want[i][j])))
					worst = math.Max(worst, d)
					if d > 1e-6 {
						t.Errorf("N=%d buckets %d: parameter %d[%d] = %.8g, one rank with batch %d gives %.8g", n, bucketBytes, i, j, got[0][i][j], batch, want[i][j])
					}
				}
			}
			t.Logf("N=%d, bucket cap %d bytes: largest relative difference from one rank %.2g", n, bucketBytes, worst)
		}
	}
	// The reference moved: the comparison is not of untrained parameters.
	init, _ := trainRank(nil, tensor.CPU, batch, 0, 0)
	if init[0][0] == want[0][0] {
		t.Error("training did not change the first weight")
	}
}

// With Overlap, each bucket is all-reduced from the backward pass as soon
// as its gradients are final (trainRankOverlap checks that Out's buckets
// started before the pass reached Hidden, and every bucket before
// Backward returned); the sums are the same, in the same
// order, so the parameters are bitwise those of AllReduceGradients after
// backward, and within the tolerance above of one rank with batch B.
func TestDataParallelOverlapMatches(t *testing.T) {
	const batch, steps = 16, 6
	want, err := trainRank(nil, tensor.CPU, batch, steps, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 2, 4} {
		for _, bucketBytes := range []int{0, 64} {
			after := runFake(t, n, batch, steps, bucketBytes)
			got := runFakeOverlap(t, n, batch, steps, bucketBytes, true)
			for r := range n {
				for i := range got[r] {
					for j := range got[r][i] {
						if got[r][i][j] != after[0][i][j] {
							t.Fatalf("N=%d buckets %d: rank %d parameter %d[%d] = %v with overlap, %v without", n, bucketBytes, r, i, j, got[r][i][j], after[0][i][j])
						}
					}
				}
			}
			for i := range want {
				for j := range want[i] {
					if d := math.Abs(float64(got[0][i][j]-want[i][j])) / math.Max(1, math.Abs(float64(want[i][j]))); d > 1e-6 {
						t.Fatalf("N=%d: parameter %d[%d] = %.8g with overlap, one rank of batch %d gives %.8g", n, i, j, got[0][i][j], batch, want[i][j])
					}
				}
			}
		}
	}
}

// With the model recomputed in the backward pass, the overlapped
// all-reduces start from the recomputed pass's gradients (every bucket
// before Backward returns, checked by trainRankWith) and the ranks take
// the same steps, bit for bit, as without recomputation.
func TestDataParallelOverlapRecompute(t *testing.T) {
	const batch, steps, n = 16, 6, 2
	g := NewFakeGroup(n, 20*time.Second)
	want := runFakeOverlap(t, n, batch, steps, 64, true)
	errs := make([]error, n)
	got := make([][][]float32, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			got[r], errs[r] = trainRankWith(g.Comm(r, tensor.CPU), tensor.CPU, batch, steps, 64, true, true)
		})
	}
	wg.Wait()
	for r := range n {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
		for i := range got[r] {
			for j := range got[r][i] {
				if got[r][i][j] != want[r][i][j] {
					t.Fatalf("rank %d parameter %d[%d] = %v recomputed, %v without", r, i, j, got[r][i][j], want[r][i][j])
				}
			}
		}
	}
}

func TestDataParallelBuckets(t *testing.T) {
	g := NewFakeGroup(1, time.Second)
	rng := rand.New(rand.NewPCG(1, 2))
	m := &mlp{Hidden: nn.NewLinear(tensor.CPU, rng, 4, 8), Out: nn.NewLinear(tensor.CPU, rng, 8, 2)}
	params := nn.Parameters(m) // 32 + 8 + 16 + 2 values
	if _, err := NewDataParallel(g.Comm(0, tensor.CPU), params, DataParallelOptions{}); err == nil || !strings.Contains(err.Error(), "create the optimiser") {
		t.Errorf("NewDataParallel before the optimiser: %v", err)
	}
	if _, err := optim.NewSGD(params, optim.SGDConfig{LR: 0.1}); err != nil {
		t.Fatal(err)
	}
	dp, err := NewDataParallel(g.Comm(0, tensor.CPU), params, DataParallelOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// One packed gradient buffer: one bucket, all parameters, last first.
	if bs := dp.Buckets(); len(bs) != 1 || bs[0].Buffer.Len != 58 || fmt.Sprint(bs[0].Params) != "[3 2 1 0]" {
		t.Errorf("buckets %+v, want one of 58 values over [3 2 1 0]", bs)
	}
	// 24 values per bucket: out.bias and out.weight (18), then hidden.bias
	// (8), then hidden.weight (32, over the cap: alone).
	dp, err = NewDataParallel(g.Comm(0, tensor.CPU), params, DataParallelOptions{BucketBytes: 24 * 4})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, b := range dp.Buckets() {
		got = append(got, fmt.Sprintf("%d@%d%v", b.Buffer.Len, b.Buffer.Off, b.Params))
	}
	if s := strings.Join(got, " "); s != "18@40[3 2] 8@32[1] 32@0[0]" {
		t.Errorf("buckets %s, want 18@40[3 2] 8@32[1] 32@0[0]", s)
	}
	// A second optimiser repacks the gradients: the old DataParallel says so.
	if _, err := optim.NewSGD(params, optim.SGDConfig{LR: 0.1}); err != nil {
		t.Fatal(err)
	}
	if err := dp.AllReduceGradients(); err == nil || !strings.Contains(err.Error(), "moved") {
		t.Errorf("AllReduceGradients after a repack: %v", err)
	}
}

// Ranks whose models differ all fail, in NewDataParallel, naming the odd
// rank, instead of hanging or averaging unrelated buffers.
func TestDataParallelModelMismatch(t *testing.T) {
	g := NewFakeGroup(3, 10*time.Second)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for r := range 3 {
		wg.Go(func() {
			hidden := 8
			if r == 2 {
				hidden = 9
			}
			m := &mlp{Hidden: nn.NewLinear(tensor.CPU, nil, 4, hidden), Out: nn.NewLinear(tensor.CPU, nil, hidden, 2)}
			if _, err := optim.NewSGD(nn.Parameters(m), optim.SGDConfig{LR: 0.1}); err != nil {
				errs[r] = err
				return
			}
			_, errs[r] = NewDataParallel(g.Comm(r, tensor.CPU), nn.Parameters(m), DataParallelOptions{})
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "differs from rank 0's on rank(s) 2") || !strings.Contains(err.Error(), fmt.Sprintf("rank %d:", r)) {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

func TestDataParallelBroadcastsBuffers(t *testing.T) {
	errs := onRanks(2, 10*time.Second, func(c *FakeComm) error {
		m := &mlp{Hidden: nn.NewLinear(tensor.CPU, nil, 2, 2), Out: nn.NewLinear(tensor.CPU, nil, 2, 2)}
		if _, err := optim.NewSGD(nn.Parameters(m), optim.SGDConfig{LR: 0.1}); err != nil {
			return err
		}
		stats := tensor.Full(tensor.CPU, nil, float32(c.Rank()+5), 3) // a running mean, say
		dp, err := NewDataParallel(c, nn.Parameters(m), DataParallelOptions{Buffers: []nn.Parameter{{Name: "bn.running_mean", Tensor: stats}}})
		if err != nil {
			return err
		}
		if err := dp.BroadcastParameters(); err != nil {
			return err
		}
		if got := stats.Float32s(); fmt.Sprint(got) != "[5 5 5]" {
			return fmt.Errorf("buffer after the broadcast: %v, want rank 0's [5 5 5]", got)
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}
