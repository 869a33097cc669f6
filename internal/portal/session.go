package portal

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"sync"
	"time"
)

// A session is what a sign-in is exchanged for: held here, in memory, and
// named in the browser only by a random id. The service key itself is
// never kept, neither here nor in the browser.
type session struct {
	UserID string
	// KeyID is the service key signed in with; empty for a sign-in with
	// the identity provider, whose name Provider is then.
	KeyID    string
	Provider string
	Expires  time.Time
	// CSRF is the token every form of the session carries.
	CSRF string
}

// sessionStore holds the sessions of this process. It is shared by every
// config (a reload keeps callers signed in) and lost on restart; each node
// of a fleet has its own.
type sessionStore struct {
	mu sync.Mutex
	m  map[string]session
	// created counts sign-ins, so that every sweepEvery-th one drops the
	// expired sessions nobody came back for.
	created int
}

const sweepEvery = 256

// maxSessions bounds memory: past it, expired sessions are dropped, and if
// none is, the sign-in is refused.
const maxSessions = 100000

var sessions = &sessionStore{m: make(map[string]session)}

// randomToken is 32 random bytes, base64url: a session id or CSRF token.
func randomToken() string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// create starts a session and returns its id; false when the store is full.
func (s *sessionStore) create(sess session, now time.Time) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.created++
	if len(s.m) >= maxSessions || s.created%sweepEvery == 0 {
		for id, v := range s.m {
			if !now.Before(v.Expires) {
				delete(s.m, id)
			}
		}
		if len(s.m) >= maxSessions {
			return "", false
		}
	}
	id := randomToken()
	s.m[id] = sess
	return id, true
}

// get returns a live session; an expired one is dropped.
func (s *sessionStore) get(id string, now time.Time) (session, bool) {
	if id == "" {
		return session{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, ok := s.m[id]
	if !ok {
		return session{}, false
	}
	if !now.Before(sess.Expires) {
		delete(s.m, id)
		return session{}, false
	}
	return sess, true
}

func (s *sessionStore) end(id string) {
	s.mu.Lock()
	delete(s.m, id)
	s.mu.Unlock()
}

// count is the number of sessions held (tests).
func (s *sessionStore) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

// sameToken compares a submitted token with the expected one in constant
// time; an empty expected token matches nothing.
func sameToken(got, want string) bool {
	return want != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}
