package nn

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// testNet is a small module with PyTorch-style names: conv1.weight [2 1 3 3],
// conv1.bias [2], fc1.weight [3 8], fc1.bias [3].
func testNet(seed uint64) *Sequential {
	rng := rand.New(rand.NewPCG(seed, 7))
	return &Sequential{Layers: []Layer{
		{"conv1", NewConv2d(tensor.CPU, rng, 1, 2, 3)},
		{"fc1", NewLinear(tensor.CPU, rng, 8, 3)},
	}}
}

func paramValues(m Module) [][]float32 {
	var out [][]float32
	for _, p := range Parameters(m) {
		out = append(out, p.Tensor.Float32s())
	}
	return out
}

func sameValues(a, b [][]float32) bool {
	return slices.EqualFunc(a, b, func(x, y []float32) bool { return slices.Equal(x, y) })
}

func TestSaveLoadRoundTrip(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "net.safetensors")
	a := testNet(1)
	if err := SaveFile(path, a, map[string]string{"note": "hello \"world\"\n"}); err != nil {
		t.Fatal(err)
	}
	b := testNet(2)
	if sameValues(paramValues(a), paramValues(b)) {
		t.Fatal("different seeds gave the same parameters")
	}
	if err := LoadFile(path, b); err != nil {
		t.Fatal(err)
	}
	if !sameValues(paramValues(a), paramValues(b)) {
		t.Fatal("loaded parameters differ from the saved ones")
	}
	x := tensor.FromFloat32(tensor.CPU, nil, []float32{
		1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18,
		18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1,
	}, 2, 1, 3, 6)
	fwd := func(m *Sequential) []float32 {
		return m.Layers[1].Module.Forward(m.Layers[0].Module.Forward(x).Flatten()).Float32s()
	}
	if ya, yb := fwd(a), fwd(b); !slices.Equal(ya, yb) {
		t.Fatalf("outputs differ: %v vs %v", ya, yb)
	}

	f, err := ReadSafetensorsFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if f.Metadata["format"] != "pt" || f.Metadata["note"] != "hello \"world\"\n" {
		t.Errorf("metadata %q", f.Metadata)
	}
	var names []string
	for _, tt := range f.Tensors {
		names = append(names, tt.Name)
	}
	if want := []string{"conv1.weight", "conv1.bias", "fc1.weight", "fc1.bias"}; !slices.Equal(names, want) {
		t.Errorf("tensors %v, want %v", names, want)
	}
	raw, _ := os.ReadFile(path)
	n := binary.LittleEndian.Uint64(raw)
	if n%8 != 0 {
		t.Errorf("header length %d is not a multiple of 8", n)
	}
	if !json.Valid(raw[8 : 8+n]) {
		t.Errorf("header is not valid JSON: %q", raw[8:8+n])
	}
	if want := 8 + int(n) + 4*NumParameters(a); len(raw) != want {
		t.Errorf("file is %d bytes, want %d", len(raw), want)
	}
}

// TestReferenceBytes checks the exact bytes written for a tiny state dict
// against those Python's safetensors writes for the same tensors:
//
//	save_file({"b": torch.tensor([1.0, -2.0]), "a": torch.zeros(0)}, "x")
//
// except for the order of the header's entries (ours keeps the given
// order; the reference sorts by dtype, then name) which no reader uses.
func TestReferenceBytes(t *testing.T) {
	got, err := EncodeSafetensors([]NamedTensor{
		{Name: "a", Shape: []int{0}, Data: nil},
		{Name: "b", Shape: []int{2}, Data: []float32{1, -2}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	header := `{"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`
	for len(header)%8 != 0 {
		header += " "
	}
	want := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	want = append(want, header...)
	want = append(want, 0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0)
	if !bytes.Equal(got, want) {
		t.Fatalf("got\n%q\nwant\n%q", got, want)
	}
}

func TestWriteSafetensorsErrors(t *testing.T) {
	cases := map[string][]NamedTensor{
		"has no name":      {{Name: "", Shape: []int{1}, Data: []float32{1}}},
		"cannot be named":  {{Name: "__metadata__", Shape: []int{1}, Data: []float32{1}}},
		"two tensors":      {{Name: "a", Shape: []int{1}, Data: []float32{1}}, {Name: "a", Shape: []int{1}, Data: []float32{1}}},
		"3 values":         {{Name: "a", Shape: []int{2}, Data: []float32{1, 2, 3}}},
		"has shape [-1 2]": {{Name: "a", Shape: []int{-1, 2}, Data: nil}},
	}
	for want, ts := range cases {
		_, err := EncodeSafetensors(ts, nil)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v", want, err)
		}
	}
	err := SaveFile(filepath.Join(t.TempDir(), "no", "dir", "x.safetensors"), testNet(1), nil)
	if err == nil || !strings.Contains(err.Error(), "x.safetensors") || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("save into a missing directory: %v", err)
	}
}

// entry is one header entry of a hand-made file.
type entry struct {
	name, dtype string
	shape       []int
	begin, end  int
}

// handMade builds a safetensors file the way another program might: the
// header entries in the given order, any metadata, given data bytes, no
// padding unless asked.
func handMade(entries []entry, meta map[string]string, data []byte, pad bool) []byte {
	var h bytes.Buffer
	h.WriteString("{")
	for i, e := range entries {
		if i > 0 {
			h.WriteString(", ")
		}
		shape, _ := json.Marshal(e.shape)
		fmt.Fprintf(&h, "%q: {\"dtype\": %q, \"shape\": %s, \"data_offsets\": [%d, %d]}", e.name, e.dtype, shape, e.begin, e.end)
	}
	if meta != nil {
		m, _ := json.Marshal(meta)
		fmt.Fprintf(&h, ", \"__metadata__\": %s", m)
	}
	h.WriteString("}")
	for pad && h.Len()%8 != 0 {
		h.WriteByte(' ')
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(h.Len()))
	out = append(out, h.Bytes()...)
	return append(out, data...)
}

func f32Bytes(v []float32) []byte {
	var b []byte
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

// foreignFile lays out the tensors of m in reverse order in the data, with
// the header entries in yet another order and metadata at the end.
func foreignFile(m Module) []byte {
	ps := Parameters(m)
	var data []byte
	entries := make([]entry, len(ps))
	for i := len(ps) - 1; i >= 0; i-- {
		b := f32Bytes(ps[i].Tensor.Float32s())
		entries[i] = entry{ps[i].Name, "F32", ps[i].Tensor.Shape(), len(data), len(data) + len(b)}
		data = append(data, b...)
	}
	entries[0], entries[2] = entries[2], entries[0]
	return handMade(entries, map[string]string{"format": "pt", "producer": "another program"}, data, false)
}

func TestLoadForeignFile(t *testing.T) {
	src := testNet(3)
	path := filepath.Join(t.TempDir(), "foreign.safetensors")
	if err := os.WriteFile(path, foreignFile(src), 0o644); err != nil {
		t.Fatal(err)
	}
	dst := testNet(4)
	if err := LoadFile(path, dst); err != nil {
		t.Fatal(err)
	}
	if !sameValues(paramValues(src), paramValues(dst)) {
		t.Fatal("parameters differ after loading a file with another layout")
	}
	f, _ := ReadSafetensorsFile(path)
	if f.Metadata["producer"] != "another program" {
		t.Errorf("metadata %q", f.Metadata)
	}
	if Fingerprint(StateDict(src)) != Fingerprint(StateDict(dst)) {
		t.Error("fingerprints differ")
	}
}

// badCase is a broken checkpoint and what its error must say.
type badCase struct {
	name string
	file []byte
	want string
}

// badCheckpoints derives broken files from a good checkpoint of testNet.
func badCheckpoints(t testing.TB) []badCase {
	m := testNet(5)
	ps := Parameters(m)
	good, err := EncodeSafetensors(StateDict(m), nil)
	if err != nil {
		t.Fatal(err)
	}
	// The four tensors laid out in order, as entries and data.
	var entries []entry
	var data []byte
	for _, p := range ps {
		b := f32Bytes(p.Tensor.Float32s())
		entries = append(entries, entry{p.Name, "F32", p.Tensor.Shape(), len(data), len(data) + len(b)})
		data = append(data, b...)
	}
	with := func(i int, f func(e *entry)) []entry {
		es := slices.Clone(entries)
		f(&es[i])
		return es
	}
	hdr := func(h string) []byte {
		return append(binary.LittleEndian.AppendUint64(nil, uint64(len(h))), h...)
	}
	fc1w := entries[2] // fc1.weight [3 8], 96 bytes
	return []badCase{
		{"empty file", nil, "truncated: 0 bytes"},
		{"truncated length", good[:5], "truncated: 5 bytes"},
		{"truncated header", good[:40], "is larger than the file (40 bytes)"},
		{"truncated data", good[:len(good)-10], `truncated: tensor "fc1.bias" data_offsets [`},
		{"huge header length", binary.LittleEndian.AppendUint64(nil, 1<<62), "header length 4611686018427387904 is larger than the file (8 bytes)"},
		{"header not JSON", hdr("this is not json"), "header is not a JSON object"},
		{"header JSON array", hdr(`[{"a":1}]`), `header is not a JSON object (it starts with "[{\"a\":1}]")`},
		{"header cut JSON", hdr(`{"a": {"dtype": "F32"`), "header is not a JSON object: unexpected end of JSON"},
		{"header not UTF-8", hdr("{\"\xff\": 1}"), "not valid UTF-8"},
		{"trailing junk in header", hdr(`{} x`), "bytes after its JSON object"},
		{"missing tensor", handMade(entries[:3], nil, data[:entries[3].begin], true), `missing tensor "fc1.bias"`},
		{"two missing tensors", handMade(entries[:2], nil, data[:entries[2].begin], true), `missing tensors "fc1.weight", "fc1.bias"`},
		{"extra tensor", handMade(append(slices.Clone(entries), entry{"fc2.weight", "F32", []int{1}, len(data), len(data) + 4}), nil, append(slices.Clone(data), 0, 0, 0, 0), true),
			`unexpected tensor "fc2.weight"`},
		{"shape mismatch", handMade(with(2, func(e *entry) { e.shape = []int{8, 3} }), nil, data, true),
			`tensor "fc1.weight" has shape [8 3] in the file but [3 8] in the model`},
		{"wrong dtype", handMade(with(2, func(e *entry) { e.dtype = "F16"; e.shape = []int{3, 16} }), nil, data, true),
			`tensor "fc1.weight" has dtype F16, want F32`},
		{"unknown dtype", handMade(with(2, func(e *entry) { e.dtype = "F33" }), nil, data, true), `tensor "fc1.weight": unknown dtype "F33"`},
		{"offsets out of range", handMade(with(3, func(e *entry) { e.begin, e.end = fc1w.end, fc1w.end+4000; e.shape = []int{1000} }), nil, data, true),
			`tensor "fc1.bias" data_offsets [` + fmt.Sprint(fc1w.end) + `, ` + fmt.Sprint(fc1w.end+4000) + `] run past the end of the data`},
		{"offsets overlap", handMade(with(3, func(e *entry) { e.begin, e.end = fc1w.end-4, fc1w.end+8 }), nil, data, true), `tensors "fc1.weight" [`},
		{"offsets leave a gap", handMade(with(3, func(e *entry) { e.begin, e.end = fc1w.end+4, fc1w.end+16 }), nil, append(slices.Clone(data), 0, 0, 0, 0), true),
			`between tensors "fc1.weight" and "fc1.bias" belong to no tensor`},
		{"offsets not matching shape", handMade(with(2, func(e *entry) { e.shape = []int{3, 7} }), nil, data, true),
			`tensor "fc1.weight": data_offsets [` + fmt.Sprint(fc1w.begin) + `, ` + fmt.Sprint(fc1w.end) + `] hold 96 bytes, but shape [3 7] of dtype F32 needs 84`},
		{"offsets reversed", handMade(with(0, func(e *entry) { e.begin, e.end = e.end, e.begin }), nil, data, true), "end before they begin"},
		{"bytes after the data", handMade(entries, nil, append(slices.Clone(data), 1, 2, 3), true), "3 bytes after the end of the last tensor's data"},
		{"duplicate tensor", hdr(`{"a":{"dtype":"F32","shape":[],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[],"data_offsets":[4,8]}}`), `tensor "a" appears twice`},
		{"negative dimension", handMade(with(1, func(e *entry) { e.shape = []int{-2} }), nil, data, true), `tensor "conv1.bias": shape is "[-2]", want an array of non-negative integers`},
		{"shape overflow", hdr(`{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}}`), `tensor "a": shape [4294967296 4294967296] is too large`},
		{"missing field", hdr(`{"a":{"dtype":"F32","data_offsets":[0,0]}}`), `tensor "a": header entry has no "shape"`},
		{"metadata not strings", hdr(`{"__metadata__":{"n":1}}`), `"__metadata__" entry "n" is "1", want a string`},
	}
}

func TestBadCheckpoints(t *testing.T) {
	cases := badCheckpoints(t)
	dir := t.TempDir()
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(dir, fmt.Sprintf("bad%02d.safetensors", i))
			if err := os.WriteFile(path, c.file, 0o644); err != nil {
				t.Fatal(err)
			}
			m := testNet(9)
			before := paramValues(m)
			err := LoadFile(path, m)
			if err == nil {
				t.Fatal("loaded a bad checkpoint")
			}
			msg := err.Error()
			if !strings.Contains(msg, path) || !strings.Contains(msg, c.want) || strings.ContainsAny(msg, "\r\n") {
				t.Errorf("error %q\nwant one line naming %s and containing %q", msg, path, c.want)
			}
			var ce *CheckpointError
			if !errors.As(err, &ce) {
				t.Errorf("error is %T, want *CheckpointError", err)
			}
			if !sameValues(before, paramValues(m)) {
				t.Error("a failed load changed the model's parameters")
			}
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "none.safetensors")
	err := LoadFile(path, testNet(1))
	if err == nil || !errors.Is(err, fs.ErrNotExist) || err.Error() != "nn: "+path+": no such file or directory" {
		t.Errorf("got %v", err)
	}
}

func TestOtherDTypesParse(t *testing.T) {
	// A file with tensors of several dtypes, scalars and empty tensors parses
	// (as the reference reads it), though only F32 loads into a model.
	b := handMade([]entry{
		{"bf", "BF16", []int{3}, 0, 6},
		{"scalar", "F32", []int{}, 6, 10},
		{"empty", "I64", []int{0, 5}, 10, 10},
		{"f4", "F4", []int{4}, 10, 12},
		{"u8", "U8", []int{2, 2}, 12, 16},
	}, map[string]string{}, make([]byte, 16), true)
	f, err := ReadSafetensors("x", b)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := f.Float32s("scalar"); err != nil || len(v) != 1 {
		t.Errorf("scalar: %v, %v", v, err)
	}
	if _, err := f.Float32s("bf"); err == nil || !strings.Contains(err.Error(), `tensor "bf" has dtype BF16, want F32`) {
		t.Errorf("bf: %v", err)
	}
	if len(f.Bytes("u8")) != 4 || f.Bytes("nope") != nil {
		t.Error("Bytes")
	}
}

// FuzzReadSafetensors checks that no input makes the reader panic, that
// what it accepts is consistent, and that accepted F32 files survive a
// write/read round trip. The seeds (run by plain go test) are a good file,
// a foreign-layout file and every broken file of TestBadCheckpoints.
func FuzzReadSafetensors(f *testing.F) {
	good, _ := EncodeSafetensors(StateDict(testNet(1)), map[string]string{"k": "v"})
	f.Add(good)
	f.Add(foreignFile(testNet(2)))
	for _, c := range badCheckpoints(f) {
		f.Add(c.file)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		sf, err := ReadSafetensors("fuzz", b)
		if err != nil {
			if msg := err.Error(); !strings.HasPrefix(msg, "nn: fuzz: ") || strings.ContainsAny(msg, "\r\n") {
				t.Fatalf("bad error message %q", msg)
			}
			return
		}
		var all []NamedTensor
		allF32 := true
		var total int64
		for _, tt := range sf.Tensors {
			total += tt.End - tt.Begin
			if int64(len(sf.Bytes(tt.Name))) != tt.End-tt.Begin {
				t.Fatalf("tensor %q: %d bytes for range [%d, %d)", tt.Name, len(sf.Bytes(tt.Name)), tt.Begin, tt.End)
			}
			if tt.DType != "F32" || tt.Name == "" { // the writer refuses empty names
				allF32 = false
				continue
			}
			v, err := sf.Float32s(tt.Name)
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, NamedTensor{Name: tt.Name, Shape: tt.Shape, Data: v})
		}
		if total != int64(len(sf.data)) {
			t.Fatalf("tensors cover %d bytes of %d", total, len(sf.data))
		}
		if !allF32 {
			return
		}
		enc, err := EncodeSafetensors(all, sf.Metadata)
		if err != nil {
			t.Fatal(err)
		}
		back, err := ReadSafetensors("again", enc)
		if err != nil {
			t.Fatalf("re-reading our own encoding: %v", err)
		}
		var again []NamedTensor
		for _, tt := range back.Tensors {
			v, _ := back.Float32s(tt.Name)
			again = append(again, NamedTensor{Name: tt.Name, Shape: tt.Shape, Data: v})
		}
		if Fingerprint(all) != Fingerprint(again) || len(back.Metadata) != len(sf.Metadata) {
			t.Fatal("round trip changed the tensors or metadata")
		}
	})
}
