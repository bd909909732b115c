package data

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// cifarPixel is the value of byte p (channel-major) of image i in the
// synthetic files: distinct enough across images and channels to catch
// misplaced bytes.
func cifarPixel(i, p int) byte { return byte(i*31 + p*7 + p/1024) }

// cifarBytes encodes n records of CIFAR-10 (labelBytes 1) or CIFAR-100
// (labelBytes 2); label returns the label bytes of record i.
func cifarBytes(n, labelBytes int, label func(i int) []byte) []byte {
	var b bytes.Buffer
	for i := range n {
		l := label(i)
		if len(l) != labelBytes {
			panic("label bytes")
		}
		b.Write(l)
		for p := range CIFARImageBytes {
			b.WriteByte(cifarPixel(i, p))
		}
	}
	return b.Bytes()
}

func cifar10Bytes(n int) []byte {
	return cifarBytes(n, 1, func(i int) []byte { return []byte{byte(i % 10)} })
}

// cifar100Bytes gives record i coarse label i%20 and fine label (i*7)%100.
func cifar100Bytes(n int) []byte {
	return cifarBytes(n, 2, func(i int) []byte { return []byte{byte(i % 20), byte(i * 7 % 100)} })
}

// checkCIFARImages checks that d holds images first, first+1, ... of the
// synthetic files, in CHW order.
func checkCIFARImages(t *testing.T, d *Dataset, first int) {
	t.Helper()
	if d.Channels != 3 || d.Rows != 32 || d.Cols != 32 || d.ImageSize() != 3072 || len(d.Images) != d.N*3072 || len(d.Labels) != d.N {
		t.Fatalf("shape: N %d, %dx%dx%d, %d bytes, %d labels", d.N, d.Channels, d.Rows, d.Cols, len(d.Images), len(d.Labels))
	}
	for i := range d.N {
		img := d.Image(i)
		for _, p := range []int{0, 1, 31, 32, 1023, 1024, 2047, 2048, 3071} {
			if want := cifarPixel(first+i, p); img[p] != want {
				t.Fatalf("image %d byte %d = %d, want %d", i, p, img[p], want)
			}
		}
	}
}

func TestReadCIFAR10(t *testing.T) {
	b := cifar10Bytes(13)
	p := writeFile(t, t.TempDir(), "data_batch_1.bin", b)
	d, err := ReadCIFAR10File(p)
	if err != nil {
		t.Fatal(err)
	}
	if d.N != 13 || d.NumClasses() != 10 || !slices.Equal(d.ClassNames, CIFAR10Classes) {
		t.Fatalf("N %d, classes %d, names %v", d.N, d.NumClasses(), d.ClassNames)
	}
	for i, l := range d.Labels {
		if int(l) != i%10 {
			t.Fatalf("label %d = %d", i, l)
		}
	}
	checkCIFARImages(t, d, 0)
	s, err := ReadCIFAR10(bytes.NewReader(b), "stream")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(s.Images, d.Images) || !bytes.Equal(s.Labels, d.Labels) {
		t.Error("ReadCIFAR10 and ReadCIFAR10File disagree")
	}
}

func TestReadCIFAR100(t *testing.T) {
	p := writeFile(t, t.TempDir(), "train.bin", cifar100Bytes(25))
	fine, err := ReadCIFAR100File(p, CIFAR100Fine)
	if err != nil {
		t.Fatal(err)
	}
	coarse, err := ReadCIFAR100File(p, CIFAR100Coarse)
	if err != nil {
		t.Fatal(err)
	}
	if fine.NumClasses() != 100 || coarse.NumClasses() != 20 || fine.ClassNames != nil {
		t.Errorf("classes %d and %d, names %v", fine.NumClasses(), coarse.NumClasses(), fine.ClassNames)
	}
	for i := range 25 {
		if int(fine.Labels[i]) != i*7%100 || int(coarse.Labels[i]) != i%20 {
			t.Fatalf("record %d: fine %d coarse %d", i, fine.Labels[i], coarse.Labels[i])
		}
	}
	checkCIFARImages(t, fine, 0)
	checkCIFARImages(t, coarse, 0)
}

func TestReadCIFARBad(t *testing.T) {
	dir := t.TempDir()
	good10, good100 := cifar10Bytes(3), cifar100Bytes(3)
	badLabel := slices.Clone(good10)
	badLabel[CIFAR10RecordSize] = 10
	badFine, badCoarse := slices.Clone(good100), slices.Clone(good100)
	badFine[2*CIFAR100RecordSize+1] = 100
	badCoarse[CIFAR100RecordSize] = 20
	for _, c := range []struct {
		name      string
		b         []byte
		cifar100  bool
		fragments []string
	}{
		{"empty", nil, false, []string{"empty file, want CIFAR-10 records of 3073 bytes"}},
		{"short", good10[:100], false, []string{"100 bytes is not a whole number of 3073-byte CIFAR-10 records (0 records and 100 bytes over)"}},
		{"long", append(slices.Clone(good10), 1, 2), false, []string{"9221 bytes is not a whole number", "(3 records and 2 bytes over)"}},
		{"label", badLabel, false, []string{"record 1 (byte 3073): label 10, want 0 to 9"}},
		{"cifar10 as 100", good10[:3*CIFAR10RecordSize-3], true, []string{"9216 bytes", "3074-byte CIFAR-100 records (2 records and 3068 bytes over)"}},
		{"fine", badFine, true, []string{"record 2 (byte 6149): fine label 100, want 0 to 99"}},
		{"coarse", badCoarse, true, []string{"record 1 (byte 3074): coarse label 20, want 0 to 19"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := writeFile(t, dir, c.name, c.b)
			var errs [4]error
			if c.cifar100 {
				_, errs[0] = ReadCIFAR100File(p, CIFAR100Fine)
				_, errs[1] = ReadCIFAR100File(p, CIFAR100Coarse)
				_, errs[2] = ReadCIFAR100(bytes.NewReader(c.b), p, CIFAR100Fine)
				_, errs[3] = ReadCIFAR100(bytes.NewReader(c.b), p, CIFAR100Coarse)
			} else {
				_, errs[0] = ReadCIFAR10File(p)
				_, errs[2] = ReadCIFAR10(bytes.NewReader(c.b), p)
				errs[1], errs[3] = errs[0], errs[2]
			}
			for _, err := range errs {
				wantError(t, err, p, c.fragments...)
			}
		})
	}
	_, err := ReadCIFAR10File(dir)
	wantError(t, err, dir, "not a regular file")
	missing := filepath.Join(dir, "missing.bin")
	_, err = ReadCIFAR10File(missing)
	if e := wantError(t, err, missing, "no such file"); !errors.Is(e, fs.ErrNotExist) {
		t.Errorf("%v does not wrap fs.ErrNotExist", err)
	}
}

// writeCIFAR10Dir writes a small CIFAR-10 in its layout: batches of 2, 3,
// 1, 1 and 2 records (images 0-8 of the synthetic files, in order) and a
// test batch of 4.
func writeCIFAR10Files() map[string][]byte {
	files := map[string][]byte{}
	all := cifar10Bytes(9)
	at := 0
	for i, n := range []int{2, 3, 1, 1, 2} {
		files[CIFAR10.Train[i]] = all[at*CIFAR10RecordSize : (at+n)*CIFAR10RecordSize]
		at += n
	}
	files["test_batch.bin"] = cifar10Bytes(4)
	files["batches.meta.txt"] = []byte("a\nb\nc\nd\ne\nf\ng\nh\ni\nj\n\n")
	return files
}

func TestLoadCIFAR10(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, CIFAR10.Dir)
	os.Mkdir(dir, 0o755)
	for name, b := range writeCIFAR10Files() {
		writeFile(t, dir, name, b)
	}
	for _, d := range []string{dir, parent} {
		train, test, err := LoadCIFAR10(d)
		if err != nil {
			t.Fatal(err)
		}
		if train.N != 9 || test.N != 4 {
			t.Fatalf("N %d and %d", train.N, test.N)
		}
		checkCIFARImages(t, train, 0)
		checkCIFARImages(t, test, 0)
		if strings.Join(train.ClassNames, "") != "abcdefghij" || strings.Join(test.ClassNames, "") != "abcdefghij" {
			t.Errorf("class names %v", train.ClassNames)
		}
	}
	os.Remove(filepath.Join(dir, "batches.meta.txt"))
	train, _, err := LoadCIFAR10(dir)
	if err != nil || !slices.Equal(train.ClassNames, CIFAR10Classes) {
		t.Errorf("without batches.meta.txt: %v, %v", train, err)
	}
	meta := writeFile(t, dir, "batches.meta.txt", []byte("a\n\nb\n"))
	_, _, err = LoadCIFAR10(dir)
	wantError(t, err, meta, "line 2 is empty")
	writeFile(t, dir, "batches.meta.txt", []byte("a\nb\n"))
	_, _, err = LoadCIFAR10(dir)
	wantError(t, err, meta, "2 class names, want 10")
	os.Remove(meta)

	bad := writeFile(t, dir, "data_batch_4.bin", cifar10Bytes(1)[:3000])
	_, _, err = LoadCIFAR10(dir)
	wantError(t, err, bad, "3000 bytes is not a whole number")
	os.Remove(bad)
	_, _, err = LoadCIFAR10(parent)
	wantError(t, err, filepath.Join(dir, "data_batch_4.bin"), "no such file", "cifar-10-binary.tar.gz", "DownloadCIFAR")
}

func TestLoadCIFAR100(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "train.bin", cifar100Bytes(7))
	writeFile(t, dir, "test.bin", cifar100Bytes(3))
	var coarseNames strings.Builder
	for i := range 20 {
		coarseNames.WriteString(string(rune('a'+i)) + "\n")
	}
	writeFile(t, dir, "coarse_label_names.txt", []byte(coarseNames.String()))
	train, test, err := LoadCIFAR100(dir, CIFAR100Coarse)
	if err != nil {
		t.Fatal(err)
	}
	if train.N != 7 || test.N != 3 || len(train.ClassNames) != 20 || train.ClassNames[19] != "t" || train.Labels[6] != 6 {
		t.Errorf("N %d/%d names %v labels %v", train.N, test.N, train.ClassNames, train.Labels)
	}
	fine, _, err := LoadCIFAR100(dir, CIFAR100Fine)
	if err != nil || fine.ClassNames != nil || fine.Labels[6] != 42 {
		t.Errorf("fine: %v %v", fine, err)
	}
	names := writeFile(t, dir, "fine_label_names.txt", []byte("x\n"))
	_, _, err = LoadCIFAR100(dir, CIFAR100Fine)
	wantError(t, err, names, "1 class names, want 100")
}

// tarEntry is one member of a test archive.
type tarEntry struct {
	name string
	typ  byte
	body []byte
	size int64 // header size when body is nil and size > 0 (a lie)
}

func tarGz(t *testing.T, entries []tarEntry) []byte {
	t.Helper()
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: 0o600, Size: int64(len(e.body))}
		if e.typ == tar.TypeSymlink || e.typ == tar.TypeLink {
			h.Linkname, h.Size = "/etc/passwd", 0
		}
		if e.typ == tar.TypeDir {
			h.Size = 0
		}
		if e.size > 0 {
			h.Size = e.size
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.size > 0 {
			tw.Flush() // the header only: the archive ends early
			return gzipBytes(raw.Bytes())
		}
		tw.Write(e.body)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return gzipBytes(raw.Bytes())
}

func cifar10Archive(t *testing.T) []byte {
	entries := []tarEntry{{name: "cifar-10-batches-bin/", typ: tar.TypeDir}}
	for _, name := range []string{"batches.meta.txt", "data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin", "data_batch_5.bin", "test_batch.bin"} {
		entries = append(entries, tarEntry{name: "cifar-10-batches-bin/" + name, typ: tar.TypeReg, body: writeCIFAR10Files()[name]})
	}
	entries = append(entries, tarEntry{name: "cifar-10-batches-bin/readme.html", typ: tar.TypeReg, body: []byte("<p>")})
	return tarGz(t, entries)
}

func TestDownloadCIFAR(t *testing.T) {
	archive := cifar10Archive(t)
	m := newMirror(t, map[string][]byte{CIFAR10.Archive: archive})
	dir := t.TempDir()
	var log bytes.Buffer
	opt := DownloadOptions{Mirrors: []string{m.url()}, Checksums: map[string]string{CIFAR10.Archive: md5hex(archive)}, Log: &log}
	got, err := DownloadCIFAR(context.Background(), dir, CIFAR10, opt)
	if err != nil {
		t.Fatal(err)
	}
	if got != filepath.Join(dir, CIFAR10.Dir) {
		t.Errorf("dir %s", got)
	}
	train, test, err := LoadCIFAR10(dir)
	if err != nil {
		t.Fatal(err)
	}
	checkCIFARImages(t, train, 0)
	if test.N != 4 || train.ClassNames[0] != "a" {
		t.Errorf("test N %d, names %v", test.N, train.ClassNames)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 { // the archive and the unpacked directory, no temporary files
		t.Errorf("dir holds %d entries", len(entries))
	}
	if !strings.Contains(log.String(), "unpacked") {
		t.Errorf("log:\n%s", log.String())
	}
	// Present: no request.
	n := m.requests.Load()
	if _, err := DownloadCIFAR(context.Background(), dir, CIFAR10, opt); err != nil || m.requests.Load() != n {
		t.Errorf("second call: %v, %d requests", err, m.requests.Load()-n)
	}
	// The canonical sum is the default: the synthetic archive fails it.
	_, err = DownloadCIFAR(context.Background(), t.TempDir(), CIFAR10, DownloadOptions{Mirrors: []string{m.url()}})
	if err == nil || !strings.Contains(err.Error(), "want "+CIFAR10.MD5) {
		t.Errorf("canonical MD5 not checked: %v", err)
	}
	_, err = DownloadCIFAR(context.Background(), t.TempDir(), CIFAR10, DownloadOptions{Mirrors: []string{m.url()}, Checksums: map[string]string{"other": "00"}})
	wantError(t, err, CIFAR10.Archive, "must name the archive")
}

func TestDownloadCIFARBadArchives(t *testing.T) {
	good := writeCIFAR10Files()["data_batch_1.bin"]
	top := "cifar-10-batches-bin/"
	for _, c := range []struct {
		name     string
		entries  []tarEntry
		fragment string
	}{
		{"traversal", []tarEntry{{name: top + "../../evil", typ: tar.TypeReg, body: good}}, "not a relative path"},
		{"absolute", []tarEntry{{name: "/tmp/evil", typ: tar.TypeReg, body: good}}, "not a relative path"},
		{"outside", []tarEntry{{name: "other/data_batch_1.bin", typ: tar.TypeReg, body: good}}, "outside cifar-10-batches-bin/"},
		{"nested", []tarEntry{{name: top + "sub/data_batch_1.bin", typ: tar.TypeReg, body: good}}, "not a plain file name"},
		{"subdir", []tarEntry{{name: top + "sub/", typ: tar.TypeDir}}, "a directory inside"},
		{"symlink", []tarEntry{{name: top + "data_batch_1.bin", typ: tar.TypeSymlink}}, "refusing links"},
		{"hardlink", []tarEntry{{name: top + "data_batch_1.bin", typ: tar.TypeLink}}, "refusing links"},
		{"duplicate", []tarEntry{{name: top + "x", typ: tar.TypeReg, body: good}, {name: top + "./x", typ: tar.TypeReg, body: good}}, "appears twice"},
		{"huge", []tarEntry{{name: top + "data_batch_1.bin", typ: tar.TypeReg, size: 1 << 40}}, "more than the 1073741824 supported"},
		{"truncated", []tarEntry{{name: top + "data_batch_1.bin", typ: tar.TypeReg, size: 5000}}, "unexpected EOF"},
		{"incomplete", []tarEntry{{name: top + "data_batch_1.bin", typ: tar.TypeReg, body: good}}, "archive does not hold CIFAR-10's files"},
	} {
		t.Run(c.name, func(t *testing.T) {
			archive := tarGz(t, c.entries)
			m := newMirror(t, map[string][]byte{CIFAR10.Archive: archive})
			dir := t.TempDir()
			_, err := DownloadCIFAR(context.Background(), dir, CIFAR10, DownloadOptions{Mirrors: []string{m.url()}, Checksums: map[string]string{CIFAR10.Archive: md5hex(archive)}})
			wantError(t, err, filepath.Join(dir, CIFAR10.Archive), c.fragment)
			// Nothing but the archive is left (the incomplete archive's
			// one good file excepted).
			entries, _ := os.ReadDir(dir)
			for _, e := range entries {
				if e.Name() != CIFAR10.Archive && !(c.name == "incomplete" && e.Name() == "cifar-10-batches-bin") {
					t.Errorf("left behind: %s", e.Name())
				}
			}
			if _, err := os.Stat(filepath.Join(dir, "..", "evil")); err == nil {
				t.Error("traversal wrote a file")
			}
		})
	}
}

func FuzzReadCIFAR(f *testing.F) {
	f.Add(cifar10Bytes(1))
	f.Add(cifar10Bytes(2))
	f.Add(cifar100Bytes(1))
	f.Add(cifar100Bytes(2)[:CIFAR100RecordSize+5])
	f.Add([]byte{})
	f.Add([]byte{10})
	f.Add(append([]byte{99, 200}, make([]byte, CIFARImageBytes)...))
	f.Fuzz(func(t *testing.T, b []byte) {
		check := func(d *Dataset, err error, recordSize, labelByte int) {
			if err != nil {
				var e *Error
				if !errors.As(err, &e) || strings.Contains(err.Error(), "\n") || !strings.HasPrefix(err.Error(), "data: fuzz: ") {
					t.Fatalf("bad error %T %q", err, err)
				}
				return
			}
			if len(b)%recordSize != 0 || d.N != len(b)/recordSize || len(d.Images) != d.N*CIFARImageBytes || len(d.Labels) != d.N || d.N == 0 {
				t.Fatalf("%d bytes gave N %d, %d image bytes, %d labels", len(b), d.N, len(d.Images), len(d.Labels))
			}
			for i := range d.N {
				rec := b[i*recordSize : (i+1)*recordSize]
				if d.Labels[i] != rec[labelByte] || int(d.Labels[i]) >= d.NumClasses() || !bytes.Equal(d.Image(i), rec[recordSize-CIFARImageBytes:]) {
					t.Fatalf("record %d differs", i)
				}
			}
		}
		d, err := ReadCIFAR10(bytes.NewReader(b), "fuzz")
		check(d, err, CIFAR10RecordSize, 0)
		d, err = ReadCIFAR100(bytes.NewReader(b), "fuzz", CIFAR100Fine)
		check(d, err, CIFAR100RecordSize, 1)
		d, err = ReadCIFAR100(bytes.NewReader(b), "fuzz", CIFAR100Coarse)
		check(d, err, CIFAR100RecordSize, 0)
	})
}
