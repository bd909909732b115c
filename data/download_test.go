package data

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// mirror serves files by name from a map and counts requests.
type mirror struct {
	files    map[string][]byte
	requests atomic.Int64
	*httptest.Server
}

func newMirror(t *testing.T, files map[string][]byte) *mirror {
	m := &mirror{files: files}
	m.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.requests.Add(1)
		b, ok := m.files[strings.TrimPrefix(r.URL.Path, "/mnist/")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Write(b)
	}))
	t.Cleanup(m.Close)
	return m
}

func (m *mirror) url() string { return m.URL + "/mnist/" }

// downMirror returns the URL of a server that has been shut down, so that
// connections are refused.
func downMirror() string {
	s := httptest.NewServer(http.NotFoundHandler())
	u := s.URL + "/mnist/"
	s.Close()
	return u
}

func downloadFixture(t *testing.T) (map[string][]byte, map[string]string) {
	files := fakeFiles(fakeSet{nTrain: 20, nTest: 5, rows: 3, cols: 3, gz: true})
	sums := map[string]string{}
	for name, b := range files {
		sums[name] = md5hex(b)
	}
	return files, sums
}

// checkDir checks that dir holds exactly the files, with nothing left over
// (no temporary files).
func checkDownloaded(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(files) {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("dir holds %v, want %d files", names, len(files))
	}
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: wrong content (%v)", name, err)
		}
	}
}

func TestDownloadGood(t *testing.T) {
	files, sums := downloadFixture(t)
	m := newMirror(t, files)
	dir := filepath.Join(t.TempDir(), "new", "mnist")
	var log bytes.Buffer
	if err := Download(context.Background(), dir, DownloadOptions{Mirrors: []string{m.url()}, Checksums: sums, Log: &log}); err != nil {
		t.Fatal(err)
	}
	checkDownloaded(t, dir, files)
	if _, _, err := LoadMNIST(dir); err != nil {
		t.Errorf("downloaded data does not load: %v", err)
	}
	st, _ := os.Stat(filepath.Join(dir, TrainImagesFile+".gz"))
	if st.Mode().Perm() != 0o644 {
		t.Errorf("mode %v, want 0644", st.Mode())
	}
	// Everything is present now: no more requests. The mirror URL without
	// its trailing slash works too.
	n := m.requests.Load()
	if err := Download(context.Background(), dir, DownloadOptions{Mirrors: []string{strings.TrimSuffix(m.url(), "/")}, Checksums: sums, Log: &log}); err != nil {
		t.Fatal(err)
	}
	if m.requests.Load() != n {
		t.Error("files already present were downloaded again")
	}
	if !strings.Contains(log.String(), "present, MD5 verified") {
		t.Errorf("log:\n%s", log.String())
	}
	// A damaged file is fetched again.
	writeFile(t, dir, TestLabelsFile+".gz", []byte("damaged"))
	if err := Download(context.Background(), dir, DownloadOptions{Mirrors: []string{m.url()}, Checksums: sums}); err != nil {
		t.Fatal(err)
	}
	if m.requests.Load() != n+1 {
		t.Errorf("%d requests to repair one file", m.requests.Load()-n)
	}
	checkDownloaded(t, dir, files)
}

func TestDownloadFallsBackToNextMirror(t *testing.T) {
	files, sums := downloadFixture(t)
	corrupt := map[string][]byte{}
	for name, b := range files {
		bad := bytes.Clone(b)
		bad[len(bad)/2] ^= 1
		corrupt[name] = bad
	}
	bad, good := newMirror(t, corrupt), newMirror(t, files)
	dir := t.TempDir()
	var log bytes.Buffer
	err := Download(context.Background(), dir, DownloadOptions{Mirrors: []string{downMirror(), bad.url(), good.url()}, Checksums: sums, Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	checkDownloaded(t, dir, files)
	for _, s := range []string{"connection refused", "MD5 ", "want " + sums[TrainImagesFile+".gz"], "trying the next mirror"} {
		if !strings.Contains(log.String(), s) {
			t.Errorf("log does not mention %q:\n%s", s, log.String())
		}
	}
	if bad.requests.Load() != 4 || good.requests.Load() != 4 {
		t.Errorf("requests: bad mirror %d, good mirror %d; want 4 each", bad.requests.Load(), good.requests.Load())
	}
}

func TestDownloadAllMirrorsFail(t *testing.T) {
	files, sums := downloadFixture(t)
	corrupt := map[string][]byte{}
	for name := range files {
		corrupt[name] = []byte("not the file")
	}
	bad := newMirror(t, corrupt)
	empty := newMirror(t, nil)
	down := downMirror()
	dir := t.TempDir()
	var log bytes.Buffer
	err := Download(context.Background(), dir, DownloadOptions{Mirrors: []string{down, empty.url(), bad.url()}, Checksums: sums, Log: &log})
	wantError(t, err, filepath.Join(dir, TrainImagesFile+".gz"), "download failed from every mirror: ",
		down+": ", "connection refused",
		empty.url()+": HTTP 404 Not Found",
		bad.url()+": MD5 ", "want "+sums[TrainImagesFile+".gz"])
	if !strings.Contains(log.String(), "no mirror left") {
		t.Errorf("log:\n%s", log.String())
	}
	checkDownloaded(t, dir, nil) // nothing left behind
}

func TestDownloadCancelled(t *testing.T) {
	_, sums := downloadFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "1000000")
		w.Write([]byte("partial"))
		w.(http.Flusher).Flush()
		close(started)
		<-r.Context().Done()
	}))
	defer srv.Close()
	go func() { <-started; cancel() }()
	dir := t.TempDir()
	err := Download(ctx, dir, DownloadOptions{Mirrors: []string{srv.URL}, Checksums: map[string]string{"x.gz": sums[TrainImagesFile+".gz"]}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	checkDownloaded(t, dir, nil)
}

func TestDownloadBadOptions(t *testing.T) {
	dir := t.TempDir()
	err := Download(context.Background(), dir, DownloadOptions{Mirrors: []string{}})
	wantError(t, err, dir, "no mirrors")
	err = Download(context.Background(), dir, DownloadOptions{Mirrors: []string{"http://127.0.0.1:1/"}, Checksums: map[string]string{"../x": "00"}})
	wantError(t, err, "../x", "not a plain file name")
}

// TestDownloadCanonical serves the real MNIST files (from the module cache,
// when available) and downloads them with the default, canonical checksums.
func TestDownloadCanonical(t *testing.T) {
	t.Setenv("MNIST_DIR", "")
	src, err := Locate("")
	if err != nil {
		t.Skipf("MNIST not available: %v", err)
	}
	files := map[string][]byte{}
	for _, base := range mnistFiles {
		b, err := os.ReadFile(filepath.Join(src.Dir, base+".gz"))
		if err != nil {
			t.Fatal(err)
		}
		files[base+".gz"] = b
	}
	m := newMirror(t, files)
	dir := t.TempDir()
	if err := Download(context.Background(), dir, DownloadOptions{Mirrors: []string{m.url()}}); err != nil {
		t.Fatal(err)
	}
	checkDownloaded(t, dir, files)
	got, err := Locate(dir)
	if err != nil || !got.Canonical {
		t.Errorf("Locate(downloaded) = %+v, %v; want canonical", got, err)
	}
}

func TestDefaultMirrors(t *testing.T) {
	want := []string{"https://ossci-datasets.s3.amazonaws.com/mnist/", "https://storage.googleapis.com/cvdf-datasets/mnist/"}
	if strings.Join(DefaultMirrors, " ") != strings.Join(want, " ") {
		t.Errorf("DefaultMirrors = %v", DefaultMirrors)
	}
}
