package models

import (
	"fmt"
	"strings"

	"github.com/ember-ml/ember/data"
)

// MetaVocab is the checkpoint metadata key of a language model's
// vocabulary (data.Vocab's JSON), so that the file alone says how to turn
// text into the ids it was trained on, and back.
const MetaVocab = "ember.vocab"

// VocabMetadata returns meta (a new map when nil) with v recorded under
// MetaVocab: pass it as a checkpoint's metadata (nn.SaveFile,
// trainer.Config.ModelMetadata) together with Metadata's entries.
func VocabMetadata(meta map[string]string, v *data.Vocab) (map[string]string, error) {
	var b strings.Builder
	if err := v.WriteJSON(&b); err != nil {
		return nil, err
	}
	if meta == nil {
		meta = map[string]string{}
	}
	meta[MetaVocab] = b.String()
	return meta, nil
}

// VocabFromMetadata reads the vocabulary a checkpoint's metadata records
// (nn.ReadSafetensorsMetadata), naming file in errors.
func VocabFromMetadata(file string, meta map[string]string) (*data.Vocab, error) {
	js, ok := meta[MetaVocab]
	if !ok {
		return nil, fmt.Errorf("models: %s: no vocabulary in the metadata (%s)", file, MetaVocab)
	}
	return data.ReadVocab(strings.NewReader(js), file+" metadata "+MetaVocab)
}
