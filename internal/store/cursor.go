package store

import "encoding/base64"

// The listings' cursors, the same in both stores: opaque to callers, they
// carry the last key read (user \0 service for subscriptions, the job id,
// an alert's 8-byte sequence number), base64url without padding.

// EncodeCursor makes the cursor of a listing that stopped after key; ""
// (no more pages) for nil.
func EncodeCursor(key []byte) string {
	if key == nil {
		return ""
	}
	return base64.RawURLEncoding.EncodeToString(key)
}

// DecodeCursor reads a cursor back: nil for "" (the first page),
// ErrBadCursor for anything EncodeCursor did not write.
func DecodeCursor(cursor string) ([]byte, error) {
	if cursor == "" {
		return nil, nil
	}
	key, err := base64.RawURLEncoding.DecodeString(cursor)
	if err != nil || len(key) == 0 {
		return nil, ErrBadCursor
	}
	return key, nil
}

// DecodeAlertCursor reads the cursor of an alert listing: the sequence
// number, big-endian, of the last alert returned; nil for the first page.
func DecodeAlertCursor(cursor string) ([]byte, error) {
	before, err := DecodeCursor(cursor)
	if err != nil {
		return nil, err
	}
	if before != nil && len(before) != 8 {
		return nil, ErrBadCursor
	}
	return before, nil
}
