package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// TestServedCallKeepsItsHoldPastAReport: a caller's call is with a slow
// backend, holding its unit; meanwhile the service reports usage past
// the caller's hard quota (reports are charged past it), or, on a
// prepaid plan, the operator takes the credits back (a refund). When the
// backend answers, the served call is charged the unit it held
// (docs/wire-contract.md, "Claims past a hard limit", rule 2). Before the
// fix its ledger row said 0 units, unitsClaimed 1: served free.
func TestServedCallKeepsItsHoldPastAReport(t *testing.T) {
	arrived, release, stop := make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-release:
		case <-stop: // the test failed: never hold up its cleanup
		}
		io.WriteString(w, "done")
	}))
	t.Cleanup(be.Close)
	t.Cleanup(func() { close(stop) })
	g := startGateway(t, t.TempDir(), fmt.Sprintf(`
		service floor {
			backend %s
			secret %s
			endpoint slow {
				path /slow
			}
			product hard {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 5
			}
			product credits {
				billing PREPAID
				measurement PER_REQUEST
				unit request
				price 2
			}
		}`, be.URL, holesSecret))
	for _, tc := range []struct {
		product string
		take    func(user string)
		cost    billing.Units
	}{
		{"hard", func(user string) { raceReport(t, holesSecret, user, "floor", "10") }, 0},
		{"credits", func(user string) { raceReport(t, holesSecret, user, "floor", "10") }, billing.Whole(2)},
		{"credits", func(user string) { // a refund of all 10 credits
			if _, err := g.store().AddCredits(context.Background(), user, "floor", -billing.Whole(10), time.Now()); err != nil {
				t.Fatal(err)
			}
		}, billing.Whole(2)},
	} {
		user := "floor-" + tc.product + fmt.Sprint(time.Now().UnixNano())
		g.subscribe(user, "floor", tc.product, "ACTIVE")
		if tc.product == "credits" {
			g.credits(user, "floor", "10")
		}
		key, _ := g.newKey(user)
		type answer struct {
			code int
			err  error
		}
		done := make(chan answer, 1)
		go func() {
			resp, _, err := raceInvokeResp(invokeURL("floor", "slow"), key)
			if err != nil {
				done <- answer{0, err}
				return
			}
			done <- answer{resp.StatusCode, nil}
		}()
		select {
		case <-arrived:
		case a := <-done:
			t.Fatalf("%s: the call ended before reaching the backend: %+v", tc.product, a)
		}
		tc.take(user)
		release <- struct{}{}
		if a := <-done; a.err != nil || a.code != 200 {
			t.Fatalf("%s: the call: %+v", tc.product, a)
		}
		var row *store.LedgerEntry
		for _, e := range g.ledger(user) {
			if e.Source == store.SourceGateway {
				row = &e
			}
		}
		if row == nil || row.Units != billing.Whole(1) || row.UnitsClaimed != 0 || row.Cost != tc.cost {
			t.Errorf("%s: the served call's row %+v; want 1 unit charged in full, costing %s", tc.product, row, tc.cost)
		}
	}
}
