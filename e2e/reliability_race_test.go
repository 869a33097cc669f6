package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/e2etest"
	"github.com/platformgw/gateway/internal/store"
)

// raceCallers is how many callers race for the last units of a limit.
const raceCallers = 200

const raceSecret = "race-secret-race-secret-race-001"

func raceCatalog(syncBackend, asyncBackend string) string {
	return fmt.Sprintf(`
		job_ttl 1h
		service race {
			backend %s
			secret %s
			endpoint echo {
				path /echo
			}
			product quota {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 50
				overage block
			}
			product prepaid {
				billing PREPAID
				measurement PER_REQUEST
				unit request
				price 2
			}
			product capped {
				billing USAGE_POSTPAID
				measurement PER_REQUEST
				unit request
				price 0.5
				spending_cap 3.5
			}
			product overage {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 10
				overage allow
				price 1
				spending_cap 4
			}
		}
		service racejob {
			backend %s
			secret %s
			endpoint job {
				async
				path /job
			}
			product quota {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 20
				overage block
			}
			product tokens {
				billing USAGE_POSTPAID
				measurement PER_TOKEN
				unit token
				price 0.001
			}
		}`, syncBackend, raceSecret, asyncBackend, usageSecret)
}

// raceAll runs fn for i in [0, n) on n goroutines released together and
// returns how many answers each status got.
func raceAll(n int, fn func(i int) (int, error)) (map[int]int, []error) {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		count = map[int]int{}
		errs  []error
		start = make(chan struct{})
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			status, err := fn(i)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			count[status]++
		}()
	}
	close(start)
	wg.Wait()
	return count, errs
}

// raceInvoke is a sync invoke that may run off the test goroutine.
func raceInvoke(url, key string) (int, []byte, error) {
	return asyncPost(url, "x", "Authorization", "Bearer "+key)
}

// raceReport records units through a signed report, to bring a
// subscription to the edge of its limit.
func raceReport(t *testing.T, secret, user, service, units string) {
	t.Helper()
	resp, body := usagePost(t, usageSigned{URL: usageReportURL, Secret: secret,
		Body: usageReportBody(user, service, units, time.Now().Unix())})
	if resp.StatusCode != 200 {
		t.Fatalf("report: %d %s", resp.StatusCode, body)
	}
}

func raceState(t *testing.T, g *gateway, user, service string) billing.State {
	t.Helper()
	p, ok := usageProduct(g, user, service)
	if !ok {
		t.Fatalf("no product for %s", user)
	}
	st, err := g.store().State(context.Background(), store.Account{UserID: user, ServiceID: service, Product: p}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestRaceLastUnits: 200 callers at once for the last few units of each
// kind of hard limit. Exactly as many succeed as the limit allows, the rest
// are refused with the limit's code, and the ledger and counters end exactly
// at the limit: no overshoot by even one unit.
func TestRaceLastUnits(t *testing.T) {
	be := newTestBackend(t, raceSecret, "Platform")
	jobs := newUsageBackend(t, usageSecret)
	jobs.jobs = make(chan usageEnvelope, 1000) // the race starts many jobs at once
	g := startGateway(t, t.TempDir(), raceCatalog(be.URL, jobs.URL))
	url := invokeURL("race", "echo")

	cases := []struct {
		name, user, product string
		prepare             func(t *testing.T)
		wantOK              int
		refusal             int
		code                string
		check               func(t *testing.T, st billing.State)
	}{
		{
			name: "hard quota", user: "r-quota", product: "quota",
			prepare: func(t *testing.T) { raceReport(t, raceSecret, "r-quota", "race", "43") },
			wantOK:  7, refusal: 429, code: "quota_exceeded",
			check: func(t *testing.T, st billing.State) {
				if st.Used != billing.Whole(50) {
					t.Errorf("used %s, want the quota 50", st.Used)
				}
			},
		},
		{
			name: "prepaid balance", user: "r-prepaid", product: "prepaid",
			prepare: func(t *testing.T) { g.credits("r-prepaid", "race", "13") },
			wantOK:  6, refusal: 403, code: "insufficient_credits",
			check: func(t *testing.T, st billing.State) {
				if st.Credits != billing.Whole(1) || st.CreditsHeld != 0 {
					t.Errorf("credits %s held %s, want 1 and 0", st.Credits, st.CreditsHeld)
				}
			},
		},
		{
			name: "spending cap", user: "r-capped", product: "capped",
			prepare: func(t *testing.T) { raceReport(t, raceSecret, "r-capped", "race", "3") }, // spend 1.5 of 3.5
			wantOK:  4, refusal: 429, code: "quota_exceeded",
			check: func(t *testing.T, st billing.State) {
				if st.Spend != 3_500_000 {
					t.Errorf("spend %s, want the cap 3.5", st.Spend)
				}
			},
		},
		{
			name: "spending cap on overage", user: "r-overage", product: "overage",
			prepare: func(t *testing.T) { raceReport(t, raceSecret, "r-overage", "race", "12") }, // 2 overage = spend 2 of 4
			wantOK:  2, refusal: 429, code: "quota_exceeded",
			check: func(t *testing.T, st billing.State) {
				if st.Spend != billing.Whole(4) || st.Used != billing.Whole(14) {
					t.Errorf("spend %s used %s, want 4 and 14", st.Spend, st.Used)
				}
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			key, _ := g.newKey(tc.user)
			g.subscribe(tc.user, "race", tc.product, "ACTIVE")
			tc.prepare(t)
			ledgerBefore := ledgerSum(g.ledger(tc.user))
			seenBefore := be.count()
			var codeMu sync.Mutex
			codes := map[string]int{}
			count, errs := raceAll(raceCallers, func(int) (int, error) {
				status, body, err := raceInvoke(url, key)
				if err == nil && status != 200 {
					var e struct{ Code string }
					json.Unmarshal(body, &e)
					codeMu.Lock()
					codes[e.Code]++
					codeMu.Unlock()
				}
				return status, err
			})
			if len(errs) > 0 {
				t.Fatalf("%d transport errors, first %v", len(errs), errs[0])
			}
			if count[200] != tc.wantOK || count[tc.refusal] != raceCallers-tc.wantOK || codes[tc.code] != raceCallers-tc.wantOK {
				t.Errorf("answers %v codes %v, want %d × 200 and %d × %d %s", count, codes, tc.wantOK, raceCallers-tc.wantOK, tc.refusal, tc.code)
			}
			if got := be.count() - seenBefore; got != tc.wantOK {
				t.Errorf("the backend served %d calls, want %d", got, tc.wantOK)
			}
			if got := ledgerSum(g.ledger(tc.user)) - ledgerBefore; got != billing.Whole(int64(tc.wantOK)) {
				t.Errorf("ledger grew by %s, want %d", got, tc.wantOK)
			}
			st := raceState(t, g, tc.user, "race")
			if st.Reserved != 0 || st.ReservedSpend != 0 {
				t.Errorf("holds left after the race: %+v", st)
			}
			tc.check(t, st)
			t.Logf("%d callers: %v", raceCallers, count)
		})
	}

	t.Run("async jobs for the last units of a hard quota", func(t *testing.T) {
		key, _ := g.newKey("r-jobs")
		g.subscribe("r-jobs", "racejob", "quota", "ACTIVE")
		raceReport(t, usageSecret, "r-jobs", "racejob", "15")
		count, errs := raceAll(raceCallers, func(int) (int, error) {
			status, _, err := asyncPost(asyncURL("/api", "racejob", "job"), "x", "Authorization", "Bearer "+key)
			return status, err
		})
		if len(errs) > 0 || count[202] != 5 || count[429] != raceCallers-5 {
			t.Fatalf("answers %v (errors %v), want 5 × 202", count, errs)
		}
		st := raceState(t, g, "r-jobs", "racejob")
		if st.Used+st.Reserved != billing.Whole(20) {
			t.Errorf("used %s + held %s, want the quota 20", st.Used, st.Reserved)
		}
		// Completing every job with more units than it holds still ends at
		// the quota: the store cuts each charge at the limit.
		for range 5 {
			env := jobs.next(t)
			body := fmt.Sprintf(`{"status":"COMPLETED","units":3,"timestamp":%d}`, time.Now().Unix())
			resp, rb := usagePost(t, usageSigned{URL: gwBase + "/api/usage/complete/" + env.RequestID, Secret: usageSecret, Body: body})
			if resp.StatusCode != 200 {
				t.Fatalf("completion: %d %s", resp.StatusCode, rb)
			}
		}
		st = raceState(t, g, "r-jobs", "racejob")
		if st.Used != billing.Whole(20) || st.Reserved != 0 {
			t.Errorf("after the completions %+v, want used 20 and nothing held", st)
		}
		if got := ledgerSum(g.ledger("r-jobs")); got != billing.Whole(20) {
			t.Errorf("ledger sum %s, want 20", got)
		}
	})
}

// TestRaceCompletions: concurrent completions of one job. Different ones:
// exactly one wins (200), every other is 409 request_already_completed, and
// the winner's units are metered once. The same one sent 200 times: every
// answer is 200 and the units are still metered once.
func TestRaceCompletions(t *testing.T) {
	be := newTestBackend(t, raceSecret, "Platform")
	jobs := newUsageBackend(t, usageSecret)
	g := startGateway(t, t.TempDir(), raceCatalog(be.URL, jobs.URL))
	key, _ := g.newKey("r-complete")
	g.subscribe("r-complete", "racejob", "tokens", "ACTIVE")

	complete := func(id, body string) (int, []byte, error) {
		ts := fmt.Sprint(time.Now().Unix())
		return asyncPost(gwBase+"/api/usage/complete/"+id, body,
			"X-Platform-Signature", e2etest.UsageSign(usageSecret, []byte(body), ts), "X-Platform-Timestamp", ts,
			"Content-Type", "application/json")
	}
	completionEntries := func(id string) []store.LedgerEntry {
		var out []store.LedgerEntry
		for _, e := range g.ledger("r-complete") {
			if e.RequestID == id && e.Source == store.SourceCompletion {
				out = append(out, e)
			}
		}
		return out
	}

	t.Run("different completions: one wins", func(t *testing.T) {
		acc, _ := usageStart(t, jobs, asyncURL("/api", "racejob", "job"), key, "x")
		ts := time.Now().Unix()
		var mu sync.Mutex
		winners := []int{}
		count, errs := raceAll(raceCallers, func(i int) (int, error) {
			body := fmt.Sprintf(`{"status":"COMPLETED","result":"r%d","units":%d,"timestamp":%d}`, i, i+1, ts)
			status, _, err := complete(acc.RequestID, body)
			if status == 200 {
				mu.Lock()
				winners = append(winners, i)
				mu.Unlock()
			}
			return status, err
		})
		if len(errs) > 0 || count[200] != 1 || count[http.StatusConflict] != raceCallers-1 {
			t.Fatalf("answers %v (errors %v), want 1 × 200 and %d × 409", count, errs, raceCallers-1)
		}
		es := completionEntries(acc.RequestID)
		if len(es) != 1 || es[0].Units != billing.Whole(int64(winners[0]+1)) {
			t.Fatalf("ledger %+v, want one entry of the winner's %d units", es, winners[0]+1)
		}
		j, _ := g.store().GetJob(context.Background(), acc.RequestID)
		if j.Status != store.JobCompleted || j.Result != fmt.Sprintf("r%d", winners[0]) || j.Units != es[0].Units {
			t.Errorf("job %+v is not the winner's completion %d", j, winners[0])
		}
	})

	t.Run("the same completion 200 times: all 200, metered once", func(t *testing.T) {
		acc, _ := usageStart(t, jobs, asyncURL("/api", "racejob", "job"), key, "x")
		body := fmt.Sprintf(`{"status":"COMPLETED","result":"same","units":7.25,"timestamp":%d}`, time.Now().Unix())
		count, errs := raceAll(raceCallers, func(int) (int, error) {
			status, _, err := complete(acc.RequestID, body)
			return status, err
		})
		if len(errs) > 0 || count[200] != raceCallers {
			t.Fatalf("answers %v (errors %v), want %d × 200", count, errs, raceCallers)
		}
		if es := completionEntries(acc.RequestID); len(es) != 1 || es[0].Units != 7_250_000 {
			t.Fatalf("ledger %+v, want one entry of 7.25", es)
		}
	})

	t.Run("completion racing a failure: one terminal state", func(t *testing.T) {
		acc, _ := usageStart(t, jobs, asyncURL("/api", "racejob", "job"), key, "x")
		ts := time.Now().Unix()
		count, errs := raceAll(raceCallers, func(i int) (int, error) {
			status := "COMPLETED"
			if i%2 == 1 {
				status = "FAILED"
			}
			body := fmt.Sprintf(`{"status":%q,"units":5,"timestamp":%d}`, status, ts)
			code, _, err := complete(acc.RequestID, body)
			return code, err
		})
		// Each kind's identical bodies: the winner's kind all get 200.
		if len(errs) > 0 || count[200] != raceCallers/2 || count[http.StatusConflict] != raceCallers/2 {
			t.Fatalf("answers %v (errors %v)", count, errs)
		}
		j, _ := g.store().GetJob(context.Background(), acc.RequestID)
		es := completionEntries(acc.RequestID)
		switch j.Status {
		case store.JobCompleted:
			if len(es) != 1 || es[0].Units != billing.Whole(5) {
				t.Errorf("completed job metered %+v", es)
			}
		case store.JobFailed:
			if len(es) != 0 {
				t.Errorf("failed job metered %+v", es)
			}
		default:
			t.Errorf("job %s after the race", j.Status)
		}
		st := raceState(t, g, "r-complete", "racejob")
		if st.Reserved != 0 {
			t.Errorf("holds left %+v", st)
		}
	})
}
