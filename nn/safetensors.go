package nn

// A reader and writer of the safetensors format
// (https://github.com/huggingface/safetensors):
//
//	8 bytes      N, the header length, little-endian uint64
//	N bytes      JSON header: {"name": {"dtype": "F32", "shape": [...],
//	             "data_offsets": [begin, end]}, ..., "__metadata__": {"k": "v"}}
//	             padded with spaces to a multiple of 8 bytes
//	the rest     tensor data, little-endian, row-major; offsets count from
//	             the first byte after the header
//
// This file writes only F32 tensors but reads and checks files holding any
// of the format's dtypes, with the rules of the reference implementation:
// the tensors' byte ranges must tile the data exactly (no gaps, no overlap,
// nothing after the last tensor), each range must be as long as its shape
// and dtype need, and the header must be a JSON object of at most 100 MB.
//
// It does not use github.com/nlpodyssey/safetensors: that package's errors
// name neither the sizes nor, for a wrong byte count, the tensor ("metadata
// incomplete buffer" stands for both a truncated file and trailing bytes;
// "info data offsets mismatch" for a shape that does not fit its range), it
// does not know the F8/F4/F6 dtypes, it cannot make a view of a 0-d tensor
// (it counts shape [] as 0 elements), it returns tensors in a map, and it
// serialises from a map of []byte views (one more copy of every tensor).

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"math/bits"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ember-ml/ember/internal/atomicfile"
	"github.com/ember-ml/ember/internal/safefile"
	"github.com/ember-ml/ember/tensor"
)

// MaxSafetensorsHeader is the largest header accepted, as in the reference
// implementation.
const MaxSafetensorsHeader = 100_000_000

// metadataKey is the header entry holding string metadata.
const metadataKey = "__metadata__"

// CheckpointError reports a checkpoint file that cannot be read, written,
// or loaded into a model. Its message is one line: "nn: FILE: PROBLEM".
type CheckpointError struct {
	File    string
	Problem string
	Err     error // the underlying error (an fs error, ErrStateMismatch), or nil
}

func (e *CheckpointError) Error() string { return "nn: " + e.File + ": " + e.Problem }
func (e *CheckpointError) Unwrap() error { return e.Err }

func ckErrorf(file string, cause error, format string, args ...any) *CheckpointError {
	return &CheckpointError{File: file, Problem: oneLine(fmt.Sprintf(format, args...)), Err: cause}
}

// fileError wraps an error of the file system (open, read, write) into a
// CheckpointError without repeating the path.
func fileError(file string, err error) *CheckpointError {
	var pe *fs.PathError
	msg := err.Error()
	if errors.As(err, &pe) {
		msg = pe.Err.Error()
		if pe.Op != "open" && pe.Op != "read" {
			msg = pe.Op + ": " + msg
		}
	}
	return &CheckpointError{File: file, Problem: oneLine(msg), Err: err}
}

func oneLine(s string) string {
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	return strings.Join(strings.Fields(s), " ")
}

// NamedTensor is a float32 tensor on the host with its state_dict name.
type NamedTensor struct {
	Name  string
	Shape []int
	Data  []float32 // row-major, len = product of Shape
}

// StateDict copies the parameters and buffers of m to the host, in m's order, named as
// in a PyTorch state_dict. It works for any backend (Float32s downloads). A
// parameter whose tensor is nil (a layer without bias) is left out, as
// PyTorch leaves out a bias of None.
func StateDict(m Module) []NamedTensor {
	ps := StateTensors(m)
	out := make([]NamedTensor, 0, len(ps))
	for _, p := range ps {
		if p.Tensor != nil {
			out = append(out, NamedTensor{Name: p.Name, Shape: p.Tensor.Shape(), Data: p.Tensor.Float32s()})
		}
	}
	return out
}

// WriteSafetensors writes tensors (as F32, in the order given) and metadata
// (omitted when empty) in the safetensors format. Names must be unique, not
// empty and not "__metadata__", and each Data must have as many values as
// its Shape.
func WriteSafetensors(w io.Writer, tensors []NamedTensor, metadata map[string]string) error {
	header, err := safetensorsHeader(tensors, metadata)
	if err != nil {
		return err
	}
	if _, err := w.Write(header); err != nil {
		return err
	}
	buf := make([]byte, 0, 64<<10)
	for _, t := range tensors {
		for i := 0; i < len(t.Data); {
			buf = buf[:0]
			for ; i < len(t.Data) && len(buf) < cap(buf); i++ {
				buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(t.Data[i]))
			}
			if _, err := w.Write(buf); err != nil {
				return err
			}
		}
	}
	return nil
}

// EncodeSafetensors returns the bytes WriteSafetensors would write.
func EncodeSafetensors(tensors []NamedTensor, metadata map[string]string) ([]byte, error) {
	var b bytes.Buffer
	if err := WriteSafetensors(&b, tensors, metadata); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// safetensorsHeader returns the length prefix and the padded JSON header.
func safetensorsHeader(tensors []NamedTensor, metadata map[string]string) ([]byte, error) {
	var h bytes.Buffer
	h.WriteByte('{')
	if len(metadata) > 0 {
		keys := make([]string, 0, len(metadata))
		for k := range metadata {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		h.WriteString(`"__metadata__":{`)
		for i, k := range keys {
			if i > 0 {
				h.WriteByte(',')
			}
			writeJSONString(&h, k)
			h.WriteByte(':')
			writeJSONString(&h, metadata[k])
		}
		h.WriteByte('}')
	}
	seen := make(map[string]bool, len(tensors))
	var off uint64
	for i, t := range tensors {
		switch {
		case t.Name == "":
			return nil, writeProblem(fmt.Sprintf("tensor %d has no name", i))
		case t.Name == metadataKey:
			return nil, writeProblem(fmt.Sprintf("a tensor cannot be named %q", metadataKey))
		case seen[t.Name]:
			return nil, writeProblem(fmt.Sprintf("two tensors named %q", t.Name))
		}
		seen[t.Name] = true
		n := 1
		for _, d := range t.Shape {
			if d < 0 {
				return nil, writeProblem(fmt.Sprintf("tensor %q has shape %v", t.Name, t.Shape))
			}
			n *= d
		}
		if n != len(t.Data) {
			return nil, writeProblem(fmt.Sprintf("tensor %q has %d values for shape %v", t.Name, len(t.Data), t.Shape))
		}
		if i > 0 || len(metadata) > 0 {
			h.WriteByte(',')
		}
		writeJSONString(&h, t.Name)
		h.WriteString(`:{"dtype":"F32","shape":[`)
		for j, d := range t.Shape {
			if j > 0 {
				h.WriteByte(',')
			}
			h.WriteString(strconv.Itoa(d))
		}
		end := off + 4*uint64(len(t.Data))
		fmt.Fprintf(&h, `],"data_offsets":[%d,%d]}`, off, end)
		off = end
	}
	h.WriteByte('}')
	for h.Len()%8 != 0 {
		h.WriteByte(' ')
	}
	out := binary.LittleEndian.AppendUint64(make([]byte, 0, 8+h.Len()), uint64(h.Len()))
	return append(out, h.Bytes()...), nil
}

// writeProblem is an error in the tensors given to WriteSafetensors.
type writeProblem string

func (e writeProblem) Error() string { return "nn: safetensors: " + string(e) }

func writeJSONString(b *bytes.Buffer, s string) {
	enc, _ := json.Marshal(s) // cannot fail for a string
	b.Write(enc)
}

// dtypeBits are the dtypes of the safetensors format and their widths.
var dtypeBits = map[string]uint64{
	"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
	"I16": 16, "U16": 16, "F16": 16, "BF16": 16,
	"I32": 32, "U32": 32, "F32": 32,
	"I64": 64, "U64": 64, "F64": 64, "C64": 64,
	"F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}

// SafetensorsTensor describes one tensor of a safetensors file.
type SafetensorsTensor struct {
	Name  string
	DType string // "F32", "F16", "BF16", "I64", ...
	Shape []int
	// Begin and End are the tensor's byte range within the data section.
	Begin, End int64
}

// SafetensorsFile is a parsed and checked safetensors file held in memory.
type SafetensorsFile struct {
	// Name is the file name given to ReadSafetensors, used in errors.
	Name string
	// Metadata is the header's "__metadata__" (nil when absent).
	Metadata map[string]string
	// Tensors are in the order of their data.
	Tensors []SafetensorsTensor
	index   map[string]int
	data    []byte
	dataLen int64 // bytes after the header, known before data is read
}

// MaxSafetensorsData bounds the tensor data of a file that
// ReadSafetensorsFile reads (16 GiB), so that no header can make it
// allocate more. Loading into a model (LoadFile, LoadCheckpoint) is bounded
// more tightly: by the model's own size.
const MaxSafetensorsData = 16 << 30

// ReadSafetensorsFile reads and checks the safetensors file at path. Only a
// regular file is read (a directory, a device or a named pipe is refused by
// kind, without blocking), its header is checked against the file's size
// before the data is read, and no more than MaxSafetensorsData bytes of
// data are.
func ReadSafetensorsFile(path string) (*SafetensorsFile, error) {
	return readSafetensorsFile(path, nil)
}

// ReadSafetensorsMetadata reads only the header of the safetensors file at
// path, checked as ReadSafetensorsFile checks it, and returns its metadata
// (nil when there is none): enough to tell what wrote a file without reading
// its tensors.
func ReadSafetensorsMetadata(path string) (map[string]string, error) {
	var meta map[string]string
	_, err := readSafetensorsFile(path, func(f *SafetensorsFile) error {
		meta = f.Metadata
		return errHeaderOnly
	})
	if err == errHeaderOnly {
		err = nil
	}
	return meta, err
}

var errHeaderOnly = errors.New("header only")

// readSafetensorsFile reads the header of the file at path, checks it
// against the file's size, lets accept refuse the file by its header alone
// (say, because it does not fit a model), and only then reads the data, of
// the size the header and the file agree on.
func readSafetensorsFile(path string, accept func(*SafetensorsFile) error) (*SafetensorsFile, error) {
	fh, st, err := safefile.Open(path, 8+MaxSafetensorsHeader+MaxSafetensorsData)
	if err != nil {
		return nil, fileError(path, err)
	}
	defer fh.Close()
	size := st.Size()
	var lenBuf [8]byte
	k, err := io.ReadFull(fh, lenBuf[:min(8, int(size))])
	if err != nil {
		return nil, fileError(path, err)
	}
	header, err := readHeader(path, lenBuf[:k], size, func(n int64) ([]byte, error) {
		h := make([]byte, n)
		_, err := io.ReadFull(fh, h)
		return h, err
	})
	if err != nil {
		return nil, err
	}
	dataLen := size - 8 - int64(len(header))
	f, err := parseSafetensors(path, header, dataLen)
	if err != nil {
		return nil, err
	}
	if accept != nil {
		if err := accept(f); err != nil {
			return nil, err
		}
	}
	f.data = make([]byte, dataLen)
	if _, err := io.ReadFull(fh, f.data); err != nil {
		if err == io.ErrUnexpectedEOF || err == io.EOF {
			return nil, ckErrorf(path, err, "truncated while being read (another process writing it?)")
		}
		return nil, fileError(path, err)
	}
	return f, nil
}

// readHeader checks the 8-byte length prefix against the size of the whole
// file and the limit, then returns the header that read gives for it.
func readHeader(name string, prefix []byte, size int64, read func(n int64) ([]byte, error)) ([]byte, error) {
	if len(prefix) < 8 {
		return nil, ckErrorf(name, nil, "truncated: %d bytes, but a safetensors file starts with an 8-byte header length", size)
	}
	n := binary.LittleEndian.Uint64(prefix)
	if n > uint64(size-8) {
		return nil, ckErrorf(name, nil, "header length %d is larger than the file (%d bytes): truncated, or not a safetensors file", n, size)
	}
	if n > MaxSafetensorsHeader {
		return nil, ckErrorf(name, nil, "header length %d exceeds the limit of %d bytes", n, MaxSafetensorsHeader)
	}
	h, err := read(int64(n))
	if err != nil {
		if err == io.ErrUnexpectedEOF || err == io.EOF {
			return nil, ckErrorf(name, err, "truncated while being read (another process writing it?)")
		}
		return nil, fileError(name, err)
	}
	return h, nil
}

// ReadSafetensors parses and checks a safetensors file held in b; name is
// the file name for errors. It checks everything the format requires and
// returns a *CheckpointError naming the file and the first problem found.
// The result shares memory with b.
func ReadSafetensors(name string, b []byte) (*SafetensorsFile, error) {
	header, err := readHeader(name, b[:min(8, len(b))], int64(len(b)), func(n int64) ([]byte, error) { return b[8 : 8+n], nil })
	if err != nil {
		return nil, err
	}
	data := b[8+len(header):]
	f, err := parseSafetensors(name, header, int64(len(data)))
	if err != nil {
		return nil, err
	}
	f.data = data
	return f, nil
}

// parseSafetensors checks the header and that the tensors it describes tile
// dataLen bytes of data exactly.
func parseSafetensors(name string, header []byte, dataLen int64) (*SafetensorsFile, error) {
	if !utf8.Valid(header) {
		return nil, ckErrorf(name, nil, "header is not valid UTF-8: not a safetensors file")
	}
	f := &SafetensorsFile{Name: name, index: map[string]int{}, dataLen: dataLen}
	if err := f.parseHeader(header); err != nil {
		return nil, err
	}
	if err := f.checkLayout(); err != nil {
		return nil, err
	}
	return f, nil
}

// parseHeader decodes the JSON header into f.Metadata and f.Tensors,
// checking each entry.
func (f *SafetensorsFile) parseHeader(header []byte) error {
	fail := func(format string, args ...any) error { return ckErrorf(f.Name, nil, format, args...) }
	notJSON := func(err error) error {
		return fail("header is not a JSON object: %s", jsonProblem(err))
	}
	dec := json.NewDecoder(bytes.NewReader(header))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return notJSON(err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return fail("header is not a JSON object (it starts with %s)", quoteSnippet(header))
	}
	seenMeta := false
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return notJSON(err)
		}
		key := tok.(string) // object keys are always strings
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return notJSON(err)
		}
		if key == metadataKey {
			if seenMeta {
				return fail("header has two %q entries", metadataKey)
			}
			seenMeta = true
			if err := f.parseMetadata(raw); err != nil {
				return err
			}
			continue
		}
		if _, dup := f.index[key]; dup {
			return fail("tensor %q appears twice in the header", key)
		}
		t, err := f.parseTensor(key, raw)
		if err != nil {
			return err
		}
		f.index[key] = len(f.Tensors)
		f.Tensors = append(f.Tensors, t)
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return notJSON(err)
	}
	rest := header[dec.InputOffset():]
	if len(bytes.TrimLeft(rest, " \t\r\n")) != 0 {
		return fail("header has %d bytes after its JSON object, want only space padding", len(rest))
	}
	return nil
}

func (f *SafetensorsFile) parseMetadata(raw json.RawMessage) error {
	if string(raw) == "null" {
		return nil
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return ckErrorf(f.Name, nil, "header: %q is %s, want an object of strings", metadataKey, quoteSnippet(raw))
	}
	f.Metadata = make(map[string]string, len(m))
	for k, v := range m {
		s, ok := v.(string)
		if !ok {
			return ckErrorf(f.Name, nil, "header: %q entry %q is %s, want a string", metadataKey, k, jsonSnippet(v))
		}
		f.Metadata[k] = s
	}
	return nil
}

func (f *SafetensorsFile) parseTensor(name string, raw json.RawMessage) (SafetensorsTensor, error) {
	t := SafetensorsTensor{Name: name}
	fail := func(format string, args ...any) (SafetensorsTensor, error) {
		return t, ckErrorf(f.Name, nil, "tensor %q: "+format, append([]any{name}, args...)...)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return fail("header entry is %s, want an object with dtype, shape and data_offsets", quoteSnippet(raw))
	}
	for _, k := range []string{"dtype", "shape", "data_offsets"} {
		if _, ok := fields[k]; !ok {
			return fail("header entry has no %q", k)
		}
	}
	if err := json.Unmarshal(fields["dtype"], &t.DType); err != nil {
		return fail("dtype is %s, want a string such as \"F32\"", quoteSnippet(fields["dtype"]))
	}
	bitsPer, ok := dtypeBits[t.DType]
	if !ok {
		return fail("unknown dtype %q", t.DType)
	}
	shape, ok := parseUints(fields["shape"], -1)
	if !ok {
		return fail("shape is %s, want an array of non-negative integers", quoteSnippet(fields["shape"]))
	}
	offs, ok := parseUints(fields["data_offsets"], 2)
	if !ok {
		return fail("data_offsets is %s, want [begin, end], two non-negative integers", quoteSnippet(fields["data_offsets"]))
	}
	// Bytes needed: product of shape times the dtype width, without
	// overflow, and limited to what an int64 offset can hold.
	nbits, over := bitsPer, false
	for _, d := range shape {
		hi, lo := bits.Mul64(nbits, d)
		over = over || hi != 0 || d > math.MaxInt
		nbits = lo
	}
	if over || nbits/8 > math.MaxInt {
		return fail("shape %v is too large", shape)
	}
	t.Shape = make([]int, len(shape))
	for i, d := range shape {
		t.Shape[i] = int(d)
	}
	if nbits%8 != 0 {
		return fail("shape %v of dtype %s is %d bits, not a whole number of bytes", t.Shape, t.DType, nbits)
	}
	if offs[0] > offs[1] {
		return fail("data_offsets [%d, %d] end before they begin", offs[0], offs[1])
	}
	if offs[1] > math.MaxInt64 {
		return fail("data_offsets [%d, %d] out of range", offs[0], offs[1])
	}
	if offs[1]-offs[0] != nbits/8 {
		return fail("data_offsets [%d, %d] hold %d bytes, but shape %v of dtype %s needs %d",
			offs[0], offs[1], offs[1]-offs[0], t.Shape, t.DType, nbits/8)
	}
	t.Begin, t.End = int64(offs[0]), int64(offs[1])
	return t, nil
}

// parseUints decodes a JSON array of non-negative integers (of length want,
// unless want < 0).
func parseUints(raw json.RawMessage, want int) ([]uint64, bool) {
	var nums []json.RawMessage
	if err := json.Unmarshal(raw, &nums); err != nil || nums == nil || (want >= 0 && len(nums) != want) {
		return nil, false
	}
	out := make([]uint64, len(nums))
	for i, n := range nums {
		// Only plain integer literals: not "2" (a string), 2.0 or 2e0.
		v, err := strconv.ParseUint(string(bytes.TrimSpace(n)), 10, 64)
		if err != nil {
			return nil, false
		}
		out[i] = v
	}
	return out, true
}

// checkLayout checks that the tensors' byte ranges tile the data section.
func (f *SafetensorsFile) checkLayout() error {
	fail := func(format string, args ...any) error { return ckErrorf(f.Name, nil, format, args...) }
	slices.SortStableFunc(f.Tensors, func(a, b SafetensorsTensor) int {
		if a.Begin != b.Begin {
			return cmpInt64(a.Begin, b.Begin)
		}
		return cmpInt64(a.End, b.End)
	})
	for i, t := range f.Tensors {
		f.index[t.Name] = i
	}
	var pos int64
	prev := ""
	for _, t := range f.Tensors {
		switch {
		case t.Begin < pos:
			return fail("tensors %q [%d, %d) and %q [%d, %d) overlap",
				prev, f.Tensors[f.index[prev]].Begin, pos, t.Name, t.Begin, t.End)
		case t.Begin > pos:
			if prev == "" {
				return fail("data bytes [0, %d) before tensor %q belong to no tensor", t.Begin, t.Name)
			}
			return fail("data bytes [%d, %d) between tensors %q and %q belong to no tensor", pos, t.Begin, prev, t.Name)
		}
		if t.End > f.dataLen {
			return fail("truncated: tensor %q data_offsets [%d, %d] run past the end of the data (%d bytes after the header; the header describes %d)",
				t.Name, t.Begin, t.End, f.dataLen, f.Tensors[len(f.Tensors)-1].End)
		}
		if t.End > t.Begin || prev == "" {
			pos, prev = t.End, t.Name
		}
	}
	if extra := f.dataLen - pos; extra > 0 {
		return fail("%d bytes after the end of the last tensor's data", extra)
	}
	return nil
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Lookup returns the description of the named tensor.
func (f *SafetensorsFile) Lookup(name string) (SafetensorsTensor, bool) {
	i, ok := f.index[name]
	if !ok {
		return SafetensorsTensor{}, false
	}
	return f.Tensors[i], true
}

// Bytes returns the raw little-endian data of the named tensor (nil if
// absent); it shares memory with the file.
func (f *SafetensorsFile) Bytes(name string) []byte {
	t, ok := f.Lookup(name)
	if !ok {
		return nil
	}
	return f.data[t.Begin:t.End:t.End]
}

// Float32s returns the values of the named F32 tensor, row-major.
func (f *SafetensorsFile) Float32s(name string) ([]float32, error) {
	t, ok := f.Lookup(name)
	if !ok {
		return nil, ckErrorf(f.Name, nil, "missing tensor %q", name)
	}
	if t.DType != "F32" {
		return nil, ckErrorf(f.Name, nil, "tensor %q has dtype %s, want F32", name, t.DType)
	}
	return decodeF32(f.data[t.Begin:t.End]), nil
}

func decodeF32(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

// maxListed bounds the names listed in one error message.
const maxListed = 6

// checkStateDict checks, from the header alone, that f holds exactly the
// parameters of m (each name prefixed by prefix), as F32 tensors of the
// parameters' shapes, allowing only the extra tensors named in allow. It
// reports every problem in one error, as PyTorch's
// load_state_dict(strict=True) does. A parameter whose tensor is nil (a
// layer without bias) is not part of the state dict, as in PyTorch.
func checkStateDict(f *SafetensorsFile, m Module, prefix string, allow ...string) error {
	ps := StateTensors(m)
	var missing, problems []string
	want := make(map[string]bool, len(ps))
	for _, p := range ps {
		if p.Tensor == nil {
			continue
		}
		name := prefix + p.Name
		if want[name] {
			return ckErrorf(f.Name, nil, "the model has two parameters named %q", p.Name)
		}
		want[name] = true
		t, ok := f.Lookup(name)
		if !ok {
			missing = append(missing, strconv.Quote(name))
			continue
		}
		if t.DType != "F32" {
			problems = append(problems, fmt.Sprintf("tensor %q has dtype %s, want F32", name, t.DType))
		}
		if ms := p.Tensor.Shape(); !slices.Equal(ms, t.Shape) {
			problems = append(problems, fmt.Sprintf("tensor %q has shape %v in the file but %v in the model", name, t.Shape, ms))
		}
	}
	var unexpected []string
	for _, t := range f.Tensors {
		if !want[t.Name] && !slices.Contains(allow, t.Name) {
			unexpected = append(unexpected, strconv.Quote(t.Name))
		}
	}
	if len(missing) > 0 {
		problems = append(problems, listed("missing tensor", missing))
	}
	if len(unexpected) > 0 {
		problems = append(problems, listed("unexpected tensor", unexpected))
	}
	if len(problems) > 0 {
		if len(problems) > maxListed {
			problems = append(problems[:maxListed], fmt.Sprintf("and %d more problems", len(problems)-maxListed))
		}
		return ckErrorf(f.Name, nil, "does not fit the model: %s", strings.Join(problems, "; "))
	}
	return nil
}

// decodeStateDict checks f as checkStateDict does and decodes the values of
// m's parameters in m's order (nil for a nil parameter). Values that are
// not finite are refused (ErrNonFinite): no healthy model holds them, and
// loading them would give NaN predictions without a word.
func decodeStateDict(f *SafetensorsFile, m Module, prefix string, allow ...string) ([][]float32, error) {
	if err := checkStateDict(f, m, prefix, allow...); err != nil {
		return nil, err
	}
	ps := StateTensors(m)
	vals := make([][]float32, len(ps))
	for i, p := range ps {
		if p.Tensor == nil {
			continue
		}
		t, _ := f.Lookup(prefix + p.Name)
		vals[i] = decodeF32(f.data[t.Begin:t.End])
		if err := CheckFinite(f.Name, t.Name, vals[i]); err != nil {
			return nil, err
		}
	}
	return vals, nil
}

// ErrNonFinite is wrapped by the errors of CheckFinite, and so of the
// loaders, for a tensor holding NaN or an infinity.
var ErrNonFinite = errors.New("non-finite value")

// CheckFinite returns a *CheckpointError wrapping ErrNonFinite, naming file,
// the tensor and the first bad value and its index, when vals holds NaN or
// ±Inf; nil otherwise.
func CheckFinite(file, tensorName string, vals []float32) error {
	first, count := -1, 0
	for i, v := range vals {
		if f := float64(v); math.IsNaN(f) || math.IsInf(f, 0) {
			if first < 0 {
				first = i
			}
			count++
		}
	}
	if first < 0 {
		return nil
	}
	more := ""
	if count > 1 {
		more = fmt.Sprintf(" and %d more non-finite values", count-1)
	}
	return ckErrorf(file, ErrNonFinite, "tensor %q holds %v at index %d%s (of %d): the values are broken, say by a diverged training run",
		tensorName, vals[first], first, more, len(vals))
}

func listed(what string, names []string) string {
	s := what
	if len(names) > 1 {
		s += "s"
	}
	if len(names) > maxListed {
		return fmt.Sprintf("%s %s and %d more", s, strings.Join(names[:maxListed], ", "), len(names)-maxListed)
	}
	return s + " " + strings.Join(names, ", ")
}

// setParameters copies vals (from decodeStateDict) into m's parameters. A
// device error is returned, not panicked.
func setParameters(file string, m Module, vals [][]float32) error {
	backend := ""
	err := tensor.Guard(func() {
		for i, p := range StateTensors(m) {
			if p.Tensor != nil {
				backend = p.Tensor.Backend().Name()
				p.Tensor.CopyFrom(vals[i])
			}
		}
	})
	if err != nil {
		return ckErrorf(file, err, "copying the parameters to %s: %v", backend, err)
	}
	return nil
}

// LoadStateDict loads the parameters of m from f, strictly: f must hold
// exactly m's parameters, by name, as F32 tensors of the same shapes, all
// finite (ErrNonFinite otherwise). Everything is checked before any
// parameter is changed.
func LoadStateDict(f *SafetensorsFile, m Module) error {
	vals, err := decodeStateDict(f, m, "")
	if err != nil {
		return err
	}
	return setParameters(f.Name, m, vals)
}

// SaveFile writes the parameters of m to path as a safetensors file that
// PyTorch loads with load_state_dict(safetensors.torch.load_file(path),
// strict=True). It adds "format": "pt" to the metadata unless given, as
// safetensors.torch does. The file is replaced atomically (see package
// internal/atomicfile): after a crash path holds the old or the new
// checkpoint, never a torn one.
func SaveFile(path string, m Module, metadata map[string]string) error {
	tensors := StateDict(m)
	meta := withFormat(metadata, "pt")
	err := atomicfile.Write(path, 0o644, func(w io.Writer) error {
		return WriteSafetensors(w, tensors, meta)
	})
	if err != nil {
		return writeError(path, err)
	}
	return nil
}

func withFormat(metadata map[string]string, format string) map[string]string {
	meta := make(map[string]string, len(metadata)+1)
	for k, v := range metadata {
		meta[k] = v
	}
	if _, ok := meta["format"]; !ok {
		meta["format"] = format
	}
	return meta
}

func writeError(path string, err error) error {
	var ce *CheckpointError
	if errors.As(err, &ce) {
		return err
	}
	var wp writeProblem
	if errors.As(err, &wp) {
		return ckErrorf(path, err, "%s", string(wp))
	}
	return fileError(path, err)
}

// LoadFile loads the parameters of m from the safetensors file at path,
// strictly (see LoadStateDict). Errors are *CheckpointError, one line,
// naming the file; m is unchanged unless LoadFile succeeds.
//
// The file is checked against m from its header before its data is read,
// so that memory is bounded by the model's size whatever the file claims,
// and values that are not finite are refused (ErrNonFinite).
func LoadFile(path string, m Module) error {
	f, err := readSafetensorsFile(path, func(f *SafetensorsFile) error { return checkStateDict(f, m, "") })
	if err != nil {
		return err
	}
	return LoadStateDict(f, m)
}

// jsonProblem rewrites a JSON decoding error without Go type names.
func jsonProblem(err error) string {
	var se *json.SyntaxError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("%s at byte %d", se.Error(), se.Offset)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "unexpected end of JSON"
	}
	return err.Error()
}

// quoteSnippet shows the start of some JSON or bytes, on one line.
func quoteSnippet(b []byte) string {
	var c bytes.Buffer
	if json.Compact(&c, b) == nil {
		b = c.Bytes()
	}
	const max = 40
	s := string(b)
	if len(s) > max {
		s = s[:max] + "..."
	}
	return strconv.Quote(s)
}

func jsonSnippet(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%v", v)
	}
	return quoteSnippet(b)
}
