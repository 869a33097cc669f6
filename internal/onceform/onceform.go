// Package onceform hands out one-time form values and takes each once:
// every form that changes something carries, in a hidden field, a value
// made for that form when its page was rendered. A double click, a reload
// of the answer that showed a new key (which posts its form again), a
// confirmation posted twice: the second POST carries a value already
// taken and is answered "this change was already made", changing
// nothing. A CSRF token is the same in every form of a session, so it
// cannot tell a second submission from the first. The operator console
// (internal/console) and the caller portal (internal/portal) use it.
//
// A value is the time it was made, 12 random bytes and an HMAC of both
// and the signed-in person's name under the book's key, so the book keeps
// nothing for the values it hands out, only for those it took: at most
// DefaultMax of them, each for TTL. A value older than TTL, or made
// before the oldest one still remembered when the memory was full, is
// refused as too old (reload the page), never taken again. Values are of
// one process (its key): a restart makes every open form stale, and on a
// fleet a form is taken only by the node that rendered it.
package onceform

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"slices"
	"sync"
	"time"
)

const (
	// Field is the hidden field that carries a form's value.
	Field = "once"
	// TTL is how long a rendered form can be posted.
	TTL      = 24 * time.Hour
	TTLWords = "24 hours"
	// DefaultMax bounds the values remembered as taken.
	DefaultMax = 50000
	// randLen is the random part of a value.
	randLen = 12
	// macLen is the length of a value's MAC.
	macLen = 16
)

// State is what became of the POST that took a value.
type State uint8

const (
	// Unchanged: nothing was changed (given to Finish, it gives the
	// value back).
	Unchanged State = iota
	// InFlight: its change is being made.
	InFlight
	// Made: the change was made (its audit entry maybe not).
	Made
	// Failed: it failed in a way that may or may not have changed
	// something (a store error).
	Failed
)

// Verdict is what Claim says of a POST's value.
type Verdict uint8

const (
	OK Verdict = iota
	// Bad: no value, or not one this book made for this person.
	Bad
	// Stale: older than TTL, or than what is remembered.
	Stale
	// Taken: a POST took it before; the state says with what result.
	Taken
)

// String names a verdict for the logs.
func (v Verdict) String() string {
	switch v {
	case OK:
		return "ok"
	case Bad:
		return "missing or not ours"
	case Stale:
		return "stale"
	case Taken:
		return "already taken"
	}
	return "unknown"
}

type entry struct {
	made  time.Time
	state State
}

// Book makes the values and remembers those taken.
type Book struct {
	key []byte
	// Now is the book's clock; time.Now unless a test sets it.
	Now func() time.Time
	ttl time.Duration
	max int

	mu   sync.Mutex
	used map[string]entry
	// floor: values made at or before it are refused as stale; it rises
	// when the book is full and forgets its oldest half.
	floor     time.Time
	lastPrune time.Time
}

// New is a book whose key is derived from secret under label (secret is
// the caller's process key; label keeps this use of it apart).
func New(secret []byte, label string) *Book {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(label))
	return &Book{key: m.Sum(nil), Now: time.Now, ttl: TTL, max: DefaultMax, used: map[string]entry{}}
}

// NewRandom is a book with a random key of its own.
func NewRandom(label string) (*Book, error) {
	var secret [32]byte
	if _, err := rand.Read(secret[:]); err != nil {
		return nil, err
	}
	return New(secret[:], label), nil
}

func (b *Book) mac(who string, body []byte) []byte {
	m := hmac.New(sha256.New, b.key)
	m.Write(body)
	m.Write([]byte(who))
	return m.Sum(nil)[:macLen]
}

// Mint makes a value for a form shown to who.
func (b *Book) Mint(who string) string {
	var v [8 + randLen + macLen]byte
	binary.BigEndian.PutUint64(v[:8], uint64(b.Now().UnixNano()))
	rand.Read(v[8 : 8+randLen])
	copy(v[8+randLen:], b.mac(who, v[:8+randLen]))
	return base64.RawURLEncoding.EncodeToString(v[:])
}

// Claim takes a POST's value: OK marks it in flight (Finish says what
// became of it), anything else leaves the book as it was. For Taken the
// state is the first POST's.
func (b *Book) Claim(value, who string) (string, Verdict, State) {
	v, err := base64.RawURLEncoding.DecodeString(value)
	if err != nil || len(v) != 8+randLen+macLen || !hmac.Equal(v[8+randLen:], b.mac(who, v[:8+randLen])) {
		return "", Bad, Unchanged
	}
	made := time.Unix(0, int64(binary.BigEndian.Uint64(v[:8])))
	id := string(v[:8+randLen])
	now := b.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if e, ok := b.used[id]; ok {
		return id, Taken, e.state
	}
	if now.Sub(made) > b.ttl || !made.After(b.floor) {
		return id, Stale, Unchanged
	}
	b.prune(now)
	b.used[id] = entry{made: made, state: InFlight}
	return id, OK, Unchanged
}

// Finish records what became of a claimed value's POST: Unchanged gives
// the value back, so the same form, corrected or posted again, is taken;
// anything else keeps it taken.
func (b *Book) Finish(id string, state State) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e, ok := b.used[id]
	if !ok {
		return
	}
	if state == Unchanged {
		delete(b.used, id)
		return
	}
	e.state = state
	b.used[id] = e
}

// prune forgets values past their time (once a minute), and when the
// book is still full the older half, raising the floor so that those
// are refused as stale, not taken again. b.mu is held.
func (b *Book) prune(now time.Time) {
	if len(b.used) < b.max && now.Sub(b.lastPrune) < time.Minute {
		return
	}
	b.lastPrune = now
	for id, e := range b.used {
		if now.Sub(e.made) > b.ttl {
			delete(b.used, id)
		}
	}
	if len(b.used) < b.max {
		return
	}
	made := make([]time.Time, 0, len(b.used))
	for _, e := range b.used {
		made = append(made, e.made)
	}
	slices.SortFunc(made, time.Time.Compare)
	cut := made[len(made)/2]
	for id, e := range b.used {
		if !e.made.After(cut) {
			delete(b.used, id)
		}
	}
	if cut.After(b.floor) {
		b.floor = cut
	}
}
