// Package atomicfile replaces files atomically: a reader (or a process that
// starts after a crash) sees either the old content of the file or the new
// one, never a mixture or a truncated file.
//
// A write goes to a temporary file in the same directory as the target,
// named "." + base + ".tmp-" + random digits (so that it is hidden and
// recognisable, see Temps), which is written, flushed to disk with fsync and
// closed; then it is renamed over the target, and the directory is synced
// so that the rename itself survives a power failure.
//
// A process killed during a write leaves the target untouched and at most
// one temporary file per write in flight; nothing removes it automatically,
// because a concurrent writer's temporary file looks the same. A program
// that knows it is the only writer (a training run starting up) may call
// RemoveTemps.
package atomicfile

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
)

// tempInfix separates the target's base name from the random suffix in the
// name of a temporary file.
const tempInfix = ".tmp-"

// WriteFile atomically replaces the file at path with data, giving it the
// permission bits perm (not filtered by the umask).
func WriteFile(path string, data []byte, perm fs.FileMode) error {
	return Write(path, perm, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// Write atomically replaces the file at path with what fn writes to w (a
// buffered writer on the temporary file). If fn returns an error, the
// target is left untouched, the temporary file is removed and Write returns
// fn's error.
func Write(path string, perm fs.FileMode, fn func(w io.Writer) error) error {
	p, err := Prepare(path, perm, fn)
	if err != nil {
		return err
	}
	return p.Commit()
}

// Pending is a temporary file that is complete and synced to disk, waiting
// to be renamed over its target by Commit (or removed by Discard). Preparing
// several files before committing any keeps the moment at which a crash
// leaves some of them old and some new as short as two renames.
type Pending struct {
	path, tmp string
	done      bool
}

// Prepare writes what fn writes into a new temporary file beside path,
// syncs and closes it, and returns it uncommitted. On error nothing is left
// behind.
func Prepare(path string, perm fs.FileMode, fn func(w io.Writer) error) (_ *Pending, err error) {
	dir, base := filepath.Split(path)
	if base == "" {
		return nil, &fs.PathError{Op: "write", Path: path, Err: errors.New("not a file name")}
	}
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+tempInfix+"*")
	if err != nil {
		return nil, err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	bw := bufio.NewWriterSize(f, 1<<20)
	if err := fn(bw); err != nil {
		return nil, err
	}
	if err := bw.Flush(); err != nil {
		return nil, err
	}
	if err := f.Chmod(perm); err != nil && runtime.GOOS != "windows" {
		return nil, err
	}
	if err := f.Sync(); err != nil {
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	return &Pending{path: path, tmp: tmp}, nil
}

// Path is the target the file will be renamed to.
func (p *Pending) Path() string { return p.path }

// TempPath is the temporary file's path.
func (p *Pending) TempPath() string { return p.tmp }

// Commit renames the temporary file over the target and syncs the
// directory. After an error the temporary file is removed.
func (p *Pending) Commit() error { return CommitAll(p) }

// Discard removes the temporary file of an uncommitted Pending; it does
// nothing after Commit or a previous Discard.
func (p *Pending) Discard() {
	if !p.done {
		p.done = true
		os.Remove(p.tmp)
	}
}

// CommitAll renames each prepared file over its target, in order, then
// syncs each directory involved once. If a rename fails, that file and the
// ones after it are discarded (the earlier ones stay committed) and the
// error is returned.
func CommitAll(ps ...*Pending) error {
	var dirs []string
	for i, p := range ps {
		if p.done {
			return fmt.Errorf("atomicfile: %s: already committed or discarded", p.path)
		}
		if err := os.Rename(p.tmp, p.path); err != nil {
			for _, q := range ps[i:] {
				q.Discard()
			}
			return err
		}
		p.done = true
		d := filepath.Dir(p.path)
		if !contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	for _, d := range dirs {
		if err := SyncDir(d); err != nil {
			return err
		}
	}
	return nil
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// SyncDir flushes a directory's entries (a rename into it) to disk. It does
// nothing on Windows, which cannot open directories for syncing, and
// ignores file systems that do not support it (EINVAL, ENOTSUP).
func SyncDir(dir string) error {
	if runtime.GOOS == "windows" {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	d.Close()
	if err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOTSUP) {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}

// IsTemp reports whether name (a base name) is a temporary file that a
// write of the target base name would create.
func IsTemp(target, name string) bool {
	return strings.HasPrefix(name, "."+target+tempInfix)
}

// Temps lists the temporary files beside path that writes of path have
// created and not (yet) renamed or removed: those of writes in flight, and
// those left by processes that died while writing.
func Temps(path string) ([]string, error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if IsTemp(base, e.Name()) && e.Type().IsRegular() {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	return out, nil
}

// RemoveTemps removes the temporary files that Temps lists and returns
// their paths. Call it only when no other process may be writing path.
func RemoveTemps(path string) ([]string, error) {
	ts, err := Temps(path)
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, t := range ts {
		if err := os.Remove(t); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return removed, err
		}
		removed = append(removed, t)
	}
	return removed, nil
}
