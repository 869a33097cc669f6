package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/e2etest"
	"github.com/platformgw/gateway/internal/store"
)

// asyncQuotaCatalog is the platform block of the async quota tests: an
// async service whose products have hard limits.
func asyncQuotaCatalog(backend string) string {
	return fmt.Sprintf(`
		job_ttl 1h
		service quota {
			backend %s
			secret %s
			endpoint job {
				async
				path /job
			}
			endpoint refuse {
				async
				path /refuse
			}
			product ten {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 10
				overage block
			}
			product one {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 1
				overage block
			}
			product credits {
				billing PREPAID
				measurement PER_REQUEST
				unit request
				price 1
			}
		}`, backend, usageSecret)
}

// asyncReserved is what a subscription holds for its jobs in flight.
func asyncReserved(t *testing.T, g *gateway, user string) billing.State {
	t.Helper()
	p, ok := usageProduct(g, user, "quota")
	if !ok {
		t.Fatalf("no product for %s", user)
	}
	st, err := g.store().State(context.Background(), store.Account{UserID: user, ServiceID: "quota", Product: p}, g.app().Now())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// asyncPost is a request that may run off the test's goroutine: it
// reports failures instead of stopping the test.
func asyncPost(url, body string, hdr ...string) (int, []byte, error) {
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	return resp.StatusCode, answer, err
}

// TestAsyncQuotaConcurrent: async jobs reserve the endpoint's cost at
// invoke, so jobs started at once never pass a blocked quota, and their
// completions never charge past it.
func TestAsyncQuotaConcurrent(t *testing.T) {
	be := newUsageBackend(t, usageSecret)
	g := startGateway(t, t.TempDir(), asyncQuotaCatalog(be.URL))
	key, _ := g.newKey("u-burst")
	g.subscribe("u-burst", "quota", "ten", "ACTIVE")

	const callers = 30
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		statuses = map[int]int{}
		codes    = map[string]int{}
	)
	start := make(chan struct{})
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			status, body, err := asyncPost(asyncURL("/api", "quota", "job"), "{}", "Authorization", "Bearer "+key, "Content-Type", "application/json")
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("invoke: %v", err)
				return
			}
			statuses[status]++
			var e struct{ Code string }
			json.Unmarshal(body, &e)
			codes[e.Code]++
		}()
	}
	close(start)
	wg.Wait()
	if statuses[http.StatusAccepted] != 10 || statuses[http.StatusTooManyRequests] != callers-10 || codes["quota_exceeded"] != callers-10 {
		t.Fatalf("statuses %v, codes %v; want 10 × 202 and %d × 429 quota_exceeded", statuses, codes, callers-10)
	}
	envs := make([]usageEnvelope, 10)
	for i := range envs {
		envs[i] = be.next(t)
	}
	select {
	case env := <-be.jobs:
		t.Fatalf("a refused job reached the backend: %s", env.Raw)
	default:
	}
	if st := asyncReserved(t, g, "u-burst"); st.Reserved != billing.Whole(10) || st.Used != 0 {
		t.Errorf("state %+v, want the 10 jobs holding 10", st)
	}
	// The allowance headers count the jobs in flight.
	resp, body := call(t, "POST", asyncURL("/api", "quota", "job"), key, "{}")
	if resp.StatusCode != 429 || resp.Header.Get("X-RateLimit-Remaining") != "0" || resp.Header.Get("Retry-After") == "" {
		t.Errorf("with the quota held: %d %s %v", resp.StatusCode, body, resp.Header)
	}

	// Every backend completes at once, each stating 2 units: the jobs
	// together are charged the quota, not a unit more.
	for _, env := range envs {
		ts := usageURLTimestamp(t, env.CallbackURL)
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := `{"status":"COMPLETED","units":2,"timestamp":` + ts + `}`
			status, answer, err := asyncPost(env.CallbackURL, body, "Content-Type", "application/json",
				"X-Platform-Signature", e2etest.UsageSign(usageSecret, []byte(body), ts), "X-Platform-Timestamp", ts)
			if err != nil || status != 200 {
				t.Errorf("complete: %d %s %v", status, answer, err)
			}
		}()
	}
	wg.Wait()
	es := g.ledger("u-burst")
	if len(es) != 10 || ledgerSum(es) != billing.Whole(10) {
		t.Fatalf("ledger %+v, want 10 completions charging 10 in all", es)
	}
	for _, e := range es {
		if e.Source != store.SourceCompletion || e.Units != billing.Whole(1) || e.UnitsClaimed != billing.Whole(2) {
			t.Errorf("entry %+v, want 1 charged of 2 claimed", e)
		}
	}
	if st := asyncReserved(t, g, "u-burst"); st.Reserved != 0 || st.Used != billing.Whole(10) {
		t.Errorf("state %+v, want exactly the quota used", st)
	}
	resp, body = call(t, "POST", asyncURL("/api", "quota", "job"), key, "{}")
	if resp.StatusCode != 429 || errorCode(t, resp, body) != "quota_exceeded" {
		t.Errorf("with the quota used: %d %s", resp.StatusCode, body)
	}
}

// TestAsyncHoldReleased: every way a job ends without being charged gives
// its reservation back, and a job's reservation survives a restart.
func TestAsyncHoldReleased(t *testing.T) {
	be := newUsageBackend(t, usageSecret)
	dir := t.TempDir()
	g := startGateway(t, dir, asyncQuotaCatalog(be.URL))
	key, _ := g.newKey("u-one")
	g.subscribe("u-one", "quota", "one", "ACTIVE")
	job := asyncURL("/api", "quota", "job")
	overQuota := func(what string) {
		t.Helper()
		resp, body := call(t, "POST", job, key, "{}")
		if resp.StatusCode != 429 || errorCode(t, resp, body) != "quota_exceeded" {
			t.Fatalf("%s: %d %s, want quota_exceeded", what, resp.StatusCode, body)
		}
	}

	// The backend refuses the envelope: the job fails and its hold goes.
	resp, body := call(t, "POST", asyncURL("/api", "quota", "refuse"), key, "{}")
	be.next(t)
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("refused job: %d %s", resp.StatusCode, body)
	}
	if st := asyncReserved(t, g, "u-one"); st.Reserved != 0 || st.Used != 0 {
		t.Fatalf("after the backend refused: %+v, want nothing held", st)
	}
	acc, env := usageStart(t, be, job, key, "{}")
	overQuota("with one job running")

	// A restart keeps the running job's hold.
	g.tester.InitServer(fmt.Sprintf("{\n\tadmin localhost:%d\n}\n", adminPort), "caddyfile")
	g = startGateway(t, dir, asyncQuotaCatalog(be.URL))
	if st := asyncReserved(t, g, "u-one"); st.Reserved != billing.Whole(1) {
		t.Fatalf("after a restart: %+v, want the job's hold kept", st)
	}
	overQuota("after a restart")

	// The backend fails the job: released, nothing charged.
	ts := usageURLTimestamp(t, env.CallbackURL)
	resp, body = usagePost(t, usageSigned{URL: acc.CallbackURL, Body: `{"status":"FAILED","units":1,"timestamp":` + ts + `}`, Secret: usageSecret, Timestamp: ts})
	if resp.StatusCode != 200 {
		t.Fatalf("failed completion: %d %s", resp.StatusCode, body)
	}
	if st := asyncReserved(t, g, "u-one"); st.Reserved != 0 || st.Used != 0 {
		t.Fatalf("after a FAILED completion: %+v", st)
	}

	// The job expires: the sweep releases it.
	usageStart(t, be, job, key, "{}")
	overQuota("with another job running")
	g.app().SetClock(func() time.Time { return time.Now().Add(61 * time.Minute) })
	g.app().RunMaintenance(context.Background())
	if st := asyncReserved(t, g, "u-one"); st.Reserved != 0 || st.Used != 0 {
		t.Fatalf("after expiry: %+v", st)
	}
	acc, env = usageStart(t, be, job, key, "{}")

	// Completed: the hold becomes the charge.
	ts = usageURLTimestamp(t, env.CallbackURL)
	resp, body = usagePost(t, usageSigned{URL: acc.CallbackURL, Body: `{"status":"COMPLETED","timestamp":` + ts + `}`, Secret: usageSecret, Timestamp: ts})
	if resp.StatusCode != 200 {
		t.Fatalf("completion: %d %s", resp.StatusCode, body)
	}
	if st := asyncReserved(t, g, "u-one"); st.Reserved != 0 || st.Used != billing.Whole(1) {
		t.Fatalf("after completion: %+v", st)
	}
	if es := g.ledger("u-one"); len(es) != 1 || es[0].Units != billing.Whole(1) || es[0].RequestID != acc.RequestID {
		t.Errorf("ledger %+v", es)
	}
	overQuota("with the quota used")
}

// TestAsyncPrepaidHold: a job holds its cost in credits, so jobs started
// at once never spend more than the balance.
func TestAsyncPrepaidHold(t *testing.T) {
	be := newUsageBackend(t, usageSecret)
	g := startGateway(t, t.TempDir(), asyncQuotaCatalog(be.URL))
	key, _ := g.newKey("u-credits")
	g.subscribe("u-credits", "quota", "credits", "ACTIVE")
	g.credits("u-credits", "quota", "2")
	job := asyncURL("/api", "quota", "job")
	var accs []usageAccepted
	var envs []usageEnvelope
	for range 2 {
		acc, env := usageStart(t, be, job, key, "{}")
		accs, envs = append(accs, acc), append(envs, env)
	}
	resp, body := call(t, "POST", job, key, "{}")
	if resp.StatusCode != 403 || errorCode(t, resp, body) != "insufficient_credits" {
		t.Fatalf("third job on a balance of 2: %d %s", resp.StatusCode, body)
	}
	for i, env := range envs {
		ts := usageURLTimestamp(t, env.CallbackURL)
		resp, body := usagePost(t, usageSigned{URL: accs[i].CallbackURL, Body: `{"status":"COMPLETED","units":5,"timestamp":` + ts + `}`, Secret: usageSecret, Timestamp: ts})
		if resp.StatusCode != 200 {
			t.Fatalf("completion: %d %s", resp.StatusCode, body)
		}
	}
	sub, err := g.store().GetSubscription(context.Background(), "u-credits", "quota")
	if err != nil || sub.Credits != 0 || sub.CreditsHeld != 0 {
		t.Errorf("balance %+v, %v; want spent to exactly 0", sub, err)
	}
	if got := ledgerSum(g.ledger("u-credits")); got != billing.Whole(2) {
		t.Errorf("charged %s, want 2", got)
	}
}

// TestRefusedCompletionRaisesNoHold: a completion the gateway refuses (409:
// the job finished already, with 1 unit) charges nothing, and must not
// become what the caller's next jobs hold either. Its 10 units were noted
// before the store decided, so with a quota of 10 and 1 used the next job
// was refused 429 quota_exceeded. The same steps without the refused
// completion accept the next job.
func TestRefusedCompletionRaisesNoHold(t *testing.T) {
	for _, refused := range []bool{false, true} {
		t.Run(fmt.Sprintf("refused=%v", refused), func(t *testing.T) {
			be := newUsageBackend(t, usageSecret)
			g := startGateway(t, t.TempDir(), asyncQuotaCatalog(be.URL))
			key, _ := g.newKey("u-note")
			g.subscribe("u-note", "quota", "ten", "ACTIVE")
			acc, _ := usageStart(t, be, asyncURL("/api", "quota", "job"), key, "{}")
			ts := fmt.Sprint(time.Now().Unix())
			ok := `{"status":"COMPLETED","units":1,"timestamp":` + ts + `}`
			if resp, body := usagePost(t, usageSigned{URL: acc.CallbackURL, Body: ok, Secret: usageSecret, Timestamp: ts}); resp.StatusCode != 200 {
				t.Fatalf("completion: %d %s", resp.StatusCode, body)
			}
			if refused {
				late := `{"status":"COMPLETED","units":10,"timestamp":` + ts + `}`
				resp, body := usagePost(t, usageSigned{URL: acc.CallbackURL, Body: late, Secret: usageSecret, Timestamp: ts})
				if resp.StatusCode != http.StatusConflict {
					t.Fatalf("a second, different completion: %d %s, want 409", resp.StatusCode, body)
				}
			}
			if u := ledgerSum(g.ledger("u-note")); u.String() != "1" {
				t.Fatalf("ledger %s, want 1", u)
			}
			// 1 of 10 used: a job costing 1 fits.
			resp, body := call(t, "POST", asyncURL("/api", "quota", "job"), key, "{}", "Content-Type", "application/json")
			if resp.StatusCode != http.StatusAccepted {
				t.Errorf("next job: %d %s (state %+v), want 202", resp.StatusCode, body, asyncReserved(t, g, "u-note"))
			}
		})
	}
}
