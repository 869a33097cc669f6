// Package signing implements the HMAC wire contract between the gateway,
// service backends and the usage service (docs/wire-contract.md, "Signing, version 3").
//
// Backends already written against the platform this gateway replaces verify
// what we send and sign what they send us with their SDKs, so every byte of
// the canonical strings here is fixed by those SDKs, not by taste: HMAC-SHA256
// keyed with the service secret, standard padded Base64 output, Unix-seconds
// timestamps, and the version 3 user context appended with no separators.
//
// The package is pure (no I/O, no clock, no Caddy) so that the gateway, the
// usage handler and the backend SDK all share one implementation and the
// golden vectors in the tests pin it down.
package signing

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"strconv"
	"sync"
	"time"
)

// Version is the signing version the gateway speaks to backends; it is sent
// in the Signing-Version header and is also the first byte of the context
// string, so a v3 signature can never be replayed as some other version.
const Version = "3"

// UserContext is the caller context a v3 signature covers. Binding it into
// the signature is what lets a backend trust the identity headers: a caller
// cannot change its user, product or subscription status in transit without
// invalidating the signature.
//
// Absent values are empty strings (and a nil or empty Roles); the context
// string carries them as nothing at all, exactly as the existing SDKs do.
type UserContext struct {
	UserID, ServiceProductID                                     string
	Roles                                                        []string
	SubscriptionStatus, BillingModel, MeasurementType, UnitLabel string
}

// ContextString returns the v3 context string:
//
//	"3" + userId + serviceProductId + rolesCSV + subscriptionStatus +
//	billingModelType + measurementType + unitLabel
//
// with roles joined by "," (no spaces) and no separators between fields.
// The lack of separators is ambiguous in theory (user "ab" + product "c"
// equals user "a" + product "bc"), but it is the format deployed backends
// verify, so it is reproduced as is; the header values sent alongside are
// what a backend actually reads.
func ContextString(uc UserContext) string {
	return string(AppendContext(nil, uc))
}

// AppendContext appends the context string of uc to dst and returns the
// extended slice. It exists for the per-request signing path: with a dst of
// enough capacity it does not allocate.
func AppendContext(dst []byte, uc UserContext) []byte {
	dst = append(dst, Version...)
	dst = append(dst, uc.UserID...)
	dst = append(dst, uc.ServiceProductID...)
	for i, r := range uc.Roles {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, r...)
	}
	dst = append(dst, uc.SubscriptionStatus...)
	dst = append(dst, uc.BillingModel...)
	dst = append(dst, uc.MeasurementType...)
	dst = append(dst, uc.UnitLabel...)
	return dst
}

// Sign returns the standard, padded Base64 encoding of
// HMAC-SHA256(secret, parts[0] || parts[1] || …). Taking the canonical
// string in parts spares callers from copying a large body just to append a
// timestamp to it.
func Sign(secret []byte, parts ...[]byte) string {
	var sum [sha256.Size]byte
	return encode(mac(sum[:0], secret, parts))
}

// encode is base64.StdEncoding.EncodeToString for a MAC, through a
// fixed-size buffer so the string is the only allocation.
func encode(sum []byte) string {
	var out [44]byte // base64.StdEncoding.EncodedLen(sha256.Size)
	base64.StdEncoding.Encode(out[:], sum)
	return string(out[:])
}

// scratch holds buffers for the timestamp + context suffix of a v3
// canonical string. A stack buffer would escape to the heap through the
// hash.Hash interface, so pooling is what keeps SignV3 from allocating one
// per request.
var scratch = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

// maxPooled keeps an occasional caller with thousands of roles from pinning
// a huge buffer in the pool for the life of the process.
const maxPooled = 4 << 10

// SignV3 signs the gateway-to-backend canonical string
// payload + timestamp + ContextString(uc). For a sync invoke the payload is
// the raw request body as received; for an async invoke it is
// AsyncCanonical(body, requestID).
func SignV3(secret, payload []byte, timestamp string, uc UserContext) string {
	bp := scratch.Get().(*[]byte)
	suffix := append((*bp)[:0], timestamp...)
	suffix = AppendContext(suffix, uc)

	h := hmac.New(sha256.New, secret)
	h.Write(payload)
	h.Write(suffix)
	var sum [sha256.Size]byte
	sig := encode(h.Sum(sum[:0]))

	if cap(suffix) <= maxPooled {
		*bp = suffix[:0]
		scratch.Put(bp)
	}
	return sig
}

// Signer makes v3 signatures with one secret, reusing its HMAC state from
// call to call: hmac.New derives the inner and outer pads from the key and
// allocates two hash states each time, which on the gateway's request path
// was most of the cost of a signature. Keep one Signer per secret (the
// gateway keeps one per service of a config); it is safe for concurrent use.
type Signer struct {
	secret []byte
	macs   sync.Pool // of *signerState
}

type signerState struct {
	mac hash.Hash
	buf []byte // the timestamp + context suffix, then the MAC
}

// NewSigner returns a Signer for secret (not copied: do not change it).
func NewSigner(secret []byte) *Signer {
	s := &Signer{secret: secret}
	s.macs.New = func() any {
		return &signerState{mac: hmac.New(sha256.New, secret), buf: make([]byte, 0, 256)}
	}
	return s
}

// SignV3At is SignV3 with the timestamp of t: it returns the signature and
// the timestamp, both sharing one allocated string (the only allocation).
func (s *Signer) SignV3At(payload []byte, t time.Time, uc UserContext) (signature, timestamp string) {
	st := s.macs.Get().(*signerState)
	// The string is "<signature><timestamp>": the signature's 44 Base64
	// characters, then the decimal seconds; the canonical suffix is built
	// in the same buffer past them.
	const sigLen = 44 // base64.StdEncoding.EncodedLen(sha256.Size)
	b := append(st.buf[:0], make([]byte, sigLen)...)
	b = strconv.AppendInt(b, t.Unix(), 10)
	tsEnd := len(b)
	b = AppendContext(b, uc)
	st.mac.Reset()
	st.mac.Write(payload)
	st.mac.Write(b[sigLen:])
	b = st.mac.Sum(b)
	base64.StdEncoding.Encode(b[:sigLen], b[len(b)-sha256.Size:])
	out := string(b[:tsEnd])
	if cap(b) <= maxPooled {
		st.buf = b[:0]
		s.macs.Put(st)
	}
	return out[:sigLen], out[sigLen:]
}

// SignV3 is the package's SignV3 with this Signer's secret.
func (s *Signer) SignV3(payload []byte, timestamp string, uc UserContext) string {
	st := s.macs.Get().(*signerState)
	b := append(st.buf[:0], timestamp...)
	b = AppendContext(b, uc)
	st.mac.Reset()
	st.mac.Write(payload)
	st.mac.Write(b)
	sig := encode(st.mac.Sum(b)[len(b):])
	if cap(b) <= maxPooled {
		st.buf = b[:0]
		s.macs.Put(st)
	}
	return sig
}

// Verify reports whether signature, a standard padded Base64 string, is the
// HMAC-SHA256 of the concatenated parts under any one of secrets. Several
// secrets exist during a rotation: a backend may still sign with the old one
// while the catalog already lists the new one.
//
// The MAC is compared with hmac.Equal (constant time) and every secret is
// tried even after a match, so the response time says neither how much of a
// forged signature was right nor which secret matched. Empty secrets are
// skipped: an unset secret must not turn into a key anyone can sign with.
// A signature that is not exactly 32 bytes of canonical Base64 is false.
func Verify(secrets [][]byte, signature string, parts ...[]byte) bool {
	// 32 bytes always encode to 44 characters; checking first keeps junk of
	// any size from costing a decode, and length is not secret.
	if len(signature) != base64.StdEncoding.EncodedLen(sha256.Size) {
		return false
	}
	var want [sha256.Size + 1]byte
	n, err := base64.StdEncoding.Strict().Decode(want[:], []byte(signature))
	if err != nil || n != sha256.Size {
		return false
	}
	ok := false
	var sum [sha256.Size]byte
	for _, secret := range secrets {
		if len(secret) == 0 {
			continue
		}
		if hmac.Equal(mac(sum[:0], secret, parts), want[:sha256.Size]) {
			ok = true
		}
	}
	return ok
}

// mac appends HMAC-SHA256(secret, parts…) to dst.
func mac(dst, secret []byte, parts [][]byte) []byte {
	h := hmac.New(sha256.New, secret)
	for _, p := range parts {
		h.Write(p)
	}
	return h.Sum(dst)
}

// Timestamp renders t as Unix epoch seconds in decimal, the form of the
// Timestamp header and of the timestamp inside every canonical string.
func Timestamp(t time.Time) string {
	return strconv.FormatInt(t.Unix(), 10)
}

// ErrTimestamp is wrapped by every ParseTimestamp error, so a caller maps
// all of them to one answer with errors.Is and never echoes the raw value.
var ErrTimestamp = errors.New("invalid timestamp")

// millisDigits is where seconds end and milliseconds begin: epoch seconds
// have 10 digits until the year 2286 and epoch milliseconds have had 13
// since 2001, so a 13+ digit value is unambiguously milliseconds for any
// clock this gateway will meet. Some backend SDKs send Date.now() as is.
const millisDigits = 13

// ParseTimestamp parses a Timestamp header value: ASCII digits only (no sign,
// no spaces, no fraction), read as epoch seconds, or as epoch milliseconds
// when it has 13 or more digits. Anything else, including a value that
// overflows int64, is an error wrapping ErrTimestamp.
func ParseTimestamp(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, fmt.Errorf("%w: empty", ErrTimestamp)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return time.Time{}, fmt.Errorf("%w: not a decimal epoch number", ErrTimestamp)
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		// Only a range error is possible after the digit check.
		return time.Time{}, fmt.Errorf("%w: out of range", ErrTimestamp)
	}
	if len(s) >= millisDigits {
		return time.UnixMilli(n), nil
	}
	return time.Unix(n, 0), nil
}

// Within reports whether ts lies in [from-skew, to+skew], the window a
// signed timestamp must fall in. A report uses from = to = now; a job's
// progress and completion use from = job creation, to = now, because
// backends reuse the timestamp handed to them in the callback URL.
//
// from is truncated to the whole second first: wire timestamps have
// second resolution, so a job created at 12:00:00.7 hands out "12:00:00",
// which must not fall before the job's own creation. A negative skew counts
// as zero; an allowance cannot sensibly shrink the window.
func Within(ts, from, to time.Time, skew time.Duration) bool {
	if skew < 0 {
		skew = 0
	}
	lo := from.Truncate(time.Second).Add(-skew)
	hi := to.Add(skew)
	return !ts.Before(lo) && !ts.After(hi)
}

// AsyncCanonical returns the v3 payload signed for an async invoke:
//
//	{"payload":"<payload>","request_id":"<id>"}
//
// with the keys in that order, no whitespace, and both strings escaped as
// JavaScript's JSON.stringify escapes them, because backend SDKs rebuild
// this object with JSON.stringify (or a port of it) from the forwarded body
// and compare signatures over the result. Invalid UTF-8 in payload is
// replaced as described at AppendJSString; the forwarded body must carry the
// same replaced string (write it with AppendJSString) for the backend to
// reproduce these bytes.
func AsyncCanonical(payload, requestID string) []byte {
	const (
		head = `{"payload":`
		mid  = `,"request_id":`
	)
	// A JSON body escapes two quotes per key and string value; an eighth
	// of slack covers typical payloads so the common path allocates once.
	n := len(head) + len(payload) + len(payload)/8 + len(mid) + len(requestID) + 8
	dst := make([]byte, 0, n)
	dst = append(dst, head...)
	dst = AppendJSString(dst, payload)
	dst = append(dst, mid...)
	dst = AppendJSString(dst, requestID)
	return append(dst, '}')
}
