package usagehandler

import (
	"strings"
	"testing"
)

// TestRepeatedNameReadsBytesAsTheDecoder: repeatedName's reading of the
// body's bytes finds what the JSON decoder finds, for bodies with values
// that hold quotes, escapes, braces and objects, escaped names, and more
// names than it keeps.
func TestRepeatedNameReadsBytesAsTheDecoder(t *testing.T) {
	many := make([]string, 40)
	for i := range many {
		many[i] = `"f` + strings.Repeat("x", i) + `":1`
	}
	for _, body := range []string{
		`{}`,
		`{"a":1}`,
		`{"a":1,"a":2}`,
		`{"a":1,"b":{"a":2,"a":3}}`,
		`{"a":"x\",\"a\":1","b":2}`,
		`{"a":[{"b":1},{"b":2}],"b":3}`,
		`{"a":[{"b":1},{"b":2}],"c":3}`,
		`{"a":"\\","a":1}`,
		`{"unitsUsed":1,"units\u0055sed":1000}`,
		`{"\u0061":1,"b":2}`,
		`{"":1,"":2}`,
		`{ "a" : 1 , "b" : "}" , "a" : 2 }`,
		`{"result":{"x":{"y":"{\"z\":1}"}},"status":"COMPLETED","status":"FAILED"}`,
		"{" + strings.Join(many, ",") + "}",
		"{" + strings.Join(many, ",") + `,"fxx":2}`,
	} {
		gotName, got := repeatedName([]byte(body))
		wantName, want := repeatedNameDecoded([]byte(body))
		if got != want || gotName != wantName {
			t.Errorf("%s: repeatedName %q %v, the decoder %q %v", body, gotName, got, wantName, want)
		}
	}
}

// TestRepeatedNameAllocatesNothing: the usual report body is checked
// without an allocation.
func TestRepeatedNameAllocatesNothing(t *testing.T) {
	body := []byte(`{"userId":"u-1","serviceId":"svc","unitsUsed":12,"timestamp":"2026-11-27T10:00:00Z","metadata":{"model":"m"}}`)
	if n := testing.AllocsPerRun(100, func() { repeatedName(body) }); n != 0 {
		t.Errorf("repeatedName allocates %.0f times on a report body", n)
	}
}

func BenchmarkRepeatedName(b *testing.B) {
	body := []byte(`{"userId":"u-1","serviceId":"svc","unitsUsed":12,"timestamp":"2026-11-27T10:00:00Z","metadata":{"model":"m"}}`)
	b.Run("bytes", func(b *testing.B) {
		for b.Loop() {
			repeatedName(body)
		}
	})
	b.Run("decoder", func(b *testing.B) {
		for b.Loop() {
			repeatedNameDecoded(body)
		}
	})
}
