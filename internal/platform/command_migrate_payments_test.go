package platform

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
	"github.com/platformgw/gateway/internal/store/pgstore"
)

// TestStoreMigratePayments: the payments data (records, credit grants with
// their reversals and expiries, leases with their cursors) moves to
// PostgreSQL, and a payment or refund delivered again after the move is
// still a replay.
func TestStoreMigratePayments(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2024, 3, 20, 12, 0, 0, 0, time.UTC)
	whole := billing.Whole
	path := filepath.Join(t.TempDir(), "platform.db")
	src, err := boltstore.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err = src.PutSubscription(ctx, store.Subscription{UserID: "alice", ServiceID: "pay", ProductID: "credits", Status: "ACTIVE",
		StartedAt: t0, UpdatedAt: t0})
	must(err)
	g := store.CreditGrant{ID: "pi_1", UserID: "alice", ServiceID: "pay", Credits: whole(100), GrantedAt: t0,
		ExpiresAt: t0.Add(time.Hour), Source: "stripe", Reference: "cs_1"}
	_, err = src.GrantCredits(ctx, g)
	must(err)
	_, err = src.GrantCredits(ctx, store.CreditGrant{ID: "pi_2", UserID: "alice", ServiceID: "pay", Credits: whole(10), GrantedAt: t0.Add(time.Minute)})
	must(err)
	_, _, err = src.ReverseCredits(ctx, store.CreditReversal{ID: "re_1", GrantID: "pi_1", Credits: whole(40), At: t0})
	must(err)
	_, err = src.ExpireCredits(ctx, t0.Add(time.Hour)) // 60 of pi_1 expire: balance 10
	must(err)
	_, err = src.InsertPaymentRecord(ctx, "customer", "alice", []byte(`{"id":"cus_1"}`), t0)
	must(err)
	l, err := src.TakeLease(ctx, "meter-shipper", "node-a", time.Minute, t0)
	must(err)
	must(src.PutLeaseCursor(ctx, "meter-shipper", "node-a", l.Epoch, []byte("42"), t0))
	must(src.Close())

	dsn := pgtest.DB(t)
	out, err := cliRun(t, "store", "migrate", "--to", "postgres", "--dsn", dsn, path)
	if err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	for _, want := range []string{"both sides agree", "credit grants", "credit reversals", "payment records", "leases"} {
		if !strings.Contains(out, want) {
			t.Errorf("migrate printed no %q:\n%s", want, out)
		}
	}
	dst, err := pgstore.Open(ctx, pgstore.Options{DSN: dsn, NodeID: "check"})
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	if sub, err := dst.GetSubscription(ctx, "alice", "pay"); err != nil || sub.Credits != whole(10) {
		t.Errorf("balance after the move: %+v, %v; want 10", sub, err)
	}
	gs, err := dst.ListCreditGrants(ctx, "alice", "pay")
	if err != nil || len(gs) != 2 || gs[0].Reversed != whole(40) || gs[0].Expired != whole(60) || !gs[0].ExpiredAt.Equal(t0.Add(time.Hour)) ||
		gs[0].Reference != "cs_1" || gs[1].ID != "pi_2" {
		t.Errorf("grants after the move: %+v, %v", gs, err)
	}
	if _, err := dst.GrantCredits(ctx, g); !errors.Is(err, store.ErrReplayed) {
		t.Errorf("the payment delivered again after the move: %v, want ErrReplayed", err)
	}
	if _, _, err := dst.ReverseCredits(ctx, store.CreditReversal{ID: "re_1", GrantID: "pi_1", Credits: whole(40), At: t0}); !errors.Is(err, store.ErrReplayed) {
		t.Errorf("the refund delivered again after the move: %v, want ErrReplayed", err)
	}
	if b, err := dst.GetPaymentRecord(ctx, "customer", "alice"); err != nil || string(b) != `{"id":"cus_1"}` {
		t.Errorf("record after the move: %q, %v", b, err)
	}
	if err := dst.PutLeaseCursor(ctx, "meter-shipper", "node-a", l.Epoch, []byte("43"), t0.Add(time.Second)); err != nil {
		t.Errorf("the lease's holder after the move: %v", err)
	}
	if got, err := dst.TakeLease(ctx, "meter-shipper", "node-b", time.Minute, t0.Add(time.Hour)); err != nil || !got.Held ||
		got.Epoch != l.Epoch+1 || string(got.Cursor) != "43" {
		t.Errorf("the lease after the move: %+v, %v", got, err)
	}
}
