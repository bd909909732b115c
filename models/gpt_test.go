package models_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ember-ml/ember/models"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// The state dict of zoo.py's GPT with a vocabulary of 65 (Tiny
// Shakespeare's), written out from its definition: C = 384, T = 256, six
// Blocks, each with ln1, ln2, qkv (C → 3C), proj (C → C) and mlp (entries
// 0 and 2 are Linear(C, 4C) and Linear(4C, C)).
func gptTorchKeys() []string {
	keys := []string{"tok.weight [65,384]", "pos.weight [256,384]", "ln.weight [384]", "ln.bias [384]", "head.weight [65,384]"}
	for i := range 6 {
		for _, k := range []string{
			"ln1.weight [384]", "ln1.bias [384]", "ln2.weight [384]", "ln2.bias [384]",
			"qkv.weight [1152,384]", "qkv.bias [1152]", "proj.weight [384,384]", "proj.bias [384]",
			"mlp.0.weight [1536,384]", "mlp.0.bias [1536]", "mlp.2.weight [384,1536]", "mlp.2.bias [384]",
		} {
			keys = append(keys, fmt.Sprintf("blocks.%d.%s", i, k))
		}
	}
	return keys
}

func TestGPTStateDict(t *testing.T) {
	m := models.NewGPT(tensor.CPU, 1, models.DefaultGPTConfig(65))
	defer m.Release()
	sameKeys(t, "gpt", zooKeys(m), gptTorchKeys())
	// 2·65·384 (tok, head) + 256·384 (pos) + 6·(4·384 + 1152·385 + 384·385
	// + 1536·385 + 384·1537) (blocks) + 2·384 (ln).
	if n := nn.NumParameters(m); n != 10795776 {
		t.Errorf("%d parameters, want 10795776", n)
	}
	mustPanic(t, "multiple of heads", func() {
		models.NewGPT(tensor.CPU, 1, models.GPTConfig{Layers: 1, Heads: 5, Channels: 32, Context: 4, Vocab: 3})
	})
}

func smallGPTConfig() models.GPTConfig {
	return models.GPTConfig{Layers: 2, Heads: 2, Channels: 32, Context: 16, Vocab: 20, Dropout: 0.2}
}

// gptBatch is B random sequences of the small config's vocabulary, and
// their targets: each id's successor modulo the vocabulary, a rule the
// model can learn from one token.
func gptBatch(rng *rand.Rand, b, t, vocab int) (ids, targets []int32) {
	ids = randomLabels(rng, b*t, vocab)
	targets = make([]int32, len(ids))
	for i, v := range ids {
		targets[i] = (v + 1) % int32(vocab)
	}
	return ids, targets
}

// Forward gives [B, T, V] logits whose position t depends on tokens 0 ...
// t only; Loss is the cross entropy over the flattened positions.
func TestGPTForward(t *testing.T) {
	cfg := smallGPTConfig()
	m := models.NewGPT(tensor.CPU, 2, cfg)
	defer m.Release()
	nn.SetTraining(m, false)
	rng := rand.New(rand.NewPCG(8, 1))
	const b, tt = 3, 10 // shorter than the context: the first 10 positions
	ids, targets := gptBatch(rng, b, tt, cfg.Vocab)
	s := tensor.NewNoGradScope()
	defer s.Release()
	y := m.Forward(tensor.FromInt32(tensor.CPU, s, ids, b, tt))
	if !slices.Equal(y.Shape(), []int{b, tt, cfg.Vocab}) {
		t.Fatalf("logits %v, want [%d %d %d]", y.Shape(), b, tt, cfg.Vocab)
	}
	changed := slices.Clone(ids)
	changed[tt-1] = (changed[tt-1] + 1) % int32(cfg.Vocab) // the first sequence's last token
	y2 := m.Forward(tensor.FromInt32(tensor.CPU, s, changed, b, tt)).Float32s()
	v := y.Float32s()
	first := (tt - 1) * cfg.Vocab
	if !slices.Equal(y2[:first], v[:first]) {
		t.Error("changing the last token changed the logits of earlier positions (attention not causal)")
	}
	if slices.Equal(y2[first:tt*cfg.Vocab], v[first:tt*cfg.Vocab]) {
		t.Error("changing the last token left its logits unchanged")
	}
	loss := m.Loss(tensor.FromInt32(tensor.CPU, s, ids, b, tt), tensor.FromInt32(tensor.CPU, s, targets, b, tt))
	ref := tensor.CrossEntropyLoss(y.Reshape(b*tt, cfg.Vocab), tensor.FromInt32(tensor.CPU, s, targets, b*tt), tensor.CrossEntropyOptions{})
	if got, want := loss.Item(), ref.Item(); got != want {
		t.Errorf("Loss %v, cross entropy of the flattened logits %v", got, want)
	}
	for _, bad := range []*tensor.Tensor{tensor.FromInt32(tensor.CPU, s, make([]int32, 17), 1, 17), tensor.Zeros(tensor.CPU, s, 1, 4)} {
		mustPanic(t, "int32 token ids [B, T] with 1 <= T <= 16", func() { m.Forward(bad) })
	}
}

// AdamW (torch's defaults but a learning rate of 1e-2, so that a dozen
// steps suffice) with zoo.py's gradient clipping at norm 1 lowers the loss
// of a learnable batch; dropout makes training passes random and
// evaluation deterministic.
func TestGPTTrains(t *testing.T) {
	cfg := smallGPTConfig()
	m := models.NewGPT(tensor.CPU, 3, cfg)
	defer m.Release()
	nn.SetRandomSource(m, tensor.NewGenerator(4))
	cfgW := optim.DefaultAdamWConfig()
	cfgW.LR = 1e-2
	adam, err := optim.NewAdamW(nn.Parameters(m), cfgW)
	if err != nil {
		t.Fatal(err)
	}
	defer adam.Release()
	rng := rand.New(rand.NewPCG(9, 1))
	const b, steps = 4, 15
	ids, targets := gptBatch(rng, b, cfg.Context, cfg.Vocab)
	evalLoss := func() float32 {
		nn.SetTraining(m, false)
		defer nn.SetTraining(m, true)
		return lossAt(func(s *tensor.Scope) *tensor.Tensor {
			return m.Loss(tensor.FromInt32(tensor.CPU, s, ids, b, cfg.Context), tensor.FromInt32(tensor.CPU, s, targets, b, cfg.Context))
		})
	}
	before := evalLoss()
	if again := evalLoss(); again != before {
		t.Errorf("evaluation is not deterministic: loss %v then %v", before, again)
	}
	s := tensor.NewScope()
	var trainLosses []float32
	for range steps {
		s.Reset()
		loss := m.Loss(tensor.FromInt32(tensor.CPU, s, ids, b, cfg.Context), tensor.FromInt32(tensor.CPU, s, targets, b, cfg.Context))
		adam.ZeroGrad()
		loss.Backward()
		optim.ClipGradNorm(s, adam.Gradients(), 1.0)
		adam.Step()
		trainLosses = append(trainLosses, loss.Item())
	}
	s.Release()
	if trainLosses[0] == before {
		t.Errorf("the first training loss equals the evaluation loss %v: dropout did nothing", before)
	}
	after := evalLoss()
	// Random N(0, 1) embeddings start far above ln 20 = 3.0; the successor
	// rule is learnt quickly.
	if !(after < 0.7*before) {
		t.Errorf("evaluation loss %v after %d steps from %v (training losses %v)", after, steps, before, trainLosses)
	}
}
