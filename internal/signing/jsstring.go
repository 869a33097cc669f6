package signing

import "unicode/utf8"

// AppendJSString appends s to dst as a JSON string literal, quotes included,
// escaped byte for byte as JavaScript's JSON.stringify escapes it (ECMA-262
// QuoteJSONString), because backends recompute async signatures with
// JSON.stringify and any difference breaks verification:
//
//   - `"` and `\` become \" and \\;
//   - U+0008, U+0009, U+000A, U+000C, U+000D become \b \t \n \f \r;
//   - every other code point below U+0020 becomes \u00xx, lower-case hex;
//   - everything else, including <, >, &, DEL, U+2028, U+2029 and all
//     non-ASCII, is written as raw UTF-8. (encoding/json escapes the first
//     five of those, which is why it cannot be used here.)
//
// Invalid UTF-8 cannot reach JSON.stringify as such: a JavaScript backend
// decodes the body bytes first, and Node's decoder, following the WHATWG
// Encoding Standard, turns each maximal subpart of an ill-formed sequence
// into one U+FFFD. This function does the same, so "\xE2\x82" (a truncated
// three-byte sequence) yields one U+FFFD where utf8.DecodeRuneInString would
// report two errors, and "\xED\xA0\x80" (an encoded surrogate) yields three.
// JSON.stringify's \udXXX escapes for lone surrogates therefore never
// arise: a Go string cannot hold a surrogate as valid UTF-8.
func AppendJSString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0 // s[start:i] is pending raw output
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			dst = appendEscape(dst, c)
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r != utf8.RuneError || size != 1 {
			// Valid multi-byte sequence (possibly a literal U+FFFD): raw.
			i += size
			continue
		}
		dst = append(dst, s[start:i]...)
		dst = append(dst, "\uFFFD"...)
		i += invalidLen(s[i:])
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

const lowerHex = "0123456789abcdef"

// appendEscape writes the JSON.stringify escape of an ASCII byte that needs
// one.
func appendEscape(dst []byte, c byte) []byte {
	switch c {
	case '"':
		return append(dst, '\\', '"')
	case '\\':
		return append(dst, '\\', '\\')
	case '\b':
		return append(dst, '\\', 'b')
	case '\t':
		return append(dst, '\\', 't')
	case '\n':
		return append(dst, '\\', 'n')
	case '\f':
		return append(dst, '\\', 'f')
	case '\r':
		return append(dst, '\\', 'r')
	}
	return append(dst, '\\', 'u', '0', '0', lowerHex[c>>4], lowerHex[c&0xF])
}

// invalidLen returns the length of the maximal subpart of an ill-formed
// UTF-8 sequence at the start of s (Unicode §3.9, "U+FFFD Substitution of
// Maximal Subparts", which the WHATWG decoder implements): a lead byte
// followed by as many continuation bytes as could still begin a valid
// sequence. The caller has established that s does not start with a valid
// sequence, so the result is always shorter than a full sequence.
//
// The byte ranges are those of the Unicode well-formed table, which also
// rule out overlong forms (E0 80–9F, F0 80–8F), surrogates (ED A0–BF) and
// code points above U+10FFFF (F4 90–BF).
func invalidLen(s string) int {
	lo, hi := byte(0x80), byte(0xBF)
	var need int
	switch b := s[0]; {
	case b >= 0xC2 && b <= 0xDF:
		need = 1
	case b >= 0xE0 && b <= 0xEF:
		need = 2
		if b == 0xE0 {
			lo = 0xA0
		} else if b == 0xED {
			hi = 0x9F
		}
	case b >= 0xF0 && b <= 0xF4:
		need = 3
		if b == 0xF0 {
			lo = 0x90
		} else if b == 0xF4 {
			hi = 0x8F
		}
	default:
		// A continuation byte, C0, C1 or F5–FF: never part of a valid
		// sequence, one replacement each.
		return 1
	}
	n := 1
	for n <= need && n < len(s) && s[n] >= lo && s[n] <= hi {
		lo, hi = 0x80, 0xBF // only the first continuation byte is narrowed
		n++
	}
	return n
}
