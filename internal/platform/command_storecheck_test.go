package platform

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/pgstore"
)

// TestStoreCheckPostgres: `caddy platform store check --dsn` of a fleet's
// database that a node serves (its leases held) says OK; with used, spend
// and leased_units changed by SQL it exits non-zero naming each (user,
// service, period, counter, stored and derived).
func TestStoreCheckPostgres(t *testing.T) {
	ctx := context.Background()
	whole := billing.Whole
	quota := whole(100)
	pQuota := billing.Product{ID: "basic", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, Quota: &quota}
	pPrepaid := billing.Product{ID: "credits", BillingModel: billing.Prepaid, MeasurementType: billing.PerRequest, Price: whole(1)}
	dsn := pgtest.DB(t)
	node, err := pgstore.Open(ctx, pgstore.Options{DSN: dsn, NodeID: "gw-1"})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	now := time.Now().UTC()
	for _, s := range []struct{ svc, product string }{{"svc", "basic"}, {"pay", "credits"}} {
		if _, err := node.PutSubscription(ctx, store.Subscription{UserID: "alice", ServiceID: s.svc, ProductID: s.product,
			Status: "ACTIVE", StartedAt: now, UpdatedAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := node.AddCredits(ctx, "alice", "pay", whole(20), now); err != nil {
		t.Fatal(err)
	}
	for _, a := range []store.Account{{UserID: "alice", ServiceID: "svc", Product: pQuota}, {UserID: "alice", ServiceID: "pay", Product: pPrepaid}} {
		for range 3 {
			res, err := node.Reserve(ctx, a, whole(1), time.Now())
			if err != nil || !res.Decision.Allowed {
				t.Fatalf("reserve: %+v %v", res.Decision, err)
			}
			if _, err := node.Settle(ctx, res, whole(1), store.LedgerEntry{UserID: a.UserID, ServiceID: a.ServiceID,
				ProductID: a.Product.ID, Source: store.SourceGateway}); err != nil {
				t.Fatal(err)
			}
		}
	}

	out, err := cliRun(t, "store", "check", "--dsn", dsn)
	if err != nil {
		t.Fatalf("store check --dsn of a sound store: %v\n%s", err, out)
	}
	for _, want := range []string{"Result:", "OK", "used and spend of 2 subscriptions", "node leases", "Balances:"} {
		if !strings.Contains(out, want) {
			t.Errorf("store check --dsn printed no %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "postgres@") {
		t.Errorf("store check --dsn printed the DSN's user:\n%s", out)
	}
	t.Logf("store check --dsn printed:\n%s", out)

	period := pgtest.Query(t, dsn, "SELECT period FROM allowances WHERE service_id = 'svc'")
	pgtest.Query(t, dsn, "UPDATE allowances SET used = used + 2000000 WHERE service_id = 'svc'")
	pgtest.Query(t, dsn, "UPDATE allowances SET spend = spend + 500000 WHERE service_id = 'pay'")
	pgtest.Query(t, dsn, "UPDATE allowances SET leased_units = leased_units - 1000000 WHERE service_id = 'svc'")
	_, err = cliRun(t, "store", "check", "--dsn", dsn)
	if !errors.Is(err, pgstore.ErrCountersDisagree) {
		t.Fatalf("store check --dsn of changed counters: %v", err)
	}
	ps, perr := strconv.ParseInt(period, 10, 64)
	if perr != nil {
		t.Fatal(perr)
	}
	at := time.Unix(ps, 0).UTC().Format(time.RFC3339)
	for _, want := range []string{
		`3 figures differ`,
		`user "alice" service "svc" all periods: used stored 5, derived 3`,
		`user "alice" service "pay" all periods: spend stored 3.5, derived 3`,
		`user "alice" service "svc" period ` + at + `: leased_units stored `,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q:\n%v", want, err)
		}
	}

	if _, err := cliRun(t, "store", "check", "--dsn", dsn, "platform.db"); err == nil || !strings.Contains(err.Error(), "not both") {
		t.Errorf("store check of a file and --dsn: %v", err)
	}
	if _, err := cliRun(t, "store", "check"); err == nil || !strings.Contains(err.Error(), "--dsn") {
		t.Errorf("store check without a file or --dsn: %v", err)
	}
}
