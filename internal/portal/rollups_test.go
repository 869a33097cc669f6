package portal

import (
	"context"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// TestDashboardFromRollups: the dashboard's charts, newest rows and cut
// rows are the same read through the store's hourly rollups as from its
// raw rows alone (the same store with its rollups hidden), for a period
// that starts mid-hour, so that its day boundaries cut hours in two.
func TestDashboardFromRollups(t *testing.T) {
	e := local(t, "")
	ctx := context.Background()
	now := time.Now().UTC()
	started := now.Add(-10 * 24 * time.Hour).Truncate(time.Hour).Add(37 * time.Minute)
	_, key := e.user("alice", "capped")
	if _, err := e.store().PutSubscription(ctx, store.Subscription{UserID: "alice", ServiceID: "echo", ProductID: "capped",
		Status: "ACTIVE", StartedAt: started, UpdatedAt: started}); err != nil {
		t.Fatal(err)
	}
	svc, _ := e.rt.Catalog.Service("echo")
	p, _ := svc.Product("capped")
	var at []time.Time
	for day := range 10 {
		b := started.Add(time.Duration(day) * 24 * time.Hour)
		at = append(at, b.Add(-time.Minute), b.Add(time.Minute), b.Add(30*time.Minute), b.Add(-20*time.Minute), b.Add(5*time.Hour))
	}
	for i, t0 := range at {
		if t0.After(now) {
			continue
		}
		en := store.LedgerEntry{Time: t0, UserID: "alice", ServiceID: "echo", EndpointID: "hello", ProductID: "capped",
			Source: store.SourceReport, Units: billing.Units(i+1) * 100_000}
		if i%7 == 0 {
			en.UnitsClaimed = en.Units * 2 // a row a hard limit cut short
		}
		if _, err := e.store().Record(ctx, store.Account{UserID: "alice", ServiceID: "echo", Product: *p}, en,
			func(store.LedgerEntry, billing.State) ([]byte, error) { return []byte("{}"), nil }); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := e.store().(store.RollupReader); !ok {
		t.Fatal("the bbolt store keeps no rollups")
	}
	load := func(rollups bool) *dashboard {
		t.Helper()
		rt := *e.rt
		if !rollups {
			rt.OpenStore, rt.Data = nil, struct{ store.Store }{e.store()}
		}
		h := &Handler{rt: &rt, ops: e.ops}
		q := &request{r: httptest.NewRequest("GET", "/portal/", nil), now: now}
		d, err := h.load(q, session{UserID: "alice", KeyID: key.ID}, key)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	a, b := load(true), load(false)
	if len(a.Subscriptions) != 1 || a.Subscriptions[0].Chart == nil || a.Subscriptions[0].Chart.Total == 0 || len(a.Recent) == 0 || len(a.Cut) == 0 {
		t.Fatalf("dashboard without figures: %+v", a)
	}
	if !reflect.DeepEqual(a.Subscriptions[0].Chart, b.Subscriptions[0].Chart) {
		t.Errorf("chart from rollups\n%+v\nfrom raw rows\n%+v", a.Subscriptions[0].Chart, b.Subscriptions[0].Chart)
	}
	if !reflect.DeepEqual(a.Recent, b.Recent) || !reflect.DeepEqual(a.Cut, b.Cut) || a.Partial != b.Partial {
		t.Errorf("rows from rollups\n%+v\n%+v\nfrom raw rows\n%+v\n%+v", a.Recent, a.Cut, b.Recent, b.Cut)
	}
	// And both are what the rows give.
	var want billing.Units
	if err := e.store().ScanLedger(ctx, store.LedgerFilter{UserID: "alice", From: a.Subscriptions[0].PeriodStart}, func(en store.LedgerEntry) error {
		want += en.Units
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := a.Subscriptions[0].Chart.Total; got != want {
		t.Errorf("chart total %s, the period's rows sum to %s", got, want)
	}
}
