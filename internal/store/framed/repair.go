package framed

import (
	"fmt"
	"os"

	"github.com/platformgw/gateway/internal/store/vfs"
)

// Repair cuts the torn tail e describes off its file (from e.Offset to the
// end) and syncs the file: for a user that appends to the file again, so
// that its next record does not follow garbage. It refuses damage (e.Torn
// false), and a file that is no longer the size e was read at. The user
// says what was cut (e.What, e.Cut): a torn tail is never cut silently.
func Repair(e *Error) error { return RepairIn(vfs.OS, e) }

// RepairIn is Repair of a file on fsys.
func RepairIn(fsys vfs.FS, e *Error) error {
	if !e.Torn {
		return fmt.Errorf("not cut: %w (damage, not a torn tail)", e)
	}
	f, err := fsys.OpenFile(e.Path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("cut the torn tail of %s: %w", e.Path, err)
	}
	size, err := f.Size()
	if err == nil && size != e.Size {
		err = fmt.Errorf("the file has %d bytes, it was read at %d", size, e.Size)
	}
	if err == nil {
		err = f.Truncate(e.Offset)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("cut the torn tail of %s at offset %d: %w", e.Path, e.Offset, err)
	}
	return nil
}
