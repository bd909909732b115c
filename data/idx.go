package data

import (
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strconv"
	"strings"

	"github.com/ember-ml/ember/internal/safefile"
)

// Error is the error returned by everything in this package that reads,
// checks, locates or downloads a data file. Its message is one line:
//
//	data: <File>: <Problem>
//
// Use errors.As to get at the fields. Err, when not nil, is the underlying
// cause (for example fs.ErrNotExist or context.Canceled) and is what
// errors.Is and errors.Unwrap see.
type Error struct {
	File    string // the file or directory concerned, as the caller named it
	Problem string // what is wrong with it, one line
	Err     error  // underlying cause, or nil
}

func (e *Error) Error() string { return "data: " + e.File + ": " + e.Problem }

// Unwrap returns the underlying cause, if any.
func (e *Error) Unwrap() error { return e.Err }

func errorf(file string, cause error, format string, args ...any) *Error {
	return &Error{File: file, Problem: fmt.Sprintf(format, args...), Err: cause}
}

// idxUbyte is the IDX element type code (third byte of the magic number)
// for unsigned bytes, the only type this package reads.
const idxUbyte = 0x08

// maxIDXDims bounds the number of dimensions in an IDX header.
const maxIDXDims = 8

// MaxIDXBytes is the largest IDX payload ReadIDX accepts (2 GiB). It is well
// above any MNIST-like data set (EMNIST ByClass is about 550 MB) and keeps a
// corrupt header from asking for an absurd allocation.
const MaxIDXBytes = 1 << 31

// IDX is the content of an IDX file of unsigned bytes.
type IDX struct {
	// Dims are the dimensions from the header, outermost first: [N] for a
	// label file, [N, Rows, Cols] for an image file.
	Dims []int
	// Data holds the product of Dims bytes, row-major.
	Data []uint8
}

// ReadIDXFile reads an IDX file of unsigned bytes (type 0x08), gzip-compressed
// or raw: gzip is recognised by its magic bytes 0x1f 0x8b, not by the file
// name. It checks the header and that the file holds exactly as many bytes
// as the header says, no fewer and no more. Every error is an *Error naming
// path.
//
// Only regular files are read: a directory, a device such as /dev/zero or a
// named pipe is refused by kind, without blocking, and so is a file larger
// than any IDX file this package accepts (MaxIDXBytes of data).
func ReadIDXFile(path string) (*IDX, error) {
	f, st, err := safefile.Open(path, maxIDXFileBytes)
	if err != nil {
		return nil, openError(path, err)
	}
	defer f.Close()
	return readIDX(f, path, st.Size())
}

// maxIDXFileBytes bounds the size of an IDX file, raw or compressed: the
// largest payload plus the largest header.
const maxIDXFileBytes = MaxIDXBytes + 4 + 4*maxIDXDims

// maxGzipFirstAlloc bounds the first allocation for the payload of a
// compressed file, whose size says little about what it holds: a larger
// payload grows from there as it arrives, so that a small corrupt file whose
// header claims gigabytes cannot take them.
const maxGzipFirstAlloc = 256 << 20

// ReadIDX is ReadIDXFile for an open reader; name is used in error messages
// only.
func ReadIDX(r io.Reader, name string) (*IDX, error) {
	return readIDX(r, name, -1)
}

// openError reports a failure to open or stat path. The path is already in
// File, so the problem is the bare reason.
func openError(path string, err error) *Error {
	return errorf(path, err, "%v", unwrapPathError(err))
}

func unwrapPathError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// trackingReader remembers the last error its reader returned, so that a
// short read can be told apart: a clean end of the stream (the IDX data is
// truncated) versus a broken gzip stream.
type trackingReader struct {
	r   io.Reader
	err error
}

func (t *trackingReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if err != nil {
		t.err = err
	}
	return n, err
}

// streamError turns an error from the (possibly decompressing) reader into
// an *Error. It returns nil when the stream simply ended.
func (t *trackingReader) streamError(name string, gz bool) *Error {
	err := t.err
	if err == nil || err == io.EOF {
		return nil
	}
	if gz {
		return gzipError(name, err)
	}
	return errorf(name, err, "read: %v", unwrapPathError(err))
}

// readIDX reads an IDX stream from r. fileSize, when >= 0, is the size of
// the underlying file; it only sizes the first allocation.
func readIDX(r io.Reader, name string, fileSize int64) (*IDX, error) {
	br := &byteReader{r: r}
	// Peek at the first two bytes to detect gzip.
	head, err := br.peek(2)
	if err != nil && err != io.EOF {
		return nil, errorf(name, err, "read: %v", unwrapPathError(err))
	}
	var src io.Reader = br
	gz := len(head) == 2 && head[0] == 0x1f && head[1] == 0x8b
	hint := fileSize // size of the first allocation (bounded by the payload's), or -1 if unknown
	if gz {
		// br is an io.ByteReader, so flate reads exactly the compressed
		// bytes and leaves anything after the gzip member in br.
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, gzipError(name, err)
		}
		zr.Multistream(false)
		src = zr
		if fileSize >= 0 {
			// DEFLATE cannot expand by more than about 1032:1.
			hint = min(fileSize*1032, maxGzipFirstAlloc)
		}
	}
	t := &trackingReader{r: src}
	idx, perr := parseIDX(t, name, gz, hint)
	if perr != nil {
		if gz && t.err == nil {
			// A corrupt gzip stream usually decompresses to garbage that
			// fails the IDX checks long before the CRC at its end is
			// reached. Read on (within reason) to report the root cause.
			io.Copy(io.Discard, io.LimitReader(t, 256<<20))
			if e := t.streamError(name, gz); e != nil {
				return nil, e
			}
		}
		return nil, perr
	}
	if gz {
		// Anything after the (single) gzip member is trailing garbage.
		if _, err := br.ReadByte(); err == nil {
			return nil, errorf(name, nil, "trailing bytes after the gzip stream")
		}
	}
	return idx, nil
}

func gzipError(name string, err error) *Error {
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return errorf(name, err, "gzip: %s", strings.TrimPrefix(err.Error(), "gzip: "))
}

// byteReader is a small buffered reader that satisfies io.ByteReader (which
// flate needs so as not to read past the end of the compressed data) and
// lets large reads of raw files bypass the buffer.
type byteReader struct {
	r    io.Reader
	buf  []byte
	i, n int
	err  error
}

const byteReaderSize = 128 << 10

func (b *byteReader) fill() {
	if b.buf == nil {
		b.buf = make([]byte, byteReaderSize)
	}
	if b.i > 0 {
		b.n = copy(b.buf, b.buf[b.i:b.n])
		b.i = 0
	}
	for tries := 0; b.n < len(b.buf) && b.err == nil; tries++ {
		k, err := b.r.Read(b.buf[b.n:])
		b.n += k
		b.err = err
		if k > 0 {
			return
		}
		if tries == 100 {
			b.err = io.ErrNoProgress
		}
	}
}

// peek returns the next k bytes without consuming them (fewer, with the
// error, at the end of the stream).
func (b *byteReader) peek(k int) ([]byte, error) {
	for b.n-b.i < k && b.err == nil {
		b.fill()
	}
	if b.n-b.i < k {
		return b.buf[b.i:b.n], b.err
	}
	return b.buf[b.i : b.i+k], nil
}

func (b *byteReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if b.i == b.n {
		if b.err != nil {
			return 0, b.err
		}
		if len(p) >= byteReaderSize {
			// Large reads bypass the buffer.
			n, err := b.r.Read(p)
			b.err = err
			return n, err
		}
		b.fill()
		if b.i == b.n {
			return 0, b.err
		}
	}
	n := copy(p, b.buf[b.i:b.n])
	b.i += n
	return n, nil
}

func (b *byteReader) ReadByte() (byte, error) {
	if b.i == b.n {
		if b.err != nil {
			return 0, b.err
		}
		b.fill()
		if b.i == b.n {
			return 0, b.err
		}
	}
	c := b.buf[b.i]
	b.i++
	return c, nil
}

// parseIDXHeader reads and checks the magic number and dimensions, and
// returns the dimensions and their product.
func parseIDXHeader(t *trackingReader, name string, gz bool) ([]int, int64, error) {
	var magic [4]byte
	if n, _ := io.ReadFull(t, magic[:]); n < 4 {
		if e := t.streamError(name, gz); e != nil {
			return nil, 0, e
		}
		if n == 0 {
			return nil, 0, errorf(name, nil, "empty file, want an IDX file")
		}
		return nil, 0, errorf(name, nil, "truncated: %d bytes, too short for an IDX header", n)
	}
	m := binary.BigEndian.Uint32(magic[:])
	typ, ndim := magic[2], int(magic[3])
	if magic[0] != 0 || magic[1] != 0 || !knownIDXType(typ) || ndim == 0 {
		return nil, 0, errorf(name, nil, "bad magic 0x%08x, want an IDX file of unsigned bytes (0x00000803 or 0x00000801)", m)
	}
	if typ != idxUbyte {
		return nil, 0, errorf(name, nil, "IDX element type 0x%02x (%s) is not supported, only unsigned bytes (0x08)", typ, idxTypeName(typ))
	}
	if ndim > maxIDXDims {
		return nil, 0, errorf(name, nil, "IDX header has %d dimensions, at most %d supported", ndim, maxIDXDims)
	}
	var dimBuf [4 * maxIDXDims]byte
	db := dimBuf[:4*ndim]
	if n, _ := io.ReadFull(t, db); n < len(db) {
		if e := t.streamError(name, gz); e != nil {
			return nil, 0, e
		}
		return nil, 0, errorf(name, nil, "truncated: header of %d dimensions needs %d bytes, file has %d", ndim, 4+len(db), 4+n)
	}
	dims := make([]int, ndim)
	total := int64(1)
	for i := range dims {
		d := binary.BigEndian.Uint32(db[4*i:])
		if d == 0 {
			return nil, 0, errorf(name, nil, "dimension %d of %s is zero", i, dimString(db, ndim))
		}
		dims[i] = int(d)
		// Both factors are below 2^32 and total <= 2^31 before: no overflow.
		total *= int64(d)
		if total > MaxIDXBytes {
			return nil, 0, errorf(name, nil, "header says %s, more than the %d bytes supported", dimString(db, ndim), int64(MaxIDXBytes))
		}
	}
	return dims, total, nil
}

// parseIDX reads the header and payload from t. hint, when >= 0, is how
// many bytes to allocate first at most (for a raw file its size, which
// bounds what it can hold); a larger payload grows as it arrives.
func parseIDX(t *trackingReader, name string, gz bool, hint int64) (*IDX, error) {
	dims, total, err := parseIDXHeader(t, name, gz)
	if err != nil {
		return nil, err
	}
	hdr := int64(4 + 4*len(dims))

	// Allocate exactly once when the size is plausibly available; otherwise
	// grow, so that a lying header on a short stream cannot force a huge
	// allocation.
	const step = 4 << 20
	want := int(total)
	c := want
	if hint >= 0 {
		if h := hint - hdr; h < int64(c) {
			c = int(max(h, 0))
		}
	} else {
		c = min(c, step)
	}
	buf := make([]byte, 0, c)
	for len(buf) < want {
		if len(buf) == cap(buf) {
			nc := min(max(2*cap(buf), step), want)
			nb := make([]byte, len(buf), nc)
			copy(nb, buf)
			buf = nb
		}
		n, _ := io.ReadFull(t, buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if len(buf) < cap(buf) {
			// Stream ended (or broke) early.
			if e := t.streamError(name, gz); e != nil {
				return nil, e
			}
			return nil, errorf(name, nil, "truncated: header says %s (%d bytes), file has %d", describeDims(dims), want, len(buf))
		}
	}
	// Anything more is an error; reading past the end also makes the gzip
	// reader verify its CRC and length.
	var extra [1]byte
	if n, _ := io.ReadFull(t, extra[:]); n > 0 {
		more, _ := io.Copy(io.Discard, io.LimitReader(t, 1<<20))
		if e := t.streamError(name, gz); e != nil && more < 1<<20 {
			return nil, e
		}
		count := strconv.FormatInt(1+more, 10)
		if more == 1<<20 {
			count = "more than " + strconv.Itoa(1<<20)
		}
		return nil, errorf(name, nil, "%s trailing bytes after the %d bytes of %s", count, want, describeDims(dims))
	}
	if e := t.streamError(name, gz); e != nil {
		return nil, e
	}
	return &IDX{Dims: dims, Data: buf}, nil
}

func knownIDXType(t byte) bool {
	switch t {
	case 0x08, 0x09, 0x0b, 0x0c, 0x0d, 0x0e:
		return true
	}
	return false
}

func idxTypeName(t byte) string {
	switch t {
	case 0x09:
		return "signed byte"
	case 0x0b:
		return "int16"
	case 0x0c:
		return "int32"
	case 0x0d:
		return "float32"
	case 0x0e:
		return "float64"
	}
	return "unsigned byte"
}

// dimString formats raw header dimensions as "AxBxC".
func dimString(db []byte, ndim int) string {
	var sb strings.Builder
	for i := range ndim {
		if i > 0 {
			sb.WriteByte('x')
		}
		sb.WriteString(strconv.FormatUint(uint64(binary.BigEndian.Uint32(db[4*i:])), 10))
	}
	return sb.String()
}

// describeDims says what the dimensions hold: "60000x28x28 images",
// "60000 labels" or "2x3x4x5 bytes".
func describeDims(dims []int) string {
	parts := make([]string, len(dims))
	for i, d := range dims {
		parts[i] = strconv.Itoa(d)
	}
	s := strings.Join(parts, "x")
	switch len(dims) {
	case 1:
		return s + " labels"
	case 3:
		return s + " images"
	}
	return s + " bytes"
}
