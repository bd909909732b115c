package data

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"unicode/utf8"
)

// TextLevel says what one token of a text data set is.
type TextLevel string

const (
	// ByteLevel tokens are bytes: any file can be read, and a vocabulary
	// has at most 256 symbols.
	ByteLevel TextLevel = "byte"
	// CharLevel tokens are Unicode code points of UTF-8 text: the file
	// must be valid UTF-8.
	CharLevel TextLevel = "char"
)

// Bounds on text data, checked before allocation.
const (
	// MaxTextBytes bounds a text file read by LoadText (1 GiB).
	MaxTextBytes = 1 << 30
	// MaxVocabBytes bounds a vocabulary file read by ReadVocab (16 MiB;
	// the JSON of every Unicode code point takes about 8 MiB).
	MaxVocabBytes = 16 << 20
)

// Vocab maps the distinct symbols (bytes or code points) of a text to token
// ids: the symbols sorted, id i for the i-th. It is immutable and safe for
// concurrent use.
type Vocab struct {
	level   TextLevel
	symbols []rune         // sorted, distinct; bytes as values 0-255
	small   [256]int32     // id of symbols below 256, or -1
	large   map[rune]int32 // id of the others (CharLevel)
}

func newVocab(level TextLevel, symbols []rune) *Vocab {
	v := &Vocab{level: level, symbols: symbols}
	for i := range v.small {
		v.small[i] = -1
	}
	for id, s := range symbols {
		if s < 256 {
			v.small[s] = int32(id)
		} else {
			if v.large == nil {
				v.large = make(map[rune]int32)
			}
			v.large[s] = int32(id)
		}
	}
	return v
}

// NewVocab returns the vocabulary of text: its distinct bytes (ByteLevel)
// or code points (CharLevel), sorted. name is used in error messages only.
// For CharLevel, text must be valid UTF-8: the error gives the offset of
// the first invalid byte. An empty text is an error (its vocabulary would
// be empty).
func NewVocab(text []byte, level TextLevel, name string) (*Vocab, error) {
	if len(text) == 0 {
		return nil, errorf(name, nil, "empty text, no vocabulary")
	}
	var syms []rune
	switch level {
	case ByteLevel:
		var seen [256]bool
		for _, c := range text {
			seen[c] = true
		}
		for c, ok := range seen {
			if ok {
				syms = append(syms, rune(c))
			}
		}
	case CharLevel:
		var ascii [utf8.RuneSelf]bool
		other := map[rune]bool{}
		for i := 0; i < len(text); {
			if c := text[i]; c < utf8.RuneSelf {
				ascii[c] = true
				i++
				continue
			}
			r, n := utf8.DecodeRune(text[i:])
			if r == utf8.RuneError && n <= 1 {
				return nil, errorf(name, nil, "invalid UTF-8 at byte %d (use ByteLevel for text that is not UTF-8)", i)
			}
			other[r] = true
			i += n
		}
		for c, ok := range ascii {
			if ok {
				syms = append(syms, rune(c))
			}
		}
		start := len(syms)
		for r := range other {
			syms = append(syms, r)
		}
		slices.Sort(syms[start:])
	default:
		return nil, errorf(name, nil, "text level %q, want %q or %q", level, ByteLevel, CharLevel)
	}
	return newVocab(level, syms), nil
}

// Level is ByteLevel or CharLevel.
func (v *Vocab) Level() TextLevel { return v.level }

// Size is the number of symbols, and so of token ids: ids are 0 to
// Size()-1.
func (v *Vocab) Size() int { return len(v.symbols) }

// Symbols returns the symbols in id order: byte values for ByteLevel, code
// points for CharLevel. The slice is a copy.
func (v *Vocab) Symbols() []rune { return slices.Clone(v.symbols) }

// ID returns the token id of symbol s (a byte value for ByteLevel), and
// whether s is in the vocabulary.
func (v *Vocab) ID(s rune) (int32, bool) {
	if s >= 0 && s < 256 {
		id := v.small[s]
		return id, id >= 0
	}
	id, ok := v.large[s]
	return id, ok
}

// Encode returns the token ids of text. A byte or code point outside the
// vocabulary, or invalid UTF-8 for CharLevel, is an error naming name and
// the byte offset.
func (v *Vocab) Encode(text []byte, name string) ([]int32, error) {
	if v.level == ByteLevel {
		ids := make([]int32, len(text))
		for i, c := range text {
			id := v.small[c]
			if id < 0 {
				return nil, errorf(name, nil, "byte 0x%02x at offset %d is not in the vocabulary", c, i)
			}
			ids[i] = id
		}
		return ids, nil
	}
	ids := make([]int32, 0, utf8.RuneCount(text))
	for i := 0; i < len(text); {
		r, n := rune(text[i]), 1
		if r >= utf8.RuneSelf {
			r, n = utf8.DecodeRune(text[i:])
			if r == utf8.RuneError && n <= 1 {
				return nil, errorf(name, nil, "invalid UTF-8 at byte %d", i)
			}
		}
		id, ok := v.ID(r)
		if !ok {
			return nil, errorf(name, nil, "character %q (U+%04X) at byte %d is not in the vocabulary", r, r, i)
		}
		ids = append(ids, id)
		i += n
	}
	return ids, nil
}

// Decode returns the text of token ids: bytes for ByteLevel, UTF-8 for
// CharLevel. An id outside 0 to Size()-1 is an error.
func (v *Vocab) Decode(ids []int32) ([]byte, error) {
	out := make([]byte, 0, len(ids))
	for i, id := range ids {
		if id < 0 || int(id) >= len(v.symbols) {
			return nil, fmt.Errorf("data: Vocab.Decode: id %d at index %d is out of range, want 0 to %d", id, i, len(v.symbols)-1)
		}
		if s := v.symbols[id]; v.level == ByteLevel {
			out = append(out, byte(s))
		} else {
			out = utf8.AppendRune(out, s)
		}
	}
	return out, nil
}

// vocabFormat and vocabVersion identify the JSON vocabulary files.
const (
	vocabFormat  = "ember-vocab"
	vocabVersion = 1
)

// vocabJSON is the file format: the symbols as numbers (byte values or
// code points), which JSON holds exactly whatever they are, unlike strings
// (a lone byte 0x80 is not valid UTF-8).
type vocabJSON struct {
	Format  string    `json:"format"`
	Version int       `json:"version"`
	Level   TextLevel `json:"level"`
	Size    int       `json:"size"`
	Symbols []int64   `json:"symbols"`
}

// WriteJSON writes v as one line of JSON, for instance
//
//	{"format":"ember-vocab","version":1,"level":"char","size":3,"symbols":[10,32,97]}
//
// so that the vocabulary can travel with a model. ReadVocab reads it back.
func (v *Vocab) WriteJSON(w io.Writer) error {
	j := vocabJSON{Format: vocabFormat, Version: vocabVersion, Level: v.level, Size: len(v.symbols), Symbols: make([]int64, len(v.symbols))}
	for i, s := range v.symbols {
		j.Symbols[i] = int64(s)
	}
	b, err := json.Marshal(j)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// WriteVocabFile writes v to path as WriteJSON does, atomically: a
// temporary file in the same directory, synced, then renamed.
func WriteVocabFile(path string, v *Vocab) error {
	var b bytes.Buffer
	if err := v.WriteJSON(&b); err != nil {
		return errorf(path, err, "write: %v", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".part-*")
	if err != nil {
		return errorf(path, err, "write: %v", unwrapPathError(err))
	}
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.Write(b.Bytes()); err != nil {
		return errorf(path, err, "write: %v", unwrapPathError(err))
	}
	if err := tmp.Chmod(0o644); err != nil {
		return errorf(path, err, "write: %v", unwrapPathError(err))
	}
	if err := tmp.Sync(); err != nil {
		return errorf(path, err, "write: %v", unwrapPathError(err))
	}
	if err := tmp.Close(); err != nil {
		return errorf(path, err, "write: %v", unwrapPathError(err))
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return errorf(path, err, "write: %v", unwrapPathError(err))
	}
	ok = true
	syncDir(filepath.Dir(path))
	return nil
}

// ReadVocabFile reads a vocabulary written by WriteVocabFile or WriteJSON.
func ReadVocabFile(path string) (*Vocab, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, openError(path, err)
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil {
		return nil, openError(path, err)
	} else if !st.Mode().IsRegular() {
		return nil, errorf(path, nil, "not a regular file")
	}
	return ReadVocab(f, path)
}

// ReadVocab reads a vocabulary from r, at most MaxVocabBytes of it, and
// checks it strictly: one JSON object with exactly the fields WriteJSON
// writes and nothing after it, format "ember-vocab", version 1, a known
// level, at least one symbol, as many as size says, strictly increasing,
// each a byte value (ByteLevel) or a Unicode code point that is not a
// surrogate (CharLevel). name is used in error messages only.
func ReadVocab(r io.Reader, name string) (*Vocab, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxVocabBytes+1))
	if err != nil {
		return nil, errorf(name, err, "read: %v", unwrapPathError(err))
	}
	if len(b) > MaxVocabBytes {
		return nil, errorf(name, nil, "more than %d bytes, too long for a vocabulary", MaxVocabBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var j vocabJSON
	if err := dec.Decode(&j); err != nil {
		return nil, errorf(name, err, "not a vocabulary (JSON): %s", oneLine(err.Error()))
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errorf(name, nil, "data after the vocabulary's JSON object")
	}
	switch {
	case j.Format != vocabFormat:
		return nil, errorf(name, nil, "format %q, want %q", j.Format, vocabFormat)
	case j.Version != vocabVersion:
		return nil, errorf(name, nil, "version %d, want %d", j.Version, vocabVersion)
	case j.Level != ByteLevel && j.Level != CharLevel:
		return nil, errorf(name, nil, "level %q, want %q or %q", j.Level, ByteLevel, CharLevel)
	case len(j.Symbols) == 0:
		return nil, errorf(name, nil, "no symbols")
	case j.Size != len(j.Symbols):
		return nil, errorf(name, nil, "size %d but %d symbols", j.Size, len(j.Symbols))
	}
	syms := make([]rune, len(j.Symbols))
	for i, s := range j.Symbols {
		if j.Level == ByteLevel && (s < 0 || s > 255) {
			return nil, errorf(name, nil, "symbol %d is %d, want a byte value (0 to 255)", i, s)
		}
		if j.Level == CharLevel && (s < 0 || s > utf8.MaxRune || !utf8.ValidRune(rune(s))) {
			return nil, errorf(name, nil, "symbol %d is %d, not a Unicode code point (0 to 0x10FFFF, no surrogates)", i, s)
		}
		if i > 0 && s <= j.Symbols[i-1] {
			return nil, errorf(name, nil, "symbol %d (%d) is not above symbol %d (%d): symbols must be sorted and distinct", i, s, i-1, j.Symbols[i-1])
		}
		syms[i] = rune(s)
	}
	return newVocab(j.Level, syms), nil
}

// TextOptions configures LoadText and NewText.
type TextOptions struct {
	// Level is ByteLevel or CharLevel; "" means ByteLevel.
	Level TextLevel
	// Vocab, when not nil, is used instead of the text's own vocabulary
	// (for example the one saved with a model); every symbol of the text
	// must be in it, and its level is used.
	Vocab *Vocab
	// ValFraction is the fraction of the tokens, taken from the end of the
	// text, held out for validation: 0 (none) to below 1. The vocabulary is
	// built from the whole text, so validation tokens are always known.
	ValFraction float64
}

// Text is a text encoded to token ids and split for training.
type Text struct {
	// Vocab maps symbols to ids.
	Vocab *Vocab
	// Train holds the first tokens, Val the last ValFraction of them
	// (rounded down). They share one array.
	Train, Val []int32
}

// LoadText reads a text file (a regular file of at most MaxTextBytes) and
// encodes it as NewText does.
func LoadText(path string, opt TextOptions) (*Text, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, openError(path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, openError(path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, errorf(path, nil, "not a regular file")
	}
	if st.Size() > MaxTextBytes {
		return nil, errorf(path, nil, "%d bytes, more than the %d supported", st.Size(), int64(MaxTextBytes))
	}
	b := make([]byte, st.Size())
	if n, err := io.ReadFull(f, b); err != nil {
		return nil, errorf(path, err, "read: %d of %d bytes: %v", n, len(b), unwrapPathError(err))
	}
	return NewText(b, path, opt)
}

// NewText encodes text with opt.Vocab, or with the text's own vocabulary
// at opt.Level, and splits it into training and validation tokens. name is
// used in error messages only.
func NewText(text []byte, name string, opt TextOptions) (*Text, error) {
	if opt.ValFraction < 0 || opt.ValFraction >= 1 || math.IsNaN(opt.ValFraction) {
		return nil, errorf(name, nil, "TextOptions.ValFraction is %v, want 0 to below 1", opt.ValFraction)
	}
	v := opt.Vocab
	if v == nil {
		level := opt.Level
		if level == "" {
			level = ByteLevel
		}
		var err error
		if v, err = NewVocab(text, level, name); err != nil {
			return nil, err
		}
	}
	ids, err := v.Encode(text, name)
	if err != nil {
		return nil, err
	}
	nVal := int(float64(len(ids)) * opt.ValFraction)
	cut := len(ids) - nVal
	return &Text{Vocab: v, Train: ids[:cut:cut], Val: ids[cut:]}, nil
}

// WindowSampler draws batches of windows for next-token prediction from a
// sequence of tokens: each example is x = tokens[i:i+T] and y =
// tokens[i+1:i+T+1] for a start i drawn uniformly from 0 to len(tokens)-T-1.
// It holds no state: batch s is a fixed function of (len(tokens), T, B,
// Seed, s), so a resumed run sees the same batches, and it is safe for
// concurrent use.
//
// The draw is part of this package's contract, like Permutation's: the
// starts of batch s are B successive draws of Lemire's bounded integers
// (boundedUint32) from math/rand/v2's PCG seeded with (Seed,
// splitmix64(s)).
type WindowSampler struct {
	tokens            []int32
	blockSize, batchN int
	seed              uint64
}

// NewWindowSampler returns a sampler of batches of batchSize windows of
// blockSize tokens. tokens must hold at least blockSize+1 tokens and fewer
// than 2^32; blockSize and batchSize must be positive.
func NewWindowSampler(tokens []int32, blockSize, batchSize int, seed uint64) (*WindowSampler, error) {
	switch {
	case blockSize <= 0 || batchSize <= 0:
		return nil, fmt.Errorf("data: NewWindowSampler: block size %d and batch size %d, want both positive", blockSize, batchSize)
	case len(tokens) < blockSize+1:
		return nil, fmt.Errorf("data: NewWindowSampler: %d tokens, want at least block size + 1 = %d", len(tokens), blockSize+1)
	case int64(len(tokens)) >= 1<<32:
		return nil, fmt.Errorf("data: NewWindowSampler: %d tokens, want fewer than 2^32", len(tokens))
	}
	return &WindowSampler{tokens: tokens, blockSize: blockSize, batchN: batchSize, seed: seed}, nil
}

// BlockSize is T, the tokens in each window.
func (s *WindowSampler) BlockSize() int { return s.blockSize }

// BatchSize is B, the windows in each batch.
func (s *WindowSampler) BatchSize() int { return s.batchN }

// Starts returns the B window starts of batch step.
func (s *WindowSampler) Starts(step int) []int {
	r := rand.NewPCG(s.seed, splitmix64(uint64(step)))
	n := uint32(len(s.tokens) - s.blockSize)
	starts := make([]int, s.batchN)
	for i := range starts {
		starts[i] = int(boundedUint32(r, n))
	}
	return starts
}

// Batch returns batch step: x and y of B*T token ids each, window after
// window, y being x shifted by one token.
func (s *WindowSampler) Batch(step int) (x, y []int32) {
	x = make([]int32, s.batchN*s.blockSize)
	y = make([]int32, s.batchN*s.blockSize)
	s.BatchInto(step, x, y)
	return x, y
}

// BatchInto is Batch writing into x and y, which must hold B*T ids each.
func (s *WindowSampler) BatchInto(step int, x, y []int32) {
	t := s.blockSize
	if len(x) < s.batchN*t || len(y) < s.batchN*t {
		panic(fmt.Sprintf("data: WindowSampler.BatchInto: x and y hold %d and %d ids, want %d", len(x), len(y), s.batchN*t))
	}
	for b, i := range s.Starts(step) {
		copy(x[b*t:(b+1)*t], s.tokens[i:i+t])
		copy(y[b*t:(b+1)*t], s.tokens[i+1:i+t+1])
	}
}
