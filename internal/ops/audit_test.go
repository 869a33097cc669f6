package ops

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/pgstore"
)

// TestChangeWithoutAuditNotMade: a key created or revoked, a subscription
// set, credits added and a usage prune write their audit entry in the same
// transaction as the change. With the database refusing audit entries (a trigger standing in
// for a full tablespace or a database lost between two statements), each
// change is refused whole: no key, the key still active, the subscription
// and its balance as they were, the ledger's rows all there. The change was made and only its entry missed, answered
// ErrAuditNotRecorded; a crash between the two writes left no trace at all.
func TestChangeWithoutAuditNotMade(t *testing.T) {
	dsn := pgtest.DB(t)
	ctx := context.Background()
	st, err := pgstore.Open(ctx, pgstore.Options{DSN: dsn, NodeID: "audit-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	q := billing.Whole(10)
	svc := &catalog.Service{ID: "weather", Backend: "http://127.0.0.1:9", Secrets: []string{"0123456789abcdef0123456789abcdef"},
		Endpoints: []*catalog.Endpoint{{ID: "hello"}},
		Products: []*billing.Product{
			{ID: "basic", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, Quota: &q, Overage: "block"},
			{ID: "pro", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, Quota: &q, Overage: "block"},
		}}
	cat, err := catalog.Compile([]*catalog.Service{svc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	o := New(engine.New(engine.Runtime{Catalog: cat, Data: st}), nil)
	key, err := o.CreateKey(ctx, "test", CreateKeyRequest{UserID: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.PutSubscription(ctx, "test", "alice", "weather", "basic", ""); err != nil {
		t.Fatal(err)
	}
	// January's usage, for a prune to remove.
	var rows []store.LedgerEntry
	for i := range 5 {
		rows = append(rows, store.LedgerEntry{Seq: uint64(i + 1), ID: fmt.Sprint("led_", i), Time: time.Date(2026, 1, 10, i, 0, 0, 0, time.UTC),
			UserID: "alice", ServiceID: "weather", ProductID: "basic", Units: billing.Whole(1), Source: store.SourceGateway})
	}
	if err := st.ImportLedger(ctx, rows); err != nil {
		t.Fatal(err)
	}
	ledgerRows := func() int {
		n := 0
		if err := st.ScanLedger(ctx, store.LedgerFilter{}, func(store.LedgerEntry) error { n++; return nil }); err != nil {
			t.Fatal(err)
		}
		return n
	}
	feb := time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)
	if _, err := pgtest.Exec(ctx, dsn, `CREATE FUNCTION refuse_audit() RETURNS trigger LANGUAGE plpgsql AS
		$$ BEGIN RAISE EXCEPTION 'audit log refused'; END $$;
		CREATE TRIGGER refuse_audit BEFORE INSERT ON audit FOR EACH ROW EXECUTE FUNCTION refuse_audit();`); err != nil {
		t.Fatal(err)
	}

	v, err := o.CreateKey(ctx, "test", CreateKeyRequest{UserID: "bob"})
	if err == nil || errors.Is(err, ErrAuditNotRecorded) || v.Key != "" {
		t.Errorf("CreateKey with the audit log refusing = %+v, %v; want a store error and no key", v, err)
	}
	if keys, err := st.ListKeys(ctx, "bob"); err != nil || len(keys) != 0 {
		t.Errorf("bob's keys after a refused audit entry: %+v, %v; want none", keys, err)
	}
	if _, err := o.RevokeKey(ctx, "test", key.ID); err == nil || errors.Is(err, ErrAuditNotRecorded) {
		t.Errorf("RevokeKey with the audit log refusing: %v; want a store error", err)
	}
	if k, err := st.KeyByID(ctx, key.ID); err != nil || !k.RevokedAt.IsZero() {
		t.Errorf("key after a refused revocation: %+v, %v; want it active", k, err)
	}
	if _, err := o.PutSubscription(ctx, "test", "alice", "weather", "pro", ""); err == nil || errors.Is(err, ErrAuditNotRecorded) {
		t.Errorf("PutSubscription with the audit log refusing: %v; want a store error", err)
	}
	if sub, err := st.GetSubscription(ctx, "alice", "weather"); err != nil || sub.ProductID != "basic" {
		t.Errorf("subscription after a refused put: %+v, %v; want product basic", sub, err)
	}
	if _, err := o.AddCredits(ctx, "test", "alice", "weather", billing.Whole(5)); err == nil || errors.Is(err, ErrAuditNotRecorded) {
		t.Errorf("AddCredits with the audit log refusing: %v; want a store error", err)
	}
	if sub, err := st.GetSubscription(ctx, "alice", "weather"); err != nil || sub.Credits != 0 {
		t.Errorf("subscription after refused credits: %+v, %v; want a balance of 0", sub, err)
	}

	if _, err := o.PruneLedger(ctx, "test", feb); err == nil || errors.Is(err, ErrAuditNotRecorded) {
		t.Errorf("PruneLedger with the audit log refusing: %v; want a store error", err)
	}
	if n := ledgerRows(); n != len(rows) {
		t.Errorf("%d of %d ledger rows left after a prune whose entry was refused", n, len(rows))
	}

	// The log accepts entries again: each change is made with its entry.
	if _, err := pgtest.Exec(ctx, dsn, `DROP TRIGGER refuse_audit ON audit`); err != nil {
		t.Fatal(err)
	}
	if _, err := o.RevokeKey(ctx, "test", key.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := o.PutSubscription(ctx, "test", "alice", "weather", "pro", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := o.AddCredits(ctx, "test", "alice", "weather", billing.Whole(5)); err != nil {
		t.Fatal(err)
	}
	if res, err := o.PruneLedger(ctx, "test", feb); err != nil || res.Rows != int64(len(rows)) || ledgerRows() != 0 {
		t.Fatalf("PruneLedger = %+v, %v", res, err)
	}
	entries, _, err := st.ListAudit(ctx, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Action)
		if e.Time.IsZero() || time.Since(e.Time) > time.Hour {
			t.Errorf("entry %+v has no time of now", e)
		}
	}
	want := []string{AuditUsagePrune, AuditCreditsAdd, AuditSubscriptionPut, AuditKeyRevoke, AuditSubscriptionPut, AuditKeyCreate}
	if len(got) != len(want) {
		t.Fatalf("audit log %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("audit log %v, want %v", got, want)
		}
	}
	if entries[3].KeyID != key.ID || entries[2].Detail != "product pro, status ACTIVE (was product basic)" ||
		entries[1].Detail != "amount 5, balance 5" ||
		!strings.HasPrefix(entries[0].Detail, "raw ledger rows before 2026-02-01T00:00:00Z: 1 segments, 5 rows, ") {
		t.Errorf("entries %+v", entries)
	}
}
