package ops

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
)

// TestGrantViewShowsDeferred: a grant that expired while calls held part
// of it shows, in the admin API's view, the part still to expire as the
// holds give it back (deferred), so what it granted is what was taken
// back, expired, deferred and left. Before, the view had no such field:
// a grant of 100 with 70 expired and 30 held at the expiry read
// "expired 70, left 0", 30 credits accounted nowhere.
func TestGrantViewShowsDeferred(t *testing.T) {
	ctx := context.Background()
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "platform.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	t0 := time.Now().UTC().Truncate(time.Second)
	p := billing.Product{ID: "pp", BillingModel: billing.Prepaid, MeasurementType: billing.PerRequest, Price: billing.Whole(1)}
	if _, err := st.PutSubscription(ctx, store.Subscription{UserID: "u", ServiceID: "s", ProductID: "pp", Status: "ACTIVE",
		StartedAt: t0, UpdatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GrantCredits(ctx, store.CreditGrant{ID: "A", UserID: "u", ServiceID: "s", Credits: billing.Whole(100),
		GrantedAt: t0, ExpiresAt: t0.Add(time.Hour), Source: "stripe"}); err != nil {
		t.Fatal(err)
	}
	a := store.Account{UserID: "u", ServiceID: "s", Product: p}
	res, err := st.Reserve(ctx, a, billing.Whole(30), t0)
	if err != nil || !res.Decision.Allowed {
		t.Fatalf("reserve: %+v %v", res.Decision, err)
	}
	if _, err := st.ExpireCredits(ctx, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	gs, err := st.ListCreditGrants(ctx, "u", "s")
	if err != nil || len(gs) != 1 {
		t.Fatalf("grants %+v, %v", gs, err)
	}
	raw, err := json.Marshal(ViewGrant(gs[0]))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Credits, Reversed, Expired, ExpiredLater, Deferred, Left float64
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	if v.Expired != 70 || v.Deferred != 30 || v.Left != 0 || v.Credits != v.Reversed+v.Expired+v.Deferred+v.Left {
		t.Errorf("grant view %s; want 70 expired, 30 deferred, 0 left, adding up to the 100 granted", raw)
	}
	// The call is charged 10 of its 30: 20 given back expire later.
	if _, err := st.Settle(ctx, res, billing.Whole(10), store.LedgerEntry{UserID: "u", ServiceID: "s", ProductID: "pp",
		Source: store.SourceGateway, Time: t0.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if gs, err = st.ListCreditGrants(ctx, "u", "s"); err != nil || len(gs) != 1 {
		t.Fatalf("grants %+v, %v", gs, err)
	}
	raw, _ = json.Marshal(ViewGrant(gs[0]))
	v = struct{ Credits, Reversed, Expired, ExpiredLater, Deferred, Left float64 }{}
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	if v.Expired != 90 || v.ExpiredLater != 20 || v.Deferred != 0 {
		t.Errorf("grant view after the call settled %s; want 90 expired, 20 of them later, nothing deferred", raw)
	}
}
