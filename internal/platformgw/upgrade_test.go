package platformgw

import (
	"net/http"
	"testing"
)

func TestIgnoreH2COffer(t *testing.T) {
	cases := []struct {
		name                string
		in                  http.Header
		upgrade, conn, sets string
	}{
		{"Java's HttpClient", http.Header{"Connection": {"Upgrade, HTTP2-Settings"}, "Upgrade": {"h2c"}, "Http2-Settings": {"AAEAAEAA"}}, "", "", ""},
		{"h2c alone", http.Header{"Upgrade": {"H2C"}}, "", "", ""},
		{"other Connection options stay", http.Header{"Connection": {"keep-alive, upgrade", "http2-settings"}, "Upgrade": {"h2c"}, "Http2-Settings": {"x"}}, "", "keep-alive", ""},
		{"websocket stays", http.Header{"Connection": {"Upgrade, HTTP2-Settings"}, "Upgrade": {"h2c, websocket"}, "Http2-Settings": {"x"}}, "websocket", "Upgrade", ""},
		{"websocket alone is untouched", http.Header{"Connection": {"Upgrade"}, "Upgrade": {"websocket"}}, "websocket", "Upgrade", ""},
		{"no offer is untouched", http.Header{"Connection": {"HTTP2-Settings"}, "Http2-Settings": {"x"}}, "", "HTTP2-Settings", "x"},
		{"h2c as a substring is not h2c", http.Header{"Upgrade": {"h2cx"}}, "h2cx", "", ""},
	}
	for _, tc := range cases {
		ignoreH2COffer(tc.in)
		if got := tc.in.Get("Upgrade"); got != tc.upgrade {
			t.Errorf("%s: Upgrade %q, want %q", tc.name, got, tc.upgrade)
		}
		if got := tc.in.Get("Connection"); got != tc.conn {
			t.Errorf("%s: Connection %q, want %q", tc.name, got, tc.conn)
		}
		if got := tc.in.Get("HTTP2-Settings"); got != tc.sets {
			t.Errorf("%s: HTTP2-Settings %q, want %q", tc.name, got, tc.sets)
		}
	}
}
