package platformgw

import (
	"bytes"
	"encoding/json"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/platformgw/gateway/internal/signing"
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
		// The envelope is the canonical string's bytes around the same
		// escapes, and its URLs carry that query.
		var env envelope
		canon := env.start(id, status, jobURLs{progress: callback, callback: callback})
		if want := signing.AsyncCanonical(status, id); string(canon) != string(want) {
			t.Fatalf("canonical %q, signing.AsyncCanonical %q", canon, want)
		}
		var got struct {
			RequestID   string `json:"request_id"`
			ProgressURL string `json:"progress_url"`
		}
		body := env.finish(jobURLs{progress: callback, callback: callback}, sig, ts)
		escaped := canon[len(`{"payload":`):bytes.LastIndex(canon, []byte(`,"request_id":`))]
		if !strings.Contains(string(body), `,"payload":`+string(escaped)+`,"progress_url":`) {
			t.Fatalf("payload escaped differently from the canonical string:\n%s\n%s", body, canon)
		}
		if err := json.Unmarshal(body, &got); err != nil {
			t.Fatalf("envelope is not JSON: %v\n%s", err, body)
		}
		if utf8.ValidString(callback) && got.ProgressURL != callback+wantQ {
			t.Fatalf("progress URL %q, want %q", got.ProgressURL, callback+wantQ)
		}
		if got := string(appendSignedQuery(nil, sig, ts)); got != wantQ {
			t.Fatalf("query %q, url.Values: %q", got, wantQ)
		}
	})
}
