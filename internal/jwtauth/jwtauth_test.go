package jwtauth

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

var (
	t0       = time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	hsSecret = []byte("0123456789abcdef0123456789abcdef")
	rsaKey   = mustRSA()
	ecKey    = mustEC()
	otherRSA = mustRSA()
)

func mustRSA() *rsa.PrivateKey {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	return k
}

func mustEC() *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	return k
}

// sign makes a token; claims default to a valid set for user-1.
func sign(t testing.TB, m jwt.SigningMethod, key any, kid string, mod func(jwt.MapClaims)) string {
	t.Helper()
	c := jwt.MapClaims{"sub": "user-1", "iss": "https://idp.example", "aud": "platform",
		"exp": t0.Add(time.Hour).Unix(), "iat": t0.Add(-time.Minute).Unix()}
	if mod != nil {
		mod(c)
	}
	tok := jwt.NewWithClaims(m, c)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func verifier(t testing.TB, o Options) *Verifier {
	t.Helper()
	o.Issuer, o.Audience, o.Now = "https://idp.example", "platform", func() time.Time { return t0 }
	if o.Leeway == 0 {
		o.Leeway = DefaultLeeway
	}
	v, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func pemOf(t testing.TB, pub crypto.PublicKey) []byte {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

func TestUserID(t *testing.T) {
	v := verifier(t, Options{HS256Secret: hsSecret, PublicKeys: []crypto.PublicKey{&rsaKey.PublicKey, &ecKey.PublicKey}})
	none := func() string {
		s, err := jwt.NewWithClaims(jwt.SigningMethodNone, jwt.MapClaims{"sub": "user-1", "iss": "https://idp.example",
			"aud": "platform", "exp": t0.Add(time.Hour).Unix()}).SignedString(jwt.UnsafeAllowNoneSignatureType)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}()
	rsaPEM := pemOf(t, &rsaKey.PublicKey)
	for _, tc := range []struct {
		name  string
		token string
		user  string // "" means refused
	}{
		{"HS256", sign(t, jwt.SigningMethodHS256, hsSecret, "", nil), "user-1"},
		{"RS256", sign(t, jwt.SigningMethodRS256, rsaKey, "", nil), "user-1"},
		{"ES256", sign(t, jwt.SigningMethodES256, ecKey, "", nil), "user-1"},
		{"expired", sign(t, jwt.SigningMethodHS256, hsSecret, "", func(c jwt.MapClaims) { c["exp"] = t0.Add(-time.Minute).Unix() }), ""},
		{"expired within the leeway", sign(t, jwt.SigningMethodHS256, hsSecret, "", func(c jwt.MapClaims) { c["exp"] = t0.Add(-10 * time.Second).Unix() }), "user-1"},
		{"no exp", sign(t, jwt.SigningMethodHS256, hsSecret, "", func(c jwt.MapClaims) { delete(c, "exp") }), ""},
		{"not yet valid", sign(t, jwt.SigningMethodHS256, hsSecret, "", func(c jwt.MapClaims) { c["nbf"] = t0.Add(time.Hour).Unix() }), ""},
		{"issued in the future", sign(t, jwt.SigningMethodHS256, hsSecret, "", func(c jwt.MapClaims) { c["iat"] = t0.Add(time.Hour).Unix() }), ""},
		{"wrong issuer", sign(t, jwt.SigningMethodHS256, hsSecret, "", func(c jwt.MapClaims) { c["iss"] = "https://evil.example" }), ""},
		{"no issuer", sign(t, jwt.SigningMethodHS256, hsSecret, "", func(c jwt.MapClaims) { delete(c, "iss") }), ""},
		{"wrong audience", sign(t, jwt.SigningMethodHS256, hsSecret, "", func(c jwt.MapClaims) { c["aud"] = "other" }), ""},
		{"audience in a list", sign(t, jwt.SigningMethodHS256, hsSecret, "", func(c jwt.MapClaims) { c["aud"] = []string{"x", "platform"} }), "user-1"},
		{"no sub", sign(t, jwt.SigningMethodHS256, hsSecret, "", func(c jwt.MapClaims) { delete(c, "sub") }), ""},
		{"sub not a string", sign(t, jwt.SigningMethodHS256, hsSecret, "", func(c jwt.MapClaims) { c["sub"] = 42 }), ""},
		{"alg none", none, ""},
		{"unknown RSA key", sign(t, jwt.SigningMethodRS256, otherRSA, "", nil), ""},
		{"wrong HMAC secret", sign(t, jwt.SigningMethodHS256, []byte("another-secret-another-secret-00"), "", nil), ""},
		{"HS256 keyed with the RSA public key", sign(t, jwt.SigningMethodHS256, rsaPEM, "", nil), ""},
		{"RS512 is not allowed", sign(t, jwt.SigningMethodRS512, rsaKey, "", nil), ""},
		{"tampered payload", func() string {
			p := strings.Split(sign(t, jwt.SigningMethodHS256, hsSecret, "", nil), ".")
			p[1] = base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"admin","iss":"https://idp.example","aud":"platform","exp":9999999999}`))
			return strings.Join(p, ".")
		}(), ""},
		{"not a JWT", "psk_abc", ""},
		{"too long", strings.Repeat("a", MaxTokenBytes+1), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			user, err := v.UserID(tc.token)
			if tc.user != "" {
				if err != nil || user != tc.user {
					t.Fatalf("UserID = %q, %v; want %q", user, err, tc.user)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrInvalid) || user != "" {
				t.Fatalf("UserID = %q, %v; want ErrInvalid", user, err)
			}
		})
	}
}

func TestAllowedAlgorithmsFollowKeys(t *testing.T) {
	v := verifier(t, Options{PublicKeys: []crypto.PublicKey{&ecKey.PublicKey}})
	// Only ES256 is allowed: an HS256 token signed with any secret, even
	// an empty one, is refused.
	for _, tok := range []string{
		sign(t, jwt.SigningMethodHS256, hsSecret, "", nil),
		sign(t, jwt.SigningMethodRS256, rsaKey, "", nil),
	} {
		if _, err := v.UserID(tok); !errors.Is(err, ErrInvalid) {
			t.Errorf("accepted an algorithm without its key: %v", err)
		}
	}
	if _, err := v.UserID(sign(t, jwt.SigningMethodES256, ecKey, "", nil)); err != nil {
		t.Errorf("ES256: %v", err)
	}
}

func TestUserClaim(t *testing.T) {
	v := verifier(t, Options{HS256Secret: hsSecret, UserClaim: "uid"})
	user, err := v.UserID(sign(t, jwt.SigningMethodHS256, hsSecret, "", func(c jwt.MapClaims) { c["uid"] = "u-42" }))
	if err != nil || user != "u-42" {
		t.Fatalf("UserID = %q, %v", user, err)
	}
}

func jwkOf(kid string, pub crypto.PublicKey) map[string]string {
	enc := base64.RawURLEncoding.EncodeToString
	switch k := pub.(type) {
	case *rsa.PublicKey:
		return map[string]string{"kty": "RSA", "kid": kid, "use": "sig", "n": enc(k.N.Bytes()), "e": enc(big.NewInt(int64(k.E)).Bytes())}
	case *ecdsa.PublicKey:
		point, err := k.Bytes() // 0x04 || X || Y, 32 bytes each on P-256
		if err != nil || len(point) != 65 {
			panic("P-256 key expected")
		}
		return map[string]string{"kty": "EC", "kid": kid, "crv": "P-256", "x": enc(point[1:33]), "y": enc(point[33:])}
	}
	panic("key type")
}

func TestJWKS(t *testing.T) {
	set, _ := json.Marshal(map[string]any{"keys": []any{
		jwkOf("r1", &rsaKey.PublicKey), jwkOf("e1", &ecKey.PublicKey),
		map[string]string{"kty": "RSA", "use": "enc", "n": "AQAB", "e": "AQAB"}, // skipped
		map[string]string{"kty": "oct", "k": "c2VjcmV0"},                        // skipped
	}})
	byID, unnamed, err := ParseJWKS(set)
	if err != nil || len(byID) != 2 || len(unnamed) != 0 {
		t.Fatalf("ParseJWKS = %v, %v, %v", byID, unnamed, err)
	}
	v := verifier(t, Options{KeysByID: byID})
	for _, tc := range []struct {
		name, token string
		ok          bool
	}{
		{"RS256 with its kid", sign(t, jwt.SigningMethodRS256, rsaKey, "r1", nil), true},
		{"ES256 with its kid", sign(t, jwt.SigningMethodES256, ecKey, "e1", nil), true},
		{"RS256 naming the EC key's kid", sign(t, jwt.SigningMethodRS256, rsaKey, "e1", nil), false},
		{"an unknown kid", sign(t, jwt.SigningMethodRS256, otherRSA, "r9", nil), false},
		{"no kid: named keys are not tried", sign(t, jwt.SigningMethodRS256, rsaKey, "", nil), false},
	} {
		if _, err := v.UserID(tc.token); (err == nil) != tc.ok {
			t.Errorf("%s: %v", tc.name, err)
		}
	}

	for name, bad := range map[string]string{
		"not JSON":              `{"keys":`,
		"no signing key":        `{"keys":[]}`,
		"EC off the curve":      `{"keys":[{"kty":"EC","crv":"P-256","x":"` + strings.Repeat("A", 43) + `","y":"` + strings.Repeat("A", 42) + `E"}]}`,
		"P-384":                 `{"keys":[{"kty":"EC","crv":"P-384","x":"AA","y":"AA"}]}`,
		"duplicate kid":         `{"keys":[{"kty":"RSA","kid":"a","n":"AQAB","e":"AQAB"},{"kty":"RSA","kid":"a","n":"AQAB","e":"AQAB"}]}`,
		"RSA without a modulus": `{"keys":[{"kty":"RSA","e":"AQAB"}]}`,
	} {
		if _, _, err := ParseJWKS([]byte(bad)); err == nil {
			t.Errorf("ParseJWKS accepted %s", name)
		}
	}
}

func TestParsePEMAndNew(t *testing.T) {
	data := append(pemOf(t, &rsaKey.PublicKey), pemOf(t, &ecKey.PublicKey)...)
	keys, err := ParsePEM(data)
	if err != nil || len(keys) != 2 {
		t.Fatalf("ParsePEM = %v, %v", keys, err)
	}
	if _, err := ParsePEM([]byte("nothing")); err == nil {
		t.Error("ParsePEM accepted no key")
	}
	small, _ := rsa.GenerateKey(rand.Reader, 1024)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	for name, o := range map[string]Options{
		"no key":       {},
		"short secret": {HS256Secret: []byte("short")},
		"1024-bit RSA": {PublicKeys: []crypto.PublicKey{&small.PublicKey}},
		"P-384":        {PublicKeys: []crypto.PublicKey{&p384.PublicKey}},
	} {
		if _, err := New(o); err == nil {
			t.Errorf("New accepted %s", name)
		}
	}
}

func TestLooksLikeJWT(t *testing.T) {
	for tok, want := range map[string]bool{
		sign(t, jwt.SigningMethodHS256, hsSecret, "", nil): true,
		"psk_" + strings.Repeat("a", 39):                   false,
		"a.b":                                              false,
		"psk_a.b.c":                                        false,
		"a.b.c":                                            true,
	} {
		if got := LooksLikeJWT(tok); got != want {
			t.Errorf("LooksLikeJWT(%.20q) = %v", tok, got)
		}
	}
}

// FuzzUserID: any bearer token is answered with a user id only when it
// verifies, and never panics. Seeds are tokens of each kind and their
// corruptions.
func FuzzUserID(f *testing.F) {
	v := verifier(f, Options{HS256Secret: hsSecret, PublicKeys: []crypto.PublicKey{&rsaKey.PublicKey, &ecKey.PublicKey}})
	good := sign(f, jwt.SigningMethodHS256, hsSecret, "", nil)
	f.Add(good)
	f.Add(sign(f, jwt.SigningMethodRS256, rsaKey, "k", nil))
	f.Add(sign(f, jwt.SigningMethodES256, ecKey, "", nil))
	f.Add(good[:len(good)-2])
	f.Add("eyJhbGciOiJub25lIn0.eyJzdWIiOiJ1In0.")
	f.Add("..")
	f.Add("a.b.c")
	f.Fuzz(func(t *testing.T, token string) {
		user, err := v.UserID(token)
		if err != nil {
			if !errors.Is(err, ErrInvalid) || user != "" {
				t.Fatalf("refusal %q, %v", user, err)
			}
			return
		}
		if user == "" {
			t.Fatal("accepted with no user")
		}
		// Whatever verified was signed by one of the keys; the only
		// seeds that can are the untouched tokens, so the user is theirs.
		if user != "user-1" {
			t.Fatalf("token %q verified as %q", token, user)
		}
	})
}
