// Package framed is the one framing of the store's append-only files: the
// settlement log's segments (internal/store/settlelog), and the ledger's
// raw segments and rollup log (internal/store/ledger). Each file starts
// with a header of its own, then holds records framed as
//
//	length uint32 LE | CRC-32C of the payload uint32 LE | payload
//
// and each user keeps its own header and payload encoding. This package
// owns the frame, the checksum, reading a file's records back, and the one
// rule for a record that does not read:
//
//   - A torn tail: the bad record is the last thing in the file. Its frame
//     or its payload runs past the end of the file, or its checksum fails
//     and it ends exactly at the end, or everything from it to the end is
//     zeros (space the file system gave a write that never landed). That
//     is what a crash in the middle of an append leaves, and the append was
//     never acknowledged: the user drops it (Repair cuts it off a file that
//     is appended to again) and says so. Only the last file of a log may
//     end in one; a user that knows the file held more (the ledger's
//     Options.Covers) refuses it as damage instead.
//   - Damage: anything else, such as a bad checksum with bytes after the
//     record, or a length of zero or of more than a record holds. The user
//     refuses to open the file, naming it and the offset: the records after
//     the bad one cannot be trusted, and skipping them would lose
//     acknowledged ones silently.
//
// A length field garbled to point past the end of the file reads as a torn
// tail: a crash leaves the same bytes. The ledger, which knows how far its
// segments must reach, catches it; see docs/reliability.md.
package framed

import (
	"encoding/binary"
	"hash/crc32"
)

// HeaderSize is the size of a record's frame header: length and checksum.
const HeaderSize = 8

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Checksum is the CRC-32C of b: the frame's checksum, which the users'
// file headers use too.
func Checksum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// Append appends the frame of payload, and payload, to b.
func Append(b, payload []byte) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(len(payload)))
	b = binary.LittleEndian.AppendUint32(b, Checksum(payload))
	return append(b, payload...)
}

// Put fills in the frame header b[:HeaderSize] for the payload that
// follows it, b[HeaderSize:]: for a user that encodes the payload in
// place after reserving the header's room, saving a copy.
func Put(b []byte) {
	payload := b[HeaderSize:]
	binary.LittleEndian.PutUint32(b[:4], uint32(len(payload)))
	binary.LittleEndian.PutUint32(b[4:HeaderSize], Checksum(payload))
}

// Format is what a file's records are, for reading them and for the
// errors about them.
type Format struct {
	// Noun is what the user calls a record ("record", "block", "frame"),
	// as errors say it.
	Noun string
	// Max is the largest payload a record holds; a longer length is
	// damage. 0: any length the frame can say.
	Max int64
}

func (f Format) max() int64 {
	if f.Max <= 0 {
		return 1<<32 - 1
	}
	return f.Max
}
