package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
)

// slowBackend answers after 3 s, or never when the gateway gives up on it
// first; it counts the requests that reached it.
func slowBackend(t *testing.T, hits *atomic.Int64) *httptest.Server {
	t.Helper()
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		select {
		case <-r.Context().Done():
			return
		case <-time.After(3 * time.Second):
		}
		w.Header().Set("X-Platform-Units", "7")
		w.Write([]byte("late"))
	}))
	t.Cleanup(be.Close)
	return be
}

func goneCatalog(backend string) string {
	return fmt.Sprintf(`
		service gone {
			backend %[1]s
			secret %[2]s
			endpoint slow {
				methods GET
				streaming
			}
			product request {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 5
			}
			product second {
				billing USAGE_POSTPAID
				measurement PER_TIME_UNIT
				unit second
				price 0.01
			}
			product token {
				billing USAGE_POSTPAID
				measurement PER_TOKEN
				unit token
				price 0.001
			}
		}
		service gonewrap {
			backend %[1]s
			secret %[2]s
			sync_response wrapped
			endpoint slow {
				methods GET
			}
			product prepaid {
				billing PREPAID
				measurement PER_REQUEST
				unit request
				price 2
			}
		}`, backend, testSecret)
}

// TestCallerGoneBeforeAnswerNotCharged: a caller that hangs up (or a
// balancer in front that gives up) before the backend's status line is
// charged nothing, whatever the measurement (docs/wire-contract.md, "What
// is charged when": no status line, nothing), and its hold is released.
// Caddy's reverse proxy writes a 499 for the cancelled request, which the
// metering took for the backend's answer: a PER_REQUEST call was charged
// its unit, a PER_TIME_UNIT call the seconds until the hang-up, and a
// wrapped prepaid call its credits.
func TestCallerGoneBeforeAnswerNotCharged(t *testing.T) {
	var hits atomic.Int64
	be := slowBackend(t, &hits)
	g := startGateway(t, t.TempDir(), goneCatalog(be.URL))
	for _, tc := range []struct{ service, product string }{
		{"gone", "request"}, {"gone", "second"}, {"gone", "token"}, {"gonewrap", "prepaid"},
	} {
		t.Run(tc.product, func(t *testing.T) {
			user := "gone-" + tc.product
			key, _ := g.newKey(user)
			g.subscribe(user, tc.service, tc.product, "ACTIVE")
			if tc.product == "prepaid" {
				g.credits(user, tc.service, "10")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 1200*time.Millisecond)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", invokeURL(tc.service, "slow"), nil)
			req.Header.Set("Authorization", "Bearer "+key)
			if resp, err := http.DefaultClient.Do(req); !errors.Is(err, context.DeadlineExceeded) {
				if err == nil {
					resp.Body.Close()
				}
				t.Fatalf("the caller got an answer (%v) before it gave up", err)
			}
			// The gateway's handler unwinds once the proxy sees the
			// cancellation: bounded wait for the hold to go.
			var st billing.State
			for range 200 {
				if st = raceState(t, g, user, tc.service); st.Reserved == 0 && st.ReservedSpend == 0 && st.CreditsHeld == 0 {
					break
				}
				time.Sleep(25 * time.Millisecond)
			}
			time.Sleep(200 * time.Millisecond) // a settlement would be written with the release
			st = raceState(t, g, user, tc.service)
			if es := g.ledger(user); len(es) != 0 || st.Used != 0 || st.Spend != 0 || st.Reserved != 0 || st.CreditsHeld != 0 {
				t.Fatalf("a call the caller left before any answer: ledger %+v, state %+v; want nothing charged or held", es, st)
			}
			if tc.product == "prepaid" && st.Credits != billing.Whole(10) {
				t.Fatalf("credits %s, want the 10 given", st.Credits)
			}
		})
	}
	if hits.Load() != 4 {
		t.Errorf("the backend got %d requests, want 4", hits.Load())
	}
}

// TestRetriedGetNeverResent: with lb_retries, Caddy retries a GET after
// any transport error, a response_header_timeout too, when the backend
// has the request and may be working on it. The gateway's transport
// sends a call at most once: the retry is refused with the first
// attempt's error, the caller gets 504 service_timeout, the backend ran
// the call once, and nothing is charged. Before, the backend ran it twice
// (under the same signature and timestamp) and the second answer was
// charged.
func TestRetriedGetNeverResent(t *testing.T) {
	var hits atomic.Int64
	be := slowBackend(t, &hits)
	g := startGatewayWithProxy(t, t.TempDir(), goneCatalog(be.URL), "response_header_timeout 300ms", "", "lb_retries 2")
	key, _ := g.newKey("retry-token")
	g.subscribe("retry-token", "gone", "token", "ACTIVE")
	resp, body := call(t, "GET", invokeURL("gone", "slow"), key, "")
	if resp.StatusCode != http.StatusGatewayTimeout || errorCode(t, resp, body) != "service_timeout" {
		t.Fatalf("a call whose backend timed out: %d %s, want 504 service_timeout", resp.StatusCode, body)
	}
	time.Sleep(200 * time.Millisecond)
	if n := hits.Load(); n != 1 {
		t.Fatalf("the backend got the call %d times, want once", n)
	}
	if es := g.ledger("retry-token"); len(es) != 0 {
		t.Fatalf("ledger %+v, want nothing charged", es)
	}
}

// TestBackendRequestIDReplaced: a backend that sends an X-Platform-Request-ID
// of its own (echoing the one it was sent, say) does not give the caller
// two: the answer carries the gateway's, once.
func TestBackendRequestIDReplaced(t *testing.T) {
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Platform-Request-ID", "backend-"+r.Header.Get("X-Platform-Request-ID"))
		w.Write([]byte("ok"))
	}))
	t.Cleanup(be.Close)
	g := startGateway(t, t.TempDir(), goneCatalog(be.URL))
	key, _ := g.newKey("rid")
	g.subscribe("rid", "gone", "request", "ACTIVE")
	resp, body := call(t, "GET", invokeURL("gone", "slow"), key, "")
	ids := resp.Header.Values("X-Platform-Request-Id")
	if resp.StatusCode != http.StatusOK || len(ids) != 1 || len(ids[0]) != 36 {
		t.Fatalf("answer %d %s with request ids %q, want the gateway's one", resp.StatusCode, body, ids)
	}
	if es := g.ledger("rid"); len(es) != 1 || es[0].RequestID != ids[0] {
		t.Fatalf("ledger %+v, want one row under request id %s", es, ids[0])
	}
}
