package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// The contract of store.Payments: records, credit grants and fenced
// leases. A store that does not implement it skips these cases.

func payments(t *testing.T, s store.Store) store.Payments {
	t.Helper()
	p, ok := s.(store.Payments)
	if !ok {
		t.Skipf("%T does not implement store.Payments", s)
	}
	return p
}

func testPaymentRecords(t *testing.T, c *suite) {
	s := c.store(t)
	p := payments(t, s)
	if _, err := p.GetPaymentRecord(ctx, "customer", "u1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get of nothing = %v, want ErrNotFound", err)
	}
	if _, err := p.InsertPaymentRecord(ctx, "customer", "u1", []byte(`{"id":"cus_1"}`), T0); err != nil {
		t.Fatal(err)
	}
	stored, err := p.InsertPaymentRecord(ctx, "customer", "u1", []byte(`{"id":"cus_2"}`), T0.Add(time.Second))
	if !errors.Is(err, store.ErrExists) || string(stored) != `{"id":"cus_1"}` {
		t.Fatalf("second Insert = %q, %v; want the first body with ErrExists", stored, err)
	}
	// An empty body is a record too: a second insert finds it.
	if _, err := p.InsertPaymentRecord(ctx, "customer", "empty", nil, T0); err != nil {
		t.Fatal(err)
	}
	if b, err := p.InsertPaymentRecord(ctx, "customer", "empty", []byte(`{}`), T0); !errors.Is(err, store.ErrExists) || len(b) != 0 || b == nil {
		t.Fatalf("Insert over an empty body = %q, %v; want an empty body with ErrExists", b, err)
	}
	// The same id under another kind is another record.
	if _, err := p.InsertPaymentRecord(ctx, "event", "u1", []byte(`{}`), T0); err != nil {
		t.Fatalf("same id, other kind: %v", err)
	}
	if err := p.PutPaymentRecord(ctx, "customer", "u1", []byte(`{"id":"cus_3"}`), T0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if b, err := p.GetPaymentRecord(ctx, "customer", "u1"); err != nil || string(b) != `{"id":"cus_3"}` {
		t.Fatalf("Get after Put = %q, %v", b, err)
	}

	// Bad input is an error and writes nothing.
	for _, bad := range [][2]string{{"", "x"}, {"customer", ""}, {"", ""}, {"cus\x00tomer", "x"}} {
		if _, err := p.InsertPaymentRecord(ctx, bad[0], bad[1], []byte(`{}`), T0); !errors.Is(err, store.ErrBadInput) {
			t.Errorf("Insert(%q, %q) = %v, want ErrBadInput", bad[0], bad[1], err)
		}
		if err := p.PutPaymentRecord(ctx, bad[0], bad[1], []byte(`{}`), T0); !errors.Is(err, store.ErrBadInput) {
			t.Errorf("Put(%q, %q) = %v, want ErrBadInput", bad[0], bad[1], err)
		}
	}
	for _, limit := range []int{0, -1} {
		if _, _, err := p.ListPaymentRecords(ctx, "customer", "", limit); !errors.Is(err, store.ErrBadInput) {
			t.Errorf("List with limit %d = %v, want ErrBadInput", limit, err)
		}
	}
	if _, _, err := p.ListPaymentRecords(ctx, "", "", 10); !errors.Is(err, store.ErrBadInput) {
		t.Errorf("List of no kind = %v, want ErrBadInput", err)
	}
	if recs, _, _ := p.ListPaymentRecords(ctx, "customer", "", 100); len(recs) != 2 {
		t.Errorf("bad input wrote records: %+v", recs)
	}

	// Listing pages in id order (bytewise), after an id, with more.
	ids := []string{"b", "a", "B", "c2", "c10", "é", "d"}
	for _, id := range ids {
		if _, err := p.InsertPaymentRecord(ctx, "invoice", id, []byte(`"`+id+`"`), T0); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"B", "a", "b", "c10", "c2", "d", "é"}
	var got []string
	after := ""
	for pages := 0; ; pages++ {
		if pages > len(want) {
			t.Fatal("listing does not end")
		}
		recs, more, err := p.ListPaymentRecords(ctx, "invoice", after, 3)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if r.Kind != "invoice" || string(r.Body) != `"`+r.ID+`"` || !r.UpdatedAt.Equal(T0) {
				t.Errorf("listed %+v", r)
			}
			got = append(got, r.ID)
		}
		if len(recs) > 0 {
			after = recs[len(recs)-1].ID
		}
		if !more {
			break
		}
		if len(recs) != 3 {
			t.Fatalf("a page with more after it has %d records", len(recs))
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("listed %v, want %v", got, want)
	}
	got = got[:0]
	for r, err := range store.PaymentRecords(ctx, p, "invoice", "b") {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r.ID)
	}
	if fmt.Sprint(got) != fmt.Sprint(want[3:]) {
		t.Errorf("PaymentRecords after b = %v, want %v", got, want[3:])
	}
	if recs, more, err := p.ListPaymentRecords(ctx, "invoice", "d", 1); err != nil || len(recs) != 1 || recs[0].ID != "é" || more {
		t.Errorf("List after d = %+v, %v, %v", recs, more, err)
	}
	if recs, more, err := p.ListPaymentRecords(ctx, "invoice", "c", 1); err != nil || len(recs) != 1 || recs[0].ID != "c10" || !more {
		t.Errorf("List after an id not stored = %+v, %v, %v", recs, more, err)
	}

	s = c.restart(t, s)
	p = payments(t, s)
	if b, err := p.GetPaymentRecord(ctx, "customer", "u1"); err != nil || string(b) != `{"id":"cus_3"}` {
		t.Fatalf("Get after restart = %q, %v", b, err)
	}
}

// testPaymentRecordsConcurrent: many inserts of one (kind, id) at once:
// exactly one wins, every other gets the winner's body with ErrExists.
func testPaymentRecordsConcurrent(t *testing.T, c *suite) {
	s := c.store(t)
	p := payments(t, s)
	const n = 32
	var wg sync.WaitGroup
	bodies := make([][]byte, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			bodies[i], errs[i] = p.InsertPaymentRecord(ctx, "event", "evt_1", fmt.Appendf(nil, `{"n":%d}`, i), T0)
		})
	}
	wg.Wait()
	CheckOneInsertWon(t, errs, bodies, func(i int) []byte { return fmt.Appendf(nil, `{"n":%d}`, i) })
	stored, err := p.GetPaymentRecord(ctx, "event", "evt_1")
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if errs[i] == nil && !bytes.Equal(stored, fmt.Appendf(nil, `{"n":%d}`, i)) {
			t.Errorf("insert %d won, but %q is stored", i, stored)
		}
	}
}

// testSwapPaymentRecord: a swap replaces a record only while its body is
// the one the caller read; a stale swap, a swap of no record and bad
// input write nothing.
func testSwapPaymentRecord(t *testing.T, c *suite) {
	s := c.store(t)
	p := payments(t, s)
	if err := p.SwapPaymentRecord(ctx, "invoice", "in_1", nil, []byte(`{"v":1}`), T0); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Swap of no record = %v, want ErrNotFound", err)
	}
	if _, err := p.GetPaymentRecord(ctx, "invoice", "in_1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a Swap of no record wrote one: %v", err)
	}
	if _, err := p.InsertPaymentRecord(ctx, "invoice", "in_1", []byte(`{"v":1}`), T0); err != nil {
		t.Fatal(err)
	}
	if err := p.SwapPaymentRecord(ctx, "invoice", "in_1", []byte(`{"v":1}`), []byte(`{"v":2}`), T0.Add(time.Second)); err != nil {
		t.Fatalf("Swap from the stored body: %v", err)
	}
	// From the body before: stale, and nothing changes.
	if err := p.SwapPaymentRecord(ctx, "invoice", "in_1", []byte(`{"v":1}`), []byte(`{"v":3}`), T0.Add(2*time.Second)); !errors.Is(err, store.ErrStale) {
		t.Fatalf("Swap from an old body = %v, want ErrStale", err)
	}
	// Bodies compare byte for byte, not as JSON.
	if err := p.SwapPaymentRecord(ctx, "invoice", "in_1", []byte(`{"v": 2}`), []byte(`{"v":3}`), T0.Add(2*time.Second)); !errors.Is(err, store.ErrStale) {
		t.Fatalf("Swap from an equal JSON of other bytes = %v, want ErrStale", err)
	}
	for _, bad := range [][2]string{{"", "x"}, {"invoice", ""}, {"inv\x00oice", "in_1"}} {
		if err := p.SwapPaymentRecord(ctx, bad[0], bad[1], []byte(`{"v":2}`), []byte(`{}`), T0); !errors.Is(err, store.ErrBadInput) {
			t.Errorf("Swap(%q, %q) = %v, want ErrBadInput", bad[0], bad[1], err)
		}
	}
	if recs, _, err := p.ListPaymentRecords(ctx, "invoice", "", 10); err != nil || len(recs) != 1 ||
		string(recs[0].Body) != `{"v":2}` || !recs[0].UpdatedAt.Equal(T0.Add(time.Second)) {
		t.Fatalf("after stale swaps and bad input: %+v, %v; want only the first swap's body and time", recs, err)
	}
	// An empty body swaps like any other.
	if err := p.SwapPaymentRecord(ctx, "invoice", "in_1", []byte(`{"v":2}`), nil, T0); err != nil {
		t.Fatal(err)
	}
	if err := p.SwapPaymentRecord(ctx, "invoice", "in_1", []byte{}, []byte(`{"v":4}`), T0); err != nil {
		t.Fatalf("Swap from an empty body: %v", err)
	}
	s = c.restart(t, s)
	p = payments(t, s)
	if b, err := p.GetPaymentRecord(ctx, "invoice", "in_1"); err != nil || string(b) != `{"v":4}` {
		t.Fatalf("Get after restart = %q, %v", b, err)
	}
}

// testSwapPaymentRecordConcurrent: rounds of many swaps of one record at
// once, each from the body of the round before: exactly one wins a round
// and its body is stored; every other is ErrStale. Then swappers that
// re-read and retry each add their own change, and none is lost.
func testSwapPaymentRecordConcurrent(t *testing.T, c *suite) {
	s := c.store(t)
	p := payments(t, s)
	if _, err := p.InsertPaymentRecord(ctx, "invoice", "in_c", []byte(`{"round":0}`), T0); err != nil {
		t.Fatal(err)
	}
	const n, rounds = 8, 10
	for round := 1; round <= rounds; round++ {
		old := fmt.Appendf(nil, `{"round":%d}`, round-1)
		body := func(i int) []byte { return fmt.Appendf(nil, `{"round":%d,"n":%d}`, round, i) }
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() { errs[i] = p.SwapPaymentRecord(ctx, "invoice", "in_c", old, body(i), T0) })
		}
		wg.Wait()
		winner := -1
		for i, err := range errs {
			switch {
			case err == nil:
				if winner >= 0 {
					t.Fatalf("round %d: swaps %d and %d both won", round, winner, i)
				}
				winner = i
			case !errors.Is(err, store.ErrStale):
				t.Fatalf("round %d: swap %d: %v, want ErrStale", round, i, err)
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: no swap won", round)
		}
		if b, err := p.GetPaymentRecord(ctx, "invoice", "in_c"); err != nil || !bytes.Equal(b, body(winner)) {
			t.Fatalf("round %d: swap %d won but %q is stored (%v)", round, winner, b, err)
		}
		// The next round swaps from a body of this round's form.
		if err := p.SwapPaymentRecord(ctx, "invoice", "in_c", body(winner), fmt.Appendf(nil, `{"round":%d}`, round), T0); err != nil {
			t.Fatal(err)
		}
	}

	// Read, add one's own mark, swap; on ErrStale read again: every mark
	// is kept.
	if err := p.PutPaymentRecord(ctx, "invoice", "in_c", []byte(``), T0); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			for {
				b, err := p.GetPaymentRecord(ctx, "invoice", "in_c")
				if err != nil {
					t.Error(err)
					return
				}
				err = p.SwapPaymentRecord(ctx, "invoice", "in_c", b, fmt.Appendf(bytes.Clone(b), "[%d]", i), T0)
				if err == nil {
					return
				}
				if !errors.Is(err, store.ErrStale) {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b, err := p.GetPaymentRecord(ctx, "invoice", "in_c")
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if !bytes.Contains(b, fmt.Appendf(nil, "[%d]", i)) {
			t.Errorf("swapper %d's change is lost: %q", i, b)
		}
	}
}

// CheckOneInsertWon checks concurrent InsertPaymentRecord results: exactly
// one nil error, every other ErrExists with the winner's body (body(i) is
// what insert i wrote). The stores' own tests use it across nodes.
func CheckOneInsertWon(t testing.TB, errs []error, bodies [][]byte, body func(i int) []byte) {
	t.Helper()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil:
			if winner >= 0 {
				t.Errorf("inserts %d and %d both won", winner, i)
			}
			winner = i
		case !errors.Is(err, store.ErrExists):
			t.Errorf("insert %d: %v", i, err)
		}
	}
	if winner < 0 {
		t.Fatal("no insert won")
	}
	for i, err := range errs {
		if err != nil && !bytes.Equal(bodies[i], body(winner)) {
			t.Errorf("insert %d got %q with ErrExists, want the winner's %q", i, bodies[i], body(winner))
		}
	}
}

func testLeases(t *testing.T, c *suite) {
	s := c.store(t)
	p := payments(t, s)
	const ttl = time.Minute
	a, err := p.TakeLease(ctx, "shipper", "node-a", ttl, T0)
	if err != nil || !a.Held || a.Holder != "node-a" || a.Epoch == 0 || !a.Expires.Equal(T0.Add(ttl)) || a.Cursor != nil {
		t.Fatalf("first Take = %+v, %v", a, err)
	}
	if b, err := p.TakeLease(ctx, "shipper", "node-b", ttl, T0.Add(time.Second)); err != nil || b.Held || b.Holder != "node-a" || b.Epoch != a.Epoch {
		t.Fatalf("Take of a held lease = %+v, %v; want node-a's", b, err)
	}
	// A renewal keeps the epoch and moves the expiry.
	if r, err := p.TakeLease(ctx, "shipper", "node-a", ttl, T0.Add(30*time.Second)); err != nil || !r.Held || r.Epoch != a.Epoch ||
		!r.Expires.Equal(T0.Add(30*time.Second+ttl)) {
		t.Fatalf("renewal = %+v, %v", r, err)
	}
	if err := p.PutLeaseCursor(ctx, "shipper", "node-a", a.Epoch, []byte("pos-1"), T0.Add(40*time.Second)); err != nil {
		t.Fatal(err)
	}
	// node-a stalls past its expiry; node-b takes the lease.
	late := T0.Add(30*time.Second + ttl)
	b, err := p.TakeLease(ctx, "shipper", "node-b", ttl, late)
	if err != nil || !b.Held || b.Epoch <= a.Epoch || string(b.Cursor) != "pos-1" {
		t.Fatalf("Take of an expired lease = %+v, %v; want held, a later epoch, the cursor", b, err)
	}
	if err := p.PutLeaseCursor(ctx, "shipper", "node-a", a.Epoch, []byte("stale"), late); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("the old holder's PutLeaseCursor = %v, want ErrLeaseLost", err)
	}
	// Even node-a's clock running behind does not let it write.
	if err := p.PutLeaseCursor(ctx, "shipper", "node-a", a.Epoch, []byte("stale"), T0); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("the old holder's PutLeaseCursor at an early time = %v, want ErrLeaseLost", err)
	}
	if r, err := p.TakeLease(ctx, "shipper", "node-a", ttl, late.Add(time.Second)); err != nil || r.Held || r.Holder != "node-b" {
		t.Fatalf("the old holder's Take = %+v, %v", r, err)
	}
	if err := p.PutLeaseCursor(ctx, "shipper", "node-b", b.Epoch, []byte("pos-2"), late.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	// Its own lease, expired, fences node-b too.
	if err := p.PutLeaseCursor(ctx, "shipper", "node-b", b.Epoch, []byte("pos-x"), late.Add(ttl)); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("PutLeaseCursor on an expired lease = %v, want ErrLeaseLost", err)
	}
	if err := p.PutLeaseCursor(ctx, "never", "node-b", 1, []byte("x"), late); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("PutLeaseCursor on a lease never taken = %v, want ErrLeaseLost", err)
	}
	// Releasing by another holder does nothing; by the holder frees it.
	if err := p.ReleaseLease(ctx, "shipper", "node-a"); err != nil {
		t.Fatal(err)
	}
	if r, _ := p.TakeLease(ctx, "shipper", "node-c", ttl, late.Add(2*time.Second)); r.Held {
		t.Fatalf("a release by a non-holder freed the lease: %+v", r)
	}
	if err := p.ReleaseLease(ctx, "shipper", "node-b"); err != nil {
		t.Fatal(err)
	}
	cl, err := p.TakeLease(ctx, "shipper", "node-c", ttl, late.Add(3*time.Second))
	if err != nil || !cl.Held || cl.Epoch <= b.Epoch || string(cl.Cursor) != "pos-2" {
		t.Fatalf("Take after release = %+v, %v", cl, err)
	}
	if err := p.PutLeaseCursor(ctx, "shipper", "node-b", b.Epoch, []byte("stale"), late.Add(3*time.Second)); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("PutLeaseCursor after release = %v, want ErrLeaseLost", err)
	}

	// Bad input.
	for _, bad := range []struct {
		name, holder string
		ttl          time.Duration
	}{{"", "h", ttl}, {"n", "", ttl}, {"n", "h", 0}, {"n", "h", -time.Second}} {
		if _, err := p.TakeLease(ctx, bad.name, bad.holder, bad.ttl, T0); !errors.Is(err, store.ErrBadInput) {
			t.Errorf("Take(%q, %q, %s) = %v, want ErrBadInput", bad.name, bad.holder, bad.ttl, err)
		}
	}

	// The lease and its cursor survive a restart.
	s = c.restart(t, s)
	p = payments(t, s)
	if r, err := p.TakeLease(ctx, "shipper", "node-d", ttl, late.Add(4*time.Second)); err != nil || r.Held || r.Holder != "node-c" ||
		r.Epoch != cl.Epoch || string(r.Cursor) != "pos-2" {
		t.Fatalf("after restart = %+v, %v; want node-c's lease with its cursor", r, err)
	}
	if err := p.PutLeaseCursor(ctx, "shipper", "node-c", cl.Epoch, []byte("pos-3"), late.Add(5*time.Second)); err != nil {
		t.Fatalf("the holder's PutLeaseCursor after restart: %v", err)
	}
	if r, err := p.TakeLease(ctx, "shipper", "node-d", ttl, late.Add(2*ttl)); err != nil || !r.Held || string(r.Cursor) != "pos-3" {
		t.Fatalf("Take after restart and expiry = %+v, %v", r, err)
	}
}

// balance reads a subscription's prepaid balance once every write landed.
func (c *suite) balance(t *testing.T, s store.Store, user, service string) billing.Units {
	t.Helper()
	if c.sync != nil {
		c.sync(t, s)
	}
	sub, err := s.GetSubscription(ctx, user, service)
	if err != nil {
		t.Fatalf("GetSubscription(%s/%s): %v", user, service, err)
	}
	return sub.Credits
}

func grant(id, user, service string, credits int64, at time.Time) store.CreditGrant {
	return store.CreditGrant{ID: id, UserID: user, ServiceID: service, Credits: whole(credits), GrantedAt: at,
		Source: "stripe", Reference: "cs_" + id}
}

// spend charges credits of a prepaidWhole account through a report.
func spend(t *testing.T, s store.Store, a store.Account, credits int64) {
	t.Helper()
	if _, err := s.Record(ctx, a, EntryFor(a, whole(credits), T0), OKResponse); err != nil {
		t.Fatalf("Record: %v", err)
	}
}

func testCreditGrants(t *testing.T, c *suite) {
	s := c.store(t)
	p := payments(t, s)
	subscribe(t, s, "u1", "svc", prepaidWhole, whole(5))
	g := grant("pi_1", "u1", "svc", 100, T0)
	sub, err := p.GrantCredits(ctx, g)
	if err != nil || sub.Credits != whole(105) {
		t.Fatalf("Grant = %+v, %v; want a balance of 105", sub, err)
	}
	again := g
	again.Credits = whole(7)
	if sub, err := p.GrantCredits(ctx, again); !errors.Is(err, store.ErrReplayed) || sub.Credits != whole(105) {
		t.Fatalf("replayed Grant = %+v, %v; want ErrReplayed and 105", sub, err)
	}
	if _, err := p.GrantCredits(ctx, grant("pi_x", "u1", "nosuch", 10, T0)); !errors.Is(err, store.ErrNoAccount) {
		t.Fatalf("Grant without a subscription = %v, want ErrNoAccount", err)
	}
	bad := []store.CreditGrant{grant("", "u1", "svc", 1, T0), grant("pi_b", "", "svc", 1, T0), grant("pi_b", "u1", "", 1, T0),
		grant("pi_b", "u1", "svc", 0, T0), grant("pi_b", "u1", "svc", -1, T0), grant("pi_b", "u1", "svc", 1, time.Time{})}
	early := grant("pi_b", "u1", "svc", 1, T0)
	early.ExpiresAt = T0
	reversed := grant("pi_b", "u1", "svc", 1, T0)
	reversed.Reversed = 1
	for _, b := range append(bad, early, reversed) {
		if _, err := p.GrantCredits(ctx, b); !errors.Is(err, store.ErrBadInput) {
			t.Errorf("Grant(%+v) = %v, want ErrBadInput", b, err)
		}
	}
	if got := c.balance(t, s, "u1", "svc"); got != whole(105) {
		t.Errorf("balance %s after bad input, want 105", got)
	}
	gs, err := p.ListCreditGrants(ctx, "u1", "svc")
	if err != nil || len(gs) != 1 || gs[0].ID != "pi_1" || gs[0].Credits != whole(100) || !gs[0].GrantedAt.Equal(T0) ||
		gs[0].Source != "stripe" || gs[0].Reference != "cs_pi_1" {
		t.Fatalf("ListCreditGrants = %+v, %v", gs, err)
	}

	// Reversals: at most what the grant has left, once per id; the
	// balance may go negative.
	a := store.Account{UserID: "u1", ServiceID: "svc", Product: prepaidWhole}
	spend(t, s, a, 90) // balance 15
	sub, gr, err := p.ReverseCredits(ctx, store.CreditReversal{ID: "re_1", GrantID: "pi_1", Credits: whole(40), At: T0.Add(time.Hour), Reason: "refund"})
	if err != nil || gr.Reversed != whole(40) || sub.Credits != whole(-25) {
		t.Fatalf("Reverse 40 = %+v, %+v, %v; want reversed 40, balance -25", sub, gr, err)
	}
	if _, gr, err := p.ReverseCredits(ctx, store.CreditReversal{ID: "re_1", GrantID: "pi_1", Credits: whole(40), At: T0.Add(2 * time.Hour)}); !errors.Is(err, store.ErrReplayed) || gr.Reversed != whole(40) {
		t.Fatalf("replayed Reverse = %+v, %v; want ErrReplayed", gr, err)
	}
	sub, gr, err = p.ReverseCredits(ctx, store.CreditReversal{ID: "dp_1", GrantID: "pi_1", Credits: whole(80), At: T0.Add(3 * time.Hour), Reason: "dispute lost"})
	if err != nil || gr.Reversed != whole(100) || gr.Left() != 0 || sub.Credits != whole(-85) {
		t.Fatalf("Reverse 80 of 60 left = %+v, %+v, %v; want all 100 reversed, balance -85", sub, gr, err)
	}
	if _, gr, err := p.ReverseCredits(ctx, store.CreditReversal{ID: "re_2", GrantID: "pi_1", Credits: whole(1), At: T0.Add(4 * time.Hour)}); err != nil || gr.Reversed != whole(100) {
		t.Fatalf("Reverse of a grant with nothing left = %+v, %v", gr, err)
	}
	if _, _, err := p.ReverseCredits(ctx, store.CreditReversal{ID: "re_3", GrantID: "nosuch", Credits: whole(1), At: T0}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Reverse of an unknown grant = %v, want ErrNotFound", err)
	}
	for _, r := range []store.CreditReversal{{GrantID: "pi_1", Credits: 1, At: T0}, {ID: "re_b", Credits: 1, At: T0},
		{ID: "re_b", GrantID: "pi_1", At: T0}, {ID: "re_b", GrantID: "pi_1", Credits: -1, At: T0}, {ID: "re_b", GrantID: "pi_1", Credits: 1}} {
		if _, _, err := p.ReverseCredits(ctx, r); !errors.Is(err, store.ErrBadInput) {
			t.Errorf("Reverse(%+v) = %v, want ErrBadInput", r, err)
		}
	}
	if got := c.balance(t, s, "u1", "svc"); got != whole(-85) {
		t.Errorf("balance %s, want -85", got)
	}

	// The audit log has each change, by the grant's source.
	entries, _, err := s.ListAudit(ctx, "", 100)
	if err != nil {
		t.Fatal(err)
	}
	actions := map[string]int{}
	for _, e := range entries {
		if e.Actor == "stripe" && e.UserID == "u1" && e.ServiceID == "svc" {
			actions[e.Action]++
		}
	}
	if actions["credits.grant"] != 1 || actions["credits.reverse"] != 3 {
		t.Errorf("audit entries by action: %v; want 1 credits.grant and 3 credits.reverse", actions)
	}

	// Every grant and reversal survives a restart.
	s = c.restart(t, s)
	p = payments(t, s)
	if got := c.balance(t, s, "u1", "svc"); got != whole(-85) {
		t.Errorf("balance after restart %s, want -85", got)
	}
	if _, err := p.GrantCredits(ctx, g); !errors.Is(err, store.ErrReplayed) {
		t.Errorf("Grant after restart = %v, want ErrReplayed", err)
	}
	if _, _, err := p.ReverseCredits(ctx, store.CreditReversal{ID: "dp_1", GrantID: "pi_1", Credits: whole(1), At: T0}); !errors.Is(err, store.ErrReplayed) {
		t.Errorf("Reverse after restart = %v, want ErrReplayed", err)
	}
	if gs, _ := p.ListCreditGrants(ctx, "", ""); len(gs) != 1 || gs[0].Reversed != whole(100) {
		t.Errorf("grants after restart: %+v", gs)
	}
}

// testCreditGrantsConcurrent: the same grant from many goroutines at once
// applies once; so does the same reversal.
func testCreditGrantsConcurrent(t *testing.T, c *suite) {
	s := c.store(t)
	p := payments(t, s)
	subscribe(t, s, "u1", "svc", prepaidWhole, 0)
	const n = 16
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { _, errs[i] = p.GrantCredits(ctx, grant("pi_1", "u1", "svc", 10, T0)) })
	}
	wg.Wait()
	CheckOneApplied(t, "grant", errs)
	for i := range n {
		wg.Go(func() {
			_, _, errs[i] = p.ReverseCredits(ctx, store.CreditReversal{ID: "re_1", GrantID: "pi_1", Credits: whole(3), At: T0})
		})
	}
	wg.Wait()
	CheckOneApplied(t, "reversal", errs)
	if got := c.balance(t, s, "u1", "svc"); got != whole(7) {
		t.Errorf("balance %s, want 7 (10 granted once, 3 reversed once)", got)
	}
}

// CheckOneApplied checks concurrent calls of one idempotent change: exactly
// one nil error, every other ErrReplayed.
func CheckOneApplied(t testing.TB, what string, errs []error) {
	t.Helper()
	applied := 0
	for i, err := range errs {
		switch {
		case err == nil:
			applied++
		case !errors.Is(err, store.ErrReplayed):
			t.Errorf("%s %d: %v", what, i, err)
		}
	}
	if applied != 1 {
		t.Errorf("%s applied %d times, want once", what, applied)
	}
}

// testExpireCredits holds the expiry rule (store.ExpireGrants) to concrete
// numbers: credits are spent oldest grant first.
func testExpireCredits(t *testing.T, c *suite) {
	s := c.store(t)
	p := payments(t, s)
	a := subscribe(t, s, "u1", "svc", prepaidWhole, 0)
	subscribe(t, s, "u2", "svc", prepaidWhole, 0)
	expiring := func(g store.CreditGrant, at time.Time) store.CreditGrant {
		g.ExpiresAt = at
		return g
	}
	// u1: A 100 expiring at T0+1h, then B 50 that never expires; 70 spent.
	for _, g := range []store.CreditGrant{expiring(grant("A", "u1", "svc", 100, T0), T0.Add(time.Hour)), grant("B", "u1", "svc", 50, T0.Add(time.Minute)),
		// u2: C 10 expiring at T0+1h, D 10 expiring at T0+2h, nothing spent.
		expiring(grant("C", "u2", "svc", 10, T0), T0.Add(time.Hour)), expiring(grant("D", "u2", "svc", 10, T0.Add(time.Minute)), T0.Add(2*time.Hour))} {
		if _, err := p.GrantCredits(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	spend(t, s, a, 70)
	if c.sync != nil {
		c.sync(t, s)
	}
	if got, err := p.ExpireCredits(ctx, T0.Add(time.Hour-time.Second)); err != nil || len(got) != 0 {
		t.Fatalf("ExpireCredits before any is due = %+v, %v", got, err)
	}
	got, err := p.ExpireCredits(ctx, T0.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	expired := map[string]store.CreditGrant{}
	for _, g := range got {
		expired[g.ID] = g
	}
	// A has 80 - 50 = 30 left; C all 10 (D is newer, and unspent).
	if len(got) != 2 || expired["A"].Expired != whole(30) || expired["C"].Expired != whole(10) ||
		!expired["A"].ExpiredAt.Equal(T0.Add(time.Hour)) {
		t.Fatalf("ExpireCredits at T0+1h = %+v; want A with 30 expired, C with 10", got)
	}
	if b := c.balance(t, s, "u1", "svc"); b != whole(50) {
		t.Errorf("u1 balance %s after expiry, want 50 (B untouched)", b)
	}
	if b := c.balance(t, s, "u2", "svc"); b != whole(10) {
		t.Errorf("u2 balance %s after expiry, want 10 (D)", b)
	}
	// Each grant expires once.
	if got, err := p.ExpireCredits(ctx, T0.Add(90*time.Minute)); err != nil || len(got) != 0 {
		t.Fatalf("second ExpireCredits = %+v, %v; want nothing", got, err)
	}
	// u2 spends 15 of its 10: the balance is -5, D expires nothing.
	spend(t, s, store.Account{UserID: "u2", ServiceID: "svc", Product: prepaidWhole}, 15)
	if c.sync != nil {
		c.sync(t, s)
	}
	got, err = p.ExpireCredits(ctx, T0.Add(2*time.Hour))
	if err != nil || len(got) != 1 || got[0].ID != "D" || got[0].Expired != 0 || got[0].ExpiredAt.IsZero() {
		t.Fatalf("ExpireCredits of an overdrawn subscription = %+v, %v", got, err)
	}
	if b := c.balance(t, s, "u2", "svc"); b != whole(-5) {
		t.Errorf("u2 balance %s, want -5", b)
	}
	// A refund of an expired grant takes back at most what it still has
	// (less what expired): 100 - 30.
	_, gr, err := p.ReverseCredits(ctx, store.CreditReversal{ID: "re_A", GrantID: "A", Credits: whole(100), At: T0.Add(3 * time.Hour)})
	if err != nil || gr.Reversed != whole(70) || gr.Expired != whole(30) {
		t.Fatalf("Reverse of an expired grant = %+v, %v", gr, err)
	}
	entries, _, err := s.ListAudit(ctx, "", 100)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if e.Action == "credits.expire" && e.Actor == "stripe" {
			n++
		}
	}
	if n != 3 {
		t.Errorf("%d credits.expire audit entries, want 3", n)
	}

	s = c.restart(t, s)
	p = payments(t, s)
	if got, err := p.ExpireCredits(ctx, T0.Add(5*time.Hour)); err != nil || len(got) != 0 {
		t.Fatalf("ExpireCredits after restart = %+v, %v; want nothing", got, err)
	}
	gs, err := p.ListCreditGrants(ctx, "u1", "")
	if err != nil || len(gs) != 2 || gs[0].ID != "A" || gs[0].Expired != whole(30) || gs[1].ID != "B" || !gs[1].ExpiredAt.IsZero() {
		t.Fatalf("u1's grants after restart = %+v, %v", gs, err)
	}
	if _, err := p.ListCreditGrants(ctx, "", "svc"); !errors.Is(err, store.ErrBadInput) {
		t.Errorf("ListCreditGrants of a service without a user = %v, want ErrBadInput", err)
	}
}
