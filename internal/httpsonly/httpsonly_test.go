package httpsonly

import (
	"crypto/tls"
	"net/http/httptest"
	"testing"
)

// TestPlainFromAfar: only a plain HTTP request from a peer that is not on
// loopback is "from afar"; TLS from anywhere and plain HTTP from loopback
// are not, and a forged X-Forwarded-For changes nothing. A cookie is
// Secure except over plain HTTP from loopback (SecureCookie).
func TestPlainFromAfar(t *testing.T) {
	for addr, loopback := range map[string]bool{
		"127.0.0.1:1": true, "[::1]:2": true, "127.8.9.1:3": true,
		"192.168.1.1:4": false, "203.0.113.7:5000": false, "[2001:db8::1]:443": false,
		"10.0.0.1": false, "": false, "localhost:80": false, "[::ffff:127.0.0.1]:9": true,
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = addr
		r.Header.Set("X-Forwarded-For", "127.0.0.1")
		if got := Loopback(r); got != loopback {
			t.Errorf("Loopback(%q) = %v", addr, got)
		}
		if got := PlainFromAfar(r); got != !loopback {
			t.Errorf("PlainFromAfar(%q) over plain HTTP = %v", addr, got)
		}
		if got := SecureCookie(r); got != !loopback {
			t.Errorf("SecureCookie(%q) over plain HTTP = %v", addr, got)
		}
		r.TLS = &tls.ConnectionState{}
		if PlainFromAfar(r) {
			t.Errorf("PlainFromAfar(%q) over TLS = true", addr)
		}
		if !SecureCookie(r) {
			t.Errorf("SecureCookie(%q) over TLS = false", addr)
		}
	}
}
