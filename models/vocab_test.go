package models

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/ember-ml/ember/data"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// A GPT's checkpoint carries its vocabulary: saved with the weights, read
// back from the file alone, it encodes text to the same ids.
func TestVocabTravelsWithTheModel(t *testing.T) {
	text := []byte("func main() { println(\"héllo\") }")
	v, err := data.NewVocab(text, data.CharLevel, "test")
	if err != nil {
		t.Fatal(err)
	}
	m := NewGPT(tensor.CPU, 1, GPTConfig{Layers: 1, Heads: 1, Channels: 8, Context: 4, Vocab: v.Size()})
	defer m.Release()
	meta, err := VocabMetadata(Metadata("gpt", Config{InputShape: []int{4}, Classes: v.Size()}), v)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "gpt.safetensors")
	if err := nn.SaveFile(path, m, meta); err != nil {
		t.Fatal(err)
	}
	got, err := nn.ReadSafetensorsMetadata(path)
	if err != nil {
		t.Fatal(err)
	}
	w, err := VocabFromMetadata(path, got)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := v.Encode(text, "text")
	b, err := w.Encode(text, "text")
	if err != nil || !slices.Equal(a, b) || w.Level() != data.CharLevel {
		t.Fatalf("ids through the file's vocabulary %v (%v), want %v", b, err, a)
	}
	if _, err := VocabFromMetadata(path, map[string]string{}); err == nil {
		t.Error("a file without a vocabulary: no error")
	}
}
