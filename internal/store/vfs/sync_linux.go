package vfs

import (
	"os"
	"syscall"
)

// fdatasync makes f's data durable without its metadata where only the
// size changed, which the file's data needs anyway.
func fdatasync(f *os.File) error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if err != syscall.EINTR {
			return err
		}
	}
}
