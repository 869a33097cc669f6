package boltstore

import (
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/storetest"
)

// TestFlooredChargeReplayedAfterCrash: a call charged its hold past a
// balance credits were taken back from (store.ChargeFloor) is in the
// settlement log only when the process is killed; the replay at the next
// start gives the same balance, usage and ledger row, unitsClaimed
// included, as the store had in memory, and the integrity check agrees.
func TestFlooredChargeReplayedAfterCrash(t *testing.T) {
	defer func(d time.Duration) { applyInterval = d }(applyInterval)
	applyInterval = time.Hour // nothing is applied before the crash
	path := storePath(t)
	s := openAt(t, path)
	a := subscribe(t, s, "u1", "svc", prepaid, whole(5))
	res, err := s.Reserve(ctx, a, whole(3), t0)
	if err != nil || !res.Decision.Allowed {
		t.Fatalf("hold: %+v %v", res.Decision, err)
	}
	if _, err := s.AddCredits(ctx, "u1", "svc", -whole(5), t0); err != nil {
		t.Fatal(err)
	}
	out, err := s.Settle(ctx, res, whole(5), store.LedgerEntry{Time: t0, UserID: "u1", ServiceID: "svc",
		ProductID: prepaid.ID, RequestID: "r", Source: store.SourceGateway})
	if err != nil || out.Units != whole(3) || out.UnitsClaimed != whole(5) {
		t.Fatalf("Settle = %+v, %v; want 3 charged of 5 claimed", out, err)
	}
	before, _ := s.State(ctx, a, t0)
	rows := storetest.Ledger(t, s, store.LedgerFilter{})
	crash(t, s)

	s = openAt(t, path)
	after, _ := s.State(ctx, a, t0)
	if after.Used != before.Used || after.Spend != before.Spend || after.Credits != before.Credits || after.Credits != -billing.Units(750_000) {
		t.Errorf("replayed state %+v; before the crash %+v (credits -0.75)", after, before)
	}
	again := storetest.Ledger(t, s, store.LedgerFilter{})
	if len(again) != 1 || len(rows) != 1 || again[0].Units != rows[0].Units || again[0].UnitsClaimed != rows[0].UnitsClaimed ||
		again[0].Cost != rows[0].Cost || again[0].ID != rows[0].ID {
		t.Errorf("replayed ledger %+v; before the crash %+v", again, rows)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if rep, err := CheckFile(path); err != nil {
		t.Errorf("store check after the replay: %v %+v", err, rep)
	}
}
