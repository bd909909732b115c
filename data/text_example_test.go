package data_test

import (
	"bytes"
	"fmt"
	"log"

	"github.com/ember-ml/ember/data"
)

// A character-level data set for next-token prediction: build the
// vocabulary, encode, hold out the last 10% for validation, save the
// vocabulary with the model, and draw batches of windows deterministically
// by seed and step.
func ExampleNewText() {
	text := []byte("to be or not to be, that is the question")
	tx, err := data.NewText(text, "quote.txt", data.TextOptions{Level: data.CharLevel, ValFraction: 0.1})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("vocabulary of %d: %q\n", tx.Vocab.Size(), string(tx.Vocab.Symbols()))
	fmt.Println("train", len(tx.Train), "tokens, validation", len(tx.Val))

	var saved bytes.Buffer // a file beside the checkpoint, in practice
	if err := tx.Vocab.WriteJSON(&saved); err != nil {
		log.Fatal(err)
	}
	vocab, err := data.ReadVocab(&saved, "vocab.json")
	if err != nil {
		log.Fatal(err)
	}

	s, err := data.NewWindowSampler(tx.Train, 8, 2, 1) // T = 8, B = 2, seed 1
	if err != nil {
		log.Fatal(err)
	}
	x, y := s.Batch(0) // step 0: the same for every run with seed 1
	for b := range s.BatchSize() {
		xs, _ := vocab.Decode(x[b*8 : (b+1)*8])
		ys, _ := vocab.Decode(y[b*8 : (b+1)*8])
		fmt.Printf("x %q -> y %q\n", xs, ys)
	}
	// Output:
	// vocabulary of 14: " ,abehinoqrstu"
	// train 36 tokens, validation 4
	// x "t is the" -> y " is the "
	// x " that is" -> y "that is "
}
