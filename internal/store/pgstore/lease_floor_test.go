package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
)

// TestLapsedLeaseCallKeepsItsHold: calls in flight on a node whose lease
// lapsed (its row expired and was swept: the units the calls held went
// back to the allowance), then something that is no call takes that
// room (a usage report charged past a blocked quota, credits taken back
// from a prepaid balance), then the calls settle, for as much as they
// held, for more and for less. Each was served on its hold, so it is
// charged at least what it held, as far as it stated, past the limit as
// the report or the refund went (docs/wire-contract.md, "Claims past a
// hard limit", rule 2; store.ChargeFloor, as bbolt and a job's
// completion charge it). The charge finding no lease row was capped at
// what the limits allowed with no floor: 0 units, served free; under
// settle log, after the call had been acknowledged as charged. Both
// modes, since a lapsed lease's covered charge goes to the log and the
// rest to the group commit.
func TestLapsedLeaseCallKeepsItsHold(t *testing.T) {
	const ttl = 2 * time.Second
	hold := units(3)
	modes := []struct {
		name   string
		commit bool
	}{{"settle commit", true}, {"settle log", false}}
	limits := []struct {
		name string
		p    billing.Product
		take func(t *testing.T, b *Store)
	}{
		{"blocked quota, report past it", quotaProduct(20), func(t *testing.T, b *Store) {
			a := store.Account{UserID: "u", ServiceID: "svc", Product: quotaProduct(20)}
			e := store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "q", Units: units(60), Source: store.SourceReport}
			if _, err := b.Record(context.Background(), a, e, func(store.LedgerEntry, billing.State) ([]byte, error) { return nil, nil }); err != nil {
				t.Fatalf("Record: %v", err)
			}
		}},
		{"prepaid, credits taken back", prepaidProduct(1), func(t *testing.T, b *Store) {
			if _, err := b.AddCredits(context.Background(), "u", "svc", -units(100), time.Now()); err != nil {
				t.Fatalf("AddCredits: %v", err)
			}
		}},
	}
	for _, m := range modes {
		for _, lim := range limits {
			t.Run(m.name+", "+lim.name, func(t *testing.T) {
				ctx := context.Background()
				dsn := pgtest.DB(t)
				tune := func(o *Options) { o.LeaseTTL, o.LogDir, o.SettleCommit = ttl, t.TempDir(), m.commit }
				a, b := openNode(t, dsn, "a", tune), openNode(t, dsn, "b", tune)
				subscribe(t, a, "u", "svc", lim.p.ID)
				if lim.p.BillingModel == billing.Prepaid {
					if _, err := a.AddCredits(ctx, "u", "svc", units(20), time.Now()); err != nil {
						t.Fatal(err)
					}
				}
				acct := store.Account{UserID: "u", ServiceID: "svc", Product: lim.p}
				claims := []billing.Units{hold, units(5), units(1)}
				var inflight []store.Reservation
				for range claims {
					res, err := a.Reserve(ctx, acct, hold, time.Now())
					if err != nil || !res.Decision.Allowed {
						t.Fatalf("hold: %v %+v", err, res.Decision)
					}
					inflight = append(inflight, res)
				}
				// a loses the database for longer than the TTL, as far as
				// its lease rows go: they expire and are swept, and a's own
				// deadline passes too.
				lapseLeases(t, a, b)
				time.Sleep(ttl)
				lim.take(t, b)

				entry := store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: lim.p.ID, Source: store.SourceGateway}
				for i, claim := range claims {
					e := entry
					e.RequestID = "call-" + claim.String()
					out, err := a.Settle(ctx, inflight[i], claim, e)
					if err != nil {
						t.Fatalf("Settle %s: %v", claim, err)
					}
					if !m.commit && (out.Units != claim || out.UnitsClaimed != 0) {
						// Acknowledged from the log when its lease covered
						// it; what the ledger says is checked below.
						t.Logf("claim %s acknowledged as %s (claimed %s)", claim, out.Units, out.UnitsClaimed)
					}
				}
				if err := a.Flush(ctx); err != nil {
					t.Fatalf("Flush: %v", err)
				}
				var sum billing.Units
				seen := 0
				if err := b.ScanLedger(ctx, store.LedgerFilter{}, func(e store.LedgerEntry) error {
					sum += e.Units
					if e.Source != store.SourceGateway {
						return nil
					}
					seen++
					var claim billing.Units
					for _, c := range claims {
						if e.RequestID == "call-"+c.String() {
							claim = c
						}
					}
					want := min(claim, hold)
					ok := e.Units >= want && e.Units <= claim && (e.Units < claim) == (e.UnitsClaimed == claim) &&
						(e.Units == claim) == (e.UnitsClaimed == 0)
					if !ok {
						t.Errorf("the call that held %s and claimed %s was charged %s (claimed %s); want at least %s charged",
							hold, claim, e.Units, e.UnitsClaimed, want)
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				if seen != len(claims) {
					t.Errorf("%d calls in the ledger; want %d", seen, len(claims))
				}
				// The counters agree with the ledger.
				var used int64
				if err := b.pool.QueryRow(ctx, "SELECT coalesce(sum(used), 0) FROM allowances WHERE user_id = 'u'").Scan(&used); err != nil {
					t.Fatal(err)
				}
				if lim.p.Quota != nil && billing.Units(used) != sum {
					t.Errorf("used %s, ledger %s", billing.Units(used), sum)
				}
				if lim.p.BillingModel == billing.Prepaid {
					var credits, held int64
					if err := b.pool.QueryRow(ctx, "SELECT credits, credits_held FROM subscriptions WHERE user_id = 'u'").Scan(&credits, &held); err != nil {
						t.Fatal(err)
					}
					// 20 granted, 100 taken back, a credit a unit charged.
					if want := units(20) - units(100) - sum; billing.Units(credits) != want || held != 0 {
						t.Errorf("credits %s, held %s; want %s (20 - 100 - %s charged), none held",
							billing.Units(credits), billing.Units(held), want, sum)
					}
				}
				// And `store check` agrees with the floored charges.
				if rep, err := Check(ctx, dsn); err != nil {
					t.Errorf("store check: %v %+v", err, rep.Mismatches)
				}
			})
		}
	}
}

// TestImportedJobKeepsItsHold: an async job open when an embedded store
// was moved to PostgreSQL (`store migrate`) keeps its hold there, and is
// charged at least that hold when it completes after credits were taken
// back meanwhile (docs/wire-contract.md, "Claims past a hard limit", rule
// 2), as a job created on PostgreSQL is (TestContract/
// HoldKeptPastOutsideCharges). The imported hold's lease row held only
// the dimensions its product's limits bound (credits, for a PREPAID
// product: no units), and the completion reads its floor from the row's
// units: 0, so the job was cut to what the balance fit, 0 units,
// `unitsClaimed 3`: served free.
func TestImportedJobKeepsItsHold(t *testing.T) {
	ctx := context.Background()
	p := prepaidProduct(2)
	acct := store.Account{UserID: "u", ServiceID: "svc", Product: p}
	now := time.Now().UTC()

	bolt, err := boltstore.Open(t.TempDir() + "/gw.db")
	if err != nil {
		t.Fatal(err)
	}
	defer bolt.Close()
	if _, err := bolt.PutSubscription(ctx, store.Subscription{UserID: "u", ServiceID: "svc", ProductID: p.ID,
		Status: "ACTIVE", StartedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if _, err := bolt.AddCredits(ctx, "u", "svc", units(100), now); err != nil {
		t.Fatal(err)
	}
	j := store.Job{ID: "job", UserID: "u", KeyID: "key_1", ServiceID: "svc", EndpointID: "ep", ProductID: p.ID,
		Status: store.JobPending, CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour),
		Terms: &store.JobTerms{EndpointCost: units(1)}}
	if res, err := bolt.CreateJobReserved(ctx, j, acct, units(3), now); err != nil || !res.Decision.Allowed {
		t.Fatalf("CreateJobReserved: %+v %v", res, err)
	}

	dsn := pgtest.DB(t)
	pg := openNode(t, dsn, "a")
	if _, err := bolt.Export(ctx, pg, 0); err != nil {
		t.Fatalf("Export: %v", err)
	}
	if rep, err := Check(ctx, dsn); err != nil {
		t.Fatalf("store check after the import: %v %+v", err, rep.Mismatches)
	}
	if _, err := pg.AddCredits(ctx, "u", "svc", -units(100), now); err != nil {
		t.Fatal(err)
	}
	e := store.LedgerEntry{Time: now, UserID: "u", ServiceID: "svc", ProductID: p.ID, RequestID: "job",
		Units: units(3), Source: store.SourceCompletion}
	done, err := pg.CompleteJob(ctx, "job", acct, e, func(j *store.Job) error {
		j.Status, j.CompletionDigest, j.Result = store.JobCompleted, "d", "done"
		j.UpdatedAt, j.CompletedAt = now, now
		return nil
	})
	if err != nil {
		t.Fatalf("CompleteJob: %v", err)
	}
	if done.Units != units(3) {
		t.Errorf("the imported job that held 3 units and stated 3 was charged %s; want 3", done.Units)
	}
	if rep, err := Check(ctx, dsn); err != nil {
		t.Errorf("store check after the completion: %v %+v", err, rep.Mismatches)
	}
}
