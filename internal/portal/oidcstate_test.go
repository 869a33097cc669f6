package portal

import (
	"crypto/tls"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"
)

// TestFlowCookieSealed: a sealed flow opens as it was; one changed by a
// single character, cut short, made up, or past its expiry does not.
func TestFlowCookieSealed(t *testing.T) {
	now := time.Now()
	f := oidcFlow{State: "s", Nonce: "n", Verifier: "v", Return: "/", Expires: now.Add(oidcFlowTTL)}
	sealed := sealFlow(f)
	got, err := openFlow(sealed, now)
	if err != nil || got.State != "s" || got.Nonce != "n" || got.Verifier != "v" || got.Return != "/" {
		t.Fatalf("open: %+v %v", got, err)
	}
	flip := []byte(sealed)
	if flip[20] == 'A' {
		flip[20] = 'B'
	} else {
		flip[20] = 'A'
	}
	for name, v := range map[string]string{
		"changed":   string(flip),
		"cut short": sealed[:len(sealed)-4],
		"made up":   "eyJzIjoicyJ9",
		"empty":     "",
	} {
		if _, err := openFlow(v, now); !errors.Is(err, errFlowCookie) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := openFlow(sealed, now.Add(oidcFlowTTL)); !errors.Is(err, errFlowCookie) {
		t.Errorf("expired: %v", err)
	}
}

// TestFlowCookieAttributes: Lax (the callback is a navigation from the
// provider), HttpOnly, under the portal's /oidc/ path, and Secure except
// over plain HTTP on loopback; the portal's other cookies are Secure by
// the same rule.
func TestFlowCookieAttributes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		remote string
		tls    bool
		secure bool
	}{
		{"plain on loopback", "127.0.0.1:5000", false, false},
		{"plain on IPv6 loopback", "[::1]:5000", false, false},
		{"plain from afar (allow_plain_http)", "192.0.2.7:5000", false, true},
		{"TLS", "192.0.2.7:5000", true, true},
	} {
		r := httptest.NewRequest(http.MethodGet, "/oidc/start", nil)
		r.RemoteAddr = tc.remote
		if tc.tls {
			r.TLS = &tls.ConnectionState{}
		}
		q := &request{r: r, base: "/portal"}
		c := q.flowCookie("v", 600)
		if c.Secure != tc.secure || !c.HttpOnly || c.SameSite != http.SameSiteLaxMode || c.Path != "/portal/oidc/" {
			t.Errorf("%s: %+v", tc.name, c)
		}
		// The session and pre-session cookies follow the same rule; they
		// were Secure over TLS only, and not behind a proxy that
		// terminates it (a review of security by default).
		if c := q.cookie(sessionCookie, "v", 600); c.Secure != tc.secure || !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/portal/" {
			t.Errorf("%s: session cookie %+v", tc.name, c)
		}
	}
}

// TestSpentStates: a state is spent once; past the bound, expired
// states make room and live ones do not.
func TestSpentStates(t *testing.T) {
	s := &spentStates{m: make(map[string]time.Time)}
	now := time.Now()
	if err := s.spend("a", now.Add(time.Minute), now); err != nil {
		t.Fatal(err)
	}
	if err := s.spend("a", now.Add(time.Minute), now); !errors.Is(err, errStateSpent) {
		t.Fatalf("second use: %v", err)
	}
	for i := range maxSpentStates - 1 {
		s.m["k"+strconv.Itoa(i)] = now.Add(time.Minute)
	}
	if err := s.spend("b", now.Add(time.Minute), now); !errors.Is(err, errStatesFull) {
		t.Fatalf("full: %v", err)
	}
	if err := s.spend("b", now.Add(time.Hour), now.Add(2*time.Minute)); err != nil {
		t.Fatalf("after the others expired: %v", err)
	}
	if err := s.spend("a", now.Add(time.Hour), now.Add(2*time.Minute)); err != nil {
		t.Fatalf("a spent state is forgotten only once its flow has expired: %v", err)
	}
}
