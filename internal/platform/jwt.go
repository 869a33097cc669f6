package platform

import (
	"crypto"
	"fmt"
	"os"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/platformgw/gateway/internal/jwtauth"
)

// JWTConfig is how end users' JWTs are verified where the platform accepts
// them (the billing estimate, as the upstream SDKs' estimateUsageWithJwt
// sends one): the keys of the operator's identity provider and the claims
// it must carry. Without it no JWT is accepted.
type JWTConfig struct {
	// HS256Secret is a shared secret (at least 32 bytes) for HS256 tokens;
	// {env.X} and {file.X} placeholders are resolved.
	HS256Secret string `json:"hs256_secret,omitempty"`
	// PublicKeyFiles are PEM files of RSA (RS256) or P-256 (ES256) public
	// keys or certificates.
	PublicKeyFiles []string `json:"public_key_files,omitempty"`
	// JWKSFile is a local JWK Set file of RSA and P-256 keys; a token's
	// kid selects its key.
	JWKSFile string `json:"jwks_file,omitempty"`
	// Issuer and Audience, when set, must match the token's iss and aud.
	Issuer   string `json:"issuer,omitempty"`
	Audience string `json:"audience,omitempty"`
	// UserClaim holds the user id; sub by default.
	UserClaim string `json:"user_claim,omitempty"`
	// Leeway is the clock skew allowed on exp, nbf and iat, 0 to
	// MaxJWTLeeway; jwtauth.DefaultLeeway (30s) when not set. A pointer,
	// so that 0 (no skew at all) is told from unset.
	Leeway *caddy.Duration `json:"leeway,omitempty"`
}

// MaxJWTLeeway is the most clock skew a jwt block may allow.
const MaxJWTLeeway = 5 * time.Minute

// verifier builds the verifier, checking times against now (the app's
// clock); nil config, nil verifier. Keys are read at provisioning, so a
// reload picks up rotated key files.
func (c *JWTConfig) verifier(repl *caddy.Replacer, now func() time.Time) (*jwtauth.Verifier, error) {
	if c == nil {
		return nil, nil
	}
	o := jwtauth.Options{Issuer: c.Issuer, Audience: c.Audience, UserClaim: c.UserClaim,
		Leeway: jwtauth.DefaultLeeway, Now: now}
	if c.Leeway != nil {
		// Checked here too: a JSON config does not go through the
		// Caddyfile's check.
		if o.Leeway = time.Duration(*c.Leeway); o.Leeway < 0 || o.Leeway > MaxJWTLeeway {
			return nil, fmt.Errorf("leeway %s: between 0 and %s", o.Leeway, MaxJWTLeeway)
		}
	}
	if c.HS256Secret != "" {
		secret, err := repl.ReplaceOrErr(c.HS256Secret, true, true)
		if err != nil {
			return nil, fmt.Errorf("hs256_secret: %w", err)
		}
		o.HS256Secret = []byte(secret)
	}
	for _, path := range c.PublicKeyFiles {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("public_key: %w", err)
		}
		keys, err := jwtauth.ParsePEM(data)
		if err != nil {
			return nil, fmt.Errorf("public_key %s: %w", path, err)
		}
		o.PublicKeys = append(o.PublicKeys, keys...)
	}
	if c.JWKSFile != "" {
		data, err := os.ReadFile(c.JWKSFile)
		if err != nil {
			return nil, fmt.Errorf("jwks_file: %w", err)
		}
		var unnamed []crypto.PublicKey
		if o.KeysByID, unnamed, err = jwtauth.ParseJWKS(data); err != nil {
			return nil, fmt.Errorf("jwks_file %s: %w", c.JWKSFile, err)
		}
		o.PublicKeys = append(o.PublicKeys, unnamed...)
	}
	return jwtauth.New(o)
}

// JWTVerifier verifies end users' JWTs; nil when none are accepted.
func (a *App) JWTVerifier() *jwtauth.Verifier { return a.jwt }
