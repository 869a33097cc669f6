package payments_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/payments"
)

// TestReconcile: the period's totals per customer and meter against
// Stripe's summaries; a user without a customer and usage not sent yet
// are the differences, each with its reason.
func TestReconcile(t *testing.T) {
	st := openBolt(t, filepath.Join(t.TempDir(), "gw.db"))
	t.Cleanup(func() { _ = st.Close() })
	e := newMeterEnv(t, st)
	e.apiBase = e.mock.MeterState(t, map[string]string{"geo_payg": "mtr_payg", "geo_overage": "mtr_over"})
	s := e.service("node-a")
	ship(t, s)
	e.subscribe("alice", postpaid)
	e.subscribe("bob", postpaid)
	e.subscribe("carol", plan)
	e.customer("alice", "cus_alice")
	e.customer("carol", "cus_carol")
	e.report("alice", postpaid, 3, e.clock.Now())
	e.report("bob", postpaid, 2, e.clock.Now())
	e.report("carol", plan, 12, e.clock.Now())
	e.clock.Add(time.Hour)
	ship(t, s)
	e.report("alice", postpaid, 1, e.clock.Now()) // not sent yet

	from, to, err := payments.ParsePeriod("2026-11", e.clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	rec, err := s.Reconcile(context.Background(), from, to)
	if err != nil {
		t.Fatal(err)
	}
	byUser := map[string]payments.ReconcileRow{}
	for _, r := range rec.Rows {
		byUser[r.UserID] = r
	}
	if len(rec.Rows) != 3 || rec.Differ != 2 {
		t.Fatalf("rows %+v, differ %d; want 3 rows, 2 differing", rec.Rows, rec.Differ)
	}
	if r := byUser["carol"]; r.Differs || r.Ledger != 20000 || r.Stripe != 20000 || r.MeterID != "mtr_over" || r.Currency != "USD" {
		t.Errorf("carol: %+v", r)
	}
	if r := byUser["alice"]; !r.Differs || r.Ledger != 8000 || r.Sent != 6000 || r.Stripe != 6000 || !strings.Contains(r.Reason, "not sent yet") {
		t.Errorf("alice: %+v", r)
	}
	if r := byUser["bob"]; !r.Differs || r.Customer != "" || r.Ledger != 4000 || !strings.Contains(r.Reason, "no Stripe customer") {
		t.Errorf("bob: %+v", r)
	}
	// Once alice's last unit is sent, only bob differs.
	ship(t, s)
	if rec, err = s.Reconcile(context.Background(), from, to); err != nil || rec.Differ != 1 {
		t.Fatalf("after shipping: %+v %v", rec, err)
	}
}

func TestParsePeriod(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	day := func(d int) time.Time { return time.Date(2026, 11, d, 0, 0, 0, 0, time.UTC) }
	for _, tc := range []struct {
		in       string
		from, to time.Time
	}{
		{"2026-11", day(1), time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)},
		{"2026-11-01..2026-11-15", day(1), day(16)},
		{"2026-11-02T10:00:00Z..2026-11-02T12:00:00Z", day(2).Add(10 * time.Hour), day(2).Add(12 * time.Hour)},
	} {
		from, to, err := payments.ParsePeriod(tc.in, now)
		if err != nil || !from.Equal(tc.from) || !to.Equal(tc.to) {
			t.Errorf("%s: %s..%s %v", tc.in, from, to, err)
		}
	}
	for _, bad := range []string{"", "2026", "2026-13", "2026-11-15..2026-11-01", "2026-11-01", "2026-11-01T10:30:00Z..2026-11-02",
		"2027-01", "x..y", "2026-11-01..", "..2026-11-01"} {
		if _, _, err := payments.ParsePeriod(bad, now); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
