package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/platformgw/gateway/sdk"
)

const jwtSecret = "jwt-secret-jwt-secret-jwt-secret-0001"

// TestCompatBillingEstimateJWT: the billing estimate takes the end user's
// JWT (the upstream SDKs' estimateUsageWithJwt) beside a service key, with
// HS256, RS256 from a PEM file and ES256 from a JWKS file; every token that
// does not verify is 401 invalid_token and changes nothing.
func TestCompatBillingEstimateJWT(t *testing.T) {
	dir := t.TempDir()
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	otherRSA, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&rsaKey.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	pemPath := filepath.Join(dir, "idp.pem")
	if err := os.WriteFile(pemPath, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	x, y := make([]byte, 32), make([]byte, 32)
	ecKey.X.FillBytes(x)
	ecKey.Y.FillBytes(y)
	jwks, _ := json.Marshal(map[string]any{"keys": []any{map[string]string{
		"kty": "EC", "crv": "P-256", "kid": "ec-1", "use": "sig",
		"x": base64.RawURLEncoding.EncodeToString(x), "y": base64.RawURLEncoding.EncodeToString(y),
	}}})
	jwksPath := filepath.Join(dir, "jwks.json")
	if err := os.WriteFile(jwksPath, jwks, 0o600); err != nil {
		t.Fatal(err)
	}
	be := newTestBackend(t, coreSecret, "Platform")
	g := startGateway(t, dir, coreCatalog(be.URL)+`
		jwt {
			hs256_secret `+jwtSecret+`
			public_key `+pemPath+`
			jwks_file `+jwksPath+`
			issuer https://idp.example
			audience platform
		}`)
	key, _ := g.newKey("u-jwt")
	g.subscribe("u-jwt", "pre", "basic", "ACTIVE")
	before := coreSnapshot(t, g, "u-jwt", "pre")

	token := func(m jwt.SigningMethod, k any, kid string, mod func(jwt.MapClaims)) string {
		c := jwt.MapClaims{"sub": "u-jwt", "iss": "https://idp.example", "aud": "platform",
			"exp": time.Now().Add(time.Hour).Unix(), "iat": time.Now().Unix()}
		if mod != nil {
			mod(c)
		}
		tok := jwt.NewWithClaims(m, c)
		if kid != "" {
			tok.Header["kid"] = kid
		}
		s, err := tok.SignedString(k)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	hs := func(mod func(jwt.MapClaims)) string { return token(jwt.SigningMethodHS256, []byte(jwtSecret), "", mod) }
	body := coreBody(t, "userId", "u-jwt", "serviceId", "pre", "estimatedUnits", 1)
	bearer := func(tok string) []string { return []string{"Authorization", "Bearer " + tok} }
	wantAllowed := `{"sufficientCredits":true,"wouldExceedCap":false,"wouldAllow":true,"estimatedCost":0,` +
		`"billingModelType":"SUBSCRIPTION","measurementType":"PER_REQUEST","unitLabel":"request",` +
		`"breakdown":{"unitsUsed":1,"unitsRemaining":2,"totalUnitsUsedThisCycle":1,"isOverLimit":false,"isOverage":false,"isOverageAllowed":false}}`

	for name, tok := range map[string]string{
		"HS256":                   hs(nil),
		"RS256 from the PEM file": token(jwt.SigningMethodRS256, rsaKey, "", nil),
		"ES256 from the JWKS":     token(jwt.SigningMethodES256, ecKey, "ec-1", nil),
		"the user's service key":  key,
	} {
		t.Run(name, func(t *testing.T) {
			a := corePost(t, usageSigned{URL: coreBillingURL, Body: body, Header: bearer(tok)}, "")
			a.expect(t, 200, "")
			a.mustUnsigned(t)
			if string(a.Body) != wantAllowed {
				t.Errorf("body\n got %s\nwant %s", a.Body, wantAllowed)
			}
		})
	}

	none, err := jwt.NewWithClaims(jwt.SigningMethodNone, jwt.MapClaims{"sub": "u-jwt", "iss": "https://idp.example",
		"aud": "platform", "exp": time.Now().Add(time.Hour).Unix()}).SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	good := strings.Split(hs(nil), ".")
	for _, tt := range []struct {
		name, token string
		status      int
		code        string
	}{
		{"another user's JWT", hs(func(c jwt.MapClaims) { c["sub"] = "u-else" }), 403, "forbidden"},
		{"expired", hs(func(c jwt.MapClaims) { c["exp"] = time.Now().Add(-10 * time.Minute).Unix() }), 401, "invalid_token"},
		{"wrong issuer", hs(func(c jwt.MapClaims) { c["iss"] = "https://evil.example" }), 401, "invalid_token"},
		{"wrong audience", hs(func(c jwt.MapClaims) { c["aud"] = "someone-else" }), 401, "invalid_token"},
		{"alg none", none, 401, "invalid_token"},
		{"unknown key", token(jwt.SigningMethodRS256, otherRSA, "", nil), 401, "invalid_token"},
		{"unknown kid", token(jwt.SigningMethodES256, ecKey, "ec-9", nil), 401, "invalid_token"},
		{"bad signature", good[0] + "." + good[1] + ".AAAA", 401, "invalid_token"},
		{"garbage with two dots", "a.b.c", 401, "invalid_token"},
		{"not a JWT, not a key", "nope", 401, "invalid_key"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := corePost(t, usageSigned{URL: coreBillingURL, Body: body, Header: bearer(tt.token)}, "")
			a.expect(t, tt.status, tt.code)
			a.mustUnsigned(t)
			if strings.Contains(string(a.Body), tt.token) {
				t.Errorf("the answer quotes the token: %s", a.Body)
			}
		})
	}
	t.Run("the Go SDK's EstimateUsageWithJWT", func(t *testing.T) {
		c, err := sdk.NewClient(gwBase, "pre", coreSecret)
		if err != nil {
			t.Fatal(err)
		}
		est, err := c.EstimateUsageWithJWT(context.Background(), hs(nil), "u-jwt", sdk.WholeUnits(1))
		if err != nil || !est.WouldAllow || est.Status != 200 || est.Breakdown.UnitsRemaining == nil ||
			*est.Breakdown.UnitsRemaining != sdk.WholeUnits(2) || !est.Timestamp.IsZero() {
			t.Fatalf("estimate %+v, %v", est, err)
		}
		_, err = c.EstimateUsageWithJWT(context.Background(), hs(func(c jwt.MapClaims) { c["aud"] = "x" }), "u-jwt", sdk.WholeUnits(1))
		var apiErr *sdk.APIError
		if !errors.As(err, &apiErr) || apiErr.Status != 401 || apiErr.Code != "invalid_token" {
			t.Fatalf("a bad token: %v", err)
		}
	})
	coreUnchanged(t, "JWT estimates", before, coreSnapshot(t, g, "u-jwt", "pre"))
}
