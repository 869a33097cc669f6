package platformgw

import (
	"encoding/json"
	"net/url"
	"testing"
)

// FuzzAcceptedBody: the 202's body and the envelope's signed query are
// byte for byte json.Marshal's and url.Values' Encode for any strings
// (control characters, <>&, U+2028/2029, invalid UTF-8, reserved URL
// characters).
func FuzzAcceptedBody(f *testing.F) {
	f.Add("0123abcd", "http://gw/api/requests/0123abcd/status", "http://gw/usage/complete/0123abcd", "abc+/=", "1795467718")
	f.Add("a<b>&\u2028\xff", "\"\\\x00\x7f", "é\u2029", "a b&c=%", "x?y#z")
	f.Fuzz(func(t *testing.T, id, status, callback, sig, ts string) {
		u := jobURLs{status: status, callback: callback}
		want, _ := json.Marshal(accepted{Status: "ACCEPTED", RequestID: id, ProgressURL: status, CallbackURL: callback})
		if got := acceptedBody(id, u); string(got) != string(want) {
			t.Fatalf("by hand:\n%s\njson.Marshal:\n%s", got, want)
		}
		wantQ := "?" + url.Values{"signature": {sig}, "timestamp": {ts}}.Encode()
		if got := signedQuery(sig, ts); got != wantQ {
			t.Fatalf("query %q, url.Values: %q", got, wantQ)
		}
	})
}
