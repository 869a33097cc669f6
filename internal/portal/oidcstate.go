package portal

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"sync"
	"time"
)

// A sign-in with the identity provider is carried from /oidc/start to
// /oidc/callback by a cookie sealed (AES-256-GCM) under a key only this
// process knows: the state sent to the provider, the nonce the ID token
// must carry, the PKCE verifier and the page to return to. The browser
// can neither read nor change it. The state is single use: the callback
// notes it as spent, so a callback URL replayed later, even with the
// cookie, is refused.

// oidcFlowTTL is how long a started sign-in may take at the provider.
const oidcFlowTTL = 10 * time.Minute

// oidcFlow is what the state cookie holds.
type oidcFlow struct {
	State    string    `json:"s"`
	Nonce    string    `json:"n"`
	Verifier string    `json:"v"`
	Return   string    `json:"r"`
	Expires  time.Time `json:"e"`
}

// flowAEAD seals state cookies. Like the sessions it is the process's:
// shared by every config, new on restart (a sign-in under way then
// starts again).
var flowAEAD = func() cipher.AEAD {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		panic(err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		panic(err)
	}
	return aead
}()

// flowCookieAD binds a sealed value to its use, so no other sealed value
// of the process can pass for it.
var flowCookieAD = []byte("platform_portal oidc flow")

func sealFlow(f oidcFlow) string {
	b, err := json.Marshal(f)
	if err != nil {
		panic(err) // plain strings and a time
	}
	nonce := make([]byte, flowAEAD.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		panic(err)
	}
	return base64.RawURLEncoding.EncodeToString(flowAEAD.Seal(nonce, nonce, b, flowCookieAD))
}

var errFlowCookie = errors.New("no valid sign-in state")

// openFlow opens a sealed flow that has not expired at now.
func openFlow(v string, now time.Time) (oidcFlow, error) {
	b, err := base64.RawURLEncoding.DecodeString(v)
	n := flowAEAD.NonceSize()
	if err != nil || len(b) < n {
		return oidcFlow{}, errFlowCookie
	}
	plain, err := flowAEAD.Open(nil, b[:n], b[n:], flowCookieAD)
	if err != nil {
		return oidcFlow{}, errFlowCookie
	}
	var f oidcFlow
	if err := json.Unmarshal(plain, &f); err != nil || f.State == "" || !now.Before(f.Expires) {
		return oidcFlow{}, errFlowCookie
	}
	return f, nil
}

// spentStates are the states of this process's callbacks, kept until
// their flow would have expired anyway, so that each is used once.
type spentStates struct {
	mu sync.Mutex
	m  map[string]time.Time
	// noted counts states, so that every sweepEvery-th one drops those
	// past their expiry.
	noted int
}

// maxSpentStates bounds memory, like maxSessions.
const maxSpentStates = 100000

var spent = &spentStates{m: make(map[string]time.Time)}

var (
	errStateSpent = errors.New("sign-in state already used")
	errStatesFull = errors.New("too many sign-ins under way")
)

// spend notes state as used until expires: errStateSpent if it already
// was, errStatesFull if too many sign-ins are under way to note one more.
func (s *spentStates) spend(state string, expires, now time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, used := s.m[state]; used {
		return errStateSpent
	}
	s.noted++
	if len(s.m) >= maxSpentStates || s.noted%sweepEvery == 0 {
		for k, exp := range s.m {
			if !now.Before(exp) {
				delete(s.m, k)
			}
		}
		if len(s.m) >= maxSpentStates {
			return errStatesFull
		}
	}
	s.m[state] = expires
	return nil
}
