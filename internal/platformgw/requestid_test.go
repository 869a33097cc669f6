package platformgw

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/google/uuid"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/store"
)

// TestNewRequestID: a version 4, RFC 4122 variant UUID in the canonical
// lower-case text form uuid.NewString wrote, different every time, in
// one allocation.
func TestNewRequestID(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := newRequestID()
		u, err := uuid.Parse(id)
		if err != nil || u.String() != id || u.Version() != 4 || u.Variant() != uuid.RFC4122 {
			t.Fatalf("%q: %v (version %d, variant %v)", id, err, u.Version(), u.Variant())
		}
		if seen[id] {
			t.Fatalf("%q twice", id)
		}
		seen[id] = true
	}
	if raceDetector {
		return // the race detector adds allocations of its own
	}
	if n := testing.AllocsPerRun(100, func() { newRequestID() }); n > 1 {
		t.Errorf("newRequestID made %.0f allocations, want 1", n)
	}
}

// TestPublishPlaceholders: a call publishes its caller and route only once
// its key is accepted, each value once the call got that far, and answers
// no other placeholder (never the key's hash).
func TestPublishPlaceholders(t *testing.T) {
	newReq := func() (*http.Request, *caddy.Replacer) {
		repl := caddy.NewReplacer()
		r := httptest.NewRequest("POST", "/api/service/svc/endpoint/ep/invoke", nil)
		return r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl)), repl
	}
	all := []string{phUserID, phKeyID, phServiceID, phEndpointID, phProductID}

	r, repl := newReq()
	(&call{}).publish(r) // no key accepted
	for _, k := range all {
		if v, ok := repl.Get(k); ok {
			t.Errorf("%s = %v before a key was accepted", k, v)
		}
	}

	r, repl = newReq()
	c := &call{key: store.KeyRecord{ID: "kid-1", UserID: "u-1", Hash: [32]byte{1}}}
	c.publish(r)
	want := map[string]any{phUserID: "u-1", phKeyID: "kid-1"}
	for _, k := range all {
		if v, ok := repl.Get(k); v != want[k] || ok != (want[k] != nil) {
			t.Errorf("key only: %s = %v, %v; want %v", k, v, ok, want[k])
		}
	}
	// The provider reads the call when a placeholder is asked for, so
	// the service, endpoint and product appear once the call has them.
	c.svc = &catalog.Service{ID: "svc"}
	c.ep = &catalog.Endpoint{ID: "ep"}
	c.product = &billing.Product{ID: "prod"}
	want = map[string]any{phUserID: "u-1", phKeyID: "kid-1", phServiceID: "svc", phEndpointID: "ep", phProductID: "prod"}
	for _, k := range all {
		if v, _ := repl.Get(k); v != want[k] {
			t.Errorf("%s = %v, want %v", k, v, want[k])
		}
	}
	if v, ok := repl.Get("http.platform.key_hash"); ok {
		t.Errorf("unknown placeholder answered: %v", v)
	}
}

// TestRequestIDOutsideCaddy: without Caddy's replacer and access log fields
// in the request's context (where {http.request.uuid} cannot be read), a
// fresh version 4 UUID.
func TestRequestIDOutsideCaddy(t *testing.T) {
	r := httptest.NewRequest("GET", "/", nil)
	a, b := requestID(r), requestID(r)
	if u, err := uuid.Parse(a); err != nil || u.Version() != 4 || a == b {
		t.Errorf("%q, %q: %v", a, b, err)
	}
}

// TestNewFastRequestID: the sync call's generator makes the same kind of
// id as newRequestID (a version 4, RFC 4122 variant UUID in canonical
// text form), different every time, in one allocation.
func TestNewFastRequestID(t *testing.T) {
	seen := map[string]bool{}
	for range 10000 {
		id := newFastRequestID()
		u, err := uuid.Parse(id)
		if err != nil || u.String() != id || u.Version() != 4 || u.Variant() != uuid.RFC4122 {
			t.Fatalf("%q: %v (version %d, variant %v)", id, err, u.Version(), u.Variant())
		}
		if seen[id] {
			t.Fatalf("%q twice", id)
		}
		seen[id] = true
	}
	if raceDetector {
		return
	}
	if n := testing.AllocsPerRun(100, func() { newFastRequestID() }); n > 1 {
		t.Errorf("newFastRequestID made %.0f allocations, want 1", n)
	}
}

// TestSyncRequestIDIsCaddys: in a request Caddy prepared, a sync call's id
// is what {http.request.uuid} answers from then on, and a UUID Caddy made
// before (something read the placeholder first) is kept.
func TestSyncRequestIDIsCaddys(t *testing.T) {
	prepared := func() (*http.Request, *caddy.Replacer) {
		repl := caddy.NewReplacer()
		w := httptest.NewRecorder()
		r := caddyhttp.PrepareRequest(httptest.NewRequest("GET", "/", nil), repl, w, nil)
		return r, repl
	}
	r, repl := prepared()
	id := invokeRequestID(r)
	if u, err := uuid.Parse(id); err != nil || u.Version() != 4 {
		t.Fatalf("%q: %v", id, err)
	}
	for range 2 {
		if v, _ := repl.GetString(caddyUUIDPlaceholder); v != id {
			t.Errorf("{http.request.uuid} = %q, the call's id %q", v, id)
		}
	}
	r, repl = prepared()
	first, _ := repl.GetString(caddyUUIDPlaceholder)
	if got := invokeRequestID(r); got != first || first == "" {
		t.Errorf("Caddy's UUID %q was read first; the call's id is %q", first, got)
	}
}

func BenchmarkRequestID(b *testing.B) {
	b.Run("crypto", func(b *testing.B) {
		for b.Loop() {
			newRequestID()
		}
	})
	b.Run("fast", func(b *testing.B) {
		for b.Loop() {
			newFastRequestID()
		}
	})
}
