// Package servicekey makes and checks service keys, the bearer credentials
// callers present to the gateway (docs/wire-contract.md, "Service keys").
//
// A key looks like
//
//	psk_<33 random base62 characters><6 base62 characters of checksum>
//
// following GitHub's token format, for two reasons. The prefix and the
// CRC32 checksum let the gateway refuse a mistyped or made-up key with
// WellFormed before it costs a store lookup, and let secret scanners spot a
// leaked key with a regular expression and no false positives. 33 base62
// characters carry 196 bits of entropy, so keys cannot be guessed.
//
// Only Hash(key) is ever stored; the plaintext is shown once, at creation.
// A key also has a public id (NewID), a UUID, that names it in URLs and
// listings; stores made before ids were UUIDs hold "key_…" ids, which stay
// valid (IsID accepts both).
package servicekey

import (
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"hash/crc32"
	"strings"

	"github.com/google/uuid"
)

// Prefix identifies a service key; it is followed by "_". A distinct prefix
// per credential type tells a scanner (and a human) what leaked.
const Prefix = "psk"

// legacyIDPrefix marks the key ids issued before ids were UUIDs: "key_"
// and 20 base62 characters. They are still looked up, never issued.
const legacyIDPrefix = "key_"

const (
	randomLen   = 33 // 33·log2(62) ≈ 196.5 bits
	checksumLen = 6  // 62^6 > 2^32, enough for any CRC32
	legacyIDMax = 64 // the longest "key_…" id IsID accepts

	head = Prefix + "_"
	// keyLen is the length of every well-formed key: 43.
	keyLen = len(head) + randomLen + checksumLen
)

// alphabet is the base62 digit order, also the order of checksum digits.
const alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// digit maps a byte to its base62 value, or 0xFF if it is not a base62
// character. A table keeps WellFormed branch-free per character.
var digit = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xFF
	}
	for i := 0; i < len(alphabet); i++ {
		t[alphabet[i]] = byte(i)
	}
	return t
}()

// Generate returns a new service key and its hash, the value to store.
func Generate() (key string, hash [32]byte, err error) {
	var b [keyLen]byte
	copy(b[:], head)
	random := b[len(head) : len(head)+randomLen]
	if err := fillBase62(random); err != nil {
		return "", [32]byte{}, fmt.Errorf("generate service key: %w", err)
	}
	putChecksum(b[len(head)+randomLen:], crc32.ChecksumIEEE(random))
	key = string(b[:])
	return key, Hash(key), nil
}

// Hash returns the SHA-256 of the full key string, the form in which keys
// are stored and looked up. A fast unsalted hash is right here, unlike for
// passwords: 196 random bits cannot be brute-forced, and the lookup has to
// be by hash.
func Hash(key string) [32]byte {
	// Hashing through a stack buffer avoids the heap copy that
	// []byte(key) would make on every request for a key this size.
	var buf [64]byte
	if len(key) <= len(buf) {
		n := copy(buf[:], key)
		return sha256.Sum256(buf[:n])
	}
	return sha256.Sum256([]byte(key))
}

// WellFormed reports whether key has the service key shape: the prefix,
// the exact length, base62 characters only and a matching checksum. It does
// the same work for any input of the right length, whatever and wherever
// its flaws, and does not allocate, so it is cheap enough to run on every
// request before any store lookup. Passing it says nothing about whether
// the key exists.
func WellFormed(key string) bool {
	if len(key) != keyLen {
		return false
	}
	bad := byte(0)
	for i := 0; i < len(head); i++ {
		bad |= key[i] ^ head[i]
	}
	for i := len(head); i < len(head)+randomLen; i++ {
		bad |= digit[key[i]] & 0x80 // 0xFF marks a non-base62 byte
	}
	var sum uint64
	for i := len(head) + randomLen; i < keyLen; i++ {
		d := digit[key[i]]
		bad |= d & 0x80
		sum = sum*62 + uint64(d&0x3F)
	}
	// A non-base62 checksum character already set bad; its masked value
	// only has to keep the arithmetic defined.
	if sum != uint64(crcString(key[len(head):len(head)+randomLen])) {
		bad |= 1
	}
	return bad == 0
}

// NewID returns a new key id: a UUID (version 7, lower case), the type the
// SDKs of the platform this gateway replaces declare for serviceKeyId (the
// Java SDK parses it as java.util.UUID). Version 7 ids begin with their
// creation time, so listings in id order are in creation order. Ids name
// keys in the admin API and in logs, where the key itself must never appear.
func NewID() string {
	id, err := uuid.NewV7()
	if err != nil {
		// uuid reads crypto/rand, which has not returned errors since Go
		// 1.24 (it crashes the program instead); no caller could do
		// anything useful with an error.
		panic(fmt.Sprintf("servicekey: new key id: %v", err))
	}
	return id.String()
}

// IsID reports whether s has the shape of a key id: a UUID in its 36
// character form (any case), or a legacy "key_" id of base62 characters.
// A service key never passes.
func IsID(s string) bool {
	if len(s) == 36 {
		_, err := uuid.Parse(s)
		return err == nil
	}
	if !strings.HasPrefix(s, legacyIDPrefix) || len(s) == len(legacyIDPrefix) || len(s) > legacyIDMax {
		return false
	}
	for i := len(legacyIDPrefix); i < len(s); i++ {
		if digit[s[i]] == 0xFF {
			return false
		}
	}
	return true
}

// CanonicalID returns the form in which a key id is stored: a UUID in lower
// case (callers may send it in upper case, as some UUID libraries print
// it); anything else unchanged, legacy ids included.
func CanonicalID(id string) string {
	if len(id) == 36 {
		if u, err := uuid.Parse(id); err == nil {
			return u.String()
		}
	}
	return id
}

// fillBase62 fills dst with uniformly random base62 characters. A random
// byte is used only when it is below 248 = 4·62 (rejection sampling):
// taking every byte mod 62 would make the first eight characters of the
// alphabet more likely than the rest and cost entropy.
func fillBase62(dst []byte) error {
	const limit = 256 - 256%len(alphabet) // 248
	var pool [64]byte
	avail := 0
	for i := 0; i < len(dst); {
		if avail == 0 {
			if _, err := rand.Read(pool[:]); err != nil {
				return err
			}
			avail = len(pool)
		}
		avail--
		if c := pool[avail]; int(c) < limit {
			dst[i] = alphabet[int(c)%len(alphabet)]
			i++
		}
	}
	return nil
}

// crcString is crc32.ChecksumIEEE over a string. The library function's
// argument escapes (it may dispatch to assembly), so calling it would cost
// WellFormed a heap copy of the key on every request; the bytewise table
// loop is fast enough for 33 bytes and allocates nothing.
func crcString(s string) uint32 {
	crc := ^uint32(0)
	for i := 0; i < len(s); i++ {
		crc = crc32.IEEETable[byte(crc)^s[i]] ^ crc>>8
	}
	return ^crc
}

// putChecksum writes v as exactly len(dst) base62 digits, most significant
// first, zero-padded, so the checksum has a fixed place and length.
func putChecksum(dst []byte, v uint32) {
	n := uint64(v)
	for i := len(dst) - 1; i >= 0; i-- {
		dst[i] = alphabet[n%62]
		n /= 62
	}
}
