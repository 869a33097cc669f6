package platform

import (
	"context"
	"crypto/sha256"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
	"github.com/platformgw/gateway/internal/store/pgstore"
)

// TestStoreMigrate: a bbolt file with something of everything moves into
// an empty PostgreSQL database through `caddy platform store migrate`, and
// the PostgreSQL store then serves it as the file did: keys by hash,
// balances, counters (the quota left), the ledger with its ids, an open
// job completing against its hold, a retried report answered from its
// idempotency claim, an alert that must not fire again, the audit log. A
// second run into the same database is refused, and so is a file in use.
func TestStoreMigrate(t *testing.T) {
	ctx := context.Background()
	now := time.Now().UTC()
	whole := billing.Whole
	quota := whole(10)
	pQuota := billing.Product{ID: "basic", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, Quota: &quota}
	pPrepaid := billing.Product{ID: "credits", BillingModel: billing.Prepaid, MeasurementType: billing.PerRequest, Price: whole(1)}

	path := filepath.Join(t.TempDir(), "platform.db")
	src, err := boltstore.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	hash := sha256.Sum256([]byte("psk_migrated"))
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(src.CreateKey(ctx, store.KeyRecord{ID: "key_m", Hash: hash, UserID: "alice", Label: "moved", Created: now}))
	must(src.CreateKey(ctx, store.KeyRecord{ID: "key_r", Hash: sha256.Sum256([]byte("psk_revoked")), UserID: "alice", Created: now}))
	if _, err := src.RevokeKey(ctx, "key_r", now); err != nil {
		t.Fatal(err)
	}
	for _, s := range []struct{ svc, product string }{{"svc", "basic"}, {"pay", "credits"}} {
		if _, err := src.PutSubscription(ctx, store.Subscription{UserID: "alice", ServiceID: s.svc, ProductID: s.product,
			Status: "ACTIVE", StartedAt: now.Add(-time.Hour), UpdatedAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := src.AddCredits(ctx, "alice", "pay", whole(20), now); err != nil {
		t.Fatal(err)
	}
	q := store.Account{UserID: "alice", ServiceID: "svc", Product: pQuota}
	p := store.Account{UserID: "alice", ServiceID: "pay", Product: pPrepaid}
	for range 4 { // 4 of the quota of 10 used
		res, err := src.Reserve(ctx, q, whole(1), now)
		dec := res.Decision
		if err != nil || !dec.Allowed {
			t.Fatalf("Reserve: %+v %v", dec, err)
		}
		if _, err := src.Settle(ctx, res, whole(1), store.LedgerEntry{Time: now, UserID: "alice", ServiceID: "svc",
			ProductID: "basic", Source: store.SourceGateway}); err != nil {
			t.Fatal(err)
		}
	}
	report := store.LedgerEntry{Time: now, UserID: "alice", ServiceID: "pay", ProductID: "credits", Units: whole(3),
		Source: store.SourceReport, IdempotencyKey: "rep-1"}
	first, err := src.Record(ctx, p, report, func(e store.LedgerEntry, _ billing.State) ([]byte, error) {
		return []byte(`{"id":"` + e.ID + `"}`), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// An open job holding 5 credits, and a finished one.
	job := store.Job{ID: "job-open", UserID: "alice", ServiceID: "pay", EndpointID: "ep", ProductID: "credits",
		Status: store.JobPending, CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour)}
	if res, err := src.CreateJobReserved(ctx, job, p, whole(5), now); err != nil || !res.Decision.Allowed {
		t.Fatalf("CreateJobReserved: %+v %v", res.Decision, err)
	}
	done := job
	done.ID, done.Status, done.CompletedAt = "job-done", store.JobCompleted, now
	must(src.CreateJob(ctx, done))
	alert, err := src.CreateAlert(ctx, store.Alert{UserID: "alice", ServiceID: "svc", ProductID: "basic",
		PeriodStart: now.Add(-time.Hour), Threshold: "quota 40%", Value: whole(4), Limit: quota, Created: now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.AppendAudit(ctx, store.AuditEntry{Time: now, Actor: "test", Action: "key.create", KeyID: "key_m"}); err != nil {
		t.Fatal(err)
	}
	var before []store.LedgerEntry
	must(src.ScanLedger(ctx, store.LedgerFilter{}, func(e store.LedgerEntry) error { before = append(before, e); return nil }))

	// A file in use is refused.
	dsn := pgtest.DB(t)
	if _, err := cliRun(t, "store", "migrate", "--to", "postgres", "--dsn", dsn, path); err == nil ||
		!strings.Contains(err.Error(), "in use") {
		t.Fatalf("migrate of a file in use: %v", err)
	}
	must(src.Close())

	if _, err := cliRun(t, "store", "migrate", "--to", "mysql", "--dsn", dsn, path); err == nil {
		t.Error("migrate --to mysql succeeded")
	}
	out, err := cliRun(t, "store", "migrate", "--to", "postgres", "--dsn", dsn, path)
	if err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	for _, want := range []string{"both sides agree", "ledger entries", "open jobs holding units"} {
		if !strings.Contains(out, want) {
			t.Errorf("migrate printed no %q:\n%s", want, out)
		}
	}
	t.Logf("migrate printed:\n%s", out)
	if _, err := cliRun(t, "store", "migrate", "--to", "postgres", "--dsn", dsn, path); err == nil ||
		!strings.Contains(err.Error(), "not empty") {
		t.Errorf("a second migrate into the same database: %v", err)
	}

	dst, err := pgstore.Open(ctx, pgstore.Options{DSN: dsn, NodeID: "check"})
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	if k, err := dst.KeyByHash(ctx, hash); err != nil || k.ID != "key_m" || k.Label != "moved" {
		t.Errorf("key after the move: %+v, %v", k, err)
	}
	if k, err := dst.KeyByID(ctx, "key_r"); err != nil || k.RevokedAt.IsZero() {
		t.Errorf("revoked key after the move: %+v, %v", k, err)
	}
	if sub, err := dst.GetSubscription(ctx, "alice", "pay"); err != nil || sub.Credits != whole(17) ||
		sub.CreditsHeld != whole(5) || !sub.StartedAt.Equal(now.Add(-time.Hour).Truncate(time.Microsecond)) && !sub.StartedAt.Equal(now.Add(-time.Hour)) {
		t.Errorf("prepaid subscription after the move: %+v, %v; want 17 credits, 5 held by the open job", sub, err)
	}
	// 4 of 10 used: 6 more fit, a 7th does not.
	if res, err := dst.Reserve(ctx, q, whole(6), now); err != nil || !res.Decision.Allowed {
		t.Errorf("the 6 units left: %+v, %v", res.Decision, err)
	}
	if res, err := dst.Reserve(ctx, q, whole(1), now); err != nil || res.Decision.Allowed {
		t.Errorf("a unit past 4 used and 6 held of 10: %+v, %v", res.Decision, err)
	}
	var after []store.LedgerEntry
	must(dst.ScanLedger(ctx, store.LedgerFilter{}, func(e store.LedgerEntry) error { after = append(after, e); return nil }))
	if len(after) != len(before) {
		t.Fatalf("%d ledger entries after the move, %d before", len(after), len(before))
	}
	for i := range before {
		if after[i].ID != before[i].ID || after[i].Units != before[i].Units || after[i].UserID != before[i].UserID {
			t.Errorf("ledger entry %d: %+v, was %+v", i, after[i], before[i])
		}
	}
	// The retried report is answered from its claim.
	again, err := dst.Record(ctx, p, report, func(store.LedgerEntry, billing.State) ([]byte, error) { return []byte("new"), nil })
	if !errors.Is(err, store.ErrReplayed) || string(again) != string(first) {
		t.Errorf("retried report after the move: %q, %v; want ErrReplayed with %q", again, err, first)
	}
	// The open job completes against its hold: 2 of the 5 credits charged.
	j, err := dst.CompleteJob(ctx, "job-open", p, store.LedgerEntry{Time: now, UserID: "alice", ServiceID: "pay",
		ProductID: "credits", RequestID: "job-open", Units: whole(2), Source: store.SourceCompletion}, func(j *store.Job) error {
		j.Status, j.CompletedAt = store.JobCompleted, now
		return nil
	})
	if err != nil || j.Units != whole(2) {
		t.Fatalf("completing the moved job: %+v, %v", j, err)
	}
	if st, err := dst.State(ctx, p, now); err != nil || st.Credits != whole(15) || st.Used != whole(5) {
		t.Errorf("state after the moved job completed: %+v, %v; want 15 credits left, 5 used", st, err)
	}
	if _, err := dst.CreateAlert(ctx, alert); !errors.Is(err, store.ErrExists) {
		t.Errorf("the moved alert fired again: %v", err)
	}
	if entries, _, err := dst.ListAudit(ctx, "", 10); err != nil || len(entries) != 1 || entries[0].KeyID != "key_m" {
		t.Errorf("audit after the move: %+v, %v", entries, err)
	}
	if got, err := dst.GetJob(ctx, "job-done"); err != nil || got.Status != store.JobCompleted {
		t.Errorf("finished job after the move: %+v, %v", got, err)
	}
}

// TestStoreMigratePrunedLedger: a file whose oldest rows were pruned
// keeps their hourly rollups and its ledger numbering. A migrate made the
// rollups of the rows it copied only, so the sums of every pruned hour
// were lost (usage by hour, the charts), and the target numbered its next
// row after the last copied one: a ledger id (led_1, …) handed out a
// second time. Both travel now, and the migrate compares the rollups'
// sums too.
func TestStoreMigratePrunedLedger(t *testing.T) {
	ctx := context.Background()
	whole := billing.Whole
	p := billing.Product{ID: "payg", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest, Price: whole(1)}
	a := store.Account{UserID: "alice", ServiceID: "svc", Product: p}
	path := filepath.Join(t.TempDir(), "platform.db")
	src, err := boltstore.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	old := time.Now().UTC().Add(-90 * 24 * time.Hour).Truncate(time.Hour)
	if _, err := src.PutSubscription(ctx, store.Subscription{UserID: "alice", ServiceID: "svc", ProductID: "payg", Status: "ACTIVE",
		StartedAt: old.Add(-time.Hour), UpdatedAt: old}); err != nil {
		t.Fatal(err)
	}
	settle := func(at time.Time) store.LedgerEntry {
		t.Helper()
		res, err := src.Reserve(ctx, a, whole(1), at)
		if err != nil {
			t.Fatal(err)
		}
		e, err := src.Settle(ctx, res, whole(1), store.LedgerEntry{Time: at, UserID: "alice", ServiceID: "svc", EndpointID: "ep",
			ProductID: "payg", Source: store.SourceGateway})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	for i := range 3 {
		settle(old.Add(time.Duration(i) * time.Minute))
	}
	if err := src.ScanLedger(ctx, store.LedgerFilter{}, func(store.LedgerEntry) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if res, err := src.PruneLedger(ctx, old.Add(24*time.Hour)); err != nil || res.Rows != 3 {
		t.Fatalf("prune: %+v, %v", res, err)
	}
	last := settle(time.Now().UTC())
	var want []store.Rollup
	if err := src.ScanRollups(ctx, store.RollupFilter{}, func(r store.Rollup) error { want = append(want, r); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(want) != 2 || want[0].Calls != 3 {
		t.Fatalf("rollups before the move: %+v", want)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}

	dsn := pgtest.DB(t)
	if out, err := cliRun(t, "store", "migrate", "--to", "postgres", "--dsn", dsn, path); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	dst, err := pgstore.Open(ctx, pgstore.Options{DSN: dsn, NodeID: "check"})
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	var got []store.Rollup
	if err := dst.ScanRollups(ctx, store.RollupFilter{}, func(r store.Rollup) error { got = append(got, r); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("rollups after the move: %+v, want %+v", got, want)
	}
	for i := range want {
		w, g := want[i], got[i]
		if !g.Hour.Equal(w.Hour) || g.UserID != w.UserID || g.EndpointID != w.EndpointID || g.ProductID != w.ProductID ||
			g.Calls != w.Calls || g.Units != w.Units || g.Cost != w.Cost {
			t.Errorf("rollup %d after the move: %+v, want %+v", i, g, w)
		}
	}
	_, err = dst.Record(ctx, a, store.LedgerEntry{Time: time.Now().UTC(), UserID: "alice", ServiceID: "svc", ProductID: "payg",
		Units: whole(1), Source: store.SourceReport, IdempotencyKey: "k1"},
		func(store.LedgerEntry, billing.State) ([]byte, error) { return []byte("{}"), nil })
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	if err := dst.ScanLedger(ctx, store.LedgerFilter{}, func(e store.LedgerEntry) error { ids = append(ids, e.ID); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(ids) != 2 || ids[0] != last.ID || ids[1] == "led_1" || ids[1] == last.ID {
		t.Fatalf("ledger ids after the move and one more row: %v; the copied row is %s, and ids 1 to 3 were handed out before the prune", ids, last.ID)
	}
}

// TestStoreMigrateForgottenRollups: rows kept whose rollups were
// forgotten (rollup_retention shorter than the rows' age) move, and the
// target makes their rollups again: the totals compared count them so.
func TestStoreMigrateForgottenRollups(t *testing.T) {
	ctx := context.Background()
	p := billing.Product{ID: "payg", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest, Price: billing.Whole(1)}
	a := store.Account{UserID: "bob", ServiceID: "svc", Product: p}
	path := filepath.Join(t.TempDir(), "platform.db")
	src, err := boltstore.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	old := time.Now().UTC().Add(-60 * 24 * time.Hour).Truncate(time.Hour)
	if _, err := src.PutSubscription(ctx, store.Subscription{UserID: "bob", ServiceID: "svc", ProductID: "payg", Status: "ACTIVE",
		StartedAt: old.Add(-time.Hour), UpdatedAt: old}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		at := old.Add(time.Duration(i) * time.Minute)
		res, err := src.Reserve(ctx, a, billing.Whole(1), at)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := src.Settle(ctx, res, billing.Whole(1), store.LedgerEntry{Time: at, UserID: "bob", ServiceID: "svc", EndpointID: "ep",
			ProductID: "payg", Source: store.SourceGateway}); err != nil {
			t.Fatal(err)
		}
	}
	if err := src.ScanLedger(ctx, store.LedgerFilter{}, func(store.LedgerEntry) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if n, err := src.PruneRollups(ctx, old.Add(24*time.Hour)); err != nil || n == 0 {
		t.Fatalf("prune rollups: %d, %v", n, err)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	dsn := pgtest.DB(t)
	if out, err := cliRun(t, "store", "migrate", "--to", "postgres", "--dsn", dsn, path); err != nil {
		t.Fatalf("migrate of rows whose rollups were forgotten: %v\n%s", err, out)
	}
}

// TestMigrateTotalsNoBareMoney: the summary of `caddy platform store
// migrate` sums spend and cost over every product, credits and every
// currency together; it called them "spend (sum)" and "ledger cost", an
// amount of money without its currency that no currency has. They are
// named as the checksums they are.
func TestMigrateTotalsNoBareMoney(t *testing.T) {
	for _, r := range totalsRows(store.Totals{Spend: billing.Whole(26), LedgerCost: billing.Whole(26)}) {
		name := r[0]
		if (strings.Contains(name, "spend") || strings.Contains(name, "cost")) && !strings.Contains(name, "checksum: credits and every currency summed") {
			t.Errorf("summary row %q gives a sum of money and credits as if it were an amount", name)
		}
	}
}

// TestStoreMigratePrunedMidMonthChecks: a bbolt ledger is pruned in whole
// segments, at any time of a month (ledger_retention, `usage prune`),
// while PostgreSQL keeps its rows in monthly partitions and `store check
// --dsn` took every row of the first partition's month as held. After
// moving a store pruned mid-month, the check the move's docs tell the
// operator to run (docs/fleet.md, "Migrating a bbolt store") failed with
// "stored counters disagree with the ledger": the rollups and the counters
// of the pruned rows, carried over rightly, were compared with the rows
// of that month left, or, with every row pruned, with the rows the fleet
// writes later in the same month. Nothing differs: the check must pass.
func TestStoreMigratePrunedMidMonthChecks(t *testing.T) {
	for _, tc := range []struct {
		name string
		kept bool // rows kept after the prune, in the pruned rows' month
	}{{"rows kept", true}, {"every row pruned", false}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			whole := billing.Whole
			p := billing.Product{ID: "payg", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest, Price: whole(1)}
			a := store.Account{UserID: "alice", ServiceID: "svc", Product: p}
			path := filepath.Join(t.TempDir(), "platform.db")
			src, err := boltstore.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			// The 10th of a month long past, at 10:20: the pruned rows and
			// the kept ones share the month, and the first kept row the
			// pruned rows' hour.
			m := time.Now().UTC().AddDate(0, -3, 0)
			base := time.Date(m.Year(), m.Month(), 10, 10, 20, 0, 0, time.UTC)
			if _, err := src.PutSubscription(ctx, store.Subscription{UserID: "alice", ServiceID: "svc", ProductID: "payg", Status: "ACTIVE",
				StartedAt: base.Add(-time.Minute), UpdatedAt: base}); err != nil {
				t.Fatal(err)
			}
			settle := func(at time.Time) {
				t.Helper()
				res, err := src.Reserve(ctx, a, whole(1), at)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := src.Settle(ctx, res, whole(1), store.LedgerEntry{Time: at, UserID: "alice", ServiceID: "svc", EndpointID: "ep",
					ProductID: "payg", Source: store.SourceGateway}); err != nil {
					t.Fatal(err)
				}
			}
			for i := range 3 {
				settle(base.Add(time.Duration(i) * time.Minute))
			}
			if err := src.ScanLedger(ctx, store.LedgerFilter{}, func(store.LedgerEntry) error { return nil }); err != nil {
				t.Fatal(err)
			}
			if res, err := src.PruneLedger(ctx, base.Add(5*time.Minute)); err != nil || res.Rows != 3 {
				t.Fatalf("prune: %+v, %v", res, err)
			}
			if tc.kept {
				settle(base.Add(10 * time.Minute)) // the pruned rows' hour
				settle(base.Add(2 * time.Hour))    // a later hour
			}
			if err := src.Close(); err != nil {
				t.Fatal(err)
			}
			dsn := pgtest.DB(t)
			if out, err := cliRun(t, "store", "migrate", "--to", "postgres", "--dsn", dsn, path); err != nil {
				t.Fatalf("migrate: %v\n%s", err, out)
			}
			if out, err := cliRun(t, "store", "check", "--dsn", dsn); err != nil {
				t.Fatalf("store check --dsn right after the move: %v\n%s", err, out)
			}
			// The fleet goes on writing rows in that month (a report of
			// usage back then, a settlement late at the month's end).
			dst, err := pgstore.Open(ctx, pgstore.Options{DSN: dsn, NodeID: "check"})
			if err != nil {
				t.Fatal(err)
			}
			_, err = dst.Record(ctx, a, store.LedgerEntry{Time: base.Add(3 * time.Hour), UserID: "alice", ServiceID: "svc", ProductID: "payg",
				Units: whole(1), Source: store.SourceReport, IdempotencyKey: "k1"},
				func(store.LedgerEntry, billing.State) ([]byte, error) { return []byte("{}"), nil })
			if err != nil {
				t.Fatal(err)
			}
			dst.Close()
			out, err := cliRun(t, "store", "check", "--dsn", dsn)
			if err != nil {
				t.Fatalf("store check --dsn after a row of that month: %v\n%s", err, out)
			}
			if tc.kept && !strings.Contains(out, "rows from "+base.Truncate(time.Hour).Add(time.Hour).Format(time.RFC3339)+" on (earlier rows were pruned") {
				t.Errorf("the check does not say from when the rows are held:\n%s", out)
			}
			// The check still sees a counter that differs.
			conn, err := pgx.Connect(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			if _, err := conn.Exec(ctx, "UPDATE allowances SET used = used + 1000000"); err != nil {
				t.Fatal(err)
			}
			if out, err := cliRun(t, "store", "check", "--dsn", dsn); err == nil || !strings.Contains(err.Error(), `used stored`) {
				t.Fatalf("store check --dsn of a counter one unit off: %v\n%s", err, out)
			}
		})
	}
}

// failingLedgerImport is the real PostgreSQL store, whose ledger import
// fails: a migration cut off half-way (the operator's Ctrl-C, a dropped
// SSH session, the database restarted), after the keys, subscriptions and
// counters were copied.
type failingLedgerImport struct{ store.Importer }

func (failingLedgerImport) ImportLedger(context.Context, []store.LedgerEntry) error {
	return errors.New("connection reset by peer")
}

// TestStoreMigrateInterruptedNotServed: a migration that did not finish
// leaves part of the store in the database. Running it again was refused
// ("not empty"), but a gateway started on the database (the next step of
// docs/fleet.md) served it without a word: the keys and subscriptions
// copied, the ledger rows, open jobs, idempotency claims and payment
// records not, so the rows were missing from every export, the jobs'
// completions were refused and a retried report was counted again. A
// database holding an unfinished migration must be refused by a node, by
// a second migration and by store check --dsn, each saying why.
func TestStoreMigrateInterruptedNotServed(t *testing.T) {
	ctx := context.Background()
	whole := billing.Whole
	p := billing.Product{ID: "payg", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest, Price: whole(1)}
	a := store.Account{UserID: "alice", ServiceID: "svc", Product: p}
	path := filepath.Join(t.TempDir(), "platform.db")
	src, err := boltstore.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	if _, err := src.PutSubscription(ctx, store.Subscription{UserID: "alice", ServiceID: "svc", ProductID: "payg", Status: "ACTIVE",
		StartedAt: now.Add(-time.Hour), UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	res, err := src.Reserve(ctx, a, whole(1), now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.Settle(ctx, res, whole(1), store.LedgerEntry{Time: now, UserID: "alice", ServiceID: "svc", EndpointID: "ep",
		ProductID: "payg", Source: store.SourceGateway}); err != nil {
		t.Fatal(err)
	}
	dsn := pgtest.DB(t)
	dst, err := pgstore.Open(ctx, pgstore.Options{DSN: dsn, NodeID: "migrate"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := migrateStore(ctx, src, failingLedgerImport{dst}, path, 100); err == nil {
		t.Fatal("the migration whose ledger import failed succeeded")
	}
	dst.Close()
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}

	node, err := pgstore.Open(ctx, pgstore.Options{DSN: dsn, NodeID: "gw-1"})
	if err == nil {
		node.Close()
		t.Fatal("a node started on the database of an unfinished migration")
	}
	if !strings.Contains(err.Error(), "did not finish") {
		t.Errorf("a node's refusal does not say a migration did not finish: %v", err)
	}
	if out, err := cliRun(t, "store", "migrate", "--to", "postgres", "--dsn", dsn, path); err == nil || !strings.Contains(err.Error(), "did not finish") {
		t.Errorf("a second migration into it: %v\n%s", err, out)
	}
	if out, err := cliRun(t, "store", "check", "--dsn", dsn); err == nil || !strings.Contains(err.Error(), "did not finish") {
		t.Errorf("store check --dsn: %v\n%s", err, out)
	}
}

// TestStoreMigrateSpendPerUnit: a bbolt file whose period holds spend in
// two cost units (3 credits under a PREPAID product, then 4 USD under a
// USD product with a cap of 10) moves to PostgreSQL with the spend of
// each unit apart: both sides agree on the totals, and the PostgreSQL
// store leaves 6 of the USD cap, 3 credits spent.
func TestStoreMigrateSpendPerUnit(t *testing.T) {
	ctx := context.Background()
	now := time.Now().UTC()
	whole := billing.Whole
	cap10 := whole(10)
	usd := billing.Product{ID: "usd", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest,
		Price: whole(1), SpendingCap: &cap10, Currency: "USD"}
	pre := billing.Product{ID: "credits", BillingModel: billing.Prepaid, MeasurementType: billing.PerRequest, Price: whole(1)}
	path := filepath.Join(t.TempDir(), "platform.db")
	src, err := boltstore.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	serve := func(s store.Store, a store.Account, n int) {
		t.Helper()
		for range n {
			res, err := s.Reserve(ctx, a, whole(1), now)
			if err != nil || !res.Decision.Allowed {
				t.Fatalf("Reserve: %+v %v", res.Decision, err)
			}
			if _, err := s.Settle(ctx, res, whole(1), store.LedgerEntry{Time: now, UserID: a.UserID, ServiceID: a.ServiceID,
				ProductID: a.Product.ID, Source: store.SourceGateway}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, p := range []string{pre.ID, usd.ID} {
		if _, err := src.PutSubscription(ctx, store.Subscription{UserID: "alice", ServiceID: "svc", ProductID: p,
			Status: "ACTIVE", StartedAt: now.Add(-time.Hour), UpdatedAt: now}); err != nil {
			t.Fatal(err)
		}
		if p == pre.ID {
			if _, err := src.AddCredits(ctx, "alice", "svc", whole(5), now); err != nil {
				t.Fatal(err)
			}
			serve(src, store.Account{UserID: "alice", ServiceID: "svc", Product: pre}, 3)
		}
	}
	a := store.Account{UserID: "alice", ServiceID: "svc", Product: usd}
	serve(src, a, 4)
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	dsn := pgtest.DB(t)
	out, err := cliRun(t, "store", "migrate", "--to", "postgres", "--dsn", dsn, path)
	if err != nil || !strings.Contains(out, "both sides agree") {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	dst, err := pgstore.Open(ctx, pgstore.Options{DSN: dsn, NodeID: "check"})
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	for _, w := range []struct {
		p     billing.Product
		spend billing.Units
	}{{usd, whole(4)}, {pre, whole(3)}} {
		a.Product = w.p
		if st, err := dst.State(ctx, a, now); err != nil || st.Spend != w.spend || st.Used != whole(7) {
			t.Errorf("after the migration, in %q: %+v %v; want 7 used, %s spent", w.p.CostUnit(), st, err, w.spend)
		}
	}
	rep, err := pgstore.Check(ctx, dsn)
	if err != nil || len(rep.Mismatches) != 0 {
		t.Errorf("store check after the migration: %v %+v", err, rep.Mismatches)
	}
}
