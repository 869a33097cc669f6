package payments_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/payments/stripetest"
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
	"github.com/platformgw/gateway/internal/store/pgstore"
)

// fakeClock is the time the tests move by hand; the store methods and the
// shipper both read it.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// The products of the tests: a postpaid one at 0.002 USD a unit and a
// subscription with 10 units included and overage at 0.01 USD.
var (
	postpaid = billing.Product{ID: "payg", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest,
		Price: 2000}
	quota = billing.Whole(10)
	plan  = billing.Product{ID: "pro", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest,
		Quota: &quota, Overage: "allow", Price: 10000}
)

func meterCatalog(t testing.TB) *catalog.Catalog {
	t.Helper()
	p1, p2 := postpaid, plan
	cat, err := catalog.Compile([]*catalog.Service{{ID: "geo", Backend: "http://127.0.0.1:9", Secrets: []string{"s3cret-s3cret-s3cret-s3cret-0001"},
		Endpoints: []*catalog.Endpoint{{ID: "lookup", Path: "/lookup"}},
		Products:  []*billing.Product{&p1, &p2},
		ProductListings: []*catalog.ProductListing{{Product: "payg", Currency: "USD"},
			{Product: "pro", Currency: "USD"}},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return cat
}

// meterEnv is a store, stripe-mock behind its recording proxy, and the
// fake clock of one test.
type meterEnv struct {
	t     testing.TB
	st    store.Store
	mock  *stripetest.Mock
	clock *fakeClock
	cat   *catalog.Catalog
	seq   *atomic.Int64 // shared by the envs of one test's nodes
	// apiBase replaces the proxy's URL as api_base (reconcile_test.go).
	apiBase string
}

func newMeterEnv(t testing.TB, st store.Store) *meterEnv {
	return &meterEnv{t: t, st: st, mock: stripetest.Start(t), cat: meterCatalog(t), seq: new(atomic.Int64),
		clock: &fakeClock{t: time.Date(2026, 11, 2, 9, 10, 0, 0, time.UTC)}}
}

func openBolt(t testing.TB, path string) *boltstore.Store {
	t.Helper()
	st, err := boltstore.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func (e *meterEnv) config() payments.Config {
	return payments.Config{Provider: "stripe", SecretKey: "sk_test_meters", WebhookSecret: "whsec_meters",
		APIBase: cmp.Or(e.apiBase, e.mock.URL), MeterInterval: 0,
		Prices: []payments.Price{
			{Service: "geo", Product: "payg", Meter: "geo_payg", MeteredPrice: "price_payg"},
			{Service: "geo", Product: "pro", Price: "price_pro", Meter: "geo_overage", MeteredPrice: "price_over"},
		}}
}

// service is one node's payments Service on the env's store.
func (e *meterEnv) service(node string) *payments.Service {
	e.t.Helper()
	cfg := e.config()
	if err := cfg.Validate(e.cat); err != nil {
		e.t.Fatal(err)
	}
	s, err := payments.New(cfg, payments.Deps{Store: func() store.Store { return e.st }, Catalog: e.cat,
		Now: e.clock.Now, NodeID: node})
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

func (e *meterEnv) subscribe(user string, p billing.Product) {
	e.t.Helper()
	if _, err := e.st.PutSubscription(context.Background(), store.Subscription{UserID: user, ServiceID: "geo",
		ProductID: p.ID, Status: "ACTIVE", StartedAt: e.clock.Now().Add(-24 * time.Hour), UpdatedAt: e.clock.Now()}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *meterEnv) customer(user, cust string) {
	e.t.Helper()
	pay := e.st.(store.Payments)
	b, _ := json.Marshal(payments.CustomerRecord{UserID: user, CustomerID: cust, CreatedAt: e.clock.Now()})
	if _, err := pay.InsertPaymentRecord(context.Background(), payments.KindCustomer, user, b, e.clock.Now()); err != nil {
		e.t.Fatal(err)
	}
}

// report records units of usage for user at `at` through the store's
// Meter API, as the usage handler does, and returns its cost.
func (e *meterEnv) report(user string, p billing.Product, units int64, at time.Time) billing.Units {
	e.t.Helper()
	var cost billing.Units
	id := fmt.Sprintf("call-%d", e.seq.Add(1))
	_, err := e.st.Record(context.Background(), store.Account{UserID: user, ServiceID: "geo", Product: p},
		store.LedgerEntry{ID: id, RequestID: id, Time: at, UserID: user, ServiceID: "geo", EndpointID: "lookup",
			ProductID: p.ID, Units: billing.Whole(units), Source: store.SourceReport},
		func(le store.LedgerEntry, _ billing.State) ([]byte, error) { cost = le.Cost; return nil, nil })
	if err != nil {
		e.t.Fatal(err)
	}
	return cost
}

// ledgerCost is the cost of user's metered rows in the ledger.
func (e *meterEnv) ledgerCost(user string) billing.Units {
	e.t.Helper()
	var sum billing.Units
	err := e.st.ScanLedger(context.Background(), store.LedgerFilter{UserID: user, ServiceID: "geo"}, func(le store.LedgerEntry) error {
		sum += le.Cost
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return sum
}

// sentEvent is a meter event as the recording proxy saw it.
type sentEvent struct {
	customer, event string
	value           int64
	timestamp       int64
	ok              bool // some attempt was answered 200
}

// stripeSaw reads the meter events at the proxy, by identifier: every
// attempt counts (Stripe may have taken one whose answer was lost), and
// every attempt of an identifier must carry the same event.
func stripeSaw(t testing.TB, m *stripetest.Mock) map[string]sentEvent {
	t.Helper()
	out := map[string]sentEvent{}
	for _, r := range m.Requests("/v1/billing/meter_events") {
		id := r.Form.Get("identifier")
		if id == "" {
			t.Fatalf("a meter event without an identifier: %v", r.Form)
		}
		v, err := strconv.ParseInt(r.Form.Get("payload[value]"), 10, 64)
		if err != nil || v <= 0 {
			t.Fatalf("meter event %s: value %q", id, r.Form.Get("payload[value]"))
		}
		ev := sentEvent{customer: r.Form.Get("payload[stripe_customer_id]"), event: r.Form.Get("event_name"), value: v}
		if prev, ok := out[id]; ok {
			if prev.customer != ev.customer || prev.event != ev.event || prev.value != ev.value {
				t.Fatalf("identifier %s sent as %+v and again as %+v", id, prev, ev)
			}
			ev.ok = prev.ok
		}
		ev.timestamp, _ = strconv.ParseInt(r.Form.Get("timestamp"), 10, 64)
		ev.ok = ev.ok || r.Status == 200
		out[id] = ev
	}
	return out
}

// sums adds the distinct identifiers' values per customer, failing on one
// never answered 200.
func sums(t testing.TB, saw map[string]sentEvent) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for id, ev := range saw {
		if !ev.ok {
			t.Errorf("identifier %s was never taken by Stripe", id)
		}
		out[ev.customer] += ev.value
	}
	return out
}

func ship(t testing.TB, s *payments.Service) payments.MeterRun {
	t.Helper()
	run, err := s.ShipMeters(context.Background())
	if err != nil {
		t.Fatalf("ShipMeters: %v", err)
	}
	return run
}

// TestMetersOnce: postpaid usage and overage reach Stripe once, as the
// gateway's cost; a second run and a restart send nothing again; a late
// row in a shipped hour is its own new event of the difference; a user
// without a Stripe customer waits and is sent once they have one.
func TestMetersOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gw.db")
	st := openBolt(t, path)
	e := newMeterEnv(t, st)
	e.subscribe("alice", postpaid)
	e.subscribe("carol", plan)
	e.subscribe("bob", postpaid)
	e.customer("alice", "cus_alice")
	e.customer("carol", "cus_carol")

	s := e.service("node-a")
	if run := ship(t, s); !run.Leader || run.Sent != 0 {
		t.Fatalf("first run on an empty ledger: %+v", run)
	}
	start := e.clock.Now()
	e.report("alice", postpaid, 3, start)
	e.report("alice", postpaid, 4, start.Add(time.Hour))
	e.report("carol", plan, 8, start)                  // inside the quota: nothing to bill
	e.report("carol", plan, 5, start.Add(time.Hour))   // 3 units of overage
	e.report("bob", postpaid, 2, start.Add(time.Hour)) // no customer yet
	e.clock.Add(2 * time.Hour)
	run := ship(t, s)
	if run.Sent != 3 || len(run.NoCustomer) != 1 || run.NoCustomer[0] != "bob" {
		t.Fatalf("run: %+v, want 3 events sent and bob waiting", run)
	}
	got := sums(t, stripeSaw(t, e.mock))
	if got["cus_alice"] != int64(e.ledgerCost("alice")) || got["cus_alice"] != 14000 {
		t.Errorf("alice: Stripe got %d, the ledger says %d (want 14000: 7 units at 0.002)", got["cus_alice"], e.ledgerCost("alice"))
	}
	if got["cus_carol"] != 30000 || got["cus_carol"] != int64(e.ledgerCost("carol")) {
		t.Errorf("carol: Stripe got %d, want 30000 (3 units of overage at 0.01)", got["cus_carol"])
	}
	for id, ev := range stripeSaw(t, e.mock) {
		if ev.customer == "cus_carol" && ev.event != "geo_overage" || ev.customer == "cus_alice" && ev.event != "geo_payg" {
			t.Errorf("%s went to meter %s", id, ev.event)
		}
	}

	// Again, and after a restart: nothing new.
	n := len(e.mock.Requests("/v1/billing/meter_events"))
	ship(t, s)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	e.st = openBolt(t, path)
	t.Cleanup(func() { _ = e.st.Close() })
	s2 := e.service("node-a") // the same node after a restart: a new holder
	e.clock.Add(time.Minute)
	if run := ship(t, s2); run.Leader {
		t.Fatalf("the restarted shipper took a lease the old one still held: %+v", run)
	}
	e.clock.Add(3 * time.Minute) // the old lease (3 meter intervals) runs out
	if run := ship(t, s2); !run.Leader || run.Sent != 0 {
		t.Fatalf("after the restart: %+v, want nothing sent again", run)
	}
	if m := len(e.mock.Requests("/v1/billing/meter_events")); m != n {
		t.Fatalf("%d meter events after the restart, want %d", m, n)
	}

	// A late row in the first hour (recorded now, timed then): only the
	// difference, under a new identifier.
	e.report("alice", postpaid, 5, start.Add(10*time.Minute))
	run = ship(t, s2)
	if run.Sent != 1 {
		t.Fatalf("late row: %+v, want one event", run)
	}
	saw := stripeSaw(t, e.mock)
	if len(saw) != 4 {
		t.Fatalf("%d identifiers, want 4", len(saw))
	}
	if got := sums(t, saw); got["cus_alice"] != int64(e.ledgerCost("alice")) || got["cus_alice"] != 24000 {
		t.Errorf("alice after the late row: Stripe got %d, want %d", got["cus_alice"], e.ledgerCost("alice"))
	}

	// Bob gets a customer: his waiting usage goes.
	e.customer("bob", "cus_bob")
	run = ship(t, s2)
	if run.Sent != 1 || len(run.NoCustomer) != 0 {
		t.Fatalf("bob with a customer: %+v", run)
	}
	if got := sums(t, stripeSaw(t, e.mock)); got["cus_bob"] != int64(e.ledgerCost("bob")) || got["cus_bob"] != 4000 {
		t.Errorf("bob: Stripe got %d, want 4000", got["cus_bob"])
	}
}

// TestMetersOutage: while Stripe answers 500 (and 429), nothing is lost
// and nothing is skipped; once it is back, every unit goes once, with the
// identifiers and values planned before the outage.
func TestMetersOutage(t *testing.T) {
	st := openBolt(t, filepath.Join(t.TempDir(), "gw.db"))
	t.Cleanup(func() { _ = st.Close() })
	e := newMeterEnv(t, st)
	e.subscribe("alice", postpaid)
	e.customer("alice", "cus_alice")
	s := e.service("node-a")
	ship(t, s)
	var calls atomic.Int64
	e.mock.Fail(func(r stripetest.Request) int {
		if r.Path != "/v1/billing/meter_events" {
			return 0
		}
		if calls.Add(1)%2 == 0 {
			return 429
		}
		return 500
	})
	for i := 0; i < 5; i++ {
		e.report("alice", postpaid, int64(i+1), e.clock.Now())
		e.clock.Add(40 * time.Minute)
		if _, err := s.ShipMeters(context.Background()); err == nil {
			t.Fatal("ShipMeters succeeded while Stripe was down")
		}
	}
	if calls.Load() == 0 {
		t.Fatal("the shipper never tried")
	}
	e.mock.Fail(nil)
	run := ship(t, s)
	if run.Sent == 0 {
		t.Fatalf("after the outage: %+v", run)
	}
	ship(t, s)
	got := sums(t, stripeSaw(t, e.mock))
	if got["cus_alice"] != int64(e.ledgerCost("alice")) || got["cus_alice"] != 30000 {
		t.Errorf("after the outage Stripe got %d, the ledger says %d", got["cus_alice"], e.ledgerCost("alice"))
	}
}

// TestMetersLongOutage: usage older than Stripe's 35 days (an outage of
// 40) is sent with the oldest timestamp Stripe accepts, not dropped.
func TestMetersLongOutage(t *testing.T) {
	st := openBolt(t, filepath.Join(t.TempDir(), "gw.db"))
	t.Cleanup(func() { _ = st.Close() })
	e := newMeterEnv(t, st)
	e.subscribe("alice", postpaid)
	e.customer("alice", "cus_alice")
	s := e.service("node-a")
	ship(t, s)
	e.mock.Fail(func(r stripetest.Request) int {
		if r.Path == "/v1/billing/meter_events" {
			return 503
		}
		return 0
	})
	e.report("alice", postpaid, 3, e.clock.Now())
	for day := 0; day < 40; day++ {
		e.clock.Add(24 * time.Hour)
		e.report("alice", postpaid, 1, e.clock.Now())
		if day%10 == 0 {
			if _, err := s.ShipMeters(context.Background()); err == nil {
				t.Fatal("ShipMeters succeeded while Stripe was down")
			}
		}
	}
	e.mock.Fail(nil)
	for i := 0; i < 3; i++ {
		ship(t, s)
	}
	saw := stripeSaw(t, e.mock)
	oldest := e.clock.Now().Add(-payments.StripeMeterWindow).Unix()
	for id, ev := range saw {
		if ev.ok && (ev.timestamp < oldest || ev.timestamp > e.clock.Now().Unix()) {
			t.Errorf("%s sent with timestamp %s, outside Stripe's window", id, time.Unix(ev.timestamp, 0).UTC())
		}
	}
	if got := sums(t, saw); got["cus_alice"] != int64(e.ledgerCost("alice")) || got["cus_alice"] != 86000 {
		t.Errorf("after 40 days of outage Stripe got %d, the ledger says %d", got["cus_alice"], e.ledgerCost("alice"))
	}
}

// TestMetersCrashMidSend: a shipper that dies in the middle of sending (its
// context cancelled with events in flight) leaves its plan in the cursor;
// the next holder sends exactly those identifiers and values.
func TestMetersCrashMidSend(t *testing.T) {
	st := openBolt(t, filepath.Join(t.TempDir(), "gw.db"))
	t.Cleanup(func() { _ = st.Close() })
	e := newMeterEnv(t, st)
	s1 := e.service("node-a")
	ship(t, s1)
	users := []string{"u1", "u2", "u3", "u4", "u5"}
	for i, u := range users {
		e.subscribe(u, postpaid)
		e.customer(u, "cus_"+u)
		e.report(u, postpaid, int64(i+1), e.clock.Now())
	}
	e.clock.Add(time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	var seen atomic.Int64
	e.mock.Fail(func(r stripetest.Request) int {
		if r.Path == "/v1/billing/meter_events" && seen.Add(1) == 3 {
			cancel() // the process dies while Stripe is answering its third event
			time.Sleep(100 * time.Millisecond)
		}
		return 0
	})
	if _, err := s1.ShipMeters(ctx); err == nil {
		t.Fatal("the dying shipper reported success")
	}
	e.mock.Fail(nil)
	s2 := e.service("node-b")
	if run := ship(t, s2); run.Leader {
		t.Fatal("node-b took the lease before it ran out")
	}
	e.clock.Add(3 * time.Minute) // node-a's lease runs out
	run := ship(t, s2)
	if !run.Leader || run.Planned != 0 {
		t.Fatalf("node-b: %+v, want it to finish node-a's plan and plan nothing new", run)
	}
	saw := stripeSaw(t, e.mock)
	if len(saw) != len(users) {
		t.Fatalf("%d identifiers, want %d", len(saw), len(users))
	}
	got := sums(t, saw)
	for _, u := range users {
		if got["cus_"+u] != int64(e.ledgerCost(u)) {
			t.Errorf("%s: Stripe got %d, the ledger says %d", u, got["cus_"+u], e.ledgerCost(u))
		}
	}
}

// TestMetersRefused: an event Stripe refuses (400) is held and tried again
// an hour later, without holding back the others.
func TestMetersRefused(t *testing.T) {
	st := openBolt(t, filepath.Join(t.TempDir(), "gw.db"))
	t.Cleanup(func() { _ = st.Close() })
	e := newMeterEnv(t, st)
	s := e.service("node-a")
	ship(t, s)
	for _, u := range []string{"ok", "gone"} {
		e.subscribe(u, postpaid)
		e.customer(u, "cus_"+u)
		e.report(u, postpaid, 2, e.clock.Now())
	}
	e.mock.Fail(func(r stripetest.Request) int {
		if r.Form.Get("payload[stripe_customer_id]") == "cus_gone" {
			return 400
		}
		return 0
	})
	e.clock.Add(time.Minute)
	run := ship(t, s)
	if run.Sent != 1 || run.Held != 1 {
		t.Fatalf("run: %+v, want one sent and one held", run)
	}
	e.report("gone", postpaid, 1, e.clock.Now())
	e.clock.Add(time.Minute)
	ship(t, s) // the new unit is a new event (refused too); the held one is not planned again
	e.mock.Fail(nil)
	e.clock.Add(time.Hour + time.Minute)
	run = ship(t, s)
	if run.Held != 0 {
		t.Fatalf("after the retry: %+v", run)
	}
	got := sums(t, okOnly(stripeSaw(t, e.mock)))
	if got["cus_gone"] != int64(e.ledgerCost("gone")) || got["cus_ok"] != int64(e.ledgerCost("ok")) {
		t.Errorf("Stripe got %v; the ledger says gone %d, ok %d", got, e.ledgerCost("gone"), e.ledgerCost("ok"))
	}
}

// okOnly keeps the identifiers Stripe took (a refused one never counted).
func okOnly(saw map[string]sentEvent) map[string]sentEvent {
	out := map[string]sentEvent{}
	for id, ev := range saw {
		if ev.ok {
			out[id] = ev
		}
	}
	return out
}

// TestMetersFleetPG: two nodes on one PostgreSQL database, each with its
// own store and shipper, run their shippers at once while usage is
// recorded through both and the lease changes hands (a node pauses past
// its lease, the other takes over mid-plan): every unit reaches Stripe
// once, and a node that lost the lease cannot move the cursor.
func TestMetersFleetPG(t *testing.T) {
	dsn := pgtest.DB(t)
	open := func(node string) *pgstore.Store {
		st, err := pgstore.Open(context.Background(), pgstore.Options{DSN: dsn, NodeID: node})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		return st
	}
	st1, st2 := open("n1"), open("n2")
	e := newMeterEnv(t, st1)
	e2 := &meterEnv{t: t, st: st2, mock: e.mock, clock: e.clock, cat: e.cat, seq: e.seq}
	users := []string{"a", "b", "c", "d"}
	for _, u := range users {
		e.subscribe(u, postpaid)
		e.customer(u, "cus_"+u)
	}
	s1, s2 := e.service("n1"), e2.service("n2")
	ship(t, s1)

	// Fencing: n1 holds the lease; past its ttl n2 takes it; n1's cursor
	// write is refused.
	pay1 := store.Payments(st1)
	l1, err := pay1.TakeLease(context.Background(), payments.MeterLease, "fence-a", time.Minute, e.clock.Now())
	if err != nil || !l1.Held {
		// s1 holds it: wait it out first.
		e.clock.Add(4 * time.Minute)
		if l1, err = pay1.TakeLease(context.Background(), payments.MeterLease, "fence-a", time.Minute, e.clock.Now()); err != nil || !l1.Held {
			t.Fatalf("TakeLease: %+v %v", l1, err)
		}
	}
	e.clock.Add(2 * time.Minute)
	pay2 := store.Payments(st2)
	l2, err := pay2.TakeLease(context.Background(), payments.MeterLease, "fence-b", time.Minute, e.clock.Now())
	if err != nil || !l2.Held || l2.Epoch <= l1.Epoch {
		t.Fatalf("fence-b after fence-a's ttl: %+v %v", l2, err)
	}
	if err := pay1.PutLeaseCursor(context.Background(), payments.MeterLease, "fence-a", l1.Epoch, []byte(`{}`), e.clock.Now()); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("a node that lost the lease wrote the cursor: %v", err)
	}
	if err := pay2.ReleaseLease(context.Background(), payments.MeterLease, "fence-b"); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var runs [2]atomic.Int64
	for i, s := range []*payments.Service{s1, s2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if run, err := s.ShipMeters(ctx); err == nil && run.Leader {
					runs[i].Add(1)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	for round := 0; round < 40; round++ {
		for i, u := range users {
			env := e
			if (round+i)%2 == 1 {
				env = e2
			}
			env.report(u, postpaid, int64(1+(round*i)%3), e.clock.Now())
		}
		if round%10 == 9 {
			e.clock.Add(4 * time.Minute) // every lease runs out: whoever asks next takes it
		} else {
			e.clock.Add(7 * time.Minute)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	// Both drain what is left.
	e.clock.Add(5 * time.Minute)
	for i := 0; i < 3; i++ {
		ship(t, s1)
		e.clock.Add(5 * time.Minute)
		ship(t, s2)
	}
	got := sums(t, stripeSaw(t, e.mock))
	for _, u := range users {
		if got["cus_"+u] != int64(e.ledgerCost(u)) || got["cus_"+u] == 0 {
			t.Errorf("%s: Stripe got %d, the ledger says %d", u, got["cus_"+u], e.ledgerCost(u))
		}
	}
	t.Logf("leader runs: n1 %d, n2 %d; %d meter events, %d requests", runs[0].Load(), runs[1].Load(),
		len(stripeSaw(t, e.mock)), len(e.mock.Requests("/v1/billing/meter_events")))
}

// TestStartMetersStops: the shipper's loop runs at once and every
// meter_interval, and closing stop ends it (no goroutine left) and lets
// the lease go, so the next config's shipper or another node takes it at
// once.
func TestStartMetersStops(t *testing.T) {
	st := openBolt(t, filepath.Join(t.TempDir(), "gw.db"))
	t.Cleanup(func() { _ = st.Close() })
	e := newMeterEnv(t, st)
	e.subscribe("alice", postpaid)
	e.customer("alice", "cus_alice")
	s := e.service("node-a")
	ship(t, s) // the first run starts the cursor at this hour
	e.report("alice", postpaid, 2, e.clock.Now())
	stop := make(chan struct{})
	done := s.StartMeters(stop)
	deadline := time.Now().Add(10 * time.Second)
	for len(e.mock.Requests("/v1/billing/meter_events")) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the shipper did not run")
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the shipper did not stop")
	}
	if l, err := store.Payments(st).TakeLease(context.Background(), payments.MeterLease, "next", time.Minute, e.clock.Now()); err != nil || !l.Held {
		t.Fatalf("the lease was not let go at stop: %+v %v", l, err)
	}
	buf := make([]byte, 1<<20)
	if stacks := string(buf[:runtime.Stack(buf, true)]); strings.Contains(stacks, "payments.(*Service).StartMeters") {
		t.Errorf("a goroutine of the shipper outlived stop:\n%s", stacks)
	}
}

// TestConfigMeterChecks: a meter on a prepaid product, or with an event
// name Stripe would not take, is an error at load that names the line.
func TestConfigMeterChecks(t *testing.T) {
	credits := billing.Product{ID: "credits", BillingModel: billing.Prepaid, MeasurementType: billing.PerRequest, Price: billing.Whole(1)}
	p1 := postpaid
	cat, err := catalog.Compile([]*catalog.Service{{ID: "geo", Backend: "http://127.0.0.1:9", Secrets: []string{"s3cret-s3cret-s3cret-s3cret-0001"},
		Endpoints:       []*catalog.Endpoint{{ID: "lookup", Path: "/lookup"}},
		Products:        []*billing.Product{&p1, &credits},
		ProductListings: []*catalog.ProductListing{{Product: "payg", Currency: "USD"}, {Product: "credits", Currency: "USD"}},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	base := payments.Config{Provider: "stripe", SecretKey: "sk_test_x", WebhookSecret: "whsec_x"}
	for _, tc := range []struct {
		price payments.Price
		want  string
	}{
		{payments.Price{Service: "geo", Product: "credits", Meter: "geo_credits"}, "a prepaid product's usage is paid by credits"},
		{payments.Price{Service: "geo", Product: "payg", Meter: "geo payg"}, `meter event name "geo payg"`},
		{payments.Price{Service: "geo", Product: "payg", Meter: strings.Repeat("m", 101)}, "at most 100"},
	} {
		cfg := base
		cfg.Prices = []payments.Price{tc.price}
		if err := cfg.Validate(cat); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.price, err, tc.want)
		}
	}
	cfg := base
	cfg.Prices = []payments.Price{{Service: "geo", Product: "payg", Meter: "geo.payg-v2_calls"}}
	if err := cfg.Validate(cat); err != nil {
		t.Errorf("a good meter: %v", err)
	}
}

// TestMetersFirstHourInsideTheSubscription: Stripe bills a meter event by
// its timestamp, so usage of the hour a Stripe subscription started in
// is stamped at the start, not at the top of the hour before it, where
// Stripe would leave it out of every invoice. Later hours keep their own
// start.
func TestMetersFirstHourInsideTheSubscription(t *testing.T) {
	st := openBolt(t, filepath.Join(t.TempDir(), "gw.db"))
	e := newMeterEnv(t, st)
	e.subscribe("alice", postpaid)
	e.customer("alice", "cus_alice")
	s := e.service("node-a")
	ship(t, s) // the cursor starts at this hour
	hour := e.clock.Now().UTC().Truncate(time.Hour)
	started := hour.Add(30 * time.Minute)
	var pay store.Payments = st
	ctx := context.Background()
	rec, _ := json.Marshal(payments.SubscriptionRecord{ID: "sub_alice", UserID: "alice", ServiceID: "geo", ProductID: "payg",
		CustomerID: "cus_alice", StripeStatus: "active", Status: "ACTIVE", StartDate: started, UpdatedAt: started})
	link, _ := json.Marshal(map[string]any{"subscriptionId": "sub_alice", "updatedAt": started})
	if err := pay.PutPaymentRecord(ctx, payments.KindSubscription, "sub_alice", rec, started); err != nil {
		t.Fatal(err)
	}
	if err := pay.PutPaymentRecord(ctx, payments.KindSubscriptionOf, "geo/alice", link, started); err != nil {
		t.Fatal(err)
	}
	e.report("alice", postpaid, 3, started.Add(5*time.Minute))
	e.report("alice", postpaid, 4, hour.Add(time.Hour+10*time.Minute))
	e.clock.Add(3 * time.Hour)
	if run := ship(t, s); run.Sent != 2 {
		t.Fatalf("run: %+v, want the two hours sent", run)
	}
	var stamps []int64
	for _, ev := range stripeSaw(t, e.mock) {
		stamps = append(stamps, ev.timestamp)
	}
	slices.Sort(stamps)
	if want := []int64{started.Unix(), hour.Add(time.Hour).Unix()}; !slices.Equal(stamps, want) {
		t.Errorf("timestamps %v, want %v (the first hour from the subscription's start, the next at its top)", stamps, want)
	}
}

// TestMetersRefusedForeverIsAbandoned: an event Stripe refuses for longer
// than its meter window (a deleted customer) is recorded as abandoned
// and never sent again, so the cursor stops carrying it, and its usage
// is not planned again under a new identifier.
func TestMetersRefusedForeverIsAbandoned(t *testing.T) {
	st := openBolt(t, filepath.Join(t.TempDir(), "gw.db"))
	t.Cleanup(func() { _ = st.Close() })
	e := newMeterEnv(t, st)
	s := e.service("node-a")
	ship(t, s)
	e.subscribe("gone", postpaid)
	e.customer("gone", "cus_gone")
	e.report("gone", postpaid, 2, e.clock.Now())
	e.mock.Fail(func(r stripetest.Request) int {
		if r.Form.Get("payload[stripe_customer_id]") == "cus_gone" {
			return 400
		}
		return 0
	})
	e.clock.Add(time.Minute)
	if run := ship(t, s); run.Held != 1 {
		t.Fatalf("run: %+v, want the event held", run)
	}
	ids := map[string]bool{}
	for range 36 {
		e.clock.Add(24 * time.Hour)
		ship(t, s)
	}
	for _, r := range e.mock.Requests("/v1/billing/meter_events") {
		ids[r.Form.Get("identifier")] = true
	}
	if len(ids) != 1 {
		t.Fatalf("%d identifiers sent for one refused unit of usage, want 1 (never planned again): %v", len(ids), ids)
	}
	n := len(e.mock.Requests("/v1/billing/meter_events"))
	e.clock.Add(2 * time.Hour)
	if run := ship(t, s); run.Held != 0 {
		t.Fatalf("after 36 days: %+v, want nothing held", run)
	}
	if m := len(e.mock.Requests("/v1/billing/meter_events")); m != n {
		t.Errorf("an abandoned event was sent again (%d requests, then %d)", n, m)
	}
}

// linkStripeSub stores rec as the Stripe subscription of user's
// subscription to geo, as the webhook handlers keep it.
func linkStripeSub(t testing.TB, pay store.Payments, rec payments.SubscriptionRecord) {
	t.Helper()
	ctx := context.Background()
	b, _ := json.Marshal(rec)
	link, _ := json.Marshal(map[string]any{"subscriptionId": rec.ID, "updatedAt": rec.UpdatedAt})
	if err := pay.PutPaymentRecord(ctx, payments.KindSubscription, rec.ID, b, rec.UpdatedAt); err != nil {
		t.Fatal(err)
	}
	if err := pay.PutPaymentRecord(ctx, payments.KindSubscriptionOf, "geo/"+rec.UserID, link, rec.UpdatedAt); err != nil {
		t.Fatal(err)
	}
}

// TestMetersRenewalHourSplitAtTheRenewal: a Stripe subscription renews
// inside an hour (it started at 09:40:17, so it renews at 09:40:17). The
// usage of that hour before the renewal is stamped in the hour (the
// period that ends), the usage from the renewal on at the renewal (the
// new period), each part with its own identifiers; late rows of either
// part go to their part; a crash between the parts' events resends the
// same identifiers and values. Before, the whole hour was stamped at its
// top: the period that ended was billed for the new period's usage
// (found by a review of the shown figures). Run with a record as kept
// before the periods were (monthly from its start) and with one that
// knows its period and interval.
func TestMetersRenewalHourSplitAtTheRenewal(t *testing.T) {
	for _, kind := range []string{"start only", "period and interval"} {
		t.Run(kind, func(t *testing.T) {
			st := openBolt(t, filepath.Join(t.TempDir(), "gw.db"))
			t.Cleanup(func() { _ = st.Close() })
			e := newMeterEnv(t, st)
			e.subscribe("alice", postpaid)
			e.customer("alice", "cus_alice")
			s := e.service("node-a")
			ship(t, s) // the cursor at 09:00 on 2026-11-02
			hour := e.clock.Now().UTC().Truncate(time.Hour)
			renewal := hour.Add(40*time.Minute + 17*time.Second) // 09:40:17
			started := renewal.AddDate(0, -1, 0)                 // 2026-10-02 09:40:17
			rec := payments.SubscriptionRecord{ID: "sub_alice", UserID: "alice", ServiceID: "geo", ProductID: "payg",
				CustomerID: "cus_alice", StripeStatus: "active", Status: "ACTIVE", StartDate: started, UpdatedAt: started,
				CurrentPeriodEnd: renewal.AddDate(0, 1, 0)}
			if kind != "start only" {
				// As the gateway knows it before the renewal's webhook.
				rec.CurrentPeriodStart, rec.CurrentPeriodEnd = started, renewal
				rec.BillingCycleAnchor, rec.Interval, rec.IntervalCount = started, "month", 1
			}
			linkStripeSub(t, st, rec)

			oldCost := e.report("alice", postpaid, 3, renewal.Add(-10*time.Minute)) // 09:30: the old period
			e.clock.Add(25 * time.Minute)                                           // 09:35: the running hour ships
			if run := ship(t, s); run.Sent != 1 {
				t.Fatalf("09:35: %+v, want the hour so far sent", run)
			}
			lateOld := e.report("alice", postpaid, 2, renewal.Add(-2*time.Minute)) // 09:38, after it shipped
			atRenewal := e.report("alice", postpaid, 1, renewal)                   // at the renewal: the new period
			newCost := e.report("alice", postpaid, 4, renewal.Add(10*time.Minute)) // 09:50: the new period
			// A crash between the parts: the first part's event goes, then
			// Stripe fails; the next run sends the second part as planned.
			e.clock.Add(20 * time.Minute) // 09:55
			var seen atomic.Int64
			e.mock.Fail(func(r stripetest.Request) int {
				if r.Path == "/v1/billing/meter_events" && seen.Add(1) > 1 {
					return 500
				}
				return 0
			})
			if _, err := s.ShipMeters(context.Background()); err == nil {
				t.Fatal("the run with Stripe down reported success")
			}
			e.mock.Fail(nil)
			e.clock.Add(3 * time.Hour)
			if run := ship(t, s); run.Sent != 1 || run.Planned != 0 {
				t.Fatalf("after the failure: %+v, want the planned part sent, nothing planned again", run)
			}
			// A late row of the new part (a store's rows are in time order).
			lateNew := e.report("alice", postpaid, 5, renewal.Add(11*time.Minute))
			if run := ship(t, s); run.Sent != 1 {
				t.Fatalf("late row: %+v, want one event", run)
			}
			if run := ship(t, s); run.Sent != 0 {
				t.Fatalf("again: %+v, want nothing", run)
			}

			var before, after int64
			for id, ev := range stripeSaw(t, e.mock) {
				ts := time.Unix(ev.timestamp, 0).UTC()
				switch {
				case ts.Equal(hour):
					before += ev.value
				case ts.Equal(renewal):
					after += ev.value
				default:
					t.Errorf("event %s of %d stamped %s, want %s or the renewal %s", id, ev.value, ts, hour, renewal)
				}
			}
			if want := int64(oldCost + lateOld); before != want {
				t.Errorf("stamped before the renewal (the period that ends): %d, want %d", before, want)
			}
			if want := int64(newCost + atRenewal + lateNew); after != want {
				t.Errorf("stamped at the renewal (the new period): %d, want %d", after, want)
			}
			if got := sums(t, stripeSaw(t, e.mock)); got["cus_alice"] != int64(e.ledgerCost("alice")) {
				t.Errorf("Stripe got %d in all, the ledger says %d", got["cus_alice"], e.ledgerCost("alice"))
			}
			if n := len(stripeSaw(t, e.mock)); n != 4 {
				t.Errorf("%d identifiers, want 4 (two per part)", n)
			}
		})
	}
}

// TestMetersUsageBeforeTheSubscriptionStampedAtItsStart: usage recorded
// before the caller's Stripe subscription began (no customer yet, then
// Checkout) is stamped at the subscription's start, so it is billed in
// its first period. Before, it was stamped at its own hours, before the
// subscription, where it is in no invoice (found by a review of the
// shown figures).
func TestMetersUsageBeforeTheSubscriptionStampedAtItsStart(t *testing.T) {
	st := openBolt(t, filepath.Join(t.TempDir(), "gw.db"))
	t.Cleanup(func() { _ = st.Close() })
	e := newMeterEnv(t, st)
	e.subscribe("bob", postpaid)
	s := e.service("node-a")
	ship(t, s) // the cursor at 09:00
	e.clock.Add(10 * time.Minute)
	e.report("bob", postpaid, 5, e.clock.Now()) // 09:20, no customer yet
	e.clock.Add(time.Hour)
	e.report("bob", postpaid, 2, e.clock.Now()) // 10:20
	if run := ship(t, s); run.Sent != 0 || len(run.NoCustomer) != 1 {
		t.Fatalf("without a customer: %+v, want bob waiting", run)
	}
	e.clock.Add(time.Hour) // 11:20: Checkout
	started := e.clock.Now()
	e.customer("bob", "cus_bob")
	linkStripeSub(t, st, payments.SubscriptionRecord{ID: "sub_bob", UserID: "bob", ServiceID: "geo", ProductID: "payg",
		CustomerID: "cus_bob", StripeStatus: "active", Status: "ACTIVE", StartDate: started, UpdatedAt: started})
	after := e.report("bob", postpaid, 1, started.Add(5*time.Minute))
	e.clock.Add(time.Minute)
	if run := ship(t, s); run.Sent != 3 {
		t.Fatalf("with a customer: %+v, want the three hours sent", run)
	}
	saw := stripeSaw(t, e.mock)
	for id, ev := range saw {
		if ts := time.Unix(ev.timestamp, 0).UTC(); !ts.Equal(started) {
			t.Errorf("event %s of %d stamped %s, want the subscription's start %s", id, ev.value, ts, started)
		}
	}
	if got := sums(t, saw); got["cus_bob"] != int64(e.ledgerCost("bob")) || got["cus_bob"] != 16000 || after != 2000 {
		t.Errorf("Stripe got %d, the ledger says %d (want 16000)", got["cus_bob"], e.ledgerCost("bob"))
	}
}
