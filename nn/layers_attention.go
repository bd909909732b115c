package nn

import (
	"fmt"
	"math/rand/v2"

	"github.com/ember-ml/ember/tensor"
)

// MultiheadSelfAttention is self-attention over a sequence x [B, T, C]
// with Heads heads of C/Heads channels: one Linear QKV [3C, C] makes the
// queries, keys and values (in that order along its output), each head
// attends with tensor.ScaledDotProductAttentionPacked (scale 1/√(C/Heads),
// causal when Causal; on a fused attention the heads are read from the
// projection and merged again without copies), and Proj [C, C] mixes the
// heads' outputs. Its
// parameters are qkv.weight, qkv.bias, proj.weight, proj.bias, as the
// attention of a GPT block written in PyTorch as
//
//	self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
//	q, k, v = self.qkv(x).split(C, 2)  # each viewed [B, T, H, C/H], transposed to [B, H, T, C/H]
//	y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
//	return self.proj(y.transpose(1, 2).reshape(B, T, C))
//
// AttnDrop, when set, drops attention weights in training (torch's
// dropout_p of scaled_dot_product_attention); it has no state-dict entry.
//
// It has no Parameters method, so that a struct embedding it (as
// TransformerBlock does) lists qkv and proj beside its own fields.
type MultiheadSelfAttention struct {
	QKV, Proj *Linear
	Heads     int
	Causal    bool
	AttnDrop  *Dropout
}

// NewMultiheadSelfAttention returns attention over channels C split into
// heads heads (C must be a multiple of heads), its linear layers
// initialised as torch's.
func NewMultiheadSelfAttention(b tensor.Backend, rng *rand.Rand, channels, heads int, causal bool) *MultiheadSelfAttention {
	if channels < 1 || heads < 1 || channels%heads != 0 {
		panic(fmt.Sprintf("nn: MultiheadSelfAttention of %d channels in %d heads; want channels a positive multiple of heads", channels, heads))
	}
	rng = orDefault(rng)
	return &MultiheadSelfAttention{
		QKV:    NewLinear(b, rng, channels, 3*channels),
		Proj:   NewLinear(b, rng, channels, channels),
		Heads:  heads,
		Causal: causal,
	}
}

// Forward attends x [B, T, C] to itself and returns [B, T, C].
func (a *MultiheadSelfAttention) Forward(x *tensor.Tensor) *tensor.Tensor {
	s := x.Shape()
	c := a.Proj.Weight.Dim(0)
	if len(s) != 3 || s[2] != c {
		panic(fmt.Sprintf("nn: MultiheadSelfAttention of %d channels given %v; want [B, T, %d]", c, s, c))
	}
	bsz, t, h := s[0], s[1], a.Heads
	var p float32
	var src tensor.RandomSource
	if d := a.AttnDrop; d != nil && d.Training() && d.P > 0 {
		p, src = d.P, d.Source
		if src == nil {
			src = DefaultRandomSource
		}
	}
	// [B, T, 3C] viewed [B, T, 3, H, D]: the packed attention reads q, k
	// and v in place and writes [B, T, H, D], whose merge of the heads is
	// a free reshape (and the backward pass one gradient of the
	// projection), where the backend has a fused attention. Where that
	// attention reads them as bfloat16 (under autocast), the projection
	// writes them so.
	var lin *tensor.Tensor
	if tensor.PackedAttentionTakesHalf(x.Backend(), x.Scope(), bsz, t, h, c/h, a.Causal, p) {
		lin = tensor.LinearHalf(x, a.QKV.Weight, a.QKV.Bias)
	} else {
		lin = a.QKV.Forward(x)
	}
	qkv := lin.Reshape(bsz, t, 3, h, c/h)
	y := tensor.ScaledDotProductAttentionPacked(qkv, a.Causal, 0, p, src)
	// Under autocast the fused attention may keep a bfloat16 copy of qkv
	// instead of qkv itself, which then goes back now.
	tensor.ReleaseInputs(y, lin, qkv)
	return a.Proj.Forward(y.Reshape(bsz, t, c))
}

// TransformerBlock is a pre-norm transformer block, exactly the Block of
// the GPT benchmark model written in PyTorch as
//
//	self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
//	self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
//	self.mlp = nn.Sequential(nn.Linear(C, 4 * C), nn.GELU(), nn.Linear(4 * C, C), nn.Dropout(p))
//	self.drop = nn.Dropout(p)
//	def forward(self, x):
//	    x = x + self.drop(self.proj(attention(self.ln1(x))))
//	    return x + self.mlp(self.ln2(x))
//
// with the same state dict keys: ln1.weight, ln1.bias, ln2.weight,
// ln2.bias, qkv.weight, qkv.bias, proj.weight, proj.bias, mlp.0.weight,
// mlp.0.bias, mlp.2.weight, mlp.2.bias. The attention's qkv and proj
// are the block's own entries because MultiheadSelfAttention is embedded.
// Unlike that Block, the attention weights have no dropout (see
// MultiheadSelfAttention).
type TransformerBlock struct {
	LN1, LN2 *LayerNorm
	MultiheadSelfAttention
	MLP  *Sequential
	Drop *Dropout
	// Recompute runs each half of the block (the attention's, the MLP's)
	// through tensor.Recompute: training keeps the block's input, middle
	// and output, and the backward pass computes each half again
	// (SetRecompute; RecomputeBlocks sets it). Two halves hold about half
	// of what the whole block would at the backward pass's peak.
	Recompute bool
}

// NewTransformerBlock returns a causal block over channels C in heads
// heads with dropout probability dropout, initialised as torch's (Linear
// and LayerNorm defaults).
func NewTransformerBlock(b tensor.Backend, rng *rand.Rand, channels, heads int, dropout float32) *TransformerBlock {
	rng = orDefault(rng)
	attn := NewMultiheadSelfAttention(b, rng, channels, heads, true)
	attn.AttnDrop = NewDropout(dropout) // zoo.py's dropout_p, in training
	return &TransformerBlock{
		LN1:                    NewLayerNorm(b, channels),
		LN2:                    NewLayerNorm(b, channels),
		MultiheadSelfAttention: *attn,
		MLP: NewSequential(
			NewLinear(b, rng, channels, 4*channels),
			GELU{},
			NewLinear(b, rng, 4*channels, channels),
			NewDropout(dropout),
		),
		Drop: NewDropout(dropout),
	}
}

// Forward applies the block to x [B, T, C].
func (blk *TransformerBlock) Forward(x *tensor.Tensor) *tensor.Tensor {
	if blk.Recompute {
		return tensor.Recompute(blk.mlpHalf, tensor.Recompute(blk.attentionHalf, x))
	}
	return blk.mlpHalf(blk.attentionHalf(x))
}

// attentionHalf is x + Drop(attention(LN1(x))), the dropout and the
// addition one operation (Dropout.ForwardAdd). Under autocast the layer
// norms write their outputs in bfloat16 (LayerNorm.ForwardHalf), the form
// the products that read them take. Each intermediate goes back once the
// next operation has run (tensor.ReleaseInput) where no backward pass
// reads it: the projection's output.
func (blk *TransformerBlock) attentionHalf(in ...*tensor.Tensor) *tensor.Tensor {
	x := in[0]
	h := blk.LN1.ForwardHalf(x) // only the QKV projection reads it
	a := blk.MultiheadSelfAttention.Forward(h)
	tensor.ReleaseInput(h, a)
	y := blk.Drop.ForwardAdd(x, a)
	tensor.ReleaseInput(a, y)
	return y
}

// mlpHalf is x + MLP(LN2(x)), its intermediates given back as
// attentionHalf's (the MLP, a Sequential, gives back its own).
func (blk *TransformerBlock) mlpHalf(in ...*tensor.Tensor) *tensor.Tensor {
	x := in[0]
	var h *tensor.Tensor
	if len(blk.MLP.Layers) > 0 && isLinear(blk.MLP.Layers[0].Module) {
		h = blk.LN2.ForwardHalf(x) // only the MLP's first product reads it
	} else {
		h = blk.LN2.Forward(x)
	}
	// The MLP's last dropout and the residual connection are one pass.
	layers := blk.MLP.Layers
	var drop *Dropout
	if len(layers) >= 2 {
		drop, _ = layers[len(layers)-1].Module.(*Dropout)
	}
	if drop == nil {
		m := blk.MLP.Forward(h)
		tensor.ReleaseInput(h, m)
		y := tensor.Add(x, m)
		tensor.ReleaseInput(m, y)
		return y
	}
	m := blk.MLP.run(layers[:len(layers)-1], h)
	tensor.ReleaseInput(h, m)
	y := drop.ForwardAdd(x, m)
	tensor.ReleaseInput(m, y)
	return y
}

// SetRecompute sets Recompute (nn.Recomputer).
func (blk *TransformerBlock) SetRecompute(on bool) { blk.Recompute = on }

// Recomputes reports Recompute (nn.Recomputer).
func (blk *TransformerBlock) Recomputes() bool { return blk.Recompute }
