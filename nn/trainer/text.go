package trainer

import (
	"fmt"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// Text is a Source of next-token windows of a token sequence for a
// language model: example i is the window x = tokens[i·T : i·T+T] with
// the targets y = tokens[i·T+1 : i·T+T+1], the windows not overlapping, so
// that an epoch sees every token once. Load builds a batch's windows on
// the host and uploads them into two fixed device tensors in one transfer
// (outside a captured step); Batch hands those tensors out.
type Text struct {
	tokens     []int32
	context    int
	batch      *tensor.Tensor // ids then targets, packed: one upload per step
	ids, targs *tensor.Tensor // int32 [B, T] each, views of batch
	host       []int32        // the ids, then the targets
	autocast   tensor.DType   // Evaluate's (SetAutocast)
}

// SetAutocast sets the autocast Evaluate runs the model under, as
// Images.SetAutocast does.
func (tx *Text) SetAutocast(dt tensor.DType) { tx.autocast = dt }

// TextWindows is the number of non-overlapping windows of context tokens
// (each with its next-token targets) in n tokens.
func TextWindows(n, context int) int {
	if context < 1 || n < 1 {
		return 0
	}
	return (n - 1) / context
}

// NewText draws batches of batchSize windows of context tokens from
// tokens on b; a batch size of 0 makes a set for Evaluate only. Release
// frees the device tensors.
func NewText(b tensor.Backend, tokens []int32, context, batchSize int) (*Text, error) {
	if context < 1 {
		return nil, fmt.Errorf("trainer: text windows of %d tokens; want at least 1", context)
	}
	n := TextWindows(len(tokens), context)
	if batchSize < 0 || batchSize > n {
		return nil, fmt.Errorf("trainer: batch size %d for %d windows of %d tokens; want at most %d", batchSize, n, context, n)
	}
	tx := &Text{tokens: tokens, context: context, host: make([]int32, 2*batchSize*context)}
	if batchSize == 0 {
		return tx, nil
	}
	err := tensor.Guard(func() {
		tx.ids = tensor.EmptyOf(b, nil, tensor.Int32, batchSize, context)
		tx.targs = tensor.EmptyOf(b, nil, tensor.Int32, batchSize, context)
		tx.batch = tensor.Pack([]*tensor.Tensor{tx.ids, tx.targs})
	})
	if err != nil {
		return nil, err
	}
	return tx, nil
}

// Len is the number of windows.
func (tx *Text) Len() int { return TextWindows(len(tx.tokens), tx.context) }

// BatchSize is the number of windows per batch (0 for a set made for
// Evaluate only).
func (tx *Text) BatchSize() int { return len(tx.host) / (2 * tx.context) }

// Context is the window length T.
func (tx *Text) Context() int { return tx.context }

// Tokens is the number of tokens the windows are cut from.
func (tx *Text) Tokens() int { return len(tx.tokens) }

// windows writes the windows at indices into x and their targets into y
// ([len(indices)·T] each).
func (tx *Text) windows(indices []int32, x, y []int32) {
	t := tx.context
	for k, i := range indices {
		start := int(i) * t
		copy(x[k*t:(k+1)*t], tx.tokens[start:start+t])
		copy(y[k*t:(k+1)*t], tx.tokens[start+1:start+t+1])
	}
}

// Load uploads the windows at indices (BatchSize of them) and their
// targets for the next Batch.
func (tx *Text) Load(indices []int32) {
	n := tx.BatchSize()
	if len(indices) != n {
		panic(fmt.Sprintf("trainer: Text.Load of %d indices, batch size %d", len(indices), n))
	}
	half := n * tx.context
	tx.windows(indices, tx.host[:half], tx.host[half:])
	tx.batch.Backend().Upload(tx.batch.Buffer(), tx.host)
}

// Batch returns the loaded windows: Inputs are the token ids, a copy in s
// (so that the model's results on them go into s too and are freed with
// the step), and Labels the next tokens, int32 [B, T] each.
func (tx *Text) Batch(s *tensor.Scope) Batch {
	ids := tensor.EmptyOf(tx.ids.Backend(), s, tensor.Int32, tx.ids.Shape()...)
	tensor.CopyTensor(ids, tx.ids)
	return Batch{Inputs: ids, Labels: tx.targs}
}

// Evaluate returns the mean cross entropy per token and the next-token
// accuracy in percent of the language model m (logits [B, T, V] from ids
// [B, T]) over all the windows, in batches of at most batch windows,
// without recording a graph. b is the device to evaluate on.
func (tx *Text) Evaluate(b tensor.Backend, m nn.Module, batch int) (loss, accuracy float64, err error) {
	n := tx.Len()
	if n == 0 {
		return 0, 0, fmt.Errorf("trainer: no windows of %d tokens to evaluate in %d tokens", tx.context, len(tx.tokens))
	}
	err = tensor.Guard(func() { loss, accuracy = tx.evaluate(b, m, max(1, min(batch, n))) })
	return loss, accuracy, err
}

func (tx *Text) evaluate(b tensor.Backend, m nn.Module, batch int) (loss, accuracy float64) {
	n, t := tx.Len(), tx.context
	idx := make([]int32, batch)
	x, y := make([]int32, batch*t), make([]int32, batch*t)
	var lossSum float64
	correct := 0
	for start := 0; start < n; start += batch {
		k := min(batch, n-start)
		for i := range k {
			idx[i] = int32(start + i)
		}
		tx.windows(idx[:k], x, y)
		s := tensor.NewNoGradScope()
		s.SetReleaseInBackward(true) // layers may hand back each input once the next is done (tensor.ReleaseInput)
		if tx.autocast == tensor.BFloat16 {
			s.SetAutocast(tx.autocast)
		}
		ids := tensor.FromInt32(b, s, x[:k*t], k, t)
		targets := tensor.FromInt32(b, s, y[:k*t], k*t)
		logits := m.Forward(ids)
		logits = logits.Reshape(k*t, logits.Len()/(k*t))
		lossSum += float64(tensor.CrossEntropy(logits, targets).Item()) * float64(k*t)
		for i, p := range tensor.Argmax(logits).Int32s() {
			if p == y[i] {
				correct++
			}
		}
		s.Release()
	}
	positions := float64(n * t)
	return lossSum / positions, 100 * float64(correct) / positions
}

// Release frees the device tensors.
func (tx *Text) Release() {
	if tx.batch != nil {
		tx.batch.Release()
	}
	tx.batch, tx.ids, tx.targs = nil, nil, nil
}
