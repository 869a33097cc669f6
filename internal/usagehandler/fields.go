package usagehandler

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/signing"
	"github.com/platformgw/gateway/internal/wire"
)

// fields is a JSON object body, read field by field so that a wrong type
// is refused with the field's name while unknown fields are allowed (SDKs
// add their own). null counts as absent. A field given twice is refused:
// encoding/json keeps the last value, where a proxy, a log or the sender's
// own records may read the first. So is a name that differs from a field
// read only in case (get).
type fields map[string]json.RawMessage

// get returns the raw value of the field name; ok is false when it is
// absent. A name of the body that differs from name only in case, as
// encoding/json folds names (Unicode simple folding: "Units", "UNITS",
// "ſtatus"), is refused, naming the field: a serialiser that writes
// PascalCase sent {"Status":"FAILED","Units":7}, which read exactly was
// a job COMPLETED with nothing charged, and {"unitsUsed":1,"UnitsUsed":
// 1000} is 1 read exactly but 1000 to encoding/json, which matches names
// in any case and keeps the last. Such a name is never an SDK's own
// field, so unknown fields stay allowed.
func (f fields) get(name string) (json.RawMessage, bool, *apierror.Error) {
	for k := range f {
		// Folding keeps a name within three times its length (the
		// Kelvin sign is three bytes for "k"), and never shorter; an
		// ASCII first letter must be the name's in either case. So a
		// body of many names (usage_max_body_bytes of them) costs a
		// byte compare each, not a fold.
		if len(k) < len(name) || len(k) > 3*len(name) || k[0] < utf8.RuneSelf && k[0]|0x20 != name[0]|0x20 {
			continue
		}
		if k != name && strings.EqualFold(k, name) {
			return nil, true, apierror.Invalid(name, strconv.Quote(k)+" is not a field: field names are case-sensitive; send "+name)
		}
	}
	raw, ok := f[name]
	return raw, ok, nil
}

func parseObject(body []byte) (fields, *apierror.Error) {
	var f fields
	if err := json.Unmarshal(body, &f); err != nil || f == nil {
		return nil, apierror.Invalid("body", "the body must be a JSON object")
	}
	if name, dup := repeatedName(body); dup {
		if name == "" || len(name) > 64 || strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 || r == 0x7f || r == utf8.RuneError }) {
			// Not a name of the contract: not repeated into the answer
			// or the log.
			return nil, apierror.Invalid("body", "a field is given twice; give each field once")
		}
		return nil, apierror.Invalid(name, name+" is given twice; give each field once")
	}
	for k, v := range f {
		if bytes.Equal(v, []byte("null")) {
			delete(f, k)
		}
	}
	return f, nil
}

// repeatedName is the first name the object body (valid JSON, as
// json.Unmarshal found it) gives twice, and true; false when it gives
// none twice. Names are compared as decoded, so "a" and "\u0061" are the
// same field.
//
// Every report, progress and completion asks, so the usual body (a few
// names, none escaped) is answered from its bytes without allocating;
// a name with an escape, or many names, go through the JSON decoder.
func repeatedName(body []byte) (string, bool) {
	var names [16][]byte
	n, depth, key := 0, 0, false
	for i := 0; i < len(body); i++ {
		switch c := body[i]; c {
		case '{', '[':
			depth++
			key = depth == 1 && c == '{'
		case '}', ']':
			depth--
		case ',':
			key = depth == 1
		case '"':
			start := i + 1
			for i++; i < len(body) && body[i] != '"'; i++ {
				if body[i] == '\\' {
					if key {
						return repeatedNameDecoded(body)
					}
					i++
				}
			}
			if !key {
				continue
			}
			key = false
			name := body[start:min(i, len(body))]
			for _, seen := range names[:n] {
				if bytes.Equal(seen, name) {
					return string(name), true
				}
			}
			if n == len(names) {
				return repeatedNameDecoded(body)
			}
			names[n] = name
			n++
		}
	}
	return "", false
}

// repeatedNameDecoded is repeatedName through the JSON decoder.
func repeatedNameDecoded(body []byte) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if _, err := dec.Token(); err != nil { // the opening brace
		return "", false
	}
	seen := make(map[string]struct{}, 8)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return "", false
		}
		name, _ := tok.(string)
		if _, dup := seen[name]; dup {
			return name, true
		}
		seen[name] = struct{}{}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return "", false
		}
	}
	return "", false
}

// str reads a string field; ok is false when it is absent.
func (f fields) str(name string) (s string, ok bool, e *apierror.Error) {
	raw, ok, e := f.get(name)
	if e != nil || !ok {
		return "", ok, e
	}
	if raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return "", true, apierror.Invalid(name, name+" must be a string")
	}
	return s, true, nil
}

// serviceID reads a required service id: a non-empty string of printable
// characters. It is only ever looked up in the catalog (whose ids are
// catalog.ValidID), where one it does not have is refused as unknown
// (401 invalid_signature: no secret of it can have signed), so this only
// keeps bytes that are not text out of messages and logs.
func (f fields) serviceID(name string) (string, *apierror.Error) {
	s, ok, e := f.str(name)
	if e != nil {
		return "", e
	}
	if !ok || s == "" {
		return "", apierror.Invalid(name, name+" is required")
	}
	// U+FFFD is what encoding/json makes of bytes that are not UTF-8 (or of
	// a lone surrogate escape): "u\xff" and "u\xfe" were both recorded for
	// the user "u\uFFFD", so such an id is refused, as the admin API does.
	if len(s) > 256 || strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f || r == utf8.RuneError }) {
		return "", apierror.Invalid(name, name+" must be at most 256 printable characters")
	}
	return s, nil
}

// userID reads a required user id: wire.ValidUserID, the rule the admin
// API holds every user id to, so a report or estimate cannot name a user
// no key or subscription can belong to.
func (f fields) userID(name string) (string, *apierror.Error) {
	s, ok, e := f.str(name)
	if e != nil {
		return "", e
	}
	if !ok || s == "" {
		return "", apierror.Invalid(name, name+" is required")
	}
	if !wire.ValidUserID(s) {
		return "", apierror.Invalid(name, name+" must be "+wire.UserIDRule)
	}
	return s, nil
}

// maxRequestIDLen is the longest requestId of a report, in bytes: as long
// as an Idempotency-Key, which a backend may derive from it.
const maxRequestIDLen = 255

// requestID reads the optional requestId of a report: the id of the call
// or job the usage belongs to, kept in the ledger entry and shown in the
// usage exports, the admin API and the console. It is a string of at
// most 255 bytes of printable text (UTF-8, no control or format
// characters, no U+FFFD, which is what a JSON decoder makes of bytes that
// are not text); "" counts as absent, as null does. Anything else is
// refused rather than dropped: a report charged without the id its
// backend sent could never be matched to its call, and the backend would
// not know.
func (f fields) requestID(name string) (string, *apierror.Error) {
	s, ok, e := f.str(name)
	if e != nil || !ok || s == "" {
		return "", e
	}
	if len(s) > maxRequestIDLen || !printableText(s) {
		return "", apierror.Invalid(name, name+" must be at most 255 bytes of printable text")
	}
	return s, nil
}

// printableText reports whether s is UTF-8 of printable characters
// (unicode.IsPrint: letters, marks, numbers, punctuation, symbols and
// the ASCII space) without U+FFFD.
func printableText(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, c := range s {
		if c == utf8.RuneError || !unicode.IsPrint(c) {
			return false
		}
	}
	return true
}

// units reads a non-negative exact decimal: a JSON number, or a string
// holding one (some SDKs serialise decimals as strings).
func (f fields) units(name string) (u billing.Units, ok bool, e *apierror.Error) {
	raw, ok, e := f.get(name)
	if e != nil || !ok {
		return 0, ok, e
	}
	c := raw[0]
	if c != '"' && c != '-' && (c < '0' || c > '9') {
		return 0, true, apierror.Invalid(name, name+" must be a number")
	}
	if err := u.UnmarshalJSON(raw); err != nil {
		return 0, true, apierror.Invalid(name, name+" must be a non-negative decimal with at most 6 decimal places")
	}
	return u, true, nil
}

// number reads a JSON number field.
func (f fields) number(name string) (v float64, ok bool, e *apierror.Error) {
	raw, ok, e := f.get(name)
	if e != nil || !ok {
		return 0, ok, e
	}
	c := raw[0]
	if c != '-' && (c < '0' || c > '9') || json.Unmarshal(raw, &v) != nil {
		return 0, true, apierror.Invalid(name, name+" must be a number")
	}
	return v, true, nil
}

// timestamp reads the required body timestamp: an ISO-8601 string, or
// epoch seconds or milliseconds as a number (or a string of digits). It
// may not lie further in the future than the clock skew allowance, nor
// before 1970.
func (f fields) timestamp(now time.Time, skew time.Duration) (time.Time, *apierror.Error) {
	raw, ok, e := f.get("timestamp")
	if e != nil {
		return time.Time{}, e
	}
	if !ok {
		return time.Time{}, apierror.Invalid("timestamp", "timestamp is required")
	}
	var t time.Time
	var err error
	if raw[0] == '"' {
		var s string
		if err = json.Unmarshal(raw, &s); err == nil {
			t, err = parseTime(s)
		}
	} else {
		t, err = parseEpoch(string(raw))
	}
	if err != nil {
		return time.Time{}, apierror.Invalid("timestamp", "timestamp must be an ISO-8601 date-time or epoch seconds or milliseconds")
	}
	if t.After(now.Add(skew)) {
		return time.Time{}, apierror.Invalid("timestamp", "timestamp is in the future")
	}
	// Epoch numbers cannot go before 1970, and an ISO date-time before it
	// is no usage time: "0000-01-01T00:00:00+01:00" was kept as year -1,
	// which no JSON time can write (the user's usage export failed with
	// 500 from then on), and "0001-01-01T00:00:00Z" as no time at all.
	if t.Before(time.Unix(0, 0)) {
		return time.Time{}, apierror.Invalid("timestamp", "timestamp must not be before 1970-01-01T00:00:00Z")
	}
	return t.UTC(), nil
}

// isoLayouts are the ISO-8601 forms SDKs send: RFC 3339 (JavaScript's
// toISOString, Java's Instant), a numeric offset without colon, and
// zone-less local date-times (Java's LocalDateTime, Python's isoformat),
// read as UTC. Fractional seconds are accepted after the seconds by
// time.Parse itself.
var isoLayouts = []string{
	time.RFC3339,
	"2006-01-02T15:04:05Z0700",
	"2006-01-02T15:04:05",
	"2006-01-02T15:04Z07:00",
	"2006-01-02T15:04",
	"2006-01-02 15:04:05Z07:00",
	"2006-01-02 15:04:05",
}

func parseTime(s string) (time.Time, error) {
	if s != "" && s[0] >= '0' && s[0] <= '9' && !strings.ContainsAny(s, "-:T") {
		return parseEpoch(s)
	}
	var err error
	for _, layout := range isoLayouts {
		var t time.Time
		if t, err = time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, err
}

// parseEpoch reads epoch seconds (a fraction allowed, as Python's
// time.time() gives) or milliseconds (13 digits or more, as JavaScript's
// Date.now() gives).
func parseEpoch(s string) (time.Time, error) {
	whole, frac, hasFrac := strings.Cut(s, ".")
	t, err := signing.ParseTimestamp(whole)
	if err != nil {
		return time.Time{}, err
	}
	if !hasFrac {
		return t, nil
	}
	if frac == "" || len(frac) > 9 || strings.Trim(frac, "0123456789") != "" {
		return time.Time{}, signing.ErrTimestamp
	}
	n, _ := strconv.Atoi((frac + "000000000")[:9]) // nanoseconds of one unit
	unit := time.Second
	if len(whole) >= 13 {
		unit = time.Millisecond
	}
	return t.Add(time.Duration(n) * unit / time.Second), nil
}

// storable is a backend's text as a job keeps it: U+0000 (JSON's
// "\u0000") becomes U+FFFD, as bytes that are not UTF-8 already do.
// PostgreSQL cannot hold U+0000 in a jsonb record, so a stage, error text,
// result or content type (in a quoted parameter) with one was refused there with a store error (the progress
// lost, the completion never taken nor charged) while the store file kept
// it: both stores now keep the same text.
func storable(s string) string {
	return strings.ReplaceAll(s, "\x00", "\uFFFD")
}

// cut returns s cut to at most max bytes at a UTF-8 boundary, and whether
// it was cut.
func cut(s string, max int) (string, bool) {
	if len(s) <= max {
		return s, false
	}
	i := max
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i], true
}
