// Package safefile opens the files a command is given by name (models,
// training state, data files, images, metrics) without the surprises of
// special files: a FIFO blocks an open until a writer comes, /dev/zero and
// /dev/full never end, a directory fails late with a confusing message, and
// a replace by rename would swap a device node for a regular file.
//
// Open and ReadFile accept regular files only (after following symbolic
// links), refuse anything else by its kind, never block on the open, and
// check the size against a limit before anything is read. CheckWritable
// tells, before a long computation, whether a regular file can be created
// or replaced at a path.
package safefile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// NotRegularError is the error (inside an *fs.PathError) for a path that
// names something other than a regular file.
type NotRegularError struct {
	// Kind says what the path is: "a directory", "a named pipe (FIFO)",
	// "a character device", ...
	Kind string
}

func (e *NotRegularError) Error() string { return "is " + e.Kind + ", not a regular file" }

// TooLargeError is the error (inside an *fs.PathError) for a file larger
// than the limit given to Open or ReadFile.
type TooLargeError struct {
	Size, Limit int64
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("is %s, more than the %s this file may hold", Bytes(e.Size), Bytes(e.Limit))
}

// Kind describes a file mode in words, as in "is a directory".
func Kind(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "a regular file"
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	}
	return "not a regular file"
}

// Open opens path for reading. It refuses, by kind, anything that is not a
// regular file once symbolic links are followed, without blocking (a FIFO
// with no writer is refused at once), and refuses a file of more than limit
// bytes (no limit when limit <= 0). Errors are *fs.PathError naming path,
// with Op "open" and a *NotRegularError or *TooLargeError, or the error of
// the system call.
func Open(path string, limit int64) (*os.File, fs.FileInfo, error) {
	// Stat first: opening some devices has effects of its own.
	st, err := os.Stat(path)
	if err != nil {
		return nil, nil, &fs.PathError{Op: "open", Path: path, Err: unwrap(err)}
	}
	if err := check(path, st, limit); err != nil {
		return nil, nil, err
	}
	f, err := openNonBlocking(path)
	if err != nil {
		return nil, nil, err
	}
	// The path may have been replaced between the stat and the open.
	st, err = f.Stat()
	if err == nil {
		err = check(path, st, limit)
	}
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, st, nil
}

func check(path string, st fs.FileInfo, limit int64) error {
	if !st.Mode().IsRegular() {
		return &fs.PathError{Op: "open", Path: path, Err: &NotRegularError{Kind: Kind(st.Mode())}}
	}
	if limit > 0 && st.Size() > limit {
		return &fs.PathError{Op: "open", Path: path, Err: &TooLargeError{Size: st.Size(), Limit: limit}}
	}
	return nil
}

// ReadFile reads the whole regular file at path, as Open checks it, of at
// most limit bytes (limit must be positive). It allocates the size the file
// had when opened, no more, and reads no more than that.
func ReadFile(path string, limit int64) ([]byte, error) {
	if limit <= 0 {
		return nil, &fs.PathError{Op: "read", Path: path, Err: errors.New("safefile: ReadFile needs a positive limit")}
	}
	f, st, err := Open(path, limit)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, st.Size())
	n, err := io.ReadFull(f, b)
	if err == io.ErrUnexpectedEOF {
		err = nil // it shrank since the stat: what is there is the file
	}
	if err != nil && err != io.EOF {
		return nil, &fs.PathError{Op: "read", Path: path, Err: unwrap(err)}
	}
	return b[:n], nil
}

// CheckWritable reports whether a regular file can be created at path, or
// the regular file there replaced (by a rename over it, as package
// atomicfile does): path must not exist or be a regular file, and the
// directory it is in must be a directory in which a file can be created
// now. When that directory does not exist yet, the nearest ancestor that
// does must be a directory that allows creating one. CheckWritable tries by
// creating and removing a hidden empty file, which also catches read-only
// file systems and permissions that a root user is not held to. It
// returns whether path exists.
func CheckWritable(path string) (exists bool, err error) {
	dir, base := filepath.Split(path)
	if base == "" || base == "." || base == ".." {
		return false, &fs.PathError{Op: "create", Path: path, Err: errors.New("not a file name")}
	}
	if st, err := os.Stat(path); err == nil {
		if !st.Mode().IsRegular() {
			return true, &fs.PathError{Op: "create", Path: path, Err: &NotRegularError{Kind: Kind(st.Mode())}}
		}
		exists = true
	} else if !missing(err) {
		return false, err
	}
	if dir == "" {
		dir = "."
	}
	dir = filepath.Clean(dir)
	for {
		st, err := os.Stat(dir)
		if err == nil {
			if !st.IsDir() {
				return exists, &fs.PathError{Op: "create", Path: path, Err: fmt.Errorf("%s is %s, not a directory", dir, Kind(st.Mode()))}
			}
			break
		}
		if !missing(err) {
			return exists, &fs.PathError{Op: "create", Path: path, Err: unwrap(err)}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return exists, &fs.PathError{Op: "create", Path: path, Err: unwrap(err)}
		}
		dir = parent
	}
	f, err := os.CreateTemp(dir, ".safefile-probe-*")
	if err != nil {
		return exists, &fs.PathError{Op: "create", Path: path, Err: fmt.Errorf("cannot create files in %s: %w", dir, unwrap(err))}
	}
	f.Close()
	os.Remove(f.Name())
	return exists, nil
}

// missing reports an error of stat for a path that does not exist, or one
// below something that is not a directory (which the walk up then names).
func missing(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)
}

func unwrap(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// Bytes formats a byte count for messages: "812 B", "3.2 MiB", "24.0 GiB".
func Bytes(n int64) string {
	switch {
	case n < 1<<10:
		return fmt.Sprintf("%d B", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	case n < 1<<30:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
}
