package safefile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestOpenRefusesSpecialFiles(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Skipf("no FIFOs here: %v", err)
	}
	link := filepath.Join(dir, "zero-link")
	if err := os.Symlink("/dev/zero", link); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, want string }{
		{fifo, "is a named pipe (FIFO), not a regular file"},
		{dir, "is a directory, not a regular file"},
		{"/dev/zero", "is a character device, not a regular file"},
		{link, "is a character device, not a regular file"},
	} {
		done := make(chan error, 1)
		go func() { _, err := ReadFile(c.path, 1<<20); done <- err }()
		select {
		case err := <-done:
			var nr *NotRegularError
			if !errors.As(err, &nr) || !strings.Contains(err.Error(), c.path+": "+c.want) {
				t.Errorf("%s: %v, want %q", c.path, err, c.want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: ReadFile blocked", c.path)
		}
	}
}

func TestReadFileLimit(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, make([]byte, 100), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := ReadFile(p, 100); err != nil || len(b) != 100 {
		t.Errorf("at the limit: %d bytes, %v", len(b), err)
	}
	_, err := ReadFile(p, 99)
	var tl *TooLargeError
	if !errors.As(err, &tl) || tl.Size != 100 || tl.Limit != 99 {
		t.Errorf("over the limit: %v", err)
	}
}

func TestCheckWritable(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	os.WriteFile(file, []byte("x"), 0o644)
	if exists, err := CheckWritable(file); err != nil || !exists {
		t.Errorf("existing file: %v %v", exists, err)
	}
	if exists, err := CheckWritable(filepath.Join(dir, "new", "deeper", "f")); err != nil || exists {
		t.Errorf("new directories: %v %v", exists, err)
	}
	for _, c := range []struct{ path, want string }{
		{dir, "is a directory"},
		{"/dev/full", "is a character device"},
		{filepath.Join(file, "x"), file + " is a regular file, not a directory"},
		{filepath.Join(file, "a", "b"), file + " is a regular file, not a directory"},
		{dir + "/", "not a file name"},
	} {
		if _, err := CheckWritable(c.path); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.path, err, c.want)
		}
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("probe files left behind: %v", ents)
	}
}
