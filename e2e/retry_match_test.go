package e2e

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// TestRetryMatchNeverResends: Caddy's lb_retry_match may retry on the
// backend's answer ({rp.status_code}), not only on a transport error.
// That attempt succeeded at the transport, so the gateway's rule "a call
// reaches its backend at most once" did not stop it: the backend got the
// same signed request (one signature, one timestamp) twice, and a backend
// refusing replays answers the second with a 4xx, which is charged. The
// call goes out once; the caller gets 502 service_error, not charged.
func TestRetryMatchNeverResends(t *testing.T) {
	var mu sync.Mutex
	var sigs []string
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		sigs = append(sigs, r.Header.Get("X-Platform-Signature")+"@"+r.Header.Get("X-Platform-Timestamp"))
		n := len(sigs)
		mu.Unlock()
		if n == 1 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("X-Platform-Units", "3")
		w.Write([]byte("done"))
	}))
	t.Cleanup(be.Close)
	g := startGatewayWithProxy(t, t.TempDir(), goneCatalog(be.URL), "", "",
		"lb_retries 2\n\t\tlb_retry_match {\n\t\t\texpression `{rp.status_code} in [502, 503]`\n\t\t}")
	key, _ := g.newKey("retry-match")
	g.subscribe("retry-match", "gone", "token", "ACTIVE")
	resp, body := call(t, "GET", invokeURL("gone", "slow"), key, "")
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	got := append([]string(nil), sigs...)
	mu.Unlock()
	if len(got) != 1 {
		t.Fatalf("the backend got the call %d times (signature@timestamp %q), want once; caller got %d %s",
			len(got), got, resp.StatusCode, body)
	}
	if resp.StatusCode != http.StatusBadGateway || errorCode(t, resp, body) != "service_error" {
		t.Fatalf("caller got %d %s, want 502 service_error", resp.StatusCode, body)
	}
	if es := g.ledger("retry-match"); len(es) != 0 {
		t.Fatalf("ledger %+v, want nothing charged", es)
	}
}
