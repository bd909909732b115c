package nn_test

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// BatchNorm1d's running statistics after two training steps, computed by
// hand (momentum 0.1, variance unbiased):
//
//	step 1, channel 0: 1 2 3  → mean 2, var 1   → running 0.2,  1.0
//	        channel 1: 0 0 6  → mean 2, var 12  → running 0.2,  2.1
//	step 2, channel 0: 4 4 7  → mean 5, var 3   → running 0.68, 1.2
//	        channel 1: -3 0 3 → mean 0, var 9   → running 0.18, 2.79
//
// and num_batches_tracked 2. In training the output uses the batch's
// biased variance; in evaluation the running statistics, and nothing is
// updated.
func TestBatchNormRunningStatistics(t *testing.T) {
	bn := nn.NewBatchNorm1d(tensor.CPU, 2)
	defer releaseState(bn)
	s := tensor.NewScope()
	defer s.Release()
	step := func(vals ...float32) *tensor.Tensor { // vals row-major [3, 2]
		return bn.Forward(tensor.FromFloat32(tensor.CPU, s, vals, 3, 2))
	}
	y1 := step(1, 0, 2, 0, 3, 6)
	step(4, -3, 4, 0, 7, 3)
	sameValues(t, "running_mean", bn.RunningMean.Float32s(), []float32{0.68, 0.18}, 1e-6)
	sameValues(t, "running_var", bn.RunningVar.Float32s(), []float32{1.2, 2.79}, 1e-6)
	if got := bn.NumBatchesTracked.Float32s(); !slices.Equal(got, []float32{2}) || len(bn.NumBatchesTracked.Shape()) != 0 {
		t.Errorf("num_batches_tracked %v of shape %v, want 2 of shape []", got, bn.NumBatchesTracked.Shape())
	}
	// Training output of step 1: (x - mean)/√(biased var + eps); channel 0
	// has biased variance 2/3, channel 1 has 8.
	eps := 1e-5
	want := make([]float32, 6)
	in := []float64{1, 0, 2, 0, 3, 6}
	means, vars := []float64{2, 2}, []float64{2.0 / 3, 8}
	for i, v := range in {
		c := i % 2
		want[i] = float32((v - means[c]) / math.Sqrt(vars[c]+eps))
	}
	sameValues(t, "training output", y1.Float32s(), want, 1e-6)

	// Evaluation: the running statistics, with a weight and bias set to
	// show the affine transform; no statistic moves.
	bn.Weight.CopyFrom([]float32{2, 3})
	bn.Bias.CopyFrom([]float32{0.5, -1})
	nn.SetTraining(bn, false)
	if bn.Training() {
		t.Fatal("SetTraining(false) left BatchNorm training")
	}
	x := []float32{1, 2, -1, 0.5, 3, 4}
	y := bn.Forward(tensor.FromFloat32(tensor.CPU, s, x, 3, 2)).Float32s()
	rm, rv, w, b := []float64{0.68, 0.18}, []float64{1.2, 2.79}, []float64{2, 3}, []float64{0.5, -1}
	for i, v := range x {
		c := i % 2
		want[i] = float32((float64(v)-rm[c])/math.Sqrt(rv[c]+eps)*w[c] + b[c])
	}
	sameValues(t, "evaluation output", y, want, 1e-6)
	sameValues(t, "running_mean after evaluation", bn.RunningMean.Float32s(), []float32{0.68, 0.18}, 1e-6)
	if got := bn.NumBatchesTracked.Item(); got != 2 {
		t.Errorf("num_batches_tracked %v after an evaluation step, want 2", got)
	}
	// Training again normalises by the batch: a different output.
	nn.SetTraining(bn, true)
	yt := bn.Forward(tensor.FromFloat32(tensor.CPU, s, x, 3, 2)).Float32s()
	if slices.Equal(yt, y) {
		t.Error("training and evaluation outputs agree")
	}
	if got := bn.NumBatchesTracked.Item(); got != 3 {
		t.Errorf("num_batches_tracked %v after a third training step, want 3", got)
	}
}

// BatchNorm2d's forward is tensor.BatchNorm; its state dict is torch's
// (names and shapes, num_batches_tracked of shape []); the options leave
// out weight and bias (affine=False) or the buffers
// (track_running_stats=False, which uses the batch's statistics in
// evaluation too).
func TestBatchNorm2dLayer(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 1))
	s := tensor.NewScope()
	defer s.Release()
	xv := layerNormals(rng, 4*3*5*5)
	x := tensor.FromFloat32(tensor.CPU, s, xv, 4, 3, 5, 5)

	bn := nn.NewBatchNorm2d(tensor.CPU, 3)
	defer releaseState(bn)
	want := []string{"weight [3]", "bias [3]", "running_mean [3]", "running_var [3]", "num_batches_tracked []"}
	if got := stateKeys(bn); !slices.Equal(got, want) {
		t.Errorf("state dict %v, want %v", got, want)
	}
	sameValues(t, "weight", bn.Weight.Float32s(), []float32{1, 1, 1}, 0)
	sameValues(t, "running_var", bn.RunningVar.Float32s(), []float32{1, 1, 1}, 0)
	rm, rv := tensor.Zeros(tensor.CPU, s, 3), tensor.Full(tensor.CPU, s, 1, 3)
	ref := tensor.BatchNorm(x, bn.Weight, bn.Bias, rm, rv, true, 0.1, 1e-5)
	sameValues(t, "forward", bn.Forward(x).Float32s(), ref.Float32s(), 0)
	sameValues(t, "running_mean", bn.RunningMean.Float32s(), rm.Float32s(), 0)

	plain := nn.NewBatchNorm2dWith(tensor.CPU, 3, nn.BatchNormOptions{NoAffine: true, NoRunningStats: true, Eps: 1e-3})
	if got := stateKeys(plain); len(got) != 0 {
		t.Errorf("affine=False, track_running_stats=False: state %v, want none", got)
	}
	nn.SetTraining(plain, false)
	sameValues(t, "no running statistics in evaluation", plain.Forward(x).Float32s(),
		tensor.BatchNorm(x, nil, nil, nil, nil, true, 0.1, 1e-3).Float32s(), 0)
	panics(t, "want [N, 3, H, W]", func() { bn.Forward(tensor.Zeros(tensor.CPU, s, 4, 3)) })
	panics(t, "want [N, 2] or [N, 2, L]", func() { nn.NewBatchNorm1d(tensor.CPU, 2).Forward(x) })
}

// num_batches_tracked is saved as torch's int64 scalar (I64, shape []) and
// read back into the float32 count; a state dict with another dtype for it
// is refused naming the tensor.
func TestBatchNormCountInSafetensors(t *testing.T) {
	m := nn.NewSequential(nn.NewBatchNorm1d(tensor.CPU, 2))
	defer releaseState(m)
	s := tensor.NewScope()
	defer s.Release()
	for range 3 {
		m.Forward(tensor.FromFloat32(tensor.CPU, s, []float32{1, 2, 3, 5}, 2, 2))
	}
	raw, err := nn.EncodeSafetensors(nn.StateDict(m), nil)
	if err != nil {
		t.Fatal(err)
	}
	f, err := nn.ReadSafetensors("bn.safetensors", raw)
	if err != nil {
		t.Fatal(err)
	}
	c, ok := f.Lookup("0.num_batches_tracked")
	if !ok || c.DType != "I64" || len(c.Shape) != 0 {
		t.Fatalf("0.num_batches_tracked is %+v, want I64 of shape []", c)
	}
	if !bytes.Equal(f.Bytes(c.Name), []byte{3, 0, 0, 0, 0, 0, 0, 0}) {
		t.Errorf("count bytes %v, want int64 3", f.Bytes(c.Name))
	}
	other := nn.NewSequential(nn.NewBatchNorm1d(tensor.CPU, 2))
	defer releaseState(other)
	if err := nn.LoadStateDict(f, other); err != nil {
		t.Fatal(err)
	}
	bn := other.Layers[0].Module.(*nn.BatchNorm1d)
	if got := bn.NumBatchesTracked.Item(); got != 3 {
		t.Errorf("loaded count %v, want 3", got)
	}
	sameValues(t, "loaded running_mean", bn.RunningMean.Float32s(), m.Layers[0].Module.(*nn.BatchNorm1d).RunningMean.Float32s(), 0)

	// A count that is not a whole number cannot be written.
	if _, err := nn.EncodeSafetensors([]nn.NamedTensor{{Name: "bn.num_batches_tracked", Data: []float32{1.5}}}, nil); err == nil {
		t.Error("a count of 1.5 was written")
	}
	// A negative int64 count is refused on loading, by name.
	bad := slices.Clone(raw)
	copy(bad[len(bad)-8:], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	if c.End != int64(len(raw)-8-int(headerLen(raw))) {
		t.Fatalf("the count is not the last tensor of the file (ends at %d)", c.End)
	}
	fb, err := nn.ReadSafetensors("bad.safetensors", bad)
	if err != nil {
		t.Fatal(err)
	}
	if err := nn.LoadStateDict(fb, other); err == nil || !bytes.Contains([]byte(err.Error()), []byte(`"0.num_batches_tracked" holds the count -1`)) {
		t.Errorf("negative count: %v", err)
	}
}

func headerLen(raw []byte) uint64 {
	var n uint64
	for i := 7; i >= 0; i-- {
		n = n<<8 | uint64(raw[i])
	}
	return n
}

// A checkpoint of a model with buffers (the count among them) resumes:
// the fingerprint of the saved state covers the buffers on both sides.
func TestCheckpointWithBatchNorm(t *testing.T) {
	m := nn.NewSequential(nn.NewLinear(tensor.CPU, nil, 2, 2), nn.NewBatchNorm1d(tensor.CPU, 2))
	defer releaseState(m)
	s := tensor.NewScope()
	defer s.Release()
	m.Forward(tensor.FromFloat32(tensor.CPU, s, []float32{1, 2, 3, 5}, 2, 2))
	path := filepath.Join(t.TempDir(), "bn.safetensors")
	if err := nn.SaveCheckpoint(path, m, &nn.TrainingState{Epoch: 1, Step: 1, GlobalStep: 1}); err != nil {
		t.Fatal(err)
	}
	// Saving again over it takes the fingerprint of the file on disk.
	if err := nn.SaveCheckpoint(path, m, &nn.TrainingState{Epoch: 1, Step: 2, GlobalStep: 2}); err != nil {
		t.Fatal(err)
	}
	other := nn.NewSequential(nn.NewLinear(tensor.CPU, rand.New(rand.NewPCG(5, 5)), 2, 2), nn.NewBatchNorm1d(tensor.CPU, 2))
	defer releaseState(other)
	if _, err := nn.LoadCheckpoint(path, other); err != nil {
		t.Fatal(err)
	}
	if got := other.Layers[1].Module.(*nn.BatchNorm1d).NumBatchesTracked.Item(); got != 1 {
		t.Errorf("resumed count %v, want 1", got)
	}
	if !slices.Equal(other.Layers[0].Module.(*nn.Linear).Weight.Float32s(), m.Layers[0].Module.(*nn.Linear).Weight.Float32s()) {
		t.Error("resumed weights differ")
	}
}

// LayerNorm is tensor.LayerNorm over its shape, with torch's init and
// names; without the affine transform it has no state.
func TestLayerNormLayer(t *testing.T) {
	rng := rand.New(rand.NewPCG(12, 1))
	s := tensor.NewScope()
	defer s.Release()
	x := tensor.FromFloat32(tensor.CPU, s, layerNormals(rng, 2*3*4*5), 2, 3, 4, 5)
	ln := nn.NewLayerNorm(tensor.CPU, 4, 5)
	defer releaseState(ln)
	if got, want := stateKeys(ln), []string{"weight [4,5]", "bias [4,5]"}; !slices.Equal(got, want) {
		t.Errorf("state dict %v, want %v", got, want)
	}
	ln.Weight.CopyFrom(layerNormals(rng, 20))
	ln.Bias.CopyFrom(layerNormals(rng, 20))
	sameValues(t, "LayerNorm", ln.Forward(x).Float32s(), tensor.LayerNorm(x, []int{4, 5}, ln.Weight, ln.Bias, 1e-5).Float32s(), 0)
	plain := nn.NewLayerNormWith(tensor.CPU, []int{5}, 1e-3, false)
	if got := stateKeys(plain); len(got) != 0 {
		t.Errorf("elementwise_affine=False: state %v", got)
	}
	sameValues(t, "LayerNorm without affine", plain.Forward(x).Float32s(), tensor.LayerNorm(x, []int{5}, nil, nil, 1e-3).Float32s(), 0)
}

// A BatchNorm2d state dict laid out as safetensors.torch writes it (keys
// sorted, num_batches_tracked an I64 of shape []), built byte by byte here
// rather than by this package's writer, loads into the layer.
func TestBatchNormLoadsTorchLayout(t *testing.T) {
	header := `{"bias":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},` +
		`"num_batches_tracked":{"dtype":"I64","shape":[],"data_offsets":[8,16]},` +
		`"running_mean":{"dtype":"F32","shape":[2],"data_offsets":[16,24]},` +
		`"running_var":{"dtype":"F32","shape":[2],"data_offsets":[24,32]},` +
		`"weight":{"dtype":"F32","shape":[2],"data_offsets":[32,40]}}`
	for len(header)%8 != 0 {
		header += " "
	}
	var file []byte
	file = binary.LittleEndian.AppendUint64(file, uint64(len(header)))
	file = append(file, header...)
	for _, v := range []float32{0.5, -0.5} { // bias
		file = binary.LittleEndian.AppendUint32(file, math.Float32bits(v))
	}
	file = binary.LittleEndian.AppendUint64(file, 1234)     // num_batches_tracked
	for _, v := range []float32{0.1, 0.2, 1.5, 2.5, 3, 4} { // running_mean, running_var, weight
		file = binary.LittleEndian.AppendUint32(file, math.Float32bits(v))
	}
	f, err := nn.ReadSafetensors("torch.safetensors", file)
	if err != nil {
		t.Fatal(err)
	}
	bn := nn.NewBatchNorm2d(tensor.CPU, 2)
	defer releaseState(bn)
	if err := nn.LoadStateDict(f, bn); err != nil {
		t.Fatal(err)
	}
	if got := bn.NumBatchesTracked.Item(); got != 1234 {
		t.Errorf("num_batches_tracked %v, want 1234", got)
	}
	sameValues(t, "bias", bn.Bias.Float32s(), []float32{0.5, -0.5}, 0)
	sameValues(t, "running_var", bn.RunningVar.Float32s(), []float32{1.5, 2.5}, 0)
	sameValues(t, "weight", bn.Weight.Float32s(), []float32{3, 4}, 0)
}
