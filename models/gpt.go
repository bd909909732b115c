package models

import (
	"fmt"
	"math/rand/v2"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// GPTConfig sets the size of a GPT. DefaultGPTConfig is zoo.py's gpt.
type GPTConfig struct {
	// Layers is the number of transformer blocks, Heads the attention
	// heads of each, Channels the width of the residual stream (a multiple
	// of Heads).
	Layers, Heads, Channels int
	// Context is the longest sequence (the rows of the position table),
	// Vocab the number of token ids.
	Context, Vocab int
	// Dropout is the probability of the blocks' dropout layers in
	// training.
	Dropout float32
}

// DefaultGPTConfig is zoo.py's character transformer (nanoGPT's
// Shakespeare size): 6 layers of 6 heads, 384 channels, context 256,
// dropout 0.2, over vocab token ids.
func DefaultGPTConfig(vocab int) GPTConfig {
	return GPTConfig{Layers: 6, Heads: 6, Channels: 384, Context: 256, Vocab: vocab, Dropout: 0.2}
}

// GPT is a decoder-only transformer, zoo.py's GPT:
//
//	class GPT(nn.Module):  # tok, pos = nn.Embedding(V, C), nn.Embedding(T, C)
//	    # blocks = nn.Sequential(*[Block() for _ in range(L)]); ln = nn.LayerNorm(C); head = nn.Linear(C, V, bias=False)
//	    def forward(s, idx): return s.head(s.ln(s.blocks(s.tok(idx) + s.pos(torch.arange(T)))))
//
// with nn.TransformerBlock as zoo.py's Block (pre-norm, causal attention,
// a 4× GELU MLP, dropout after the projection and the MLP). Its state dict
// keys are that module's: tok.weight, pos.weight, blocks.0.ln1.weight,
// ..., ln.weight, head.weight.
//
// In training its blocks drop attention probabilities too, as zoo.py's
// scaled_dot_product_attention(dropout_p=0.2) does.
type GPT struct {
	Tok, Pos *nn.Embedding
	Blocks   *nn.Sequential
	LN       *nn.LayerNorm
	Head     *nn.Linear
	Config   GPTConfig `nn:"-"`

	// positions holds the int32 ids 0 ... Context-1 on the device, so that
	// a step reads the position table without an upload (and can be
	// captured).
	positions *tensor.Tensor
}

// NewGPT builds a GPT on b with PyTorch's default initialisation (N(0, 1)
// embeddings, uniform ±1/sqrt(fan_in) linear layers), drawing from a PCG
// generator seeded with seed. A config with a size below one, or channels
// not a multiple of the heads, is a mistake of the calling program: it
// panics saying so. Release frees it.
func NewGPT(b tensor.Backend, seed uint64, cfg GPTConfig) *GPT {
	if cfg.Layers < 1 || cfg.Heads < 1 || cfg.Channels < 1 || cfg.Context < 1 || cfg.Vocab < 1 || cfg.Channels%cfg.Heads != 0 {
		panic(fmt.Sprintf("models: GPT of %d layers, %d heads, %d channels, context %d, vocab %d; want each >= 1 and channels a multiple of heads",
			cfg.Layers, cfg.Heads, cfg.Channels, cfg.Context, cfg.Vocab))
	}
	if !(cfg.Dropout >= 0 && cfg.Dropout <= 1) {
		panic(fmt.Sprintf("models: GPT dropout %v; want a probability in [0, 1]", cfg.Dropout))
	}
	rng := rand.New(rand.NewPCG(seed, 0x6e7))
	m := &GPT{Config: cfg,
		Tok: nn.NewEmbedding(b, rng, cfg.Vocab, cfg.Channels),
		Pos: nn.NewEmbedding(b, rng, cfg.Context, cfg.Channels),
	}
	blocks := make([]nn.Module, cfg.Layers)
	for i := range blocks {
		blocks[i] = nn.NewTransformerBlock(b, rng, cfg.Channels, cfg.Heads, cfg.Dropout)
	}
	m.Blocks = nn.NewSequential(blocks...)
	m.LN = nn.NewLayerNorm(b, cfg.Channels)
	m.Head = nn.NewLinearNoBias(b, rng, cfg.Channels, cfg.Vocab)
	ids := make([]int32, cfg.Context)
	for i := range ids {
		ids[i] = int32(i)
	}
	m.positions = tensor.FromInt32(b, nil, ids, cfg.Context)
	return m
}

// CheckInput returns an error saying what was expected when ids is not an
// int32 batch [B, T] with 1 <= T <= Context. (The ids' values are checked
// by the embedding lookup.)
func (m *GPT) CheckInput(ids *tensor.Tensor) error {
	s := ids.Shape()
	if len(s) != 2 || s[0] < 1 || s[1] < 1 || s[1] > m.Config.Context || ids.DType() != tensor.Int32 {
		return fmt.Errorf("models: GPT takes int32 token ids [B, T] with 1 <= T <= %d, not %s %v", m.Config.Context, ids.DType(), s)
	}
	return nil
}

// Forward maps token ids [B, T] (int32) to logits [B, T, Vocab]: the
// logits at position t predict the token after t from tokens 0 ... t.
// It panics, saying what it expects, for ids of another shape or type.
func (m *GPT) Forward(ids *tensor.Tensor) *tensor.Tensor {
	if err := m.CheckInput(ids); err != nil {
		panic(err.Error())
	}
	// The positions are long-lived: borrowed into the ids' scope, their
	// embedding is freed with the step's tensors.
	positions := ids.Scope().Borrow(m.positions)
	if t := ids.Dim(1); t < m.Config.Context {
		positions = positions.Narrow(0, 0, t)
	}
	tok, pos := m.Tok.Forward(ids), m.Pos.Forward(positions)
	x := tensor.Add(tok, pos)
	// The embeddings' outputs and the last layer norm's go as soon as the
	// next operation has run where no backward pass reads them (the
	// addition does not; under autocast the head keeps its bfloat16 copy).
	tensor.ReleaseInput(tok, x)
	tensor.ReleaseInput(pos, x)
	h := m.LN.Forward(m.Blocks.Forward(x))
	logits := m.Head.Forward(h)
	tensor.ReleaseInput(h, logits)
	return logits
}

// Loss is the mean cross entropy of the next-token logits of ids [B, T]
// against targets [B, T] (int32; usually ids shifted by one), over the
// B·T positions flattened to [B·T, Vocab] as zoo.py does.
func (m *GPT) Loss(ids, targets *tensor.Tensor) *tensor.Tensor {
	logits := m.Forward(ids)
	if ts, is := targets.Shape(), ids.Shape(); len(ts) != 2 || ts[0] != is[0] || ts[1] != is[1] || targets.DType() != tensor.Int32 {
		panic(fmt.Sprintf("models: GPT.Loss targets %s %v; want int32 %v as the ids", targets.DType(), ts, is))
	}
	bt := ids.Dim(0) * ids.Dim(1)
	return tensor.CrossEntropyLoss(logits.Reshape(bt, m.Config.Vocab), targets.Reshape(bt), tensor.CrossEntropyOptions{})
}

// Release frees the parameters, their gradients and the position ids.
func (m *GPT) Release() {
	releaseState(m)
	m.positions.Release()
}

// releaseState frees every parameter, gradient and buffer of m.
func releaseState(m nn.Module) {
	for _, p := range nn.StateTensors(m) {
		if g := p.Tensor.Grad(); g != nil {
			g.Release()
		}
		p.Tensor.Release()
	}
}

// Generate continues prompt (token ids, at least one) by n tokens, each the
// most likely next token given the last Context ones (greedy decoding, so
// that the same checkpoint and prompt give the same text), in evaluation
// mode (in which it leaves the model) and without recording a graph. It
// returns the n new ids.
func (m *GPT) Generate(prompt []int32, n int) ([]int32, error) {
	if len(prompt) == 0 {
		return nil, fmt.Errorf("models: GPT.Generate: an empty prompt; give at least one token")
	}
	for i, id := range prompt {
		if id < 0 || int(id) >= m.Config.Vocab {
			return nil, fmt.Errorf("models: GPT.Generate: prompt token %d is %d, outside the vocabulary of %d", i, id, m.Config.Vocab)
		}
	}
	nn.SetTraining(m, false)
	b := m.Head.Weight.Backend()
	s := tensor.NewNoGradScope()
	defer s.Release()
	seq := append([]int32(nil), prompt...)
	for range n {
		s.Reset()
		ctx := seq[max(0, len(seq)-m.Config.Context):]
		logits := m.Forward(tensor.FromInt32(b, s, ctx, 1, len(ctx))) // [1, t, V]
		last := logits.Narrow(1, len(ctx)-1, 1).Reshape(1, m.Config.Vocab)
		seq = append(seq, tensor.ArgmaxAxis(last, 1, false).Int32s()[0])
	}
	return seq[len(prompt):], nil
}
