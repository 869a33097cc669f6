// Package jwtauth verifies the end user's JWT that the upstream SDKs send
// to the billing estimate (estimateUsageWithJwt): a bearer token signed by
// the operator's identity provider, checked against keys the operator
// configures (an HS256 secret, RS256 or ES256 public keys in PEM or a local
// JWKS file), with the issuer, audience and expiry the operator expects.
// It yields the user id from one claim (sub by default).
//
// Algorithms are allowed explicitly, by the keys configured: HS256 only
// with a secret, RS256 only with RSA keys, ES256 only with P-256 keys.
// "none" and every other algorithm are refused, and a token signed with a
// public key used as an HMAC secret (the RS256→HS256 confusion) cannot
// verify, as an HMAC is never checked against a public key.
package jwtauth

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// MaxTokenBytes bounds the tokens read at all: a JWT of an end user is a
// few hundred bytes, and parsing is not free.
const MaxTokenBytes = 8 << 10

// DefaultUserClaim is the claim holding the user id unless configured.
const DefaultUserClaim = "sub"

// DefaultLeeway is the clock skew allowed on exp, nbf and iat.
const DefaultLeeway = 30 * time.Second

// ErrInvalid is what every refused token wraps: bad, expired, wrong
// issuer or audience, unknown key, disallowed algorithm. Callers answer
// all of them alike (401 invalid_token) and log the wrapped reason.
var ErrInvalid = errors.New("invalid token")

// Options configure a Verifier.
type Options struct {
	// HS256Secret allows HS256 tokens signed with it (at least 32 bytes).
	HS256Secret []byte
	// PublicKeys are RSA (RS256) or P-256 ECDSA (ES256) keys, tried in
	// turn for a token without a kid or whose kid none of them has.
	PublicKeys []crypto.PublicKey
	// KeysByID are keys with a kid (from a JWKS): a token naming a kid is
	// verified with that key only.
	KeysByID map[string]crypto.PublicKey
	// Issuer and Audience, when set, must be the token's iss and one of
	// its aud.
	Issuer, Audience string
	// UserClaim names the claim with the user id; DefaultUserClaim when
	// empty.
	UserClaim string
	// Leeway for exp, nbf and iat, as given: zero allows no skew
	// (DefaultLeeway is what the platform block uses unless told).
	Leeway time.Duration
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// Verifier checks tokens. It is safe for concurrent use.
type Verifier struct {
	hs     []byte
	rsa    []jwt.VerificationKey
	ec     []jwt.VerificationKey
	byID   map[string]crypto.PublicKey
	claim  string
	parser *jwt.Parser
}

// New builds a Verifier; it needs at least one key.
func New(o Options) (*Verifier, error) {
	v := &Verifier{claim: o.UserClaim, byID: make(map[string]crypto.PublicKey, len(o.KeysByID))}
	if v.claim == "" {
		v.claim = DefaultUserClaim
	}
	var methods []string
	if len(o.HS256Secret) > 0 {
		if len(o.HS256Secret) < 32 {
			return nil, fmt.Errorf("jwt: the HS256 secret is shorter than 32 bytes")
		}
		v.hs = o.HS256Secret
		methods = append(methods, jwt.SigningMethodHS256.Alg())
	}
	for _, k := range o.PublicKeys {
		if err := checkKey(k); err != nil {
			return nil, err
		}
		if _, isRSA := k.(*rsa.PublicKey); isRSA {
			v.rsa = append(v.rsa, k)
		} else {
			v.ec = append(v.ec, k)
		}
	}
	for kid, k := range o.KeysByID {
		if err := checkKey(k); err != nil {
			return nil, fmt.Errorf("key %q: %w", kid, err)
		}
		v.byID[kid] = k
	}
	if hasType[*rsa.PublicKey](v.byID) || len(v.rsa) > 0 {
		methods = append(methods, jwt.SigningMethodRS256.Alg())
	}
	if hasType[*ecdsa.PublicKey](v.byID) || len(v.ec) > 0 {
		methods = append(methods, jwt.SigningMethodES256.Alg())
	}
	if len(methods) == 0 {
		return nil, fmt.Errorf("jwt: no key configured")
	}
	if o.Leeway < 0 {
		return nil, fmt.Errorf("jwt: a negative leeway %s", o.Leeway)
	}
	opts := []jwt.ParserOption{
		jwt.WithValidMethods(methods),
		jwt.WithLeeway(o.Leeway),
		jwt.WithExpirationRequired(),
		jwt.WithIssuedAt(),
		jwt.WithStrictDecoding(),
	}
	if o.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(o.Issuer))
	}
	if o.Audience != "" {
		opts = append(opts, jwt.WithAudience(o.Audience))
	}
	if o.Now != nil {
		opts = append(opts, jwt.WithTimeFunc(o.Now))
	}
	v.parser = jwt.NewParser(opts...)
	return v, nil
}

// checkKey accepts the keys RS256 and ES256 verify with.
func checkKey(k crypto.PublicKey) error {
	switch k := k.(type) {
	case *rsa.PublicKey:
		if k.N.BitLen() < 2048 {
			return fmt.Errorf("jwt: an RSA key of %d bits; RS256 needs 2048 or more", k.N.BitLen())
		}
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() {
			return fmt.Errorf("jwt: an ECDSA key on %s; ES256 needs P-256", k.Curve.Params().Name)
		}
	default:
		return fmt.Errorf("jwt: a %T key; only RSA (RS256) and P-256 ECDSA (ES256) keys are supported", k)
	}
	return nil
}

func hasType[T crypto.PublicKey](m map[string]crypto.PublicKey) bool {
	for _, k := range m {
		if _, ok := k.(T); ok {
			return true
		}
	}
	return false
}

// LooksLikeJWT reports whether a bearer token has the JWS compact shape
// (three dot-separated parts): how a JWT is told from a service key
// (psk_…, which has no dot) before either is checked.
func LooksLikeJWT(token string) bool {
	return strings.Count(token, ".") == 2 && !strings.HasPrefix(token, "psk_")
}

// UserID verifies token and returns the user id of its claim. Every
// refusal wraps ErrInvalid.
func (v *Verifier) UserID(token string) (string, error) {
	if len(token) > MaxTokenBytes {
		return "", fmt.Errorf("%w: longer than %d bytes", ErrInvalid, MaxTokenBytes)
	}
	claims := jwt.MapClaims{}
	if _, err := v.parser.ParseWithClaims(token, claims, v.keysFor); err != nil {
		return "", fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	user, ok := claims[v.claim].(string)
	if !ok || user == "" {
		return "", fmt.Errorf("%w: no string claim %q", ErrInvalid, v.claim)
	}
	return user, nil
}

// keysFor picks the verification keys for a token whose algorithm the
// parser has already checked against the allowed ones.
func (v *Verifier) keysFor(t *jwt.Token) (any, error) {
	alg := t.Method.Alg()
	if alg == "HS256" {
		return v.hs, nil
	}
	if kid, ok := t.Header["kid"].(string); ok {
		if k, found := v.byID[kid]; found {
			return k, nil // a wrong type for alg fails verification
		}
	}
	switch alg {
	case "RS256":
		return jwt.VerificationKeySet{Keys: v.rsa}, nil
	case "ES256":
		return jwt.VerificationKeySet{Keys: v.ec}, nil
	}
	return nil, fmt.Errorf("algorithm %s not allowed", alg)
}
