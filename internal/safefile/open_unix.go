//go:build unix

package safefile

import (
	"os"
	"syscall"
)

// openNonBlocking opens path read-only with O_NONBLOCK, so that a FIFO put
// in place of a checked regular file cannot block the open (reads of a
// regular file are not affected by the flag), and O_NOCTTY, so that a
// terminal never becomes the process's controlling terminal.
func openNonBlocking(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
}
