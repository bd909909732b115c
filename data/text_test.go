package data

import (
	"bytes"
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestVocabByte(t *testing.T) {
	text := []byte("hello\x00\xff")
	v, err := NewVocab(text, ByteLevel, "t")
	if err != nil {
		t.Fatal(err)
	}
	if v.Level() != ByteLevel || v.Size() != 6 || !slices.Equal(v.Symbols(), []rune{0, 'e', 'h', 'l', 'o', 0xff}) {
		t.Fatalf("level %s, symbols %v", v.Level(), v.Symbols())
	}
	ids, err := v.Encode(text, "t")
	if err != nil || !slices.Equal(ids, []int32{2, 1, 3, 3, 4, 0, 5}) {
		t.Fatalf("Encode: %v, %v", ids, err)
	}
	back, err := v.Decode(ids)
	if err != nil || !bytes.Equal(back, text) {
		t.Errorf("Decode: %q, %v", back, err)
	}
	_, err = v.Encode([]byte("hex"), "other.txt")
	wantError(t, err, "other.txt", "byte 0x78 at offset 2 is not in the vocabulary")
	if _, err := v.Decode([]int32{0, 6}); err == nil || !strings.Contains(err.Error(), "id 6 at index 1 is out of range, want 0 to 5") {
		t.Errorf("Decode out of range: %v", err)
	}
	if id, ok := v.ID('l'); !ok || id != 3 {
		t.Errorf("ID('l') = %d, %v", id, ok)
	}
	if _, ok := v.ID('é'); ok {
		t.Error("ID of a rune not in a byte vocabulary")
	}
}

func TestVocabChar(t *testing.T) {
	text := []byte("héllo wörld ☃é")
	v, err := NewVocab(text, CharLevel, "t")
	if err != nil {
		t.Fatal(err)
	}
	want := []rune{' ', 'd', 'h', 'l', 'o', 'r', 'w', 'é', 'ö', '☃'}
	if !slices.Equal(v.Symbols(), want) {
		t.Fatalf("symbols %q, want %q", v.Symbols(), want)
	}
	ids, err := v.Encode(text, "t")
	if err != nil || len(ids) != 14 || ids[1] != 7 || ids[12] != 9 {
		t.Fatalf("Encode: %v, %v", ids, err)
	}
	back, _ := v.Decode(ids)
	if !bytes.Equal(back, text) {
		t.Errorf("Decode: %q", back)
	}
	_, err = v.Encode([]byte("hi"), "x")
	wantError(t, err, "x", `character 'i' (U+0069) at byte 1 is not in the vocabulary`)
	_, err = v.Encode([]byte("h\xe9"), "x")
	wantError(t, err, "x", "invalid UTF-8 at byte 1")
	_, err = NewVocab([]byte("ok\xc3("), CharLevel, "bad.txt")
	wantError(t, err, "bad.txt", "invalid UTF-8 at byte 2", "ByteLevel")
	_, err = NewVocab(nil, CharLevel, "empty.txt")
	wantError(t, err, "empty.txt", "empty text")
	_, err = NewVocab([]byte("x"), "word", "w")
	wantError(t, err, "w", `text level "word"`)
}

func TestVocabJSON(t *testing.T) {
	for _, level := range []TextLevel{ByteLevel, CharLevel} {
		v, err := NewVocab([]byte("ba\n☃"), level, "t")
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := v.WriteJSON(&b); err != nil {
			t.Fatal(err)
		}
		if level == CharLevel && b.String() != `{"format":"ember-vocab","version":1,"level":"char","size":4,"symbols":[10,97,98,9731]}`+"\n" {
			t.Errorf("JSON: %s", b.String())
		}
		got, err := ReadVocab(&b, "v.json")
		if err != nil {
			t.Fatal(err)
		}
		if got.Level() != level || !slices.Equal(got.Symbols(), v.Symbols()) {
			t.Errorf("%s: read back %s %v, want %v", level, got.Level(), got.Symbols(), v.Symbols())
		}
		p := filepath.Join(t.TempDir(), "vocab.json")
		if err := WriteVocabFile(p, v); err != nil {
			t.Fatal(err)
		}
		got, err = ReadVocabFile(p)
		if err != nil || !slices.Equal(got.Symbols(), v.Symbols()) {
			t.Errorf("file round trip: %v, %v", got, err)
		}
		entries, _ := os.ReadDir(filepath.Dir(p))
		if len(entries) != 1 {
			t.Errorf("%d files left, want 1", len(entries))
		}
	}
}

func TestReadVocabBad(t *testing.T) {
	head := `{"format":"ember-vocab","version":1,`
	for _, c := range []struct{ in, fragment string }{
		{``, "not a vocabulary (JSON): EOF"},
		{`[1,2]`, "not a vocabulary (JSON)"},
		{`null`, `format "", want "ember-vocab"`},
		{`{"format":"other"}`, `format "other"`},
		{`{"format":"ember-vocab","version":2}`, "version 2, want 1"},
		{head + `"level":"word","size":1,"symbols":[1]}`, `level "word"`},
		{head + `"level":"byte","size":0,"symbols":[]}`, "no symbols"},
		{head + `"level":"byte","size":2,"symbols":[1]}`, "size 2 but 1 symbols"},
		{head + `"level":"byte","size":2,"symbols":[1,256]}`, "symbol 1 is 256, want a byte value"},
		{head + `"level":"byte","size":1,"symbols":[-1]}`, "symbol 0 is -1"},
		{head + `"level":"char","size":1,"symbols":[55296]}`, "symbol 0 is 55296, not a Unicode code point"},
		{head + `"level":"char","size":1,"symbols":[1114112]}`, "not a Unicode code point"},
		{head + `"level":"char","size":3,"symbols":[1,3,3]}`, "symbol 2 (3) is not above symbol 1 (3)"},
		{head + `"level":"char","size":2,"symbols":[5,4]}`, "must be sorted and distinct"},
		{head + `"level":"char","size":1,"symbols":[1.5]}`, "not a vocabulary (JSON)"},
		{head + `"level":"char","size":1,"symbols":[1],"extra":true}`, `unknown field "extra"`},
		{head + `"level":"char","size":1,"symbols":[1]} {}`, "data after the vocabulary"},
		{head + `"level":"char","size":1,"symbols":[1]}}`, "data after the vocabulary"},
		{strings.Repeat(" ", MaxVocabBytes+1), "more than 16777216 bytes"},
	} {
		_, err := ReadVocab(strings.NewReader(c.in), "v.json")
		wantError(t, err, "v.json", c.fragment)
	}
	// Trailing white space is fine.
	if _, err := ReadVocab(strings.NewReader(head+`"level":"char","size":1,"symbols":[1]}`+"\n\n"), "v"); err != nil {
		t.Error(err)
	}
	dir := t.TempDir()
	_, err := ReadVocabFile(dir)
	wantError(t, err, dir, "not a regular file")
}

func TestText(t *testing.T) {
	text := []byte("abcabcabcd") // 10 tokens
	tx, err := NewText(text, "t", TextOptions{Level: CharLevel, ValFraction: 0.25})
	if err != nil {
		t.Fatal(err)
	}
	// 10 * 0.25 = 2.5: 2 validation tokens, the last ones.
	if tx.Vocab.Size() != 4 || !slices.Equal(tx.Train, []int32{0, 1, 2, 0, 1, 2, 0, 1}) || !slices.Equal(tx.Val, []int32{2, 3}) {
		t.Fatalf("vocab %d train %v val %v", tx.Vocab.Size(), tx.Train, tx.Val)
	}
	if len(append(tx.Train, 9)) != 9 || tx.Val[0] != 2 {
		t.Error("appending to Train overwrote Val")
	}
	tx, err = NewText(text, "t", TextOptions{})
	if err != nil || tx.Vocab.Level() != ByteLevel || len(tx.Train) != 10 || len(tx.Val) != 0 {
		t.Errorf("defaults: %+v, %v", tx, err)
	}
	// A given vocabulary is used, and must cover the text.
	v, _ := NewVocab([]byte("abcdz"), ByteLevel, "v")
	tx, err = NewText(text, "t", TextOptions{Vocab: v})
	if err != nil || tx.Vocab != v || tx.Train[3] != 0 {
		t.Errorf("given vocab: %v", err)
	}
	_, err = NewText([]byte("abcx"), "t2", TextOptions{Vocab: v})
	wantError(t, err, "t2", "byte 0x78 at offset 3")
	for _, f := range []float64{-0.1, 1, math.NaN()} {
		_, err = NewText(text, "t", TextOptions{ValFraction: f})
		wantError(t, err, "t", "ValFraction")
	}

	p := writeFile(t, t.TempDir(), "in.txt", text)
	tx, err = LoadText(p, TextOptions{ValFraction: 0.5})
	if err != nil || len(tx.Train) != 5 || len(tx.Val) != 5 {
		t.Errorf("LoadText: %+v, %v", tx, err)
	}
	_, err = LoadText(filepath.Dir(p), TextOptions{})
	wantError(t, err, filepath.Dir(p), "not a regular file")
	empty := writeFile(t, t.TempDir(), "empty.txt", nil)
	_, err = LoadText(empty, TextOptions{})
	wantError(t, err, empty, "empty text")
}

func TestWindowSampler(t *testing.T) {
	tokens := make([]int32, 50)
	for i := range tokens {
		tokens[i] = int32(i) // token = its position, so windows show their starts
	}
	s, err := NewWindowSampler(tokens, 8, 4, 42)
	if err != nil {
		t.Fatal(err)
	}
	if s.BlockSize() != 8 || s.BatchSize() != 4 {
		t.Fatal(s.BlockSize(), s.BatchSize())
	}
	counts := make([]int, 50)
	for step := range 500 {
		x, y := s.Batch(step)
		if len(x) != 32 || len(y) != 32 {
			t.Fatalf("lengths %d %d", len(x), len(y))
		}
		starts := s.Starts(step)
		for b, i := range starts {
			if i < 0 || i > 50-8-1 {
				t.Fatalf("start %d out of range", i)
			}
			counts[i]++
			for k := range 8 {
				if x[b*8+k] != int32(i+k) || y[b*8+k] != int32(i+k+1) {
					t.Fatalf("step %d window %d: x %v y %v", step, b, x[b*8:b*8+8], y[b*8:b*8+8])
				}
			}
		}
	}
	// Every one of the 42 starts is drawn, none past the end: 2000 draws,
	// about 48 each; missing one has probability about 42*exp(-47.6).
	for i, c := range counts {
		if (i <= 41) != (c > 0) {
			t.Errorf("start %d drawn %d times", i, c)
		}
	}
	// Deterministic by (seed, step); other seeds and steps differ.
	again, _ := NewWindowSampler(slices.Clone(tokens), 8, 4, 42)
	if !slices.Equal(again.Starts(7), s.Starts(7)) {
		t.Error("same seed and step, different starts")
	}
	other, _ := NewWindowSampler(tokens, 8, 4, 43)
	if slices.Equal(other.Starts(7), s.Starts(7)) && slices.Equal(other.Starts(8), s.Starts(8)) {
		t.Error("seeds 42 and 43 give the same starts")
	}
	// The draw is part of the contract: these are the starts of seed 42,
	// step 0, computed once; a change to them breaks resumed runs.
	if got, want := s.Starts(0), []int{23, 7, 33, 17}; !slices.Equal(got, want) {
		t.Errorf("Starts(0) = %v, want %v", got, want)
	}
	// The shortest sequence: one start only.
	one, err := NewWindowSampler(tokens[:9], 8, 3, 1)
	if err != nil || !slices.Equal(one.Starts(5), []int{0, 0, 0}) {
		t.Errorf("one window: %v, %v", one.Starts(5), err)
	}
	if _, err := NewWindowSampler(tokens[:8], 8, 1, 1); err == nil || !strings.Contains(err.Error(), "8 tokens, want at least block size + 1 = 9") {
		t.Errorf("too short: %v", err)
	}
	if _, err := NewWindowSampler(tokens, 0, 1, 1); err == nil {
		t.Error("block size 0 accepted")
	}
	defer func() {
		if recover() == nil {
			t.Error("BatchInto with short buffers did not panic")
		}
	}()
	s.BatchInto(0, make([]int32, 31), make([]int32, 32))
}

// TestTextCorpus reads the corpus of the transformer benchmark
// (bench/corpus.sh: the first 1,115,394 bytes of the Go distribution's
// net/http sources, in name order), built here in memory.
func TestTextCorpus(t *testing.T) {
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		t.Skipf("no go command: %v", err)
	}
	files, _ := filepath.Glob(filepath.Join(strings.TrimSpace(string(out)), "src", "net", "http", "*.go"))
	var corpus []byte
	for _, f := range files { // Glob sorts, as the shell does in the C locale
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		corpus = append(corpus, b...)
	}
	if len(corpus) < 1115394 {
		t.Skipf("net/http sources are %d bytes", len(corpus))
	}
	corpus = corpus[:1115394]
	for _, level := range []TextLevel{ByteLevel, CharLevel} {
		// head -c may cut a character in two; the byte level does not
		// care, the character level needs whole characters.
		c := corpus
		if level == CharLevel {
			for len(c) > 0 && !utf8.Valid(c) {
				c = c[:len(c)-1]
			}
		}
		tx, err := NewText(c, "corpus", TextOptions{Level: level, ValFraction: 0.1})
		if err != nil {
			t.Fatal(err)
		}
		if n := len(tx.Train) + len(tx.Val); level == ByteLevel && n != 1115394 || tx.Vocab.Size() < 90 || tx.Vocab.Size() > 256 {
			t.Errorf("%s: %d tokens, vocabulary of %d", level, n, tx.Vocab.Size())
		}
		all := append(slices.Clone(tx.Train), tx.Val...)
		back, err := tx.Vocab.Decode(all)
		if err != nil || !bytes.Equal(back, c) {
			t.Errorf("%s: round trip differs (%v)", level, err)
		}
		s, err := NewWindowSampler(tx.Train, 256, 16, 1)
		if err != nil {
			t.Fatal(err)
		}
		x, y := s.Batch(3)
		if len(x) != 4096 || x[1] != y[0] {
			t.Errorf("%s: batch of %d, x[1] %d y[0] %d", level, len(x), x[1], y[0])
		}
	}
}

func FuzzReadVocab(f *testing.F) {
	for _, s := range []string{
		`{"format":"ember-vocab","version":1,"level":"char","size":3,"symbols":[10,32,9731]}`,
		`{"format":"ember-vocab","version":1,"level":"byte","size":2,"symbols":[0,255]}`,
		`{"format":"ember-vocab","version":1,"level":"byte","size":2,"symbols":[255,0]}`,
		`{"format":"ember-vocab","version":1,"level":"char","size":1,"symbols":[55296]}`,
		`{"format":"ember-vocab","version":1,"level":"char","size":1,"symbols":[1]} x`,
		`{"format":"ember-vocab"`,
		`null`, ``, `[]`, "\xff",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := ReadVocab(bytes.NewReader(b), "fuzz")
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || strings.Contains(err.Error(), "\n") || !strings.HasPrefix(err.Error(), "data: fuzz: ") {
				t.Fatalf("bad error %T %q", err, err)
			}
			return
		}
		syms := v.Symbols()
		if len(syms) == 0 || !slices.IsSorted(syms) || len(slices.Compact(slices.Clone(syms))) != len(syms) {
			t.Fatalf("symbols %v", syms)
		}
		var buf bytes.Buffer
		if err := v.WriteJSON(&buf); err != nil {
			t.Fatal(err)
		}
		back, err := ReadVocab(&buf, "again")
		if err != nil || back.Level() != v.Level() || !slices.Equal(back.Symbols(), syms) {
			t.Fatalf("round trip: %v, %v", back, err)
		}
		ids := make([]int32, len(syms))
		for i := range ids {
			ids[i] = int32(i)
		}
		text, err := v.Decode(ids)
		if err != nil {
			t.Fatal(err)
		}
		enc, err := v.Encode(text, "decoded")
		if err != nil || !slices.Equal(enc, ids) {
			t.Fatalf("Encode(Decode(ids)) = %v, %v", enc, err)
		}
	})
}

func FuzzNewVocab(f *testing.F) {
	f.Add([]byte("hello, world"), true)
	f.Add([]byte("h\xe9llo ☃"), true)
	f.Add([]byte("h\xe9llo ☃"), false)
	f.Add([]byte{}, false)
	f.Fuzz(func(t *testing.T, text []byte, char bool) {
		level := ByteLevel
		if char {
			level = CharLevel
		}
		v, err := NewVocab(text, level, "fuzz")
		if err != nil {
			if !strings.HasPrefix(err.Error(), "data: fuzz: ") {
				t.Fatalf("bad error %q", err)
			}
			return
		}
		ids, err := v.Encode(text, "fuzz")
		if err != nil {
			t.Fatalf("text does not encode with its own vocabulary: %v", err)
		}
		back, err := v.Decode(ids)
		if err != nil || !bytes.Equal(back, text) {
			t.Fatalf("round trip %q -> %q (%v)", text, back, err)
		}
	})
}
