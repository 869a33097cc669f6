package portal

import (
	"testing"
	"time"
)

// TestSessionStore: sessions expire, are swept, and the store refuses new
// ones when full of live ones.
func TestSessionStore(t *testing.T) {
	s := &sessionStore{m: make(map[string]session)}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	id, ok := s.create(session{UserID: "u", Expires: t0.Add(time.Minute)}, t0)
	if !ok || len(id) != 43 {
		t.Fatalf("create: %q %v", id, ok)
	}
	if _, ok := s.get(id, t0.Add(59*time.Second)); !ok {
		t.Error("a live session is not found")
	}
	if _, ok := s.get(id, t0.Add(time.Minute)); ok {
		t.Error("an expired session is found")
	}
	if s.count() != 0 {
		t.Error("an expired session is kept after it was asked for")
	}
	// Expired sessions nobody asks for again are swept by later sign-ins.
	for range sweepEvery - 2 { // the next create is the sweepEvery-th
		s.create(session{Expires: t0.Add(time.Minute)}, t0)
	}
	s.create(session{Expires: t0.Add(time.Hour)}, t0.Add(2*time.Minute))
	if n := s.count(); n != 1 {
		t.Errorf("%d sessions after the sweep, want 1", n)
	}
	if _, ok := s.get("", t0); ok {
		t.Error("the empty id is a session")
	}
	if sameToken("", "") || sameToken("a", "") || !sameToken("abc", "abc") || sameToken("abd", "abc") {
		t.Error("sameToken")
	}
}
