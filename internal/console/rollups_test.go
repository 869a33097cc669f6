package console

import (
	"context"
	"fmt"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

var csrfValue = regexp.MustCompile(`(name="csrf" value=")[^"]+`)

// TestFiguresFromRollups: the overview and the usage explorer show the
// same figures read from the store's hourly rollups as from its raw rows
// (the same store with its rollups hidden), for ranges on and off the
// hour, with an endpoint filter, and with a source filter (which only the
// raw rows know).
func TestFiguresFromRollups(t *testing.T) {
	e := local(t)
	ctx := context.Background()
	if _, err := e.ops.PutSubscription(ctx, "test", "alice", "weather", "basic", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := e.ops.PutSubscription(ctx, "test", "bob", "weather", "basic", ""); err != nil {
		t.Fatal(err)
	}
	svc, _ := e.rt.Catalog.Service("weather")
	p, _ := svc.Product("basic")
	now := time.Now().UTC()
	n := 0
	for _, back := range []time.Duration{0, 7 * time.Minute, 50 * time.Minute, 3 * time.Hour, 26 * time.Hour, 5 * 24 * time.Hour, 20 * 24 * time.Hour} {
		for i, user := range []string{"alice", "bob", "alice"} {
			ep, src := "hello", store.SourceReport
			if i == 1 {
				ep, src = "other", store.SourceCompletion
			}
			n++
			_, err := e.rt.Store().Record(ctx, store.Account{UserID: user, ServiceID: "weather", Product: *p},
				store.LedgerEntry{Time: now.Add(-back), UserID: user, ServiceID: "weather", EndpointID: ep,
					ProductID: "basic", Source: src, Units: billing.Units(n) * 250_000},
				func(store.LedgerEntry, billing.State) ([]byte, error) { return []byte("{}"), nil })
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, ok := e.rt.Store().(store.RollupReader); !ok {
		t.Fatal("the bbolt store keeps no rollups")
	}
	withRollups := direct(t, e, false)
	raw := *e.rt
	raw.OpenStore, raw.Data = nil, struct{ store.Store }{e.rt.Store()} // its rollups hidden
	rawRows := &Handler{Prefix: "/console"}
	if err := rawRows.setup(&raw, e.ops, zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	all := serve(withRollups, httptest.NewRequest("GET", "/console/usage?from="+now.Add(-30*24*time.Hour).Format(minuteLayout), nil), "op")
	if !strings.Contains(all.Body.String(), fmt.Sprintf("<strong>%d</strong> entries", n)) {
		t.Fatalf("the explorer does not count the %d rows", n)
	}
	minute := func(d time.Duration) string { return now.Add(d).Format(minuteLayout) }
	for _, path := range []string{
		"/console/",
		"/console/usage",
		"/console/usage?bucket=hour&from=" + now.Add(-30*time.Hour).Format(time.DateOnly),
		"/console/usage?from=" + minute(-4*time.Hour) + "&to=" + minute(-20*time.Minute),
		"/console/usage?from=" + minute(-30*24*time.Hour),
		"/console/usage?user=alice&endpoint=hello&from=" + minute(-27*time.Hour),
		"/console/usage?source=completion&from=" + minute(-30*24*time.Hour),
	} {
		a := serve(withRollups, httptest.NewRequest("GET", path, nil), "op")
		b := serve(rawRows, httptest.NewRequest("GET", path, nil), "op")
		if a.Code != 200 || b.Code != 200 {
			t.Fatalf("GET %s: %d, %d", path, a.Code, b.Code)
		}
		x := csrfValue.ReplaceAllString(a.Body.String(), "$1")
		y := csrfValue.ReplaceAllString(b.Body.String(), "$1")
		if x != y {
			t.Errorf("GET %s: the page from rollups differs from the page from raw rows:\n%s\n---\n%s", path, x, y)
		}
	}
}
