package platformgw

import (
	"crypto/rand"
	"encoding/hex"
)

// newRequestID returns a random (version 4) UUID in its usual text form,
// as uuid.NewString does, with the string as its only allocation
// (uuid.NewString makes two: the UUID read through an io.Reader, then
// the string). crypto/rand.Read does not let its buffer escape.
func newRequestID() string {
	var u [16]byte
	rand.Read(u[:])         // never fails (crypto/rand crashes the program instead)
	u[6] = u[6]&0x0f | 0x40 // version 4
	u[8] = u[8]&0x3f | 0x80 // RFC 4122 variant
	var s [36]byte
	hex.Encode(s[0:8], u[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], u[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], u[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], u[8:10])
	s[23] = '-'
	hex.Encode(s[24:], u[10:])
	return string(s[:])
}
