package nn_test

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// attentionRef is multi-head self-attention in float64, written out: x
// [b, t, c], qkv weight [3c, c] and bias [3c], proj weight [c, c] and
// bias [c].
func attentionRef(x []float64, b, t, c, heads int, causal bool, wqkv, bqkv, wp, bp []float64) []float64 {
	d := c / heads
	qkv := make([]float64, b*t*3*c)
	for r := 0; r < b*t; r++ {
		for o := 0; o < 3*c; o++ {
			s := bqkv[o]
			for k := 0; k < c; k++ {
				s += x[r*c+k] * wqkv[o*c+k]
			}
			qkv[r*3*c+o] = s
		}
	}
	y := make([]float64, b*t*c) // heads' outputs, [b, t, h·d]
	for bi := 0; bi < b; bi++ {
		for h := 0; h < heads; h++ {
			at := func(tt, part, j int) float64 { return qkv[(bi*t+tt)*3*c+part*c+h*d+j] }
			for i := 0; i < t; i++ {
				scores := make([]float64, t)
				m := math.Inf(-1)
				for j := 0; j < t; j++ {
					if causal && j > i {
						scores[j] = math.Inf(-1)
						continue
					}
					for k := 0; k < d; k++ {
						scores[j] += at(i, 0, k) * at(j, 1, k)
					}
					scores[j] /= math.Sqrt(float64(d))
					m = math.Max(m, scores[j])
				}
				sum := 0.0
				for j := range scores {
					scores[j] = math.Exp(scores[j] - m)
					sum += scores[j]
				}
				for k := 0; k < d; k++ {
					v := 0.0
					for j := 0; j < t; j++ {
						v += scores[j] / sum * at(j, 2, k)
					}
					y[(bi*t+i)*c+h*d+k] = v
				}
			}
		}
	}
	out := make([]float64, b*t*c)
	for r := 0; r < b*t; r++ {
		for o := 0; o < c; o++ {
			s := bp[o]
			for k := 0; k < c; k++ {
				s += y[r*c+k] * wp[o*c+k]
			}
			out[r*c+o] = s
		}
	}
	return out
}

func float64s(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// MultiheadSelfAttention against the float64 reference, causal or not,
// and its gradients with respect to x and the qkv weight against central
// finite differences of the reference's Σ out·r (r fixed random):
// float32 forward within 1e-5 relative; gradients within 1e-3·|fd| +
// 1e-4·max|fd| (float32 products over 8 channels, and h = 1e-6 in
// float64 leaves fd error ~1e-9).
func TestMultiheadSelfAttention(t *testing.T) {
	const b, tt, c, heads = 2, 5, 8, 2
	for _, causal := range []bool{false, true} {
		rng := rand.New(rand.NewPCG(13, 1))
		a := nn.NewMultiheadSelfAttention(tensor.CPU, rng, c, heads, causal)
		if got, want := stateKeys(a), []string{"qkv.weight [24,8]", "qkv.bias [24]", "proj.weight [8,8]", "proj.bias [8]"}; !slices.Equal(got, want) {
			t.Fatalf("state dict %v, want %v", got, want)
		}
		s := tensor.NewScope()
		xv := layerNormals(rng, b*tt*c)
		rv := layerNormals(rng, b*tt*c)
		x := tensor.FromFloat32(tensor.CPU, s, xv, b, tt, c).SetRequiresGrad(true)
		y := a.Forward(x)
		if !slices.Equal(y.Shape(), []int{b, tt, c}) {
			t.Fatalf("shape %v", y.Shape())
		}
		wqkv, bqkv := float64s(a.QKV.Weight.Float32s()), float64s(a.QKV.Bias.Float32s())
		wp, bp := float64s(a.Proj.Weight.Float32s()), float64s(a.Proj.Bias.Float32s())
		x64 := float64s(xv)
		ref := attentionRef(x64, b, tt, c, heads, causal, wqkv, bqkv, wp, bp)
		want := make([]float32, len(ref))
		for i, v := range ref {
			want[i] = float32(v)
		}
		sameValues(t, "attention", y.Float32s(), want, 1e-5)

		tensor.Sum(tensor.Mul(y, tensor.FromFloat32(tensor.CPU, s, rv, b, tt, c))).Backward()
		loss := func() float64 {
			out := attentionRef(x64, b, tt, c, heads, causal, wqkv, bqkv, wp, bp)
			sum := 0.0
			for i, v := range out {
				sum += v * float64(rv[i])
			}
			return sum
		}
		for _, p := range []struct {
			name     string
			vals     []float64
			analytic []float32
		}{{"x", x64, x.Grad().Float32s()}, {"qkv.weight", wqkv, a.QKV.Weight.Grad().Float32s()}} {
			fd := make([]float64, len(p.vals))
			maxFD := 0.0
			for i, v := range p.vals {
				const h = 1e-6
				p.vals[i] = v + h
				up := loss()
				p.vals[i] = v - h
				down := loss()
				p.vals[i] = v
				fd[i] = (up - down) / (2 * h)
				maxFD = math.Max(maxFD, math.Abs(fd[i]))
			}
			for i := range fd {
				if math.Abs(float64(p.analytic[i])-fd[i]) > 1e-3*math.Abs(fd[i])+1e-4*maxFD {
					t.Fatalf("causal %v: d/d%s[%d] = %v, finite difference %v", causal, p.name, i, p.analytic[i], fd[i])
				}
			}
		}
		if causal {
			// The first position sees only itself: changing the last one
			// leaves its output alone.
			x2 := slices.Clone(xv)
			for k := 0; k < c; k++ {
				x2[(tt-1)*c+k] += 1
			}
			y2 := a.Forward(tensor.FromFloat32(tensor.CPU, s, x2, b, tt, c)).Float32s()
			sameValues(t, "causal first position", y2[:c], y.Float32s()[:c], 0)
		}
		s.Release()
		releaseState(a)
	}
	panics(t, "multiple of heads", func() { nn.NewMultiheadSelfAttention(tensor.CPU, nil, 10, 4, false) })
}

// A TransformerBlock's state dict is that of the PyTorch Block of the GPT
// benchmark (zoo.py): ln1, ln2, qkv, proj, mlp = Sequential(Linear(C, 4C),
// GELU, Linear(4C, C), Dropout), drop. The keys below are written out by
// hand from that module, in its registration order.
func TestTransformerBlockStateDict(t *testing.T) {
	const c = 16
	blk := nn.NewTransformerBlock(tensor.CPU, nil, c, 4, 0.2)
	defer releaseState(blk)
	want := []string{
		"ln1.weight [16]", "ln1.bias [16]",
		"ln2.weight [16]", "ln2.bias [16]",
		"qkv.weight [48,16]", "qkv.bias [48]",
		"proj.weight [16,16]", "proj.bias [16]",
		"mlp.0.weight [64,16]", "mlp.0.bias [64]",
		"mlp.2.weight [16,64]", "mlp.2.bias [16]",
	}
	if got := stateKeys(blk); !slices.Equal(got, want) {
		t.Errorf("state dict\n got %v\nwant %v", got, want)
	}
	// Torch's init: LayerNorm ones and zeros, Linear within ±1/√fan_in.
	sameValues(t, "ln1.weight", blk.LN1.Weight.Float32s(), slices.Repeat([]float32{1}, c), 0)
	checkInit(t, "qkv.weight", blk.QKV.Weight, c)
	checkInit(t, "mlp.2.weight", blk.MLP.Layers[2].Module.(*nn.Linear).Weight, 4*c)
	// A GPT of two blocks in a Sequential, as zoo.py's blocks.
	gpt := struct {
		Tok, Pos *nn.Embedding
		Blocks   *nn.Sequential
		LN       *nn.LayerNorm
		Head     *nn.Linear
	}{nn.NewEmbedding(tensor.CPU, nil, 65, c), nn.NewEmbedding(tensor.CPU, nil, 8, c),
		nn.NewSequential(nn.NewTransformerBlock(tensor.CPU, nil, c, 4, 0.2), nn.NewTransformerBlock(tensor.CPU, nil, c, 4, 0.2)),
		nn.NewLayerNorm(tensor.CPU, c), nn.NewLinearNoBias(tensor.CPU, nil, c, 65)}
	var names []string
	for _, p := range nn.Parameters(&gpt) {
		names = append(names, p.Name)
	}
	for _, k := range []string{"tok.weight", "pos.weight", "blocks.0.qkv.weight", "blocks.1.mlp.2.bias", "ln.weight", "head.weight"} {
		if !slices.Contains(names, k) {
			t.Errorf("GPT state dict lacks %s: %v", k, names)
		}
	}
	if slices.Contains(names, "head.bias") || len(names) != 2+2*12+2+1 {
		t.Errorf("GPT state dict has %d entries %v, want %d", len(names), names, 2+2*12+2+1)
	}
	for _, p := range nn.StateTensors(&gpt) {
		p.Tensor.Release()
	}
}

// TransformerBlock's forward is x + drop(attn(ln1 x)), then + mlp(ln2 ·),
// composed by hand here from its layers in evaluation mode (dropout off);
// in training mode dropout changes the output, and SetTraining reaches the
// dropout inside mlp.
func TestTransformerBlockForward(t *testing.T) {
	const b, tt, c = 2, 6, 8
	rng := rand.New(rand.NewPCG(14, 1))
	blk := nn.NewTransformerBlock(tensor.CPU, rng, c, 2, 0.5)
	defer releaseState(blk)
	s := tensor.NewScope()
	defer s.Release()
	x := tensor.FromFloat32(tensor.CPU, s, layerNormals(rng, b*tt*c), b, tt, c)
	nn.SetTraining(blk, false)
	mlpDrop := blk.MLP.Layers[3].Module.(*nn.Dropout)
	if blk.Drop.Training() || mlpDrop.Training() {
		t.Fatal("SetTraining(false) did not reach every dropout")
	}
	y := blk.Forward(x)
	lin1, lin2 := blk.MLP.Layers[0].Module.(*nn.Linear), blk.MLP.Layers[2].Module.(*nn.Linear)
	h := tensor.Add(x, blk.Proj.Forward(attentionOf(blk, blk.LN1.Forward(x))))
	want := tensor.Add(h, lin2.Forward(tensor.GELU(lin1.Forward(blk.LN2.Forward(h)), false)))
	sameValues(t, "block", y.Float32s(), want.Float32s(), 1e-6)

	nn.SetTraining(blk, true)
	src := tensor.NewGenerator(3)
	nn.SetRandomSource(blk, src)
	if blk.Drop.Source != src || mlpDrop.Source != src {
		t.Fatal("SetRandomSource did not reach every dropout")
	}
	yt := blk.Forward(x)
	if slices.Equal(yt.Float32s(), y.Float32s()) {
		t.Error("dropout 0.5 in training left the block's output unchanged")
	}
	tensor.Sum(yt).Backward()
	for _, p := range nn.Parameters(blk) {
		if p.Tensor.Grad() == nil {
			t.Errorf("no gradient for %s", p.Name)
		}
	}
}

// attentionOf is the block's attention before its output projection,
// from the core's operations.
func attentionOf(blk *nn.TransformerBlock, x *tensor.Tensor) *tensor.Tensor {
	s := x.Shape()
	bsz, t, c, h := s[0], s[1], s[2], blk.Heads
	q, k, v := func() (*tensor.Tensor, *tensor.Tensor, *tensor.Tensor) {
		parts := blk.QKV.Forward(x).Split(2, c, c, c)
		head := func(p *tensor.Tensor) *tensor.Tensor { return p.Reshape(bsz, t, h, c/h).Transpose(1, 2) }
		return head(parts[0]), head(parts[1]), head(parts[2])
	}()
	return tensor.ScaledDotProductAttention(q, k, v, true, 0).Transpose(1, 2).Reshape(bsz, t, c)
}
