package pgstore

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

// Nodes starting together on an empty database make one schema.
func TestConcurrentOpenMigratesOnce(t *testing.T) {
	dsn := pgtest.DB(t)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	stores := make([]*Store, 3)
	for i := range stores {
		wg.Go(func() {
			stores[i], errs[i] = Open(context.Background(), Options{DSN: dsn, NodeID: "n"})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("open %d: %v", i, err)
		}
		defer stores[i].Close()
	}
	var n, max int
	if err := stores[0].pool.QueryRow(context.Background(), "SELECT count(*), max(version) FROM pgstore_migrations").Scan(&n, &max); err != nil {
		t.Fatal(err)
	}
	if n != SchemaVersion || max != SchemaVersion {
		t.Fatalf("migrations recorded: %d up to %d, want %d", n, max, SchemaVersion)
	}
	// A fourth node finds nothing to do.
	openNode(t, dsn, "late")
}

func TestKeysAcrossNodes(t *testing.T) {
	dsn := pgtest.DB(t)
	a, b := openNode(t, dsn, "a"), openNode(t, dsn, "b")
	ctx := context.Background()
	h := sha256.Sum256([]byte("pk_secret"))
	k := store.KeyRecord{ID: "0b7c3f4e-0000-4000-8000-000000000001", Hash: h, UserID: "u1", Roles: []string{"consumer"}, Created: time.Now().UTC()}
	if err := a.CreateKey(ctx, k); err != nil {
		t.Fatal(err)
	}
	if err := b.CreateKey(ctx, k); !errors.Is(err, store.ErrExists) {
		t.Fatalf("second create: %v, want ErrExists", err)
	}
	got, err := b.KeyByHash(ctx, h)
	if err != nil || got.ID != k.ID || got.UserID != "u1" || got.Hash != h {
		t.Fatalf("KeyByHash on b: %+v %v", got, err)
	}
	if _, err := b.KeyByHash(ctx, sha256.Sum256([]byte("other"))); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown key: %v", err)
	}
	first := time.Now().UTC().Truncate(time.Second)
	if _, err := a.RevokeKey(ctx, k.ID, first); err != nil {
		t.Fatal(err)
	}
	r, err := a.RevokeKey(ctx, k.ID, first.Add(time.Hour))
	if err != nil || !r.RevokedAt.Equal(first) {
		t.Fatalf("second revoke kept %v (%v), want %v", r.RevokedAt, err, first)
	}
	list, err := b.ListKeys(ctx, "u1")
	if err != nil || len(list) != 1 {
		t.Fatalf("ListKeys: %v %v", list, err)
	}
	if _, err := b.KeyByID(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("KeyByID unknown: %v", err)
	}
}

func TestSubscriptionsAndCredits(t *testing.T) {
	dsn := pgtest.DB(t)
	a, b := openNode(t, dsn, "a"), openNode(t, dsn, "b")
	ctx := context.Background()
	if _, err := a.GetSubscription(ctx, "u", "svc"); !errors.Is(err, store.ErrNoAccount) {
		t.Fatalf("missing: %v", err)
	}
	subscribe(t, a, "u", "svc", "basic")
	if _, err := b.AddCredits(ctx, "u", "svc", units(10), time.Now()); err != nil {
		t.Fatal(err)
	}
	start := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	s2, err := b.PutSubscription(ctx, store.Subscription{UserID: "u", ServiceID: "svc", ProductID: "pro", Status: "ACTIVE", StartedAt: start, UpdatedAt: time.Now()})
	if err != nil || s2.Credits != units(10) || s2.StartedAt.Equal(start) {
		t.Fatalf("update keeps start and balance: %+v %v", s2, err)
	}
	got, err := a.GetSubscription(ctx, "u", "svc")
	if err != nil || got.ProductID != "pro" || got.Credits != units(10) {
		t.Fatalf("a sees %+v %v", got, err)
	}
	subscribe(t, a, "u", "svc2", "basic")
	subscribe(t, a, "v", "svc", "basic")
	page, next, err := a.ListSubscriptions(ctx, "", "", 2)
	if err != nil || len(page) != 2 || next == "" {
		t.Fatalf("page 1: %v %q %v", page, next, err)
	}
	page, next, err = a.ListSubscriptions(ctx, "", next, 2)
	if err != nil || len(page) != 1 || next != "" || page[0].UserID != "v" {
		t.Fatalf("page 2: %v %q %v", page, next, err)
	}
	if _, _, err := a.ListSubscriptions(ctx, "v", "!!", 2); !errors.Is(err, store.ErrBadCursor) {
		t.Fatalf("bad cursor: %v", err)
	}
}

func TestAuditPages(t *testing.T) {
	s := openNode(t, pgtest.DB(t), "a")
	ctx := context.Background()
	for i := range 5 {
		if _, err := s.AppendAudit(ctx, store.AuditEntry{Time: time.Now(), Actor: "t", Action: "key.create", Detail: string(rune('a' + i))}); err != nil {
			t.Fatal(err)
		}
	}
	var all []store.AuditEntry
	cursor := ""
	for range 10 {
		page, next, err := s.ListAudit(ctx, cursor, 2)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, page...)
		if next == "" {
			break
		}
		cursor = next
	}
	if len(all) != 5 || all[0].Seq != 5 || all[4].Seq != 1 {
		t.Fatalf("audit newest first: %+v", all)
	}
	if _, _, err := s.ListAudit(ctx, "x", 2); !errors.Is(err, store.ErrBadCursor) {
		t.Fatalf("bad cursor: %v", err)
	}
}

// ledgerIndexesOfVersion2 puts back the ledger's indexes as schema
// versions 1 and 2 made them (migration 3 replaced them), having undone
// migrations 8 (spend per cost unit), 7 (the ended lease rows' expired
// credits), 6 (the deferred
// expiry's columns), 4 (the call outcomes' tables) and 5 (the payments'
// tables).
const ledgerIndexesOfVersion2 = `ALTER TABLE allowances DROP COLUMN spend_unit, DROP COLUMN spend_other;
DROP TABLE lease_pre_ended;
ALTER TABLE subscriptions DROP COLUMN expiry_slack;
DROP INDEX leases_pre;
ALTER TABLE leases DROP COLUMN pre_credits;
DROP TABLE call_outcomes, call_outcome_writers;
DROP TABLE payment_records, credit_grants, credit_reversals, payment_leases;
ALTER TABLE ledger DROP CONSTRAINT ledger_time_call_key;
ALTER TABLE ledger ADD CONSTRAINT ledger_call_id_time_key UNIQUE (call_id, time);
CREATE INDEX ledger_time ON ledger (time, seq);
`

// A ledger of schema version 2 (a unique index on (call_id, time) and one
// on (time, seq)) is migrated to the one unique index on (time, call_id):
// its rows stay, a batch sent again is still charged once, and the scans
// in (time, seq) order read the same rows in the same order.
func TestLedgerIndexMigration(t *testing.T) {
	ctx := context.Background()
	dsn, s, p, key, now := quotaNode(t)
	batch := func() []*settlement {
		var b []*settlement
		for i := range 50 {
			b = append(b, &settlement{callID: fmt.Sprintf("call-%03d", 49-i), key: key, product: p, units: units(1),
				entry: store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: p.ID, Source: store.SourceGateway,
					Time: now.Add(time.Duration(i%5) * time.Microsecond)}})
		}
		return b
	}
	if err := s.commitSettlements(batch()); err != nil {
		t.Fatal(err)
	}
	scan := func(s *Store) string {
		t.Helper()
		var out strings.Builder
		if err := s.ScanLedger(ctx, store.LedgerFilter{}, func(e store.LedgerEntry) error {
			fmt.Fprintf(&out, "%d %s %s\n", e.Seq, e.Time.Format(time.RFC3339Nano), e.Units)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	want := scan(s)
	if n := strings.Count(want, "\n"); n != 50 {
		t.Fatalf("%d ledger rows, want 50", n)
	}
	s.Close()

	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, ledgerIndexesOfVersion2+"DELETE FROM pgstore_migrations WHERE version >= 3"); err != nil {
		t.Fatal(err)
	}
	indexes := func() string {
		t.Helper()
		var out string
		if err := conn.QueryRow(ctx, `SELECT string_agg(indexdef, '; ' ORDER BY indexname) FROM pg_indexes
			WHERE tablename = 'ledger'`).Scan(&out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if got := indexes(); !strings.Contains(got, "(call_id, \"time\")") {
		t.Fatalf("the version 2 ledger was not put back: %s", got)
	}

	s = openNode(t, dsn, "b")
	if got, want := indexes(), `CREATE UNIQUE INDEX ledger_time_call_key ON ONLY public.ledger USING btree ("time", call_id)`; got != want {
		t.Fatalf("ledger indexes after the migration:\n%s\nwant\n%s", got, want)
	}
	if got := scan(s); got != want {
		t.Fatalf("ledger after the migration:\n%s\nwant\n%s", got, want)
	}
	again := batch()
	if err := s.commitSettlements(again); err != nil {
		t.Fatal(err)
	}
	if got := scan(s); got != want {
		t.Fatalf("ledger after the batch was sent again:\n%s\nwant\n%s", got, want)
	}
	if used := usedOf(t, conn, key); used != int64(units(50)) {
		t.Fatalf("used %d after the batch was sent again, want %d", used, int64(units(50)))
	}
	// A row of a new month's partition gets the index too.
	if _, err := conn.Exec(ctx, `INSERT INTO ledger (time, call_id, user_id, service_id, entry) VALUES
		('2031-05-01T00:00:00Z', 'x', 'u', 'svc', '{}')`); err == nil {
		t.Fatal("a row outside every partition was inserted")
	}
	if err := s.ensurePartition(ctx, time.Date(2031, 5, 1, 0, 0, 0, 0, time.UTC)); err != nil {
		t.Fatal(err)
	}
	ins := `INSERT INTO ledger (time, call_id, user_id, service_id, entry) VALUES ('2031-05-01T00:00:00Z', 'x', 'u', 'svc', '{}')`
	if _, err := conn.Exec(ctx, ins); err != nil {
		t.Fatal(err)
	}
	var pe *pgconn.PgError
	if _, err := conn.Exec(ctx, ins); !errors.As(err, &pe) || pe.Code != "23505" {
		t.Fatalf("the same call at the same time again: %v, want a unique violation", err)
	}
}

// The ledger's statements name its sequence (ledgerSeq): a database whose
// seq column takes its numbers elsewhere is refused at start, naming it,
// rather than numbered from a sequence the column does not use.
func TestLedgerSequenceChecked(t *testing.T) {
	dsn := pgtest.DB(t)
	s := openNode(t, dsn, "a")
	ctx := context.Background()
	if _, err := s.pool.Exec(ctx, "ALTER SEQUENCE ledger_seq_seq RENAME TO ledger_numbers"); err != nil {
		t.Fatal(err)
	}
	_, err := Open(ctx, Options{DSN: dsn, NodeID: "b"})
	if err == nil || !strings.Contains(err.Error(), "ledger's sequence") {
		t.Fatalf("open with the sequence renamed: %v, want the ledger's sequence named", err)
	}
	if _, err := s.pool.Exec(ctx, "ALTER SEQUENCE ledger_numbers RENAME TO ledger_seq_seq"); err != nil {
		t.Fatal(err)
	}
	openNode(t, dsn, "c")
}
