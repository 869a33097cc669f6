package jwtauth

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
)

// ParsePEM reads the public keys of a PEM file: PUBLIC KEY (PKIX), RSA
// PUBLIC KEY (PKCS #1) and CERTIFICATE blocks; other blocks are skipped.
func ParsePEM(data []byte) ([]crypto.PublicKey, error) {
	var keys []crypto.PublicKey
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		var k crypto.PublicKey
		var err error
		switch b.Type {
		case "PUBLIC KEY":
			k, err = x509.ParsePKIXPublicKey(b.Bytes)
		case "RSA PUBLIC KEY":
			k, err = x509.ParsePKCS1PublicKey(b.Bytes)
		case "CERTIFICATE":
			var c *x509.Certificate
			if c, err = x509.ParseCertificate(b.Bytes); err == nil {
				k = c.PublicKey
			}
		default:
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s block: %w", b.Type, err)
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("no PUBLIC KEY, RSA PUBLIC KEY or CERTIFICATE block")
	}
	return keys, nil
}

// jwk is the part of a JSON Web Key (RFC 7517, 7518) that RS256 and ES256
// verification needs.
type jwk struct {
	Kty string `json:"kty"`
	Kid string `json:"kid"`
	Use string `json:"use"`
	Alg string `json:"alg"`
	N   string `json:"n"`
	E   string `json:"e"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Y   string `json:"y"`
}

// ParseJWKS reads a JWK Set: its RSA and P-256 EC signing keys, by kid
// (keys without a kid are returned unnamed). Keys for encryption
// (use "enc") and other key types are skipped.
func ParseJWKS(data []byte) (byID map[string]crypto.PublicKey, unnamed []crypto.PublicKey, err error) {
	var set struct {
		Keys []jwk `json:"keys"`
	}
	if err := json.Unmarshal(data, &set); err != nil {
		return nil, nil, fmt.Errorf("JWK set: %w", err)
	}
	byID = make(map[string]crypto.PublicKey)
	for i, j := range set.Keys {
		if j.Use == "enc" {
			continue
		}
		var k crypto.PublicKey
		switch j.Kty {
		case "RSA":
			k, err = j.rsa()
		case "EC":
			k, err = j.ec()
		default:
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("JWK %d (kid %q): %w", i, j.Kid, err)
		}
		if j.Kid == "" {
			unnamed = append(unnamed, k)
			continue
		}
		if _, dup := byID[j.Kid]; dup {
			return nil, nil, fmt.Errorf("JWK kid %q appears twice", j.Kid)
		}
		byID[j.Kid] = k
	}
	if len(byID) == 0 && len(unnamed) == 0 {
		return nil, nil, fmt.Errorf("the JWK set has no RSA or EC signing key")
	}
	return byID, unnamed, nil
}

func (j jwk) rsa() (*rsa.PublicKey, error) {
	n, err := b64int(j.N)
	if err != nil {
		return nil, fmt.Errorf("n: %w", err)
	}
	e, err := b64int(j.E)
	if err != nil {
		return nil, fmt.Errorf("e: %w", err)
	}
	if !e.IsInt64() || e.Int64() < 3 || e.Int64() > 1<<31-1 {
		return nil, fmt.Errorf("e out of range")
	}
	return &rsa.PublicKey{N: n, E: int(e.Int64())}, nil
}

func (j jwk) ec() (*ecdsa.PublicKey, error) {
	if j.Crv != "P-256" {
		return nil, fmt.Errorf("curve %q; ES256 needs P-256", j.Crv)
	}
	x, err := b64bytes(j.X)
	if err != nil {
		return nil, fmt.Errorf("x: %w", err)
	}
	y, err := b64bytes(j.Y)
	if err != nil {
		return nil, fmt.Errorf("y: %w", err)
	}
	if len(x) != 32 || len(y) != 32 {
		return nil, fmt.Errorf("x and y must be 32 bytes each")
	}
	// An uncompressed point, parsed by crypto/ecdh's checks via x509:
	// a point not on the curve is refused.
	point := append(append([]byte{4}, x...), y...)
	pub, err := x509.ParsePKIXPublicKey(p256SPKI(point))
	if err != nil {
		return nil, fmt.Errorf("not a point on P-256: %w", err)
	}
	k, ok := pub.(*ecdsa.PublicKey)
	if !ok || k.Curve != elliptic.P256() {
		return nil, fmt.Errorf("not a P-256 key")
	}
	return k, nil
}

// p256SPKI wraps an uncompressed P-256 point in a SubjectPublicKeyInfo,
// so that x509 checks it is on the curve.
func p256SPKI(point []byte) []byte {
	// SEQUENCE { SEQUENCE { id-ecPublicKey, prime256v1 }, BIT STRING point }
	prefix := []byte{
		0x30, 0x59, 0x30, 0x13,
		0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01,
		0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07,
		0x03, 0x42, 0x00,
	}
	return append(prefix, point...)
}

func b64bytes(s string) ([]byte, error) {
	if s == "" {
		return nil, fmt.Errorf("missing")
	}
	return base64.RawURLEncoding.DecodeString(s)
}

func b64int(s string) (*big.Int, error) {
	b, err := b64bytes(s)
	if err != nil {
		return nil, err
	}
	return new(big.Int).SetBytes(b), nil
}
