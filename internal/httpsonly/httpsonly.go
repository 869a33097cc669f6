// Package httpsonly is the one rule the operator console and the caller
// portal share for plain HTTP: a page that takes a password, a key or a
// session cookie is served over plain HTTP to loopback clients only (the
// demo on 127.0.0.1), never to a client across the network, where the
// secret would travel in the clear.
package httpsonly

import (
	"net"
	"net/http"
)

// PlainFromAfar reports whether r came over plain HTTP from a client that
// is not on loopback: such a request must be refused before any secret
// it carries is checked, so the answer says nothing about the secret.
// The peer address is used, not X-Forwarded-For: a header the client
// writes cannot make it local. Behind a proxy that terminates TLS the
// handlers' allow_plain_http option skips this rule.
func PlainFromAfar(r *http.Request) bool {
	return r.TLS == nil && !Loopback(r)
}

// SecureCookie reports whether a cookie set in answer to r must be
// Secure: always, except over plain HTTP from a loopback client (local
// development, where a browser would not send a Secure cookie back over
// http://). r.TLS alone is not the rule: behind a proxy that terminates
// TLS every request is plain HTTP to the gateway, and the session and
// CSRF cookies would lose Secure exactly where the browser is across the
// network. The peer address is used, as in PlainFromAfar.
func SecureCookie(r *http.Request) bool {
	return r.TLS != nil || !Loopback(r)
}

// Loopback reports whether r's peer is on loopback (127.0.0.0/8 or ::1).
func Loopback(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
