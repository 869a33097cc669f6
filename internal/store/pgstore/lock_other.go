//go:build !unix

package pgstore

import "os"

// lockDir opens path; other systems get no lock (one process per
// settlement log is the operator's business there).
func lockDir(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
}

func unlockDir(f *os.File) {
	if f != nil {
		f.Close()
	}
}
