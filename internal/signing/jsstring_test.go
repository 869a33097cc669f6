package signing

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

func mustHex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestAppendJSString(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"empty", "", `""`},
		{"plain ASCII", "hello world", `"hello world"`},
		{"quote and backslash", `say "hi" \o/`, `"say \"hi\" \\o/"`},
		{"short escapes", "\b\t\n\f\r", `"\b\t\n\f\r"`},
		{"other controls as lower-case \\u00xx", "\x00\x01\x0b\x0e\x1a\x1f", `"\u0000\u0001\u000b\u000e\u001a\u001f"`},
		{"HTML characters stay raw", "<script>&amp;</script>", `"<script>&amp;</script>"`},
		{"slash stays raw", "a/b", `"a/b"`},
		{"DEL stays raw", "\x7f", "\"\x7f\""},
		{"line and paragraph separators stay raw", "\u2028\u2029", "\"\u2028\u2029\""},
		{"non-ASCII stays raw", "é日本😀", `"é日本😀"`},
		{"C1 controls stay raw", "\u0080\u009f", "\"\u0080\u009f\""},
		{"BOM and noncharacters stay raw", "\ufeff\uffff\U0010ffff", "\"\ufeff\uffff\U0010ffff\""},
		{"literal U+FFFD stays one", "\ufffd", "\"\ufffd\""},
		{"escape at both ends", "\nmiddle\n", `"\nmiddle\n"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := AppendJSString([]byte("prefix"), tt.in)
			if string(got) != "prefix"+tt.want {
				t.Errorf("AppendJSString(%q) = %q, want %q", tt.in, got[len("prefix"):], tt.want)
			}
		})
	}
}

// TestAppendJSStringInvalidUTF8 pins the replacement of ill-formed UTF-8 to
// what Node does. Each want is the hex of
// Buffer.from(JSON.stringify(Buffer.from(in, 'hex').toString('utf8'))),
// printed by Node 20; TextDecoder gives the same.
func TestAppendJSStringInvalidUTF8(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"truncated 3-byte sequence inside text", "61e28262", "2261efbfbd6222"},
		{"encoded surrogate", "eda080", "22efbfbdefbfbdefbfbd22"},
		{"truncated 4-byte sequence at end", "f09f98", "22efbfbd22"},
		{"overlong 2-byte", "c0af", "22efbfbdefbfbd22"},
		{"bytes never valid", "fffe", "22efbfbdefbfbd22"},
		{"above U+10FFFF", "f4908080", "22efbfbdefbfbdefbfbdefbfbd22"},
		{"overlong 3-byte", "e08080", "22efbfbdefbfbdefbfbd22"},
		{"truncated then ASCII", "f09f41", "22efbfbd4122"},
		{"lone continuation bytes", "8080", "22efbfbdefbfbd22"},
		{"5-byte form", "f888808080", "22efbfbdefbfbdefbfbdefbfbdefbfbd22"},
		{"truncated at end", "e282", "22efbfbd22"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := AppendJSString(nil, string(mustHex(t, tt.in)))
			if want := mustHex(t, tt.want); string(got) != string(want) {
				t.Errorf("AppendJSString(%s) = %x, want %x", tt.in, got, want)
			}
		})
	}
}

func TestAppendJSStringAllocs(t *testing.T) {
	buf := make([]byte, 0, 256)
	s := "a<b>\"c\"\n日本\xff"
	allocs := testing.AllocsPerRun(100, func() {
		buf = AppendJSString(buf[:0], s)
	})
	if allocs != 0 {
		t.Errorf("AppendJSString allocated %v times with enough capacity", allocs)
	}
}

// whatwgDecode is the UTF-8 decoder of the WHATWG Encoding Standard (§ 9.1.1
// "UTF-8 decoder"), transcribed step by step as an oracle for the fuzz test.
// It is deliberately written unlike invalidLen.
func whatwgDecode(s string) []rune {
	var out []rune
	var cp rune
	needed, seen := 0, 0
	lower, upper := byte(0x80), byte(0xBF)
	for i := 0; i < len(s); {
		b := s[i]
		if needed == 0 {
			switch {
			case b <= 0x7F:
				out = append(out, rune(b))
			case b >= 0xC2 && b <= 0xDF:
				needed, cp = 1, rune(b&0x1F)
			case b >= 0xE0 && b <= 0xEF:
				if b == 0xE0 {
					lower = 0xA0
				}
				if b == 0xED {
					upper = 0x9F
				}
				needed, cp = 2, rune(b&0xF)
			case b >= 0xF0 && b <= 0xF4:
				if b == 0xF0 {
					lower = 0x90
				}
				if b == 0xF4 {
					upper = 0x8F
				}
				needed, cp = 3, rune(b&0x7)
			default:
				out = append(out, utf8.RuneError)
			}
			i++
			continue
		}
		if b < lower || b > upper {
			// Error, and the byte is processed again from the start state.
			cp, needed, seen, lower, upper = 0, 0, 0, 0x80, 0xBF
			out = append(out, utf8.RuneError)
			continue
		}
		lower, upper = 0x80, 0xBF
		cp = cp<<6 | rune(b&0x3F)
		seen++
		i++
		if seen == needed {
			out = append(out, cp)
			cp, needed, seen = 0, 0, 0
		}
	}
	if needed != 0 {
		out = append(out, utf8.RuneError)
	}
	return out
}

// quoteJSONString is ECMA-262 QuoteJSONString over code points, the oracle
// for the escaping half.
func quoteJSONString(rs []rune) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range rs {
		switch r {
		case '\b':
			b.WriteString(`\b`)
		case '\t':
			b.WriteString(`\t`)
		case '\n':
			b.WriteString(`\n`)
		case '\f':
			b.WriteString(`\f`)
		case '\r':
			b.WriteString(`\r`)
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		default:
			if r < 0x20 {
				fmt.Fprintf(&b, `\u%04x`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}

func FuzzAppendJSString(f *testing.F) {
	for _, s := range []string{
		"", "plain", `"\`, "\x00\x1f\x7f", "<>&\u2028\u2029", "é日本😀",
		"\xe2\x82", "\xed\xa0\x80", "\xf0\x9f\x98", "\xf4\x90\x80\x80", "\xc0\xaf", "\xff",
		"a\xe2\x82\xacb\xe2\x82", "\ufffd\xef\xbf",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		const prefix = "x:"
		out := AppendJSString([]byte(prefix), s)
		if !strings.HasPrefix(string(out), prefix) {
			t.Fatalf("prefix lost: %q", out)
		}
		lit := out[len(prefix):]
		if !json.Valid(lit) {
			t.Fatalf("not valid JSON: %q", lit)
		}
		var back string
		if err := json.Unmarshal(lit, &back); err != nil {
			t.Fatalf("unmarshal %q: %v", lit, err)
		}
		runes := whatwgDecode(s)
		if want := string(runes); back != want {
			t.Fatalf("decodes to %q, want %q", back, want)
		}
		if utf8.ValidString(s) && back != s {
			t.Fatalf("valid input %q changed to %q", s, back)
		}
		if want := quoteJSONString(runes); string(lit) != want {
			t.Fatalf("AppendJSString(%q) = %q, want %q", s, lit, want)
		}
	})
}
