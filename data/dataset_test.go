package data

import (
	"bytes"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"io/fs"
	"path/filepath"
	"testing"
)

// fakeSet describes a small MNIST-layout data set.
type fakeSet struct {
	nTrain, nTest, rows, cols int
	gz                        bool
}

// fakeFiles returns the four files (name -> content) of a synthetic data
// set: image i of a split has every pixel equal to byte(i*3+split), and
// label i is i%10.
func fakeFiles(fs fakeSet) map[string][]byte {
	out := map[string][]byte{}
	mk := func(imgName, lblName string, n, split int) {
		sz := fs.rows * fs.cols
		img := make([]byte, n*sz)
		lbl := make([]byte, n)
		for i := range n {
			for p := range sz {
				img[i*sz+p] = byte(i*3 + split)
			}
			lbl[i] = byte(i % 10)
		}
		ib := idxBytes([]int{n, fs.rows, fs.cols}, img)
		lb := idxBytes([]int{n}, lbl)
		if fs.gz {
			ib, lb = gzipBytes(ib), gzipBytes(lb)
			imgName += ".gz"
			lblName += ".gz"
		}
		out[imgName], out[lblName] = ib, lb
	}
	mk(TrainImagesFile, TrainLabelsFile, fs.nTrain, 0)
	mk(TestImagesFile, TestLabelsFile, fs.nTest, 1)
	return out
}

// writeFakeDir writes a synthetic data set into a new directory and returns
// the directory and the MD5 sums of its files.
func writeFakeDir(t testing.TB, fs fakeSet) (string, map[string]string) {
	t.Helper()
	dir := t.TempDir()
	sums := map[string]string{}
	for name, b := range fakeFiles(fs) {
		writeFile(t, dir, name, b)
		sums[name] = md5hex(b)
	}
	return dir, sums
}

func TestLoadMNISTFake(t *testing.T) {
	for _, gz := range []bool{false, true} {
		dir, _ := writeFakeDir(t, fakeSet{nTrain: 25, nTest: 7, rows: 4, cols: 3, gz: gz})
		train, test, err := LoadMNIST(dir)
		if err != nil {
			t.Fatal(err)
		}
		if train.N != 25 || test.N != 7 || train.Rows != 4 || train.Cols != 3 || test.ImageSize() != 12 {
			t.Fatalf("gz=%v: got train %d test %d size %dx%d", gz, train.N, test.N, train.Rows, train.Cols)
		}
		if !bytes.Equal(train.Image(5), bytes.Repeat([]byte{15}, 12)) || test.Image(2)[0] != 7 || train.Labels[13] != 3 {
			t.Errorf("gz=%v: wrong content", gz)
		}
		if cap(train.Image(0)) != 12 {
			t.Errorf("Image capacity %d, want 12", cap(train.Image(0)))
		}
	}
}

func TestLoadMNISTMixedGzipAndRaw(t *testing.T) {
	dir := t.TempDir()
	raw := fakeFiles(fakeSet{nTrain: 5, nTest: 3, rows: 2, cols: 2})
	for name, b := range raw {
		if name == TrainImagesFile || name == TestLabelsFile {
			writeFile(t, dir, name+".gz", gzipBytes(b))
		} else {
			writeFile(t, dir, name, b)
		}
	}
	if _, _, err := LoadMNIST(dir); err != nil {
		t.Fatal(err)
	}
}

func TestLoadMNISTErrors(t *testing.T) {
	t.Run("count mismatch", func(t *testing.T) {
		dir, _ := writeFakeDir(t, fakeSet{nTrain: 6, nTest: 3, rows: 2, cols: 2, gz: true})
		writeFile(t, dir, TrainLabelsFile+".gz", gzipBytes(idxBytes([]int{5}, []byte{1, 2, 3, 4, 5})))
		_, _, err := LoadMNIST(dir)
		img, lbl := filepath.Join(dir, TrainImagesFile+".gz"), filepath.Join(dir, TrainLabelsFile+".gz")
		wantError(t, err, img, "has 6 images but "+lbl+" has 5 labels")
	})
	t.Run("label out of range", func(t *testing.T) {
		dir, _ := writeFakeDir(t, fakeSet{nTrain: 6, nTest: 3, rows: 2, cols: 2})
		writeFile(t, dir, TestLabelsFile, idxBytes([]int{3}, []byte{1, 12, 3}))
		_, _, err := LoadMNIST(dir)
		wantError(t, err, filepath.Join(dir, TestLabelsFile), "label 12 at index 1 is out of range, want 0 to 9")
	})
	t.Run("missing file", func(t *testing.T) {
		dir := t.TempDir()
		_, _, err := LoadMNIST(dir)
		p := filepath.Join(dir, TrainImagesFile+".gz")
		wantError(t, err, p, "no such file (nor train-images-idx3-ubyte without .gz)")
		if !errors.Is(err, fs.ErrNotExist) {
			t.Error("want errors.Is(err, fs.ErrNotExist)")
		}
	})
	t.Run("truncated", func(t *testing.T) {
		dir, _ := writeFakeDir(t, fakeSet{nTrain: 6, nTest: 3, rows: 2, cols: 2, gz: true})
		b := idxBytes([]int{60000, 28, 28}, seq(1234))
		writeFile(t, dir, TrainImagesFile+".gz", gzipBytes(b))
		_, _, err := LoadMNIST(dir)
		wantError(t, err, filepath.Join(dir, TrainImagesFile+".gz"), "truncated: header says 60000x28x28 images (47040000 bytes), file has 1234")
	})
	t.Run("labels where images belong", func(t *testing.T) {
		dir, _ := writeFakeDir(t, fakeSet{nTrain: 6, nTest: 3, rows: 2, cols: 2})
		writeFile(t, dir, TestImagesFile, idxBytes([]int{3}, []byte{1, 2, 3}))
		_, _, err := LoadMNIST(dir)
		wantError(t, err, filepath.Join(dir, TestImagesFile), "holds 3 labels, want images")
	})
	t.Run("image size differs", func(t *testing.T) {
		dir, _ := writeFakeDir(t, fakeSet{nTrain: 6, nTest: 3, rows: 2, cols: 2})
		writeFile(t, dir, TestImagesFile, idxBytes([]int{3, 3, 3}, seq(27)))
		_, _, err := LoadMNIST(dir)
		wantError(t, err, filepath.Join(dir, TestImagesFile), "images are 3x3 but those in")
	})
}

func TestReadDataset(t *testing.T) {
	dir := t.TempDir()
	im := writeFile(t, dir, "a-images", idxBytes([]int{2, 1, 3}, seq(6)))
	lb := writeFile(t, dir, "a-labels.gz", gzipBytes(idxBytes([]int{2}, []byte{9, 0})))
	ds, err := ReadDataset(im, lb)
	if err != nil {
		t.Fatal(err)
	}
	if ds.N != 2 || ds.Rows != 1 || ds.Cols != 3 || ds.Labels[0] != 9 {
		t.Fatalf("got %+v", ds)
	}
}

func md5hex(b []byte) string {
	s := md5.Sum(b)
	return hex.EncodeToString(s[:])
}
