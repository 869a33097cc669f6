package pgstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

// TestReportPastLimitStopsLeasedCalls: a usage report takes a hard limit
// (a blocked quota, a prepaid balance, a spending cap) to its end or past
// it, as reports may (docs/wire-contract.md, "Claims past a hard limit").
// From then on every call must be refused before it is forwarded, as the
// bbolt store refuses it. A fleet node holding a lease with free units on
// the allowance went on admitting calls from it, whichever node took the
// report (the node itself, or another): calls served and charged past the
// limit, which one node would have refused. The report now makes every
// node's leases of the subscription ask the database again, as credits
// taken back do (TestRefundThenLeasedCallRefused).
func TestReportPastLimitStopsLeasedCalls(t *testing.T) {
	for _, tc := range []struct {
		name    string
		product billing.Product
		credits int64
	}{
		{"quota", quotaProduct(100), 0},
		{"prepaid", prepaidProduct(1), 100},
		{"cap", capProduct(1, 100), 0},
	} {
		for _, where := range []string{"other node", "same node", "other node, settle log"} {
			t.Run(tc.name+"/"+where, func(t *testing.T) {
				ctx := context.Background()
				dsn := pgtest.DB(t)
				a, b := openNode(t, dsn, "a"), openNode(t, dsn, "b", func(o *Options) {
					if where == "other node, settle log" {
						o.LogDir = t.TempDir()
					}
				})
				subscribe(t, a, "u", "svc", tc.product.ID)
				if tc.credits > 0 {
					if _, err := a.AddCredits(ctx, "u", "svc", units(tc.credits), time.Now()); err != nil {
						t.Fatal(err)
					}
				}
				acct := store.Account{UserID: "u", ServiceID: "svc", Product: tc.product}
				call := func() bool { return tryCall(t, b, acct) }
				// Node b serves a few calls: its lease grows blocks ahead of
				// them, and keeps free units.
				for range 7 {
					if !call() {
						t.Fatal("a call refused before the report")
					}
				}
				k := AllowanceKey{"u", "svc", periodOf(tc.product, time.Now(), time.Now())}
				b.leaser.mu.Lock()
				for kk := range b.leaser.leases {
					k = kk
				}
				b.leaser.mu.Unlock()
				free, _ := limitsOf(tc.product).unitsIn(b.leaser.Free(k))
				if free <= 0 {
					t.Fatalf("node b's lease has no free units (%s): nothing to test", free)
				}
				// The backend reports 100 units: the limit reached, past
				// what b served.
				reporter := a
				if where == "same node" {
					reporter = b
				}
				rep := store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: tc.product.ID, Units: units(100),
					Source: store.SourceReport}
				if _, err := reporter.Record(ctx, acct, rep, func(store.LedgerEntry, billing.State) ([]byte, error) {
					return []byte("{}"), nil
				}); err != nil {
					t.Fatal(err)
				}
				// Node b hears of it (a notification, for a report on a):
				// its leases of the subscription ask the database again.
				// Bounded, and shorter than the two idle seconds after which
				// b gives an unused lease back by itself: with no
				// notification sent, the wait ends and the calls below tell.
				for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
					if stale(b, "u", "svc") {
						break
					}
					time.Sleep(10 * time.Millisecond)
				}
				served := 0
				for range 20 {
					if !call() {
						break
					}
					served++
				}
				st, err := a.State(ctx, acct, time.Now())
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("node b's lease had %s free units; after the report: %d calls served; state %+v", free, served, st)
				if served > 0 {
					t.Errorf("%d calls served after a report took the limit (want every call refused, as one node refuses it)", served)
				}
			})
		}
	}
}

// stale says whether every lease of node s on the subscription asks the
// database at its next call (or is gone).
func stale(s *Store, user, service string) bool {
	s.leaser.mu.Lock()
	var les []*lease
	for k, le := range s.leaser.leases {
		if k.UserID == user && k.ServiceID == service {
			les = append(les, le)
		}
	}
	s.leaser.mu.Unlock()
	for _, le := range les {
		le.mu.Lock()
		ok := le.stale || le.dead
		le.mu.Unlock()
		if !ok {
			return false
		}
	}
	return true
}

// TestFlooredChargeStopsLeasedCalls: the other charge that takes a limit
// past its end. Calls in flight on a node whose lease lapsed (its row
// swept, their holds back in the allowance) settle after the rest of the
// quota was taken by other nodes; each is charged at least its hold
// (TestLapsedLeaseCallKeepsItsHold), past the limit. From then on every
// call must be refused, as after a report past the limit; a node holding
// a lease with free units went on admitting calls from it.
func TestFlooredChargeStopsLeasedCalls(t *testing.T) {
	const ttl = 2 * time.Second
	for _, mode := range []struct {
		name   string
		commit bool
	}{{"settle commit", true}, {"settle log", false}} {
		t.Run(mode.name, func(t *testing.T) {
			ctx := context.Background()
			dsn := pgtest.DB(t)
			tune := func(o *Options) { o.LeaseTTL, o.LogDir, o.SettleCommit = ttl, t.TempDir(), mode.commit }
			a, b, c := openNode(t, dsn, "a", tune), openNode(t, dsn, "b", tune), openNode(t, dsn, "c", tune)
			p := quotaProduct(100)
			subscribe(t, a, "u", "svc", p.ID)
			acct := store.Account{UserID: "u", ServiceID: "svc", Product: p}
			entry := store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: p.ID, Source: store.SourceGateway}
			call := func(s *Store) bool {
				t.Helper()
				res, err := s.Reserve(ctx, acct, units(1), time.Now())
				if err != nil {
					t.Fatal(err)
				}
				if !res.Decision.Allowed {
					return false
				}
				if _, err := s.Settle(ctx, res, units(1), entry); err != nil {
					t.Fatal(err)
				}
				return true
			}
			// Three calls of 3 units in flight on a; a's lease lapses.
			var inflight []store.Reservation
			for range 3 {
				res, err := a.Reserve(ctx, acct, units(3), time.Now())
				if err != nil || !res.Decision.Allowed {
					t.Fatalf("hold: %v %+v", err, res.Decision)
				}
				inflight = append(inflight, res)
			}
			lapseLeases(t, a, b)
			time.Sleep(ttl)
			// b leases blocks ahead of its calls; c takes the rest.
			for range 7 {
				if !call(b) {
					t.Fatal("b refused before the limit")
				}
			}
			for call(c) {
			}
			k := AllowanceKey{"u", "svc", inflight[0].PeriodKey}
			free, _ := limitsOf(p).unitsIn(b.leaser.Free(k))
			if free <= 0 {
				t.Fatalf("node b's lease has no free units (%s): nothing to test", free)
			}
			// a's calls settle for their holds: charged past the quota.
			for i, res := range inflight {
				e := entry
				e.RequestID = fmt.Sprintf("late-%d", i)
				if _, err := a.Settle(ctx, res, units(3), e); err != nil {
					t.Fatal(err)
				}
			}
			if err := a.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(time.Second); time.Now().Before(deadline) && !stale(b, "u", "svc"); {
				time.Sleep(10 * time.Millisecond)
			}
			served := 0
			for range 20 {
				if !call(b) {
					break
				}
				served++
			}
			var used, leased int64
			if err := b.pool.QueryRow(ctx, "SELECT used, leased_units FROM allowances WHERE user_id = 'u'").Scan(&used, &leased); err != nil {
				t.Fatal(err)
			}
			t.Logf("b's lease had %s free units; after the late charges %d calls served; used %s, leased %s",
				free, served, billing.Units(used), billing.Units(leased))
			if served > 0 {
				t.Errorf("%d calls served after late charges took the quota past its end (want every call refused)", served)
			}
		})
	}
}

// TestLeaseBeforeFirstListenAsksAgain: a node's notification connection
// started as the node opened, and the node served (leased blocks) before
// its first LISTEN was in place: a change sent meanwhile (here a report
// past the limit on another node; credits taken the same) never reached
// it, and it served calls from the free units of a lease the change
// emptied. Found as a flake of TestReportPastLimitStopsLeasedCalls under
// load (7 calls served past a quota of 100 when the report came before
// node b listened). Open now returns once the node listens; past its
// wait (awaitFirst), the first LISTEN makes the leases ask again, as
// after a connection lost: here node b's listener is stopped before the
// report and a new one, late as Open leaves it, listens after it.
func TestLeaseBeforeFirstListenAsksAgain(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DB(t)
	a, b := openNode(t, dsn, "a"), openNode(t, dsn, "b")
	for _, s := range []*Store{a, b} {
		if !s.listen.up() && !s.listen.late.Load() {
			t.Errorf("node %s: Open returned before the node listened, and its first LISTEN will not make its leases ask again", s.node)
		}
	}
	p := quotaProduct(100)
	subscribe(t, a, "u", "svc", p.ID)
	acct := store.Account{UserID: "u", ServiceID: "svc", Product: p}
	call := func() bool { return tryCall(t, b, acct) }
	for range 7 {
		if !call() {
			t.Fatal("a call refused before the report")
		}
	}
	b.listen.close() // b hears nothing from here on
	rep := store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: p.ID, Units: units(100), Source: store.SourceReport}
	if _, err := a.Record(ctx, acct, rep, func(store.LedgerEntry, billing.State) ([]byte, error) { return []byte("{}"), nil }); err != nil {
		t.Fatal(err)
	}
	// b's first LISTEN, after the report, Open having stopped waiting.
	first := newListener(b)
	first.late.Store(true)
	first.start()
	defer first.close()
	for deadline := time.Now().Add(30 * time.Second); !first.up(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the new notification connection never listened")
		}
	}
	served := 0
	for range 20 {
		if !call() {
			break
		}
		served++
	}
	if served > 0 {
		t.Errorf("%d calls served from a lease after a report took the limit before the node's first LISTEN (want every call refused)", served)
	}
}
