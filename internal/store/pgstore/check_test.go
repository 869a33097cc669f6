package pgstore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

// checkOK runs Check and fails the test unless every figure agrees.
func checkOK(t *testing.T, dsn string) CheckReport {
	t.Helper()
	rep, err := Check(context.Background(), dsn)
	if err != nil {
		t.Fatalf("check of a sound store: %v", err)
	}
	return rep
}

// A fleet serving: node a settles by commit, node b from its settlement
// log with shipments held back (its calls acknowledged, not in PostgreSQL
// yet), a job open with its hold, a job completed, a usage report and a
// free account's call. The check passes while both nodes hold leases.
// Then each counter is changed with SQL, and the check names each one
// (user, service, period, counter, stored and derived) and fails.
func TestCheckCountersAgainstLedger(t *testing.T) {
	dsn := pgtest.DB(t)
	ctx := context.Background()
	a := openNode(t, dsn, "a")
	b := openNode(t, dsn, "b", func(o *Options) {
		o.LogDir, o.ShipInterval, o.LeaseMax = t.TempDir(), time.Hour, units(10)
	})
	subscribe(t, a, "u", "svc", "q")
	subscribe(t, a, "p", "pp", "pp")
	if _, err := a.AddCredits(ctx, "p", "pp", units(100), time.Now()); err != nil {
		t.Fatal(err)
	}
	quota := store.Account{UserID: "u", ServiceID: "svc", Product: quotaProduct(1000)}
	pre := store.Account{UserID: "p", ServiceID: "pp", Product: prepaidProduct(2)}
	for range 3 {
		call(t, a, quota)
		call(t, a, pre)
	}
	for range 2 {
		call(t, b, quota)
		call(t, b, pre)
	}
	if b.Unshipped() == 0 {
		t.Fatal("node b shipped its settlements: the check would not see any in flight")
	}
	now := time.Now().UTC()
	job := func(id string) store.Job {
		return store.Job{ID: id, UserID: "u", ServiceID: "svc", EndpointID: "e", Status: store.JobPending,
			CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour)}
	}
	for _, id := range []string{"open", "done"} {
		if res, err := a.CreateJobReserved(ctx, job(id), quota, units(4), now); err != nil || !res.Decision.Allowed {
			t.Fatalf("job %s: %+v %v", id, res.Decision, err)
		}
	}
	if _, err := b.CompleteJob(ctx, "done", quota, store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "q", Units: units(3)},
		func(j *store.Job) error { j.Status = store.JobCompleted; return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Record(ctx, quota, store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "q", Units: units(2)},
		func(store.LedgerEntry, billing.State) ([]byte, error) { return []byte("{}"), nil }); err != nil {
		t.Fatal(err)
	}
	free := store.Account{UserID: "f", ServiceID: "svc", Free: true}
	res, err := a.Reserve(ctx, free, units(1), now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Settle(ctx, res, units(1), store.LedgerEntry{UserID: "f", ServiceID: "svc"}); err != nil {
		t.Fatal(err)
	}

	rep := checkOK(t, dsn)
	if rep.Accounts != 2 || len(rep.Unchecked) != 0 || rep.Leases < 2 || rep.JobHolds != 1 || rep.Rollups == 0 || rep.Schema != SchemaVersion {
		t.Fatalf("report: %+v", rep)
	}

	// The figures as the database holds them, to name the damage below.
	var period int64
	if err := a.pool.QueryRow(ctx, "SELECT period FROM allowances WHERE user_id = 'u'").Scan(&period); err != nil {
		t.Fatal(err)
	}
	sum := func(sql string) billing.Units {
		t.Helper()
		var n int64
		if err := a.pool.QueryRow(ctx, sql).Scan(&n); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return billing.Units(n)
	}
	used := sum("SELECT used FROM allowances WHERE user_id = 'u'")
	spend := sum("SELECT spend FROM allowances WHERE user_id = 'p'")
	leased := sum("SELECT leased_units FROM allowances WHERE user_id = 'u'")
	held := sum("SELECT credits_held FROM subscriptions WHERE user_id = 'p'")
	var hour time.Time
	var endpoint string
	var rolled int64
	if err := a.pool.QueryRow(ctx, `SELECT hour, endpoint_id, units FROM ledger_rollups WHERE user_id = 'u' AND product_id = 'q'
		ORDER BY hour, endpoint_id LIMIT 1`).Scan(&hour, &endpoint, &rolled); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		"UPDATE allowances SET used = used + 5000000 WHERE user_id = 'u'",
		"UPDATE allowances SET spend = spend - 250000 WHERE user_id = 'p'",
		"UPDATE allowances SET leased_units = leased_units + 2000000 WHERE user_id = 'u'",
		"UPDATE subscriptions SET credits_held = credits_held - 1000000 WHERE user_id = 'p'",
		"UPDATE ledger_rollups SET units = units + 1000000 WHERE user_id = 'u' AND hour = '" + hour.Format(time.RFC3339) + "' AND endpoint_id = '" + endpoint + "'",
		"UPDATE jobs SET open = false WHERE id = 'open'",
	} {
		if _, err := a.pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	rep, err = Check(ctx, dsn)
	if !errors.Is(err, ErrCountersDisagree) {
		t.Fatalf("check of changed counters: %v", err)
	}
	t.Log(err)
	at := time.Unix(period, 0).UTC()
	want := []Mismatch{
		{UserID: "p", ServiceID: "pp", Counter: "credits_held", Stored: held - units(1), Derived: held},
		{UserID: "p", ServiceID: "pp", Counter: "spend", Stored: spend - 250000, Derived: spend},
		{UserID: "u", ServiceID: "svc", Hour: hour.UTC(), EndpointID: endpoint, ProductID: "q", Counter: "rollup units",
			Stored: billing.Units(rolled) + units(1), Derived: billing.Units(rolled)},
		{UserID: "u", ServiceID: "svc", Counter: "used", Stored: used + units(5), Derived: used},
		{UserID: "u", ServiceID: "svc", Period: at, Counter: `lease of job "open", which is not open,`, Stored: units(4)},
		{UserID: "u", ServiceID: "svc", Period: at, Counter: "leased_units", Stored: leased + units(2), Derived: leased},
	}
	if len(rep.Mismatches) != len(want) {
		t.Fatalf("%d figures named, want %d: %v", len(rep.Mismatches), len(want), err)
	}
	for _, w := range want {
		found := false
		for _, m := range rep.Mismatches {
			found = found || m.String() == w.String()
		}
		if !found {
			t.Errorf("not named: %s\nnamed:\n%v", w, err)
		}
		if !strings.Contains(err.Error(), w.String()) {
			t.Errorf("the error does not say %q", w.String())
		}
	}
}

// Retention: the rows of a dropped partition are stood in for by their
// rollups, so the counters are still proved (and a changed one named);
// once the rollups of the subscription's first period are pruned too, its
// used and spend cannot be derived and are not compared (Unchecked), and
// the check says so rather than fail.
func TestCheckAfterPrune(t *testing.T) {
	dsn := pgtest.DB(t)
	ctx := context.Background()
	s := openNode(t, dsn, "a")
	// The subscription starts at the hour of its first report, three
	// months back, so its first period starts there too.
	now := time.Now().UTC()
	t0 := monthStart(now).AddDate(0, -3, 10)
	if _, err := s.PutSubscription(ctx, store.Subscription{UserID: "u", ServiceID: "svc", ProductID: "q",
		Status: "ACTIVE", StartedAt: t0, UpdatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	acct := store.Account{UserID: "u", ServiceID: "svc", Product: quotaProduct(1000)}
	for _, at := range []time.Time{t0, t0.Add(2 * time.Hour), now} {
		if _, err := s.Record(ctx, acct, store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "q", Units: units(2), Time: at},
			func(store.LedgerEntry, billing.State) ([]byte, error) { return []byte("{}"), nil }); err != nil {
			t.Fatal(err)
		}
	}
	res, err := s.PruneLedger(ctx, monthStart(now).AddDate(0, -1, 0))
	if err != nil || res.Rows != 2 {
		t.Fatalf("prune: %+v %v", res, err)
	}
	rep := checkOK(t, dsn)
	if rep.Accounts != 1 || len(rep.Unchecked) != 0 || !rep.LedgerFrom.After(t0) || !rep.RollupsFrom.Equal(t0) {
		t.Fatalf("after the ledger's prune: %+v", rep)
	}
	if _, err := s.pool.Exec(ctx, "UPDATE allowances SET used = used + 1000000 WHERE period = $1", t0.Unix()); err != nil {
		t.Fatal(err)
	}
	rep, err = Check(ctx, dsn)
	if !errors.Is(err, ErrCountersDisagree) || len(rep.Mismatches) != 1 || rep.Mismatches[0].Counter != "used" ||
		rep.Mismatches[0].Derived != units(6) || rep.Mismatches[0].Stored != units(7) {
		t.Fatalf("a changed counter after the prune: %+v %v", rep.Mismatches, err)
	}
	if _, err := s.PruneRollups(ctx, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	rep = checkOK(t, dsn)
	if rep.Accounts != 0 || len(rep.Unchecked) != 1 || !rep.Unchecked[0].Since.Equal(t0) {
		t.Fatalf("after the rollups' prune: %+v", rep)
	}
}

// A database no gateway made, and one of an older schema, are refused
// rather than read as sound.
func TestCheckRefusesOtherDatabases(t *testing.T) {
	dsn := pgtest.DB(t)
	if _, err := Check(context.Background(), dsn); err == nil || !strings.Contains(err.Error(), "not a platform store") {
		t.Fatalf("an empty database: %v", err)
	}
	s := openNode(t, dsn, "a")
	if _, err := s.pool.Exec(context.Background(), "DELETE FROM pgstore_migrations WHERE version > 1"); err != nil {
		t.Fatal(err)
	}
	if _, err := Check(context.Background(), dsn); err == nil || !strings.Contains(err.Error(), "version 1") {
		t.Fatalf("schema version 1: %v", err)
	}
}

// The check while three nodes serve a quota and a prepaid balance, one of
// them from its settlement log: every snapshot agrees, whatever is leased,
// settled or waiting to be shipped at that moment.
func TestCheckWhileServing(t *testing.T) {
	dsn := pgtest.DB(t)
	nodes := []*Store{openNode(t, dsn, "a"), openNode(t, dsn, "b"), openNode(t, dsn, "c", func(o *Options) {
		o.LogDir, o.ShipInterval, o.LeaseMax = t.TempDir(), 50*time.Millisecond, units(10)
	})}
	subscribe(t, nodes[0], "u", "svc", "q")
	subscribe(t, nodes[0], "p", "pp", "pp")
	if _, err := nodes[0].AddCredits(context.Background(), "p", "pp", units(400), time.Now()); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		race(t, nodes, 6, store.Account{UserID: "u", ServiceID: "svc", Product: quotaProduct(300)})
		race(t, nodes, 6, store.Account{UserID: "p", ServiceID: "pp", Product: prepaidProduct(2)})
	}()
	checks := 0
	for serving := true; serving; checks++ {
		select {
		case <-done:
			serving = false
		default:
		}
		if _, err := Check(context.Background(), dsn); err != nil {
			t.Fatalf("check %d while serving: %v", checks, err)
		}
	}
	t.Logf("%d checks while serving", checks)
}
