package data

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestDownloadKeepsOtherFiles: a sound file of another data set under one
// of the names is the user's and is not replaced, nor is a special file;
// nothing is fetched for either.
func TestDownloadKeepsOtherFiles(t *testing.T) {
	files, sums := downloadFixture(t)
	m := newMirror(t, files)
	other := fakeFiles(fakeSet{nTrain: 7, nTest: 2, rows: 3, cols: 3, gz: true})
	name := TrainImagesFile + ".gz"

	dir := t.TempDir()
	p := writeFile(t, dir, name, other[name])
	err := Download(context.Background(), dir, DownloadOptions{Mirrors: []string{m.url()}, Checksums: sums})
	if err == nil || !strings.Contains(err.Error(), p+": download: present with MD5") || !strings.Contains(err.Error(), "not replacing it") {
		t.Errorf("%v", err)
	}
	if b, _ := os.ReadFile(p); !bytes.Equal(b, other[name]) {
		t.Error("the file was replaced")
	}

	dir = t.TempDir()
	fifo := filepath.Join(dir, name)
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Skipf("no FIFOs: %v", err)
	}
	err = Download(context.Background(), dir, DownloadOptions{Mirrors: []string{m.url()}, Checksums: sums})
	if err == nil || !strings.Contains(err.Error(), fifo+": download: is a named pipe (FIFO), not a regular file") {
		t.Errorf("%v", err)
	}
	if st, err := os.Lstat(fifo); err != nil || st.Mode()&os.ModeNamedPipe == 0 {
		t.Error("the FIFO was replaced")
	}
	if n := m.requests.Load(); n != 0 {
		t.Errorf("%d requests", n)
	}
}
