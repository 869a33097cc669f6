package platformgw

import (
	"net/http"
	"strings"
	"testing"
)

func TestSyncResultJSON(t *testing.T) {
	got := string(syncResult{
		requestID: "7d0c5b0e-3f1a-4c8e-9a61-2b7f4d9e0c15", contentType: "text/html; charset=utf-8",
		result: "<p>\"a\" & é\u2028\x00</p>", size: 25, completedAt: "2026-05-01T10:00:00.123Z",
	}.appendJSON(nil))
	want := `{"requestId":"7d0c5b0e-3f1a-4c8e-9a61-2b7f4d9e0c15","status":"COMPLETED","result":"<p>\"a\" & é` + "\u2028" +
		`\u0000</p>","contentType":"text/html; charset=utf-8","resultUrl":null,"size":25,"completedAt":"2026-05-01T10:00:00.123Z"}`
	if got != want {
		t.Errorf("\n got %s\nwant %s", got, want)
	}
}

func TestSnippet(t *testing.T) {
	long := strings.Repeat("a", serviceErrorSnippet-1) + "é" // é straddles the cut
	for in, want := range map[string]string{
		"":                 "",
		"  \n":             "",
		" not found \n":    ": not found",
		"bad \xff byte":    ": bad \uFFFD byte",
		long:               ": " + strings.Repeat("a", serviceErrorSnippet-1),
		long + "tail text": ": " + strings.Repeat("a", serviceErrorSnippet-1),
	} {
		if got := snippet([]byte(in)); got != want {
			t.Errorf("snippet(%.20q) = %.30q, want %.30q", in, got, want)
		}
	}
}

func TestAcceptsEventStream(t *testing.T) {
	for accept, want := range map[string]bool{
		"text/event-stream":                       true,
		"application/json, Text/Event-Stream;q=1": true,
		"application/json":                        false,
		"":                                        false,
	} {
		h := http.Header{}
		if accept != "" {
			h.Set("Accept", accept)
		}
		if got := acceptsEventStream(h); got != want {
			t.Errorf("Accept %q: %v", accept, got)
		}
	}
}
