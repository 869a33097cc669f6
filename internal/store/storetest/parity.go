package storetest

import (
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// testPutSubscriptionShowsHolds: the subscription PutSubscription returns,
// and ListSubscriptions lists, shows the credits held as GetSubscription does: what the calls in flight
// hold, nothing a store keeps aside for calls that have not come yet.
func testPutSubscriptionShowsHolds(t *testing.T, c *suite) {
	s := c.store(t)
	a := subscribe(t, s, "u1", "svc", prepaidWhole, whole(100))
	res, err := s.Reserve(ctx, a, whole(1), T0)
	if err != nil || !res.Decision.Allowed {
		t.Fatalf("Reserve = %+v, %v", res, err)
	}
	c.state(t, s, a, T0) // the barrier
	got, err := s.GetSubscription(ctx, "u1", "svc")
	if err != nil || got.Credits != whole(100) || got.CreditsHeld != whole(1) {
		t.Fatalf("GetSubscription = credits %s held %s, %v; want 100 and 1", got.Credits, got.CreditsHeld, err)
	}
	put, err := s.PutSubscription(ctx, store.Subscription{UserID: "u1", ServiceID: "svc", ProductID: prepaidWhole.ID,
		Status: "ACTIVE", UpdatedAt: T0})
	if err != nil || put.Credits != got.Credits || put.CreditsHeld != got.CreditsHeld {
		t.Errorf("PutSubscription = credits %s held %s, %v; want %s and %s as GetSubscription shows",
			put.Credits, put.CreditsHeld, err, got.Credits, got.CreditsHeld)
	}
	subs, _, err := s.ListSubscriptions(ctx, "u1", "", 10)
	if err != nil || len(subs) != 1 || subs[0].Credits != got.Credits || subs[0].CreditsHeld != got.CreditsHeld {
		t.Errorf("ListSubscriptions = %+v, %v; want credits %s held %s as GetSubscription shows", subs, err, got.Credits, got.CreditsHeld)
	}
	if _, err := s.Settle(ctx, res, whole(1), EntryFor(a, 0, T0)); err != nil {
		t.Fatal(err)
	}
}

// testCreditGrantsBalanceRange: a grant or a reversal that would take the
// balance past what a balance holds is ErrBalanceRange and changes
// nothing, as AddCredits is: no grant or reversal kept, the balance as it
// was. (The embedded store wrapped round: a reversal on a balance a huge
// report had overdrawn to the least a balance holds left it at 9.2
// trillion credits.)
func testCreditGrantsBalanceRange(t *testing.T, c *suite) {
	s := c.store(t)
	p := payments(t, s)
	// A balance a huge report overdrew to the least a balance holds.
	b := subscribe(t, s, "u2", "svc", billing.Product{ID: "dear", BillingModel: billing.Prepaid,
		MeasurementType: billing.PerToken, Price: whole(100)}, 0)
	if _, err := p.GrantCredits(ctx, grant("pi_2", "u2", "svc", 10, T0)); err != nil {
		t.Fatal(err)
	}
	for i := range 2 { // each costs past what a balance holds (the cost saturates)
		if _, err := s.Record(ctx, b, EntryFor(b, billing.MaxUnits, T0.Add(time.Duration(i)*time.Hour)), OKResponse); err != nil {
			t.Fatal(err)
		}
	}
	low := c.balance(t, s, "u2", "svc")
	if low != math.MinInt64 {
		t.Fatalf("balance %d after a huge report, want the least a balance holds", low)
	}
	_, _, err := p.ReverseCredits(ctx, store.CreditReversal{ID: "re_2", GrantID: "pi_2", Credits: whole(10), At: T0})
	if !errors.Is(err, store.ErrBalanceRange) {
		t.Errorf("ReverseCredits below the least balance = %v, want ErrBalanceRange", err)
	}
	if got := c.balance(t, s, "u2", "svc"); got != low {
		t.Errorf("balance %d after a reversal refused, want %d", got, low)
	}
	if gs, err := p.ListCreditGrants(ctx, "u2", "svc"); err != nil || len(gs) != 1 || gs[0].Reversed != 0 {
		t.Errorf("grants %+v, %v after a reversal refused, want pi_2 with nothing reversed", gs, err)
	}

	subscribe(t, s, "u1", "svc", prepaidWhole, whole(9_000_000_000_000))
	if _, err := p.GrantCredits(ctx, grant("pi_big", "u1", "svc", 1_000_000_000_000, T0)); !errors.Is(err, store.ErrBalanceRange) {
		t.Errorf("GrantCredits past the largest balance = %v, want ErrBalanceRange", err)
	}
	if got := c.balance(t, s, "u1", "svc"); got != whole(9_000_000_000_000) {
		t.Errorf("balance %s after a grant refused, want 9000000000000", got)
	}
	if gs, err := p.ListCreditGrants(ctx, "u1", "svc"); err != nil || len(gs) != 0 {
		t.Errorf("grants %+v, %v after a grant refused, want none", gs, err)
	}
	// The grant can be made once the balance has room.
	if _, err := s.AddCredits(ctx, "u1", "svc", -whole(9_000_000_000_000), T0); err != nil {
		t.Fatal(err)
	}
	if sub, err := p.GrantCredits(ctx, grant("pi_big", "u1", "svc", 1_000_000_000_000, T0)); err != nil || sub.Credits != whole(1_000_000_000_000) {
		t.Fatalf("GrantCredits = %s, %v; want a balance of 1000000000000", sub.Credits, err)
	}
}

// testRollupsSaturate: the hourly rollups of rows whose sums pass what a
// quantity holds (costs that saturated, reported and settled) saturate
// too, as the period's spend does, rather than fail the write that
// charges them: the rows are charged, their rollup reads the largest
// quantity.
func testRollupsSaturate(t *testing.T, c *suite) {
	s := c.store(t)
	dear := instant
	dear.ID, dear.Price = "instant-dear", whole(100) // MaxUnits cost past what a quantity holds
	a := subscribe(t, s, "u1", "svc", dear, 0)
	for range 2 {
		if _, err := s.Record(ctx, a, EntryFor(a, billing.MaxUnits, T0), OKResponse); err != nil {
			t.Fatalf("Record of a cost past what a quantity holds: %v", err)
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() {
			res, err := s.Reserve(ctx, a, billing.MaxUnits, T0)
			if err == nil {
				e := EntryFor(a, 0, T0.Add(time.Hour))
				e.Source = store.SourceGateway
				_, err = s.Settle(ctx, res, billing.MaxUnits, e)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("call %d costing past what a quantity holds: %v", i, err)
		}
	}
	if c.sync != nil {
		c.sync(t, s)
	}
	es := Ledger(t, s, store.LedgerFilter{})
	if len(es) != 6 {
		t.Fatalf("%d ledger rows, want 6", len(es))
	}
	for _, r := range rollups(t, s, store.RollupFilter{}) {
		if r.Cost != math.MaxInt64 || r.Units != billing.Units(r.Calls)*billing.MaxUnits {
			t.Errorf("rollup %+v: want a cost of %d (saturated) and %d calls' units", r, int64(math.MaxInt64), r.Calls)
		}
	}
}

// testJobCompletionBesideSyncHold: a completion stating more than its job
// held is charged up to what the hard limits leave, and what they leave is
// the quota less what is settled and what the calls in flight hold (store.Jobs,
// CompleteJob: "as Settle does"), not less what a store keeps aside for
// calls that have not come yet (a fleet node's unused lease).
func testJobCompletionBesideSyncHold(t *testing.T, c *suite) {
	s := c.store(t)
	p := quotaBlock
	p.ID, p.Quota = "quota-block-1000", ptr(whole(1000))
	a := subscribe(t, s, "u1", "svc", p, 0)
	sync, err := s.Reserve(ctx, a, whole(1), T0)
	if err != nil || !sync.Decision.Allowed {
		t.Fatalf("Reserve = %+v, %v", sync, err)
	}
	reserveJob(t, s, "job", a, whole(2))
	j, err := s.CompleteJob(ctx, "job", a, completion(a, "job", whole(999)), complete(store.JobCompleted, "d"))
	if err != nil || j.Units != whole(999) {
		t.Fatalf("CompleteJob = units %s, %v; want 999 charged (1 held by a call: within the quota of 1000)", j.Units, err)
	}
	if _, err := s.Settle(ctx, sync, whole(1), EntryFor(a, 0, T0)); err != nil {
		t.Fatal(err)
	}
	if st := c.state(t, s, a, T0); st.Used != whole(1000) || st.Reserved != 0 {
		t.Errorf("state %+v, want 1000 used, nothing held", st)
	}
	units, _ := SumUnits(Ledger(t, s, store.LedgerFilter{}))
	if units != whole(1000) {
		t.Errorf("ledger sums %s, want 1000", units)
	}
}

// testOddTextQueries: a read whose id, filter or cursor is text no store
// keeps (not UTF-8, or holding U+0000: PostgreSQL refuses such text as a
// parameter) finds nothing, as a well-formed id nobody has does, or is a
// bad cursor; never a store error (the admin API's and the console's
// filters come from the query string).
func testOddTextQueries(t *testing.T, c *suite) {
	s := c.store(t)
	subscribe(t, s, "u1", "svc", quotaBlock, 0)
	for _, odd := range []string{"u\xff", "u\x00v"} {
		if _, err := s.GetSubscription(ctx, odd, "svc"); !errors.Is(err, store.ErrNotFound) && !errors.Is(err, store.ErrNoAccount) {
			t.Errorf("GetSubscription(%q): %v, want not found", odd, err)
		}
		if keys, err := s.ListKeys(ctx, odd); err != nil || len(keys) != 0 {
			t.Errorf("ListKeys(%q) = %d, %v; want none", odd, len(keys), err)
		}
		if subs, _, err := s.ListSubscriptions(ctx, odd, "", 10); err != nil || len(subs) != 0 {
			t.Errorf("ListSubscriptions(%q) = %d, %v; want none", odd, len(subs), err)
		}
		if _, _, err := s.ListSubscriptions(ctx, "", store.EncodeCursor([]byte(odd)), 10); err != nil && !errors.Is(err, store.ErrBadCursor) {
			t.Errorf("ListSubscriptions after %q: %v, want a page or a bad cursor", odd, err)
		}
		n := 0
		if err := s.ScanLedger(ctx, store.LedgerFilter{UserID: odd}, func(store.LedgerEntry) error { n++; return nil }); err != nil || n != 0 {
			t.Errorf("ScanLedger(user %q) = %d rows, %v; want none", odd, n, err)
		}
		if err := s.ScanLedger(ctx, store.LedgerFilter{ServiceID: odd}, func(store.LedgerEntry) error { n++; return nil }); err != nil || n != 0 {
			t.Errorf("ScanLedger(service %q) = %d rows, %v; want none", odd, n, err)
		}
		if alerts, _, err := s.ListAlerts(ctx, store.AlertFilter{UserID: odd, ServiceID: odd, Status: odd}, "", 10); err != nil || len(alerts) != 0 {
			t.Errorf("ListAlerts(%q) = %d, %v; want none", odd, len(alerts), err)
		}
		if p, ok := s.(store.Payments); ok {
			if grants, err := p.ListCreditGrants(ctx, odd, "svc"); err != nil || len(grants) != 0 {
				t.Errorf("ListCreditGrants(%q) = %d, %v; want none", odd, len(grants), err)
			}
			if _, err := p.GetPaymentRecord(ctx, "stripe_topup", odd); !errors.Is(err, store.ErrNotFound) && !errors.Is(err, store.ErrBadInput) {
				t.Errorf("GetPaymentRecord(%q): %v, want not found (or bad input: a NUL)", odd, err)
			}
			if recs, _, err := p.ListPaymentRecords(ctx, "stripe_topup", odd, 10); err != nil || len(recs) != 0 {
				t.Errorf("ListPaymentRecords(after %q) = %d, %v; want none", odd, len(recs), err)
			}
		}
		if rr, ok := s.(store.RollupReader); ok {
			if err := rr.ScanRollups(ctx, store.RollupFilter{UserID: odd, ServiceID: odd}, func(store.Rollup) error { n++; return nil }); err != nil || n != 0 {
				t.Errorf("ScanRollups(%q) = %d, %v; want none", odd, n, err)
			}
		}
		if o, ok := s.(store.Outcomes); ok {
			if err := o.ScanOutcomes(ctx, store.OutcomeFilter{UserID: odd, ServiceID: odd, Outcome: odd}, func(store.OutcomeRow) error { n++; return nil }); err != nil || n != 0 {
				t.Errorf("ScanOutcomes(%q) = %d, %v; want none", odd, n, err)
			}
		}
	}
}
