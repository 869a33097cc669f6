package pgstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

// TestSettleCommitStoppingHealthyWaitsForTheCommit: a `settle commit`
// node told the process is stopping (Stopping) while PostgreSQL answers
// still waits for its settlements' commits, which take milliseconds, and
// answers what each commit says. Answering "pending" at once, as it must
// while the database is unreachable (TestSettleCommitStoppingAnswersWaiting),
// told the caller of a settlement that then failed (its subscription gone
// mid-call: 500, not charged) that its call was charged, and a kill -9
// before the stop's last commit lost a charge the caller was told of.
func TestSettleCommitStoppingHealthyWaitsForTheCommit(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DB(t)
	a := openNode(t, dsn, "a", func(o *Options) { o.SettleCommit = true })
	subscribe(t, a, "u", "svc", "q")
	acct := store.Account{UserID: "u", ServiceID: "svc", Product: quotaProduct(50)}
	entry := store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "q", Source: store.SourceGateway}

	a.Stopping()
	// A call settled after the stop began, the database answering.
	res, err := a.Reserve(ctx, acct, units(1), time.Now())
	if err != nil || !res.Decision.Allowed {
		t.Fatalf("reserve: %+v %v", res.Decision, err)
	}
	if _, err := a.Settle(ctx, res, units(1), entry); err != nil {
		t.Fatalf("a settlement at the stop with the database up answered %v, want its commit", err)
	}
	if n, _, _, _ := ledgerOf(t, a, acct); n != 1 {
		t.Fatalf("%d ledger rows when the caller was answered, want 1", n)
	}

	// A call whose settlement fails (its subscription deleted while it
	// was in flight) is told so, not that it is charged.
	res, err = a.Reserve(ctx, acct, units(1), time.Now())
	if err != nil || !res.Decision.Allowed {
		t.Fatalf("reserve: %+v %v", res.Decision, err)
	}
	if _, err := a.pool.Exec(ctx, "DELETE FROM subscriptions WHERE user_id = 'u'"); err != nil {
		t.Fatal(err)
	}
	_, err = a.Settle(ctx, res, units(1), entry)
	if err == nil || errors.Is(err, store.ErrSettlementPending) {
		t.Fatalf("a settlement that fails at the stop answered %v, want its failure", err)
	}
}
