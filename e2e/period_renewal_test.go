package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/e2etest"
	"github.com/platformgw/gateway/internal/store"
)

// TestCallsAcrossARenewal: a sync call and an async job are in flight,
// holding the last units of a blocked daily quota, when the period
// renews (the app's clock moved past it). Each is charged to the period
// it was admitted in, once: the new period's quota is whole for the
// calls made in it, and stays whole when the two settle; the job's
// completion claiming more than its hold is cut at the old period's
// limit to its hold, never spilling into the new period. (A run of the
// fourth outside attack: this held; no test had a call straddle a
// renewal.)
func TestCallsAcrossARenewal(t *testing.T) {
	arrived, release, stop := make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	jobs := make(chan usageEnvelope, 1)
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		switch {
		case strings.HasSuffix(r.URL.Path, "/job"):
			var env usageEnvelope
			json.Unmarshal(raw, &env)
			jobs <- env
			w.WriteHeader(http.StatusAccepted)
			return
		case strings.HasSuffix(r.URL.Path, "/slow"):
			arrived <- struct{}{}
			select {
			case <-release:
			case <-stop: // the test failed: never hold up its cleanup
			}
		}
		io.WriteString(w, "ok")
	}))
	t.Cleanup(be.Close)
	t.Cleanup(func() { close(stop) })
	g := startGateway(t, t.TempDir(), fmt.Sprintf(`
		job_ttl 48h
		service renew {
			backend %s
			secret %s
			endpoint echo {
				path /echo
			}
			endpoint slow {
				path /slow
			}
			endpoint job {
				async
				path /job
			}
			product daily {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 3 per day
			}
		}`, be.URL, usageSecret))
	defer g.app().SetClock(nil)
	ctx := context.Background()
	const user = "renew-1"
	now := time.Now().UTC()
	start := now.Add(-12 * time.Hour) // the period ends in 12 hours
	if _, err := g.store().PutSubscription(ctx, store.Subscription{UserID: user, ServiceID: "renew", ProductID: "daily",
		Status: "ACTIVE", StartedAt: start, UpdatedAt: start}); err != nil {
		t.Fatal(err)
	}
	key, _ := g.newKey(user)
	invoke := func(want int) {
		t.Helper()
		if resp, body := call(t, "GET", invokeURL("renew", "echo"), key, ""); resp.StatusCode != want {
			t.Fatalf("call: %d %s, want %d", resp.StatusCode, body, want)
		}
	}

	invoke(200)
	slow := make(chan int, 1)
	go func() {
		resp, _, err := raceInvokeResp(invokeURL("renew", "slow"), key)
		if err != nil {
			slow <- -1
			return
		}
		slow <- resp.StatusCode
	}()
	select {
	case <-arrived:
	case code := <-slow:
		t.Fatalf("the slow call ended before reaching the backend: %d", code)
	}
	if resp, body := call(t, "POST", asyncURL("/api", "renew", "job"), key, "{}", "Content-Type", "application/json"); resp.StatusCode != 202 {
		t.Fatalf("async invoke: %d %s", resp.StatusCode, body)
	}
	env := <-jobs
	invoke(429) // 1 used, 2 held: the quota is full

	// The period renews while both are in flight.
	next := start.Add(24*time.Hour + time.Minute)
	g.app().SetClock(func() time.Time { return next })
	for range 3 {
		invoke(200)
	}
	invoke(429)

	release <- struct{}{}
	if code := <-slow; code != 200 {
		t.Fatalf("the slow call: %d", code)
	}
	ts := usageURLTimestamp(t, env.CallbackURL)
	body := `{"status":"COMPLETED","units":2,"timestamp":` + ts + `}`
	if status, answer, err := asyncPost(env.CallbackURL, body, "Content-Type", "application/json",
		"X-Platform-Signature", e2etest.UsageSign(usageSecret, []byte(body), ts), "X-Platform-Timestamp", ts); err != nil || status != 200 {
		t.Fatalf("completion: %d %s %v", status, answer, err)
	}
	invoke(429) // the new period's quota did not get them

	p := productOfService(t, g, "renew", "daily")
	for _, at := range []time.Time{now, next} {
		st, err := g.store().State(ctx, store.Account{UserID: user, ServiceID: "renew", Product: p}, at)
		if err != nil {
			t.Fatal(err)
		}
		if st.Used != billing.Whole(3) || st.Reserved != 0 {
			t.Errorf("period of %s: %+v; want 3 used, nothing held", at.Format(time.RFC3339), st)
		}
	}
	es := g.ledger(user)
	var job *store.LedgerEntry
	for i := range es {
		if es[i].Source == store.SourceCompletion {
			job = &es[i]
		}
	}
	if len(es) != 6 || ledgerSum(es) != billing.Whole(6) || job == nil ||
		job.Units != billing.Whole(1) || job.UnitsClaimed != billing.Whole(2) {
		t.Errorf("ledger %+v; want 6 rows of 1, the job's claiming 2", es)
	}
}
