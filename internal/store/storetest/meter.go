package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// testReserveSettle reserves and settles once for each billing model and
// checks the decision, the hold, the ledger entry and the state after.
func testReserveSettle(t *testing.T, c *suite) {
	tests := []struct {
		name    string
		p       billing.Product
		credits billing.Units
		reserve billing.Units
		held    billing.State // the state after the hold
		settle  billing.Units
		entry   store.LedgerEntry // Units, Overage, Cost, UnitsClaimed of the entry
		after   billing.State
		noEntry bool
	}{
		{name: "subscription, quota blocked", p: quotaBlock, reserve: whole(4),
			held:   billing.State{Reserved: whole(4)},
			settle: whole(3), entry: store.LedgerEntry{Units: whole(3)},
			after: billing.State{Used: whole(3)}},
		{name: "subscription, overage priced", p: quotaAllow, reserve: whole(12),
			held:   billing.State{Reserved: whole(12), ReservedSpend: whole(1)},
			settle: whole(12), entry: store.LedgerEntry{Units: whole(12), Overage: whole(2), Cost: whole(1)},
			after: billing.State{Used: whole(12), Spend: whole(1)}},
		{name: "subscription, unlimited", p: unlimited, reserve: whole(1000),
			held:   billing.State{Reserved: whole(1000)},
			settle: whole(1000), entry: store.LedgerEntry{Units: whole(1000)},
			after: billing.State{Used: whole(1000)}},
		{name: "prepaid", p: prepaid, credits: whole(10), reserve: whole(8),
			held:   billing.State{Reserved: whole(8), ReservedSpend: whole(2), Credits: whole(10), CreditsHeld: whole(2)},
			settle: whole(8), entry: store.LedgerEntry{Units: whole(8), Cost: whole(2)},
			after: billing.State{Used: whole(8), Spend: whole(2), Credits: whole(8)}},
		{name: "usage postpaid", p: postpaid, reserve: whole(100),
			held:   billing.State{Reserved: whole(100), ReservedSpend: whole(1)},
			settle: whole(100), entry: store.LedgerEntry{Units: whole(100), Cost: whole(1)},
			after: billing.State{Used: whole(100), Spend: whole(1)}},
		{name: "usage instant", p: instant, reserve: whole(3),
			held:   billing.State{Reserved: whole(3), ReservedSpend: whole(6)},
			settle: whole(3), entry: store.LedgerEntry{Units: whole(3), Cost: whole(6)},
			after: billing.State{Used: whole(3), Spend: whole(6)}},

		// Fewer units than reserved: only what was used is charged.
		{name: "fewer than reserved", p: prepaid, credits: whole(10), reserve: whole(8),
			held:   billing.State{Reserved: whole(8), ReservedSpend: whole(2), Credits: whole(10), CreditsHeld: whole(2)},
			settle: whole(2), entry: store.LedgerEntry{Units: whole(2), Cost: 500_000},
			after: billing.State{Used: whole(2), Spend: 500_000, Credits: 9_500_000}},
		// More than reserved, within the limits: all charged.
		{name: "more than reserved, within the quota", p: quotaBlock, reserve: whole(2),
			held:   billing.State{Reserved: whole(2)},
			settle: whole(7), entry: store.LedgerEntry{Units: whole(7)},
			after: billing.State{Used: whole(7)}},
		// More than a hard limit allows: capped at what fits, claim kept.
		{name: "past the quota", p: quotaBlock, reserve: whole(2),
			held:   billing.State{Reserved: whole(2)},
			settle: whole(15), entry: store.LedgerEntry{Units: whole(10), UnitsClaimed: whole(15)},
			after: billing.State{Used: whole(10)}},
		{name: "past the prepaid balance", p: prepaid, credits: whole(10), reserve: whole(8),
			held:   billing.State{Reserved: whole(8), ReservedSpend: whole(2), Credits: whole(10), CreditsHeld: whole(2)},
			settle: whole(100), entry: store.LedgerEntry{Units: whole(40) + 1, Cost: whole(10), UnitsClaimed: whole(100)},
			after: billing.State{Used: whole(40) + 1, Spend: whole(10), Credits: 0}},
		{name: "past the spending cap", p: postpaid, reserve: whole(100),
			held:   billing.State{Reserved: whole(100), ReservedSpend: whole(1)},
			settle: whole(1000), entry: store.LedgerEntry{Units: whole(500) + 49, Cost: whole(5), UnitsClaimed: whole(1000)},
			after: billing.State{Used: whole(500) + 49, Spend: whole(5)}},
		{name: "overage past the spending cap", p: quotaAllow, reserve: whole(1),
			held:   billing.State{Reserved: whole(1)},
			settle: whole(100), entry: store.LedgerEntry{Units: whole(30), Overage: whole(20), Cost: whole(10), UnitsClaimed: whole(100)},
			after: billing.State{Used: whole(30), Spend: whole(10)}},
		// Zero units only releases the hold.
		{name: "zero releases", p: prepaid, credits: whole(10), reserve: whole(8),
			held:   billing.State{Reserved: whole(8), ReservedSpend: whole(2), Credits: whole(10), CreditsHeld: whole(2)},
			settle: 0, noEntry: true,
			after: billing.State{Credits: whole(10)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := c.store(t)
			a := subscribe(t, s, "u1", "svc", tt.p, tt.credits)
			res, err := s.Reserve(ctx, a, tt.reserve, T0)
			dec, st := res.Decision, res.State
			if err != nil || !dec.Allowed || res.ID == "" {
				t.Fatalf("Reserve = %+v, %+v, %v", res, dec, err)
			}
			if st != tt.held || c.state(t, s, a, T0) != tt.held {
				t.Errorf("after Reserve: returned %+v, stored %+v; want %+v", st, c.state(t, s, a, T0), tt.held)
			}
			if res.Decision != dec || res.Account.UserID != "u1" || res.PeriodKey != T0.Add(-time.Hour).Unix() {
				t.Errorf("Reservation = %+v", res)
			}

			in := store.LedgerEntry{Time: T0.Add(time.Second), UserID: "u1", ServiceID: "svc", EndpointID: "ep",
				ProductID: tt.p.ID, RequestID: "req-1", Source: store.SourceGateway}
			e, err := s.Settle(ctx, res, tt.settle, in)
			if err != nil {
				t.Fatalf("Settle: %v", err)
			}
			entries := Ledger(t, s, store.LedgerFilter{})
			if tt.noEntry {
				if len(entries) != 0 || e.ID != "" {
					t.Errorf("Settle(0) wrote %+v (returned %+v)", entries, e)
				}
			} else {
				if len(entries) != 1 {
					t.Fatalf("ledger has %d entries, want 1", len(entries))
				}
				got := entries[0]
				if got.Units != tt.entry.Units || got.Overage != tt.entry.Overage || got.Cost != tt.entry.Cost ||
					got.UnitsClaimed != tt.entry.UnitsClaimed {
					t.Errorf("entry units %s overage %s cost %s claimed %s; want %s %s %s %s",
						got.Units, got.Overage, got.Cost, got.UnitsClaimed,
						tt.entry.Units, tt.entry.Overage, tt.entry.Cost, tt.entry.UnitsClaimed)
				}
				if got.ID == "" || got.ID != e.ID || got.Seq != e.Seq || got.UserID != "u1" || got.ServiceID != "svc" ||
					got.EndpointID != "ep" || got.ProductID != tt.p.ID || got.RequestID != "req-1" ||
					got.Source != store.SourceGateway || !got.Time.Equal(in.Time) {
					t.Errorf("stored entry %+v, returned %+v", got, e)
				}
				if e.Units != got.Units || e.Cost != got.Cost || e.UnitsClaimed != got.UnitsClaimed {
					t.Errorf("returned entry %+v differs from stored %+v", e, got)
				}
			}
			if got := c.state(t, s, a, T0); got != tt.after {
				t.Errorf("after Settle: %+v, want %+v", got, tt.after)
			}
			if units, cost := SumUnits(entries); units != tt.after.Used || cost != tt.after.Spend {
				t.Errorf("ledger sums %s units %s cost; counter %s used %s spend", units, cost, tt.after.Used, tt.after.Spend)
			}
			if tt.p.BillingModel == billing.Prepaid {
				sub, _ := s.GetSubscription(ctx, "u1", "svc")
				if sub.Credits != tt.after.Credits || sub.CreditsHeld != 0 {
					t.Errorf("subscription balance %s held %s, want %s held 0", sub.Credits, sub.CreditsHeld, tt.after.Credits)
				}
			}

			// A reservation settles once.
			if _, err := s.Settle(ctx, res, tt.settle, in); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("second Settle = %v, want ErrNotFound", err)
			}
			if _, err := s.Settle(ctx, res, 0, store.LedgerEntry{}); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("release after Settle = %v, want ErrNotFound", err)
			}
			if got := c.state(t, s, a, T0); got != tt.after {
				t.Errorf("after the second Settle: %+v, want %+v", got, tt.after)
			}
			if n := len(Ledger(t, s, store.LedgerFilter{})); n != len(entries) {
				t.Errorf("second Settle wrote to the ledger: %d entries", n)
			}
		})
	}
}

// testReserveRefused: a refused reservation writes nothing, and settling
// the empty reservation it returns is a no-op.
func testReserveRefused(t *testing.T, c *suite) {
	tests := []struct {
		name    string
		p       billing.Product
		credits billing.Units
		units   billing.Units
		code    string
	}{
		{"quota", quotaBlock, 0, whole(10) + 1, billing.CodeQuotaExceeded},
		{"credits", prepaid, whole(1), whole(4) + 4, billing.CodeInsufficientCredits},
		{"cap", postpaid, 0, whole(500) + 100, billing.CodeQuotaExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := c.store(t)
			a := subscribe(t, s, "u1", "svc", tt.p, tt.credits)
			before := c.state(t, s, a, T0)
			res, err := s.Reserve(ctx, a, tt.units, T0)
			dec, st := res.Decision, res.State
			if err != nil || dec.Allowed || dec.Code != tt.code || res.ID != "" {
				t.Fatalf("Reserve = %+v, %+v, %v; want refusal %s", res, dec, err, tt.code)
			}
			if st != before || c.state(t, s, a, T0) != before {
				t.Errorf("refused Reserve changed the state: %+v → %+v", before, c.state(t, s, a, T0))
			}
			if e, err := s.Settle(ctx, res, tt.units, EntryFor(a, tt.units, T0)); err != nil || e.ID != "" {
				t.Errorf("Settle(refused) = %+v, %v", e, err)
			}
			if n := len(Ledger(t, s, store.LedgerFilter{})); n != 0 || c.state(t, s, a, T0) != before {
				t.Errorf("Settle(refused) wrote: %d entries, state %+v", n, c.state(t, s, a, T0))
			}
			// Exactly what is left still goes through.
			res, err = s.Reserve(ctx, a, billing.Fit(tt.p, before, tt.units), T0)
			dec = res.Decision
			if err != nil || !dec.Allowed {
				t.Errorf("Reserve(Fit) = %+v, %v", dec, err)
			}
		})
	}
}

// testSettleAmongHolds: what fits at settlement leaves room for the other
// calls still in flight.
func testSettleAmongHolds(t *testing.T, c *suite) {
	s := c.store(t)
	a := subscribe(t, s, "u1", "svc", quotaBlock, 0)
	r1, err := s.Reserve(ctx, a, whole(6), T0)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := s.Reserve(ctx, a, whole(3), T0)
	st := r2.State
	if err != nil || st.Reserved != whole(9) {
		t.Fatalf("Reserve: %+v, %v", st, err)
	}
	e, err := s.Settle(ctx, r1, whole(9), EntryFor(a, 0, T0))
	if err != nil || e.Units != whole(7) || e.UnitsClaimed != whole(9) {
		t.Fatalf("Settle(9) with 3 held elsewhere = %+v, %v; want 7 charged, 9 claimed", e, err)
	}
	if st := c.state(t, s, a, T0); st.Used != whole(7) || st.Reserved != whole(3) {
		t.Errorf("state %+v", st)
	}
	if e, err := s.Settle(ctx, r2, whole(3), EntryFor(a, 0, T0)); err != nil || e.Units != whole(3) || e.UnitsClaimed != 0 {
		t.Fatalf("Settle(3) = %+v, %v", e, err)
	}
	if st := c.state(t, s, a, T0); st != (billing.State{Used: whole(10)}) {
		t.Errorf("state %+v, want 10 used", st)
	}
}

// testPeriods: counters are per billing period; a reservation settles into
// the period it was taken in.
func testPeriods(t *testing.T, c *suite) {
	s := c.store(t)
	a := subscribe(t, s, "u1", "svc", quotaBlock, 0) // started at T0-1h: renews on the 20th at 11:00
	end := T0.Add(-time.Hour).AddDate(0, 1, 0)
	res, err := s.Reserve(ctx, a, whole(10), end.Add(-time.Nanosecond))
	if err != nil {
		t.Fatal(err)
	}
	// The next period starts empty even while the last one's call is held.
	if st := c.state(t, s, a, end); st != (billing.State{}) {
		t.Errorf("next period's state %+v, want empty", st)
	}
	if _, err := s.Settle(ctx, res, whole(10), EntryFor(a, 0, end.Add(time.Minute))); err != nil {
		t.Fatal(err)
	}
	if st := c.state(t, s, a, end.Add(-time.Second)); st.Used != whole(10) || st.Reserved != 0 {
		t.Errorf("period of the reservation: %+v, want 10 used", st)
	}
	if st := c.state(t, s, a, end); st != (billing.State{}) {
		t.Errorf("next period: %+v, want empty", st)
	}
	fresh, err := s.Reserve(ctx, a, whole(10), end)
	dec := fresh.Decision
	if err != nil || !dec.Allowed {
		t.Errorf("a fresh period refused the full quota: %+v, %v", dec, err)
	}
}

func testNoSubscription(t *testing.T, c *suite) {
	s := c.store(t)
	a := store.Account{UserID: "u1", ServiceID: "svc", Product: quotaBlock}
	if _, err := s.Reserve(ctx, a, whole(1), T0); !errors.Is(err, store.ErrNoAccount) {
		t.Errorf("Reserve = %v, want ErrNoAccount", err)
	}
	if _, err := s.Record(ctx, a, EntryFor(a, whole(1), T0), OKResponse); !errors.Is(err, store.ErrNoAccount) {
		t.Errorf("Record = %v, want ErrNoAccount", err)
	}
	if _, err := s.State(ctx, a, T0); !errors.Is(err, store.ErrNoAccount) {
		t.Errorf("State = %v, want ErrNoAccount", err)
	}
	if n := len(Ledger(t, s, store.LedgerFilter{})); n != 0 {
		t.Errorf("%d ledger entries", n)
	}
}

// testFree: a service owner's calls are recorded with no product and never
// touch counters or balances, subscription or not.
func testFree(t *testing.T, c *suite) {
	s := c.store(t)
	paid := subscribe(t, s, "owner", "svc", prepaid, whole(1))
	before := c.state(t, s, paid, T0)
	free := store.Account{UserID: "owner", ServiceID: "svc", Free: true}
	freeElsewhere := store.Account{UserID: "owner", ServiceID: "other", Free: true, Product: prepaid}

	res, err := s.Reserve(ctx, free, whole(1000), T0)
	dec, st := res.Decision, res.State
	if err != nil || !dec.Allowed || st != (billing.State{}) {
		t.Fatalf("Reserve(free) = %+v, %+v, %v", dec, st, err)
	}
	e, err := s.Settle(ctx, res, whole(1000), store.LedgerEntry{Time: T0, UserID: "owner", ServiceID: "svc",
		ProductID: "should-be-dropped", Source: store.SourceGateway})
	if err != nil || e.ID == "" || e.Units != whole(1000) || e.ProductID != "" || e.Cost != 0 {
		t.Fatalf("Settle(free) = %+v, %v", e, err)
	}
	if _, err := s.Record(ctx, freeElsewhere, store.LedgerEntry{Time: T0, UserID: "owner", ServiceID: "other",
		ProductID: prepaid.ID, Units: whole(5), Source: store.SourceReport}, OKResponse); err != nil {
		t.Fatalf("Record(free) = %v", err)
	}
	entries := Ledger(t, s, store.LedgerFilter{})
	if len(entries) != 2 {
		t.Fatalf("ledger %+v, want two entries", entries)
	}
	for _, e := range entries {
		if e.ProductID != "" || e.Cost != 0 || e.Overage != 0 {
			t.Errorf("free entry %+v carries a product or a price", e)
		}
	}
	if st := c.state(t, s, paid, T0); st != before {
		t.Errorf("free calls changed the owner's subscription state: %+v → %+v", before, st)
	}
	if st, err := s.State(ctx, free, T0); err != nil || st != (billing.State{}) {
		t.Errorf("State(free) = %+v, %v", st, err)
	}
	// Nothing free was released or charged into counters.
	if e, err := s.Settle(ctx, res, 0, store.LedgerEntry{}); err != nil || e.ID != "" {
		t.Errorf("Settle(free, 0) = %+v, %v", e, err)
	}
	if n := len(Ledger(t, s, store.LedgerFilter{})); n != 2 {
		t.Errorf("%d entries after releasing a free call", n)
	}
}

// testRecord: reports are charged past any limit, the entry and state
// handed to the response builder are the stored ones.
func testRecord(t *testing.T, c *suite) {
	s := c.store(t)
	a := subscribe(t, s, "u1", "svc", prepaid, whole(1))
	var seen store.LedgerEntry
	var seenState billing.State
	body, err := s.Record(ctx, a, EntryFor(a, whole(8), T0), func(e store.LedgerEntry, st billing.State) ([]byte, error) {
		seen, seenState = e, st
		return []byte("ok"), nil
	})
	if err != nil || string(body) != "ok" {
		t.Fatalf("Record = %q, %v", body, err)
	}
	want := billing.State{Used: whole(8), Spend: whole(2), Credits: -whole(1)}
	if seenState != want || c.state(t, s, a, T0) != want {
		t.Errorf("state handed %+v, stored %+v; want %+v", seenState, c.state(t, s, a, T0), want)
	}
	entries := Ledger(t, s, store.LedgerFilter{})
	if len(entries) != 1 || entries[0].ID != seen.ID || seen.ID == "" || entries[0].Cost != whole(2) || seen.Cost != whole(2) {
		t.Errorf("entry handed %+v, stored %+v", seen, entries)
	}

	// A failing response builder records nothing.
	boom := errors.New("boom")
	if _, err := s.Record(ctx, a, EntryFor(a, whole(8), T0), func(store.LedgerEntry, billing.State) ([]byte, error) {
		return nil, boom
	}); !errors.Is(err, boom) {
		t.Errorf("Record with a failing response = %v, want boom", err)
	}
	if c.state(t, s, a, T0) != want || len(Ledger(t, s, store.LedgerFilter{})) != 1 {
		t.Errorf("a failed Record was charged")
	}
}

// testNegativeUnits: a negative quantity is refused and changes nothing;
// a negative hold would have widened the quota for every other call.
func testNegativeUnits(t *testing.T, c *suite) {
	s := c.store(t)
	a := subscribe(t, s, "u1", "svc", quotaBlock, 0)
	if res, err := s.Reserve(ctx, a, -whole(5), T0); err == nil {
		t.Errorf("Reserve(-5) = %+v, want an error", res.Decision)
	}
	if _, err := s.Record(ctx, a, EntryFor(a, -whole(5), T0), OKResponse); err == nil {
		t.Errorf("Record(-5) succeeded")
	}
	res, err := s.Reserve(ctx, a, whole(1), T0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Settle(ctx, res, -whole(5), EntryFor(a, 0, T0)); err == nil {
		t.Errorf("Settle(-5) succeeded")
	}
	if st := c.state(t, s, a, T0); st != (billing.State{Reserved: whole(1)}) {
		t.Errorf("state %+v after refused negative quantities", st)
	}
	if res, _ := s.Reserve(ctx, a, whole(10), T0); res.Decision.Allowed {
		t.Errorf("quota widened: 10 more allowed with 1 held of 10")
	}
}

// testOveragePricedOnce: with calls in flight, units are billed as overage
// only once the quota is actually consumed, and each unit once, in every
// order of reports and settlements.
func testOveragePricedOnce(t *testing.T, c *suite) {
	p := billing.Product{ID: "qa", BillingModel: billing.Subscription, MeasurementType: billing.PerToken,
		Quota: ptr(whole(10)), Overage: "allow", Price: whole(1)}
	type step struct {
		op    string // reserve, settle (the n-th reservation), report
		n     int
		units billing.Units
	}
	tests := []struct {
		name  string
		steps []step
		used  billing.Units
	}{
		{"report while a call is held", []step{{"reserve", 0, whole(10)}, {"report", 0, whole(5)}, {"settle", 0, whole(10)}}, whole(15)},
		{"later call settles first", []step{{"reserve", 0, whole(6)}, {"reserve", 1, whole(6)}, {"settle", 1, whole(6)}, {"settle", 0, whole(6)}}, whole(12)},
		{"held call uses less", []step{{"reserve", 0, whole(10)}, {"reserve", 1, whole(5)}, {"settle", 0, whole(2)}, {"settle", 1, whole(5)}}, whole(7)},
		{"reports only", []step{{"report", 0, whole(8)}, {"report", 0, whole(8)}}, whole(16)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := c.store(t)
			a := subscribe(t, s, "u1", "svc", p, 0)
			held := map[int]store.Reservation{}
			for _, st := range tt.steps {
				switch st.op {
				case "reserve":
					res, err := s.Reserve(ctx, a, st.units, T0)
					dec := res.Decision
					if err != nil || !dec.Allowed {
						t.Fatalf("Reserve: %+v, %v", dec, err)
					}
					held[st.n] = res
				case "settle":
					if e, err := s.Settle(ctx, held[st.n], st.units, EntryFor(a, 0, T0)); err != nil || e.UnitsClaimed != 0 {
						t.Fatalf("Settle: %+v, %v", e, err)
					}
				case "report":
					if _, err := s.Record(ctx, a, EntryFor(a, st.units, T0), OKResponse); err != nil {
						t.Fatal(err)
					}
				}
			}
			state := c.state(t, s, a, T0)
			wantSpend := billing.Mul(max(0, tt.used-*p.Quota), p.Price)
			if state.Used != tt.used || state.Spend != wantSpend || state.Reserved != 0 || state.ReservedSpend != 0 {
				t.Errorf("state %+v, want %s used and %s spent", state, tt.used, wantSpend)
			}
			var overage billing.Units
			for _, e := range Ledger(t, s, store.LedgerFilter{}) {
				overage += e.Overage
			}
			if overage != max(0, tt.used-*p.Quota) {
				t.Errorf("ledger overage %s, want %s", overage, max(0, tt.used-*p.Quota))
			}
		})
	}
}

// testStoredExtremes: quantities the store legitimately holds but the wire
// never carries (negative balances, sums and costs past MaxUnits) read back.
func testStoredExtremes(t *testing.T, c *suite) {
	s := c.store(t)
	u := subscribe(t, s, "u1", "unlimited", unlimited, 0)
	for range 3 {
		if _, err := s.Record(ctx, u, EntryFor(u, billing.MaxUnits, T0), OKResponse); err != nil {
			t.Fatalf("Record(MaxUnits): %v", err)
		}
	}
	if st := c.state(t, s, u, T0); st.Used != 3*billing.MaxUnits {
		t.Errorf("Used = %s, want %s", st.Used, 3*billing.MaxUnits)
	}
	// A report priced past MaxUnits (cost saturates) on an overdrawn balance.
	p := subscribe(t, s, "u1", "prepaid", billing.Product{ID: "dear", BillingModel: billing.Prepaid,
		MeasurementType: billing.PerToken, Price: whole(100)}, 0)
	if _, err := s.Record(ctx, p, EntryFor(p, billing.MaxUnits, T0), OKResponse); err != nil {
		t.Fatalf("Record: %v", err)
	}
	if st := c.state(t, s, p, T0); st.Credits >= 0 || st.Spend <= billing.MaxUnits {
		t.Errorf("state %+v", st)
	}
	// A hold whose cost is past MaxUnits.
	i := subscribe(t, s, "u1", "instant", instant, 0)
	if res, err := s.Reserve(ctx, i, billing.MaxUnits, T0); err != nil || !res.Decision.Allowed || res.Decision.Cost <= billing.MaxUnits {
		t.Fatalf("Reserve(MaxUnits) = %+v, %v", res.Decision, err)
	}
	// A completed job costing past MaxUnits.
	if err := s.CreateJob(ctx, store.Job{ID: "job", UserID: "u1", ServiceID: "instant", Status: store.JobPending,
		CreatedAt: T0, ExpiresAt: T0.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CompleteJob(ctx, "job", i, EntryFor(i, billing.MaxUnits, T0), func(j *store.Job) error {
		j.Status = store.JobCompleted
		return nil
	}); err != nil {
		t.Fatalf("CompleteJob: %v", err)
	}
	if j, err := s.GetJob(ctx, "job"); err != nil || j.Cost <= billing.MaxUnits {
		t.Errorf("GetJob = %+v, %v", j, err)
	}
	if entries := Ledger(t, s, store.LedgerFilter{}); len(entries) != 5 {
		t.Errorf("%d ledger entries, want 5", len(entries))
	}

	// A restart releases the hold and reads the rest back.
	if c.reopen == nil {
		return
	}
	s = c.restart(t, s)
	if st := c.state(t, s, i, T0); st.Reserved != 0 || st.ReservedSpend != 0 || st.Used != billing.MaxUnits {
		t.Errorf("after reopen: %+v", st)
	}
	if sub, err := s.GetSubscription(ctx, "u1", "prepaid"); err != nil || sub.Credits >= 0 {
		t.Errorf("GetSubscription = %+v, %v", sub, err)
	}
}
