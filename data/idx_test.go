package data

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// idxBytes encodes an IDX file of unsigned bytes.
func idxBytes(dims []int, payload []byte) []byte {
	var b bytes.Buffer
	b.Write([]byte{0, 0, 0x08, byte(len(dims))})
	for _, d := range dims {
		binary.Write(&b, binary.BigEndian, uint32(d))
	}
	b.Write(payload)
	return b.Bytes()
}

func gzipBytes(b []byte) []byte {
	var out bytes.Buffer
	zw := gzip.NewWriter(&out)
	zw.Write(b)
	zw.Close()
	return out.Bytes()
}

func seq(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i * 7)
	}
	return b
}

func writeFile(t testing.TB, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// wantError checks that err is an *Error whose message names file and
// contains every fragment.
func wantError(t *testing.T, err error, file string, fragments ...string) *Error {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one about %s containing %q", file, fragments)
	}
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v is %T, want *data.Error", err, err)
	}
	msg := err.Error()
	if strings.Contains(msg, "\n") {
		t.Errorf("error is not one line: %q", msg)
	}
	if !strings.HasPrefix(msg, "data: "+file+": ") {
		t.Errorf("error %q does not start with %q", msg, "data: "+file+": ")
	}
	for _, f := range fragments {
		if !strings.Contains(msg, f) {
			t.Errorf("error %q does not contain %q", msg, f)
		}
	}
	return e
}

func TestReadIDXGood(t *testing.T) {
	dir := t.TempDir()
	payload := seq(3 * 4 * 5)
	raw := idxBytes([]int{3, 4, 5}, payload)
	for _, c := range []struct {
		name string
		b    []byte
	}{{"x-idx3-ubyte", raw}, {"x-idx3-ubyte.gz", gzipBytes(raw)}, {"gzip-without-suffix", gzipBytes(raw)}} {
		p := writeFile(t, dir, c.name, c.b)
		idx, err := ReadIDXFile(p)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !slices.Equal(idx.Dims, []int{3, 4, 5}) || !bytes.Equal(idx.Data, payload) {
			t.Errorf("%s: got dims %v data %v", c.name, idx.Dims, idx.Data[:8])
		}
		// Same through ReadIDX on a reader.
		idx2, err := ReadIDX(bytes.NewReader(c.b), c.name)
		if err != nil || !bytes.Equal(idx2.Data, payload) {
			t.Errorf("ReadIDX %s: %v", c.name, err)
		}
	}
}

func TestReadIDXLarge(t *testing.T) {
	// Bigger than the reader's buffers and growth step, through a reader of
	// unknown size.
	payload := seq(1000 * 28 * 28)
	for _, b := range [][]byte{idxBytes([]int{1000, 28, 28}, payload), gzipBytes(idxBytes([]int{1000, 28, 28}, payload))} {
		idx, err := ReadIDX(struct{ *bytes.Reader }{bytes.NewReader(b)}, "big")
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(idx.Data, payload) || cap(idx.Data) != len(payload) {
			t.Fatalf("payload differs (len %d cap %d)", len(idx.Data), cap(idx.Data))
		}
	}
}

func TestReadIDXErrors(t *testing.T) {
	dir := t.TempDir()
	good := idxBytes([]int{2, 3, 3}, seq(18))
	corruptCRC := gzipBytes(good)
	corruptCRC[len(corruptCRC)-6] ^= 0xff // inside the CRC-32 of the trailer
	corruptData := gzipBytes(idxBytes([]int{4, 28, 28}, seq(4*28*28)))
	for i := 12; i < len(corruptData)-8; i++ {
		corruptData[i] ^= 0x55
	}
	cases := []struct {
		name      string
		b         []byte
		fragments []string
	}{
		{"train-images-idx3-ubyte.gz", gzipBytes(idxBytes([]int{60000, 28, 28}, seq(1234))),
			[]string{"truncated: header says 60000x28x28 images (47040000 bytes), file has 1234"}},
		{"truncated-raw", idxBytes([]int{5}, seq(3)),
			[]string{"truncated: header says 5 labels (5 bytes), file has 3"}},
		{"truncated-header", good[:9], []string{"truncated: header of 3 dimensions needs 16 bytes, file has 9"}},
		{"short", good[:3], []string{"truncated: 3 bytes, too short for an IDX header"}},
		{"empty", nil, []string{"empty file"}},
		{"wrong-magic", append([]byte{0, 0, 0x0a, 3}, good[4:]...),
			[]string{"bad magic 0x00000a03, want an IDX file of unsigned bytes (0x00000803 or 0x00000801)"}},
		{"text-file", []byte("hello, world\n"), []string{"bad magic 0x68656c6c"}},
		{"zero-dims", []byte{0, 0, 8, 0}, []string{"bad magic 0x00000800"}},
		{"float-idx", append([]byte{0, 0, 0x0d, 3}, good[4:]...),
			[]string{"IDX element type 0x0d (float32) is not supported, only unsigned bytes (0x08)"}},
		{"many-dims", []byte{0, 0, 8, 200}, []string{"200 dimensions"}},
		{"zero-dim", idxBytes([]int{3, 0, 2}, nil), []string{"dimension 1 of 3x0x2 is zero"}},
		{"huge", idxBytes([]int{1 << 20, 1 << 20}, nil), []string{"header says 1048576x1048576, more than the 2147483648 bytes supported"}},
		{"huge-dim", append([]byte{0, 0, 8, 1}, 0xff, 0xff, 0xff, 0xff), []string{"header says 4294967295, more than"}},
		{"trailing-raw", append(slices.Clip(good), 1, 2, 3), []string{"3 trailing bytes after the 18 bytes of 2x3x3 images"}},
		{"trailing-in-gzip", gzipBytes(append(slices.Clip(good), 9)), []string{"1 trailing bytes after the 18 bytes of 2x3x3 images"}},
		{"trailing-after-gzip", append(gzipBytes(good), 0, 0, 0), []string{"trailing bytes after the gzip stream"}},
		{"bad-gzip-truncated.gz", gzipBytes(good)[:20], []string{"gzip: unexpected EOF"}},
		{"bad-gzip-header.gz", []byte{0x1f, 0x8b, 1, 2, 3}, []string{"gzip: "}},
		{"bad-gzip-crc.gz", corruptCRC, []string{"gzip: invalid checksum"}},
		{"bad-gzip-data.gz", corruptData, []string{"gzip: "}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := writeFile(t, dir, c.name, c.b)
			_, err := ReadIDXFile(p)
			wantError(t, err, p, c.fragments...)
			_, err = ReadIDX(bytes.NewReader(c.b), c.name)
			wantError(t, err, c.name, c.fragments...)
		})
	}
}

func TestReadIDXMissingFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "nope.gz")
	_, err := ReadIDXFile(p)
	wantError(t, err, p, "no such file")
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("errors.Is(%v, fs.ErrNotExist) = false", err)
	}
}

func FuzzReadIDX(f *testing.F) {
	good := idxBytes([]int{2, 3, 3}, seq(18))
	f.Add(good)
	f.Add(gzipBytes(good))
	f.Add(idxBytes([]int{4}, []byte{1, 2, 3, 4}))
	f.Add(gzipBytes(idxBytes([]int{4}, []byte{1, 2, 3, 4})))
	f.Add(good[:10])
	f.Add(append(slices.Clip(good), 0))
	f.Add(append(gzipBytes(good), 0))
	f.Add(gzipBytes(good)[:15])
	f.Add([]byte{0, 0, 8, 1, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0, 0, 8, 2, 0, 1, 0, 0, 0, 1, 0, 0})
	f.Add([]byte{0, 0, 0x0d, 1, 0, 0, 0, 1, 0, 0, 0, 0})
	f.Add([]byte{0x1f, 0x8b})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		idx, err := ReadIDX(bytes.NewReader(b), "fuzz")
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %v is %T, want *Error", err, err)
			}
			if strings.Contains(err.Error(), "\n") || !strings.HasPrefix(err.Error(), "data: fuzz: ") {
				t.Fatalf("bad message %q", err)
			}
			return
		}
		n := 1
		for _, d := range idx.Dims {
			if d <= 0 {
				t.Fatalf("dims %v", idx.Dims)
			}
			n *= d
		}
		if n != len(idx.Data) {
			t.Fatalf("dims %v but %d bytes", idx.Dims, len(idx.Data))
		}
	})
}

func TestReadIDXDirectory(t *testing.T) {
	dir := t.TempDir()
	_, err := ReadIDXFile(dir)
	wantError(t, err, dir, "is a directory, not a regular file")
}

// TestReadIDXSpecialFiles: devices and named pipes are refused by kind at
// once; none is read (/dev/zero never ends) or waited on (a FIFO without a
// writer blocks a plain open).
func TestReadIDXSpecialFiles(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Skipf("no FIFOs: %v", err)
	}
	for path, want := range map[string]string{
		"/dev/zero": "is a character device, not a regular file",
		fifo:        "is a named pipe (FIFO), not a regular file",
	} {
		_, err := ReadIDXFile(path)
		wantError(t, err, path, want)
		_, err = readIDXHeader(path)
		wantError(t, err, path, want)
	}
}
