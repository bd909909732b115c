package data

import (
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// withFashionFiles substitutes the Fashion-MNIST identities with those of a
// synthetic set written to a new directory: .gz files whose sums are
// recorded as "upstream", and raw contents recorded as "uncompressed".
func withFashionFiles(t *testing.T) (dir string, raw map[string][]byte) {
	t.Helper()
	rawFiles := fakeFiles(fakeSet{nTrain: 12, nTest: 4, rows: 2, cols: 3})
	dir = t.TempDir()
	ids := map[string]fashionFile{}
	for name, b := range rawFiles {
		gz := gzipBytes(b)
		writeFile(t, dir, name+".gz", gz)
		ids[name] = fashionFile{
			gz:  []fileID{{-1, md5hex(gz), "upstream"}, {int64(len(gz)) + 1, "00000000000000000000000000000000", "Debian"}},
			raw: fileID{int64(len(b)), md5hex(b), "uncompressed"},
		}
	}
	saved := fashionMNISTFiles
	fashionMNISTFiles = ids
	t.Cleanup(func() { fashionMNISTFiles = saved })
	return dir, rawFiles
}

func gzipLevel(t *testing.T, b []byte, level int) []byte {
	var out bytes.Buffer
	zw, err := gzip.NewWriterLevel(&out, level)
	if err != nil {
		t.Fatal(err)
	}
	zw.Name = "recompressed"
	zw.Write(b)
	zw.Close()
	return out.Bytes()
}

func TestLocateFashionMNISTSynthetic(t *testing.T) {
	dir, raw := withFashionFiles(t)
	loc, err := LocateFashionMNIST(dir)
	if err != nil {
		t.Fatal(err)
	}
	if loc.Origin != OriginFlag || loc.Dir != dir || len(loc.Files) != 4 || loc.Files[0] != filepath.Join(dir, TrainImagesFile+".gz") {
		t.Errorf("got %+v", loc)
	}
	if got, want := loc.Describe(), "Fashion-MNIST from --data "+dir+" (MD5 verified)"; got != want {
		t.Errorf("Describe() = %q, want %q", got, want)
	}

	// Recompressed: other .gz bytes, same content.
	lbl := raw[TestLabelsFile]
	re := gzipLevel(t, lbl, gzip.BestSpeed)
	if md5hex(re) == fashionMNISTFiles[TestLabelsFile].gz[0].md5 {
		t.Fatal("recompression gave the same bytes; the test proves nothing")
	}
	writeFile(t, dir, TestLabelsFile+".gz", re)
	if _, err := LocateFashionMNIST(dir); err != nil {
		t.Errorf("recompressed file refused: %v", err)
	}

	// Recompressed wrong content.
	bad := slices.Clone(lbl)
	bad[len(bad)-1] ^= 1
	p := writeFile(t, dir, TestLabelsFile+".gz", gzipLevel(t, bad, gzip.BestSpeed))
	_, err = LocateFashionMNIST(dir)
	wantError(t, err, p, "MD5 ", "want the upstream", "not the canonical Fashion-MNIST file")

	// A .gz too large to be the file is refused by its size.
	p = writeFile(t, dir, TestLabelsFile+".gz", make([]byte, 2048+len(lbl)))
	_, err = LocateFashionMNIST(dir)
	wantError(t, err, p, "more than a gzip file")

	// Raw files: size first, then MD5.
	os.Remove(p)
	p = writeFile(t, dir, TestLabelsFile, lbl)
	if _, err := LocateFashionMNIST(dir); err != nil {
		t.Errorf("raw file refused: %v", err)
	}
	writeFile(t, dir, TestLabelsFile, lbl[1:])
	_, err = LocateFashionMNIST(dir)
	wantError(t, err, p, "bytes, want ")
	writeFile(t, dir, TestLabelsFile, bad)
	_, err = LocateFashionMNIST(dir)
	wantError(t, err, p, "MD5 ", "not the canonical")

	// Missing file.
	os.Remove(p)
	_, err = LocateFashionMNIST(dir)
	wantError(t, err, filepath.Join(dir, TestLabelsFile+".gz"), "missing", "apt-get install dataset-fashion-mnist")

	// A directory that is not a file.
	if err := os.Mkdir(p, 0o755); err != nil {
		t.Fatal(err)
	}
	_, err = LocateFashionMNIST(dir)
	wantError(t, err, p, "not a regular file")
}

func TestLocateFashionMNISTAbsent(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "fashion-mnist")
	saved := fashionMNISTDebianDir
	fashionMNISTDebianDir = missing
	t.Cleanup(func() { fashionMNISTDebianDir = saved })
	_, err := LocateFashionMNIST("")
	wantError(t, err, missing, "Fashion-MNIST not found", "apt-get install dataset-fashion-mnist", FashionMNISTDebianDir)
	f := writeFile(t, t.TempDir(), "file", []byte("x"))
	_, err = LocateFashionMNIST(f)
	wantError(t, err, f, "not a directory")
}

func TestLoadFashionMNISTSynthetic(t *testing.T) {
	dir, _ := withFashionFiles(t)
	train, test, err := LoadFashionMNIST(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []*Dataset{train, test} {
		if d.NumChannels() != 1 || d.NumClasses() != 10 || !slices.Equal(d.ClassNames, FashionMNISTClasses) {
			t.Errorf("channels %d classes %d names %v", d.NumChannels(), d.NumClasses(), d.ClassNames)
		}
	}
	train.ClassNames[0] = "changed"
	if FashionMNISTClasses[0] != "T-shirt/top" || test.ClassNames[0] != "T-shirt/top" {
		t.Error("ClassNames share memory with FashionMNISTClasses")
	}
	if train.N != 12 || test.N != 4 || train.ImageSize() != 6 {
		t.Errorf("N %d/%d, image size %d", train.N, test.N, train.ImageSize())
	}
}

// TestFashionMNISTDebian checks the real files of Debian's
// dataset-fashion-mnist, when installed, against the recorded sums, and a
// recompressed and an uncompressed copy of one of them.
func TestFashionMNISTDebian(t *testing.T) {
	debian := FashionMNISTDebianDir
	if _, err := os.Stat(filepath.Join(debian, TrainImagesFile+".gz")); err != nil {
		t.Skipf("dataset-fashion-mnist not installed (apt-get install dataset-fashion-mnist): %v", err)
	}
	loc, err := LocateFashionMNIST("")
	if err != nil {
		t.Fatal(err)
	}
	if loc.Origin != OriginDebian || !strings.Contains(loc.Describe(), "Debian package dataset-fashion-mnist") {
		t.Errorf("got %+v: %s", loc, loc.Describe())
	}
	train, test, err := LoadFashionMNIST(loc.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if train.N != 60000 || test.N != 10000 || train.Rows != 28 || train.Cols != 28 {
		t.Errorf("train %d, test %d, %dx%d", train.N, test.N, train.Rows, train.Cols)
	}
	// Fashion-MNIST is balanced: 6000 and 1000 images per class.
	var count [10]int
	for _, l := range test.Labels {
		count[l]++
	}
	for c, n := range count {
		if n != 1000 {
			t.Errorf("test class %d (%s): %d images, want 1000", c, test.ClassNames[c], n)
		}
	}

	dir := t.TempDir()
	for _, base := range []string{TrainImagesFile, TrainLabelsFile, TestImagesFile} {
		if err := os.Symlink(filepath.Join(debian, base+".gz"), filepath.Join(dir, base+".gz")); err != nil {
			t.Fatal(err)
		}
	}
	var raw bytes.Buffer
	for _, l := range test.Labels {
		raw.WriteByte(l)
	}
	lbl := append(idxBytes([]int{10000}, nil), raw.Bytes()...)
	writeFile(t, dir, TestLabelsFile+".gz", gzipLevel(t, lbl, gzip.BestCompression))
	if _, err := LocateFashionMNIST(dir); err != nil {
		t.Errorf("recompressed copy refused: %v", err)
	}
	os.Remove(filepath.Join(dir, TestLabelsFile+".gz"))
	writeFile(t, dir, TestLabelsFile, lbl)
	if _, err := LocateFashionMNIST(dir); err != nil {
		t.Errorf("uncompressed copy refused: %v", err)
	}
}
