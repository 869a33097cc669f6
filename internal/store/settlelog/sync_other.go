//go:build !linux

package settlelog

import "os"

func fdatasync(f *os.File) error { return f.Sync() }
