package framed

import "fmt"

// Fault is what is wrong with a record that does not read.
type Fault int

const (
	// ShortHeader: fewer bytes are left than a frame header.
	ShortHeader Fault = iota + 1
	// Truncated: the payload the length says runs past the end.
	Truncated
	// BadLength: a length of zero (no record is empty) or of more than a
	// record holds (Format.Max).
	BadLength
	// BadChecksum: the payload does not match its checksum.
	BadChecksum
	// Zeros: the record and everything after it are zeros.
	Zeros
)

// Error is a record that does not read: the file, the offset of its frame
// and what is wrong. Torn says whether it is a torn tail (the package
// comment has the rule); if not, it is damage.
type Error struct {
	Path   string
	Offset int64 // of the bad record's frame
	Size   int64 // of the file (of the part read)
	Fault  Fault
	Length int64 // what the frame's length says (BadLength, Truncated, BadChecksum)
	Noun   string
	Torn   bool
}

// Cut is how many bytes a repair of the torn tail drops: from the bad
// record to the end.
func (e *Error) Cut() int64 { return e.Size - e.Offset }

// What says what is wrong and where in the file, without naming it, for a
// user whose message names the file itself.
func (e *Error) What() string {
	left := e.Size - e.Offset
	switch e.Fault {
	case ShortHeader:
		return fmt.Sprintf("truncated %s header at offset %d: %d bytes of the %d-byte file are left", e.Noun, e.Offset, left, e.Size)
	case Truncated:
		return fmt.Sprintf("truncated %s at offset %d: it holds %d bytes, %d of the %d-byte file are left",
			e.Noun, e.Offset, e.Length, left-HeaderSize, e.Size)
	case BadLength:
		if e.Length == 0 {
			return fmt.Sprintf("bad %s length at offset %d: 0 bytes, and no %s is empty", e.Noun, e.Offset, e.Noun)
		}
		return fmt.Sprintf("bad %s length at offset %d: %d bytes, more than a %s holds", e.Noun, e.Offset, e.Length, e.Noun)
	case BadChecksum:
		return fmt.Sprintf("bad checksum in the %d-byte %s at offset %d", e.Length, e.Noun, e.Offset)
	case Zeros:
		return fmt.Sprintf("zeros instead of a %s at offset %d: the %d bytes to the end of the %d-byte file are all zero", e.Noun, e.Offset, left, e.Size)
	}
	return fmt.Sprintf("bad %s at offset %d", e.Noun, e.Offset)
}

func (e *Error) Error() string { return e.Path + ": " + e.What() }
