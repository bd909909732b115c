package models

import (
	"slices"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// Generate is greedy: each new token is the argmax of the logits Forward
// gives for the sequence so far, and the same prompt gives the same text.
func TestGPTGenerate(t *testing.T) {
	m := NewGPT(tensor.CPU, 3, GPTConfig{Layers: 1, Heads: 2, Channels: 8, Context: 4, Vocab: 7, Dropout: 0.2})
	defer m.Release()
	prompt := []int32{1, 2, 3}
	got, err := m.Generate(prompt, 5)
	if err != nil || len(got) != 5 {
		t.Fatalf("Generate: %v, %v", got, err)
	}
	again, _ := m.Generate(prompt, 5)
	if !slices.Equal(got, again) {
		t.Errorf("two runs: %v and %v", got, again)
	}
	// The first new token, by hand (Generate left the model in evaluation
	// mode: no dropout).
	s := tensor.NewNoGradScope()
	defer s.Release()
	logits := m.Forward(tensor.FromInt32(tensor.CPU, s, prompt, 1, 3)).Float32s()[2*7:]
	best := 0
	for i, v := range logits {
		if v > logits[best] {
			best = i
		}
	}
	if got[0] != int32(best) {
		t.Errorf("first token %d, want the argmax %d of %v", got[0], best, logits)
	}
	if _, err := m.Generate([]int32{9}, 1); err == nil {
		t.Error("a token outside the vocabulary: no error")
	}
}
