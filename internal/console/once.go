package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"net/http"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
)

// One-time form values: every form that changes something carries, in a
// hidden field, a value made for that form when its page was rendered;
// the console takes each value once. A double click on "Add credits", a
// reload of the answer that showed a new key (which posts its form
// again), a confirmation posted twice: the second POST carries a value
// already taken and is answered "this change was already made", changing
// nothing. The CSRF token (csrf.go) is per cookie and the same in every
// form, so it cannot tell a second submission from the first.
//
// A value is the time it was made, 12 random bytes and an HMAC of both
// and the operator's name under the process's key (the CSRF key, with a
// label of its own), so the console keeps nothing for the values it
// hands out, only for those it took: at most onceMax of them, each for
// onceTTL. A value older than onceTTL, or made before the oldest one
// still remembered when the memory was full, is refused as too old
// (reload the page), never taken again. Values are of this process: a
// restart makes every open form stale (so does the CSRF key already),
// and on a fleet a form is taken only by the node that rendered it, the
// only one whose key signed it (docs/console.md, "Forms").

const (
	onceField = "once"
	// onceTTL is how long a rendered form can be posted.
	onceTTL      = 24 * time.Hour
	onceTTLWords = "24 hours"
	// onceMax bounds the values remembered as taken.
	onceMax = 50000
	// onceRand is the random part of a value.
	onceRand = 12
	// onceMAC is the length of a value's MAC.
	onceMAC = 16
)

// onceState is what became of the POST that took a value.
type onceState uint8

const (
	// onceInFlight: its change is being made.
	onceInFlight onceState = iota + 1
	// onceMade: the change was made (its audit entry maybe not).
	onceMade
	// onceFailed: it failed in a way that may or may not have changed
	// something (a store error).
	onceFailed
)

// onceVerdict is what claim says of a POST's value.
type onceVerdict uint8

const (
	onceOK onceVerdict = iota
	// onceBad: no value, or not one this process made for this operator.
	onceBad
	// onceStale: older than onceTTL, or than what is remembered.
	onceStale
	// onceTaken: a POST took it before; the state says with what result.
	onceTaken
)

type onceEntry struct {
	made  time.Time
	state onceState
}

// onceBook makes the values and remembers those taken.
type onceBook struct {
	key []byte
	now func() time.Time
	ttl time.Duration
	max int

	mu   sync.Mutex
	used map[string]onceEntry
	// floor: values made at or before it are refused as stale; it rises
	// when the book is full and forgets its oldest half.
	floor     time.Time
	lastPrune time.Time
}

func newOnceBook(k *csrfKey) *onceBook {
	m := hmac.New(sha256.New, k.key[:])
	m.Write([]byte("platform_console one-time form values"))
	return &onceBook{key: m.Sum(nil), now: time.Now, ttl: onceTTL, max: onceMax, used: map[string]onceEntry{}}
}

func (b *onceBook) mac(who string, body []byte) []byte {
	m := hmac.New(sha256.New, b.key)
	m.Write(body)
	m.Write([]byte(who))
	return m.Sum(nil)[:onceMAC]
}

// mint makes a value for a form the operator who is shown.
func (b *onceBook) mint(who string) string {
	var v [8 + onceRand + onceMAC]byte
	binary.BigEndian.PutUint64(v[:8], uint64(b.now().UnixNano()))
	rand.Read(v[8 : 8+onceRand])
	copy(v[8+onceRand:], b.mac(who, v[:8+onceRand]))
	return base64.RawURLEncoding.EncodeToString(v[:])
}

// claim takes a POST's value: onceOK marks it in flight (finish says
// what became of it), anything else leaves the book as it was. For
// onceTaken the state is the first POST's.
func (b *onceBook) claim(value, who string) (string, onceVerdict, onceState) {
	v, err := base64.RawURLEncoding.DecodeString(value)
	if err != nil || len(v) != 8+onceRand+onceMAC || !hmac.Equal(v[8+onceRand:], b.mac(who, v[:8+onceRand])) {
		return "", onceBad, 0
	}
	made := time.Unix(0, int64(binary.BigEndian.Uint64(v[:8])))
	id := string(v[:8+onceRand])
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if e, ok := b.used[id]; ok {
		return id, onceTaken, e.state
	}
	if now.Sub(made) > b.ttl || !made.After(b.floor) {
		return id, onceStale, 0
	}
	b.prune(now)
	b.used[id] = onceEntry{made: made, state: onceInFlight}
	return id, onceOK, 0
}

// finish records what became of a claimed value's POST: nothing changed
// (state 0) gives the value back, so the same form, corrected or posted
// again, is taken; anything else keeps it taken.
func (b *onceBook) finish(id string, state onceState) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e, ok := b.used[id]
	if !ok {
		return
	}
	if state == 0 {
		delete(b.used, id)
		return
	}
	e.state = state
	b.used[id] = e
}

// prune forgets values past their time (once a minute), and when the
// book is still full the older half, raising the floor so that those
// are refused as stale, not taken again. b.mu is held.
func (b *onceBook) prune(now time.Time) {
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

// noticeData is the notice page: what happened to a form, and where to
// see the result.
type noticeData struct {
	Class   string // "done" or "error"
	Message string
	Links   []noticeLink
}

type noticeLink struct{ Href, Text string }

// resultLinks are where the result of the form q posted can be seen: the
// user's page and the audit log's changes to them, or the requests.
func (h *Handler) resultLinks(q *req) []noticeLink {
	p := q.parts
	switch {
	case len(p) >= 2 && p[0] == "users":
		return []noticeLink{
			{h.link(nil, "users", p[1]), "User " + p[1]},
			{h.link(map[string][]string{"target": {p[1]}}, "audit"), "Changes to " + p[1] + " in the audit log"},
		}
	case len(p) >= 1 && p[0] == "requests":
		return []noticeLink{
			{h.link(nil, "requests"), "Access requests"},
			{h.link(map[string][]string{"action": {"access.decline"}}, "audit"), "Declines in the audit log"},
		}
	}
	return []noticeLink{{h.link(nil), "Overview"}}
}

// onceRefused answers a POST whose one-time value was not taken: sent
// before, too old, or none of this console's. Nothing is changed.
func (h *Handler) onceRefused(q *req, verdict onceVerdict, first onceState) {
	d := noticeData{Class: "error", Links: h.resultLinks(q)}
	status, title := http.StatusForbidden, "Form not sent"
	switch verdict {
	case onceTaken:
		status, title = http.StatusConflict, "Already sent"
		switch first {
		case onceMade:
			d.Class, title = "done", "Already made"
			d.Message = "This change was already made: this form was sent before (a second click, or a reload of the page that answered it). Nothing was changed this time; the result is on the pages linked below."
			if len(q.parts) == 3 && q.parts[2] == "keys" {
				d.Message += " The new key was shown once, on the answer to the first; if it was not copied, revoke that key and create another."
			}
		case onceInFlight:
			d.Message = "This form was sent a moment ago and that change is being made now. Nothing was changed by sending it again; see the result on the pages linked below."
		default:
			d.Message = "This form was sent before and that attempt failed (see the server log): the change may or may not have been made. Nothing was changed this time: look at the pages linked below and make the change from there if it is still needed."
		}
	case onceStale:
		d.Message = "This form is too old to send (a form can be sent within " + onceTTLWords + " of being shown). Nothing was changed: open the page again and make the change from there if it is still needed."
	default:
		d.Message = "This form lacks its one-time value, or carries one this console did not make. Nothing was changed: open the page again and send its form."
	}
	h.logger.Info("console POST not taken: its one-time form value was spent, stale or missing",
		zap.String("operator", q.who), zap.String("path", q.r.URL.Path), zap.String("verdict", verdictNames[verdict]))
	h.render(q, status, "notice", title, d)
}

var verdictNames = map[onceVerdict]string{onceBad: "missing or not ours", onceStale: "stale", onceTaken: "already taken"}
