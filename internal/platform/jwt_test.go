package platform

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/golang-jwt/jwt/v5"
)

// TestJWTLeewayAsConfigured: the leeway is what the jwt block sets, 0
// included, through the Caddyfile and through the JSON it adapts to; the
// default applies only when none is set. `leeway 0` gave 30 s (a zero
// duration was read as "unset"), so a token 10 s past its exp verified on
// a gateway configured to allow no skew at all. A JSON config may not set
// a leeway the Caddyfile refuses.
func TestJWTLeewayAsConfigured(t *testing.T) {
	const secret = "0123456789abcdef0123456789abcdef"
	now := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	token := func(expAgo time.Duration) string {
		s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "user-1",
			"exp": now.Add(-expAgo).Unix()}).SignedString([]byte(secret))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for _, tc := range []struct {
		leeway   string // the block's line, "" for none
		accepted []time.Duration
		refused  []time.Duration
	}{
		{"", []time.Duration{-time.Minute, 10 * time.Second, 29 * time.Second}, []time.Duration{31 * time.Second}},
		{"leeway 0", []time.Duration{-time.Minute}, []time.Duration{time.Second, 10 * time.Second}},
		{"leeway 0s", []time.Duration{-time.Minute}, []time.Duration{10 * time.Second}},
		{"leeway 2m", []time.Duration{time.Minute}, []time.Duration{3 * time.Minute}},
	} {
		var a App
		if err := a.UnmarshalCaddyfile(caddyfile.NewTestDispenser("platform {\n\tjwt {\n\t\ths256_secret " + secret +
			"\n\t\t" + tc.leeway + "\n\t}\n}")); err != nil {
			t.Fatalf("%q: %v", tc.leeway, err)
		}
		// As Caddy runs it: the adapted JSON, read back.
		raw, err := json.Marshal(a.JWT)
		if err != nil {
			t.Fatal(err)
		}
		var c JWTConfig
		if err := json.Unmarshal(raw, &c); err != nil {
			t.Fatal(err)
		}
		v, err := c.verifier(caddy.NewReplacer(), func() time.Time { return now })
		if err != nil {
			t.Fatalf("%q (%s): %v", tc.leeway, raw, err)
		}
		for _, ago := range tc.accepted {
			if _, err := v.UserID(token(ago)); err != nil {
				t.Errorf("%q (%s): a token %s past its exp refused: %v", tc.leeway, raw, ago, err)
			}
		}
		for _, ago := range tc.refused {
			if _, err := v.UserID(token(ago)); err == nil {
				t.Errorf("%q (%s): a token %s past its exp accepted", tc.leeway, raw, ago)
			}
		}
	}
	for _, bad := range []string{`{"hs256_secret":"` + secret + `","leeway":3600000000000}`, `{"hs256_secret":"` + secret + `","leeway":-1}`} {
		var c JWTConfig
		if err := json.Unmarshal([]byte(bad), &c); err != nil {
			t.Fatal(err)
		}
		if _, err := c.verifier(caddy.NewReplacer(), time.Now); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}
