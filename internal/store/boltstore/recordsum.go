package boltstore

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
	"time"
	"unicode/utf8"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/store"
)

// Every value the store writes to the file ends in a trailer: a mark byte,
// a version byte and the CRC32C of the record's key and value. bbolt
// checksums its meta pages only, so a byte damaged in place inside a
// record (a digit of a balance) reads back as a different, perfectly
// valid value; the trailer makes every such read fail instead, naming the
// record. The key is in the sum, so a record whose key was damaged (its
// balance moved to another user) fails as well.
//
// Stores written before the trailer (format 1) have none: Open adds it to
// every record once (sealStore) and records format 2, after which a
// record without one is damage like any other.
const (
	sumMark    = 0xFE // never in UTF-8 text, so no JSON record ends in it by chance
	sumVersion = 0x01
	trailerLen = 6
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrRecordDamaged marks a record whose checksum does not match: its bytes
// changed on disk after they were written. It wraps ErrDamaged, so callers
// treat it as damage (an internal error to the caller of the API).
var ErrRecordDamaged = fmt.Errorf("record checksum mismatch: %w", ErrDamaged)

// RecordError is a damaged record: which bucket, which key, what is wrong.
type RecordError struct {
	Bucket  string
	Key     []byte
	Problem string
}

func (e *RecordError) Error() string {
	return fmt.Sprintf("store record %s %s: %s (the file was changed on disk; restore a backup)",
		e.Bucket, describeKey(e.Bucket, e.Key), e.Problem)
}

func (e *RecordError) Unwrap() error { return ErrRecordDamaged }

// recordSum is the CRC32C of the key's length, the key and the payload
// (the length keeps key "ab" + value "c" apart from key "a" + value "bc").
// The few bytes before the payload go through the table by hand: handed
// to crc32.Update they would escape to the heap (it dispatches through a
// function value), and with them the caller's key, an allocation on every
// read; the payload, long and already on the heap or the mapped file,
// takes the hardware path.
func recordSum(key, payload []byte) uint32 {
	c := ^uint32(0)
	n := uint32(len(key))
	for _, b := range [4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)} {
		c = castagnoli[byte(c)^b] ^ c>>8
	}
	for _, b := range key {
		c = castagnoli[byte(c)^b] ^ c>>8
	}
	return crc32.Update(^c, castagnoli, payload)
}

// seal returns payload with its trailer, in a new slice (bbolt keeps the
// slice until the commit, and callers reuse theirs).
func seal(key, payload []byte) []byte {
	out := make([]byte, len(payload)+trailerLen)
	copy(out, payload)
	t := out[len(payload):]
	t[0], t[1] = sumMark, sumVersion
	binary.BigEndian.PutUint32(t[2:], recordSum(key, payload))
	return out
}

// unseal checks raw, the value stored under key in bucket, and returns its
// payload (a sub-slice of raw, valid as long as raw is).
func unseal(bucket, key, raw []byte) ([]byte, error) {
	if len(raw) < trailerLen || raw[len(raw)-trailerLen] != sumMark || raw[len(raw)-trailerLen+1] != sumVersion {
		return nil, recordError(bucket, key, "no checksum trailer")
	}
	payload, t := raw[:len(raw)-trailerLen], raw[len(raw)-trailerLen:]
	if want, got := binary.BigEndian.Uint32(t[2:]), recordSum(key, payload); want != got {
		return nil, recordError(bucket, key, fmt.Sprintf("checksum %08x, but the record sums to %08x", want, got))
	}
	return payload, nil
}

// recordError builds a RecordError with its own copy of key: the caller's
// key (often an array on its stack, or bbolt's mapped page) must not
// escape on the path every read takes.
//
//go:noinline
func recordError(bucket, key []byte, problem string) error {
	return &RecordError{Bucket: string(bucket), Key: bytes.Clone(key), Problem: problem}
}

// getRaw returns the checked payload under key in bucket, or
// store.ErrNotFound.
func getRaw(tx *bolt.Tx, bucket, key []byte) ([]byte, error) {
	raw := tx.Bucket(bucket).Get(key)
	if raw == nil {
		return nil, store.ErrNotFound
	}
	return unseal(bucket, key, raw)
}

// putRaw stores payload under key in bucket, sealed.
func putRaw(tx *bolt.Tx, bucket, key, payload []byte) error {
	return tx.Bucket(bucket).Put(key, seal(key, payload))
}

// getJSON reads the record under key in bucket into v.
func getJSON(tx *bolt.Tx, bucket, key []byte, v any) error {
	raw, err := getRaw(tx, bucket, key)
	if err != nil {
		return err
	}
	return decodeRecord(bucket, key, raw, v)
}

// putJSON stores v as JSON under key in bucket, sealed.
func putJSON(tx *bolt.Tx, bucket, key []byte, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return putRaw(tx, bucket, key, raw)
}

// decodeJSON checks raw, the value under key in bucket, and decodes it
// into v.
func decodeJSON(bucket, key, raw []byte, v any) error {
	payload, err := unseal(bucket, key, raw)
	if err != nil {
		return err
	}
	return decodeRecord(bucket, key, payload, v)
}

func decodeRecord(bucket, key, payload []byte, v any) error {
	if err := json.Unmarshal(payload, v); err != nil {
		return decodeError(bucket, key, err)
	}
	return nil
}

//go:noinline
func decodeError(bucket, key []byte, err error) error {
	k := bytes.Clone(key)
	return fmt.Errorf("store record %s %s: %w", bucket, describeKey(string(bucket), k), err)
}

// sealedBuckets are the buckets whose every value carries the trailer:
// all of the platform's. Not the marker bucket, whose format stays plain
// text (an older gateway reads it and refuses the file) and whose
// positions are checked against the ledger directory and the settlement
// log; nor the ledger bucket of a store from before the ledger directory,
// whose rows Open moves out as they are.
func sealedBuckets() [][]byte { return allBuckets }

// sealStore adds the trailer to every record of a format 1 store, in the
// transaction that records format 2: the store is sealed whole or not at
// all. It returns how many records it sealed.
func sealStore(tx *bolt.Tx) (int, error) {
	n := 0
	seal1 := func(bucket []byte, b *bolt.Bucket) error {
		var keys, vals [][]byte
		err := b.ForEach(func(k, v []byte) error {
			if v == nil && b.Bucket(k) != nil {
				return fmt.Errorf("bucket %s holds a nested bucket %q: not a platform store", bucket, k)
			}
			keys = append(keys, k)
			vals = append(vals, seal(k, v))
			return nil
		})
		if err != nil {
			return err
		}
		for i, k := range keys {
			if err := b.Put(append([]byte(nil), k...), vals[i]); err != nil {
				return err
			}
		}
		n += len(keys)
		return nil
	}
	for _, name := range sealedBuckets() {
		if b := tx.Bucket(name); b != nil {
			if err := seal1(name, b); err != nil {
				return n, err
			}
		}
	}
	return n, nil
}

// checkRecords checks the trailer of every record of a format 2 store and
// returns the damaged ones (at most limit), how many are damaged and how
// many records it read.
func checkRecords(tx *bolt.Tx, limit int) (bad []error, damaged, records int64) {
	for _, name := range sealedBuckets() {
		b := tx.Bucket(name)
		if b == nil {
			continue
		}
		b.ForEach(func(k, v []byte) error {
			records++
			if _, err := unseal(name, k, v); err != nil {
				if damaged++; len(bad) < limit {
					bad = append(bad, err)
				}
			}
			return nil
		})
	}
	return bad, damaged, records
}

// describeKey renders a record's key for an error: the parts of the
// composite keys by name, numbers as numbers, and of a service key's
// SHA-256 only its first bytes (enough to find the record, nothing more).
func describeKey(bucket string, key []byte) string {
	switch bucket {
	case string(bucketSubs):
		if u, s, ok := strings.Cut(string(key), "\x00"); ok {
			return fmt.Sprintf("(user %q, service %q)", u, s)
		}
	case string(bucketCounters):
		if len(key) > 8 {
			if u, s, ok := strings.Cut(strings.TrimSuffix(string(key[:len(key)-8]), "\x00"), "\x00"); ok {
				p := int64(binary.BigEndian.Uint64(key[len(key)-8:]))
				return fmt.Sprintf("(user %q, service %q, period %s)", u, s, time.Unix(p, 0).UTC().Format(time.RFC3339))
			}
		}
	case string(bucketKeys):
		if len(key) >= 4 {
			return fmt.Sprintf("(key hash %s…)", hex.EncodeToString(key[:4]))
		}
	}
	if len(key) == 8 && !utf8.Valid(key) || len(key) == 8 && strings.ContainsRune(string(key), 0) {
		return fmt.Sprintf("#%d", binary.BigEndian.Uint64(key))
	}
	return fmt.Sprintf("%q", key)
}

// isDamage tells whether err is damage (a damaged record or file), which
// is never read as "not there".
func isDamage(err error) bool { return errors.Is(err, ErrDamaged) }
