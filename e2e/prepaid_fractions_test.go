package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/e2etest"
	"github.com/platformgw/gateway/internal/store"
)

// fractionsCatalog: prepaid products priced in fractions of a credit.
// /units?n= states the call's units; /job takes async jobs.
func fractionsCatalog(backend string) string {
	return fmt.Sprintf(`
		job_ttl 1h
		service frac {
			backend %s
			secret %s
			endpoint echo {
				path /echo
			}
			endpoint units {
				path /units
			}
			endpoint job {
				async
				path /job
			}
			product tenth {
				billing PREPAID
				measurement PER_REQUEST
				unit request
				price 0.1
			}
			product third {
				billing PREPAID
				measurement PER_TOKEN
				unit token
				price 0.333
			}
		}`, backend, usageSecret)
}

// TestPrepaidFractionsExact: prepaid prices that are not whole credits
// (0.1, 0.333), under concurrent calls, async jobs, usage reports past the
// balance and operator corrections both ways. The gateway counts credits
// as exact millionths: the balance ends exactly at what was added less the
// sum of the ledger's costs, each row's cost is its units at the price
// rounded to a millionth, nothing stays held, and ten calls at 0.1 take a
// balance of 1 to exactly 0 and no further. (A run of the fourth outside
// attack: this held; no float drift.)
func TestPrepaidFractionsExact(t *testing.T) {
	jobs := make(chan usageEnvelope, 100)
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		if strings.HasSuffix(r.URL.Path, "/job") {
			var env usageEnvelope
			json.Unmarshal(raw, &env)
			jobs <- env
			w.WriteHeader(http.StatusAccepted)
			return
		}
		if n := r.URL.Query().Get("n"); n != "" {
			w.Header().Set("X-Platform-Units", n)
		}
		io.WriteString(w, "ok")
	}))
	t.Cleanup(be.Close)
	g := startGateway(t, t.TempDir(), fractionsCatalog(be.URL))
	ctx := context.Background()

	t.Run("tenths to exactly zero", func(t *testing.T) {
		const user = "frac-tenth"
		g.subscribe(user, "frac", "tenth", "ACTIVE")
		g.credits(user, "frac", "1")
		key, _ := g.newKey(user)
		var wg sync.WaitGroup
		var mu sync.Mutex
		codes := map[int]int{}
		for range 40 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, _, err := raceInvokeResp(invokeURL("frac", "echo"), key)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					t.Errorf("invoke: %v", err)
					return
				}
				codes[resp.StatusCode]++
			}()
		}
		wg.Wait()
		sub, err := g.store().GetSubscription(ctx, user, "frac")
		if err != nil {
			t.Fatal(err)
		}
		es := g.ledger(user)
		if codes[200] != 10 || codes[403] != 30 || sub.Credits != 0 || sub.CreditsHeld != 0 || len(es) != 10 || ledgerCost(es) != billing.Whole(1) {
			t.Errorf("answers %v, balance %s (held %s), %d rows costing %s; want 10 served, 30 refused, balance exactly 0",
				codes, sub.Credits, sub.CreditsHeld, len(es), ledgerCost(es))
		}
	})

	t.Run("thirds under mixed load", func(t *testing.T) {
		const user = "frac-third"
		g.subscribe(user, "frac", "third", "ACTIVE")
		g.credits(user, "frac", "80")
		key, _ := g.newKey(user)
		var added atomic.Int64 // millionths the operator added, less what it took
		added.Add(int64(billing.Whole(80)))
		var wg sync.WaitGroup
		for i := range 6 { // sync calls stating fractions of tokens
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := range 15 {
					n := []string{"0.7", "3.3", "0.000001", "2", "7"}[(i+k)%5]
					if _, _, err := raceInvokeResp(invokeURL("frac", "units")+"?n="+n, key); err != nil {
						t.Errorf("invoke: %v", err)
						return
					}
				}
			}()
		}
		wg.Add(1)
		go func() { // async jobs, completed with fractions, some failed
			defer wg.Done()
			for k := range 12 {
				status, _, err := asyncPost(asyncURL("/api", "frac", "job"), "{}", "Authorization", "Bearer "+key, "Content-Type", "application/json")
				if err != nil {
					t.Errorf("async invoke: %v", err)
					return
				}
				if status != http.StatusAccepted {
					continue // refused: the balance is held or spent
				}
				env := <-jobs
				ts := usageURLTimestamp(t, env.CallbackURL)
				state := "COMPLETED"
				if k%5 == 4 {
					state = "FAILED"
				}
				body := `{"status":"` + state + `","units":` + []string{"0", "1", "5.5", "12"}[k%4] + `,"timestamp":` + ts + `}`
				if status, answer, err := asyncPost(env.CallbackURL, body, "Content-Type", "application/json",
					"X-Platform-Signature", e2etest.UsageSign(usageSecret, []byte(body), ts), "X-Platform-Timestamp", ts); err != nil || status != 200 {
					t.Errorf("completion: %d %s %v", status, answer, err)
				}
			}
		}()
		for k := range 40 { // reports (charged past the balance) and corrections
			if k%4 == 0 {
				body := fmt.Sprintf(`{"userId":%q,"serviceId":"frac","unitsUsed":%s,"timestamp":%d}`, user, []string{"1", "0.5", "9"}[k/4%3], time.Now().Unix())
				if resp, answer := usagePost(t, usageSigned{URL: usageReportURL, Secret: usageSecret, Body: body}); resp.StatusCode != 200 {
					t.Errorf("report: %d %s", resp.StatusCode, answer)
				}
			}
			amount := billing.Units([]int64{3_000_000, -2_500_000, 1_000_001, -333_333}[k%4])
			if _, err := g.store().AddCredits(ctx, user, "frac", amount, time.Now()); err != nil {
				t.Errorf("add %s: %v", amount, err)
			} else {
				added.Add(int64(amount))
			}
		}
		wg.Wait()
		sub, err := g.store().GetSubscription(ctx, user, "frac")
		if err != nil {
			t.Fatal(err)
		}
		es := g.ledger(user)
		bySource, cut := map[string]int{}, 0
		for _, e := range es {
			bySource[string(e.Source)]++
			if e.UnitsClaimed != 0 {
				cut++
			}
		}
		t.Logf("rows %v, %d cut at the balance; balance %s", bySource, cut, sub.Credits)
		for _, e := range es {
			if e.Cost != billing.Mul(e.Units, billing.Units(333_000)) {
				t.Errorf("row %s: cost %s for %s tokens at 0.333", e.ID, e.Cost, e.Units)
			}
		}
		if want := billing.Units(added.Load()) - ledgerCost(es); sub.Credits != want || sub.CreditsHeld != 0 {
			t.Errorf("balance %s (held %s); want exactly %s: %s added, %d rows costing %s",
				sub.Credits, sub.CreditsHeld, want, billing.Units(added.Load()), len(es), ledgerCost(es))
		}
		var rows []struct{ Cost billing.Units }
		adminGet(t, fmt.Sprintf("http://localhost:%d/platform/usage?userId=%s", adminPort, user), http.StatusOK, &rows)
		var exported billing.Units
		for _, r := range rows {
			exported += r.Cost
		}
		if len(rows) != len(es) || exported != ledgerCost(es) {
			t.Errorf("the usage export: %d rows costing %s; the ledger %d costing %s", len(rows), exported, len(es), ledgerCost(es))
		}
	})
}

// ledgerCost sums the rows' costs.
func ledgerCost(es []store.LedgerEntry) billing.Units {
	var s billing.Units
	for _, e := range es {
		s += e.Cost
	}
	return s
}
