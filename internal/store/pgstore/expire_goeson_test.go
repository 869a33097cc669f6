package pgstore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

// TestExpireCreditsGoesOn: a subscription whose expiry fails (here a
// trigger refusing its grant's update) does not stop ExpireCredits: the
// grants of the subscriptions after it expire, and the error is returned
// after the loop. It returned at the first error, so every sweep stopped
// at the same subscription and no later grant ever expired.
func TestExpireCreditsGoesOn(t *testing.T) {
	ctx := context.Background()
	s := openNode(t, pgtest.DB(t), "a")
	at := time.Now().UTC().Truncate(time.Second)
	for _, u := range []string{"a-bad", "z-other"} {
		subscribe(t, s, u, "svc", "pp")
		if _, err := s.GrantCredits(ctx, store.CreditGrant{ID: "g-" + u, UserID: u, ServiceID: "svc", Credits: units(100),
			GrantedAt: at.Add(-time.Hour), ExpiresAt: at, Source: "stripe"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.pool.Exec(ctx, `CREATE FUNCTION refuse_a_bad() RETURNS trigger AS $$
		BEGIN IF NEW.user_id = 'a-bad' THEN RAISE EXCEPTION 'refused for the test'; END IF; RETURN NEW; END $$ LANGUAGE plpgsql;
		CREATE TRIGGER refuse_a_bad BEFORE UPDATE ON credit_grants FOR EACH ROW EXECUTE FUNCTION refuse_a_bad()`); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		got, err := s.ExpireCredits(ctx, at.Add(time.Minute))
		if err == nil || !strings.Contains(err.Error(), "refused for the test") {
			t.Errorf("sweep %d: error %v, want a-bad's refusal", i+1, err)
		}
		if i == 0 && (len(got) != 1 || got[0].ID != "g-z-other" || got[0].Expired != units(100)) {
			t.Errorf("sweep %d: expired %+v, want z-other's 100", i+1, got)
		}
		for u, want := range map[string]int64{"a-bad": 100, "z-other": 0} {
			sub, err := s.GetSubscription(ctx, u, "svc")
			if err != nil || sub.Credits != units(want) {
				t.Errorf("sweep %d: %s: balance %v, %v; want %d", i+1, u, sub.Credits, err, want)
			}
		}
	}
}
