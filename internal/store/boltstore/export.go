package boltstore

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

var _ store.Exporter = (*Store)(nil)

// Export hands the whole store to another (`caddy platform store
// migrate`), batch records at a time, in one read transaction: keys,
// subscriptions, counters, the ledger, jobs with the holds of the open
// ones, idempotency claims, alerts, the audit log and the payments data
// (payments.go, to a store.PaymentsImporter). It is meant for a
// store no gateway serves (Open has released the holds of calls a crash
// cut short, so what is held is the open jobs'). It returns the totals of
// what it handed over.
func (s *Store) Export(ctx context.Context, to store.Importer, batch int) (store.Totals, error) {
	if batch < 1 {
		batch = 1000
	}
	var t store.Totals
	type step struct {
		name string
		fn   func(context.Context, *bolt.Tx, store.Importer, int, *store.Totals) error
	}
	// The ledger is not in the bbolt file but in its segment directory, so
	// it is read between two read transactions of the file (the store is
	// not served while it is exported: nothing changes in between).
	run := func(steps []step) error {
		return s.view(func(tx *bolt.Tx) error {
			for _, st := range steps {
				if err := ctx.Err(); err != nil {
					return err
				}
				if err := st.fn(ctx, tx, to, batch, &t); err != nil {
					return fmt.Errorf("export %s: %w", st.name, err)
				}
			}
			return nil
		})
	}
	err := run([]step{{"keys", exportKeys}, {"subscriptions", exportSubs}, {"counters", exportCounters}})
	if err == nil {
		if err = s.exportLedger(ctx, to, batch, &t); err != nil {
			err = fmt.Errorf("export ledger: %w", err)
		}
	}
	if err == nil {
		err = run([]step{{"jobs", exportJobs}, {"idempotency claims", exportIdempotency},
			{"alerts", exportAlerts}, {"audit log", exportAudit}, {"payments", exportPayments}})
	}
	return t, err
}

// batcher collects records and hands them on batch at a time.
type batcher[T any] struct {
	n     int
	items []T
	flush func([]T) error
}

func (b *batcher[T]) add(v T) error {
	b.items = append(b.items, v)
	if len(b.items) >= b.n {
		return b.done()
	}
	return nil
}

func (b *batcher[T]) done() error {
	if len(b.items) == 0 {
		return nil
	}
	err := b.flush(b.items)
	b.items = b.items[:0]
	return err
}

func eachJSON[T any](tx *bolt.Tx, bucket []byte, fn func(k []byte, v T) error) error {
	return tx.Bucket(bucket).ForEach(func(k, raw []byte) error {
		var v T
		if err := decodeJSON(bucket, k, raw, &v); err != nil {
			return err
		}
		return fn(k, v)
	})
}

func exportKeys(ctx context.Context, tx *bolt.Tx, to store.Importer, n int, t *store.Totals) error {
	b := &batcher[store.KeyRecord]{n: n, flush: func(ks []store.KeyRecord) error { return to.ImportKeys(ctx, ks) }}
	err := eachJSON(tx, bucketKeys, func(k []byte, rec store.KeyRecord) error {
		copy(rec.Hash[:], k)
		t.Keys++
		return b.add(rec)
	})
	if err != nil {
		return err
	}
	return b.done()
}

func exportSubs(ctx context.Context, tx *bolt.Tx, to store.Importer, n int, t *store.Totals) error {
	b := &batcher[store.Subscription]{n: n, flush: func(ss []store.Subscription) error { return to.ImportSubscriptions(ctx, ss) }}
	err := eachJSON(tx, bucketSubs, func(_ []byte, rec subRecord) error {
		sub := rec.subscription()
		t.Subscriptions++
		t.Credits += sub.Credits
		return b.add(sub)
	})
	if err != nil {
		return err
	}
	return b.done()
}

func exportCounters(ctx context.Context, tx *bolt.Tx, to store.Importer, n int, t *store.Totals) error {
	b := &batcher[store.Counter]{n: n, flush: func(cs []store.Counter) error { return to.ImportCounters(ctx, cs) }}
	err := eachJSON(tx, bucketCounters, func(k []byte, rec counter) error {
		// user \0 service \0 period(8)
		if len(k) < 10 {
			return fmt.Errorf("counter key %q too short", k)
		}
		user, service, ok := splitUserService(k[:len(k)-9])
		if !ok {
			return fmt.Errorf("counter key %q has no service", k)
		}
		c := store.Counter{UserID: user, ServiceID: service, PeriodKey: int64(binary.BigEndian.Uint64(k[len(k)-8:])),
			Used: billing.Units(rec.Used), Spend: billing.Units(rec.Spend)}
		if rec.Unit != nil {
			c.SpendUnit, c.UnitKnown = *rec.Unit, true
		}
		c.SpendOther = rec.otherUnits()
		if c.Used == 0 && c.SpendTotal() == 0 {
			return nil // only holds, which travel with their jobs
		}
		t.Counters++
		t.Used += c.Used
		t.Spend += c.SpendTotal()
		return b.add(c)
	})
	if err != nil {
		return err
	}
	return b.done()
}

func splitUserService(k []byte) (user, service string, ok bool) {
	for i, c := range k {
		if c == 0 {
			return string(k[:i]), string(k[i+1:]), true
		}
	}
	return "", "", false
}

// exportLedger hands over the ledger of record, read from its segments,
// then what pruning left of the rows it removed (ImportLedgerHistory):
// the rollups less what the remaining rows account for, and the highest
// sequence number handed out. A migrate dropped both: the hourly sums of
// pruned rows were lost, and the target numbered its next rows from the
// last remaining one, giving ledger ids (led_1, …) a second time.
func (s *Store) exportLedger(ctx context.Context, to store.Importer, n int, t *store.Totals) error {
	type rollupKey struct {
		hour                             int64
		user, service, endpoint, product string
	}
	rollups := map[rollupKey]*store.Rollup{}
	err := s.ScanRollups(ctx, store.RollupFilter{}, func(r store.Rollup) error {
		t.RollupCalls += r.Calls
		t.RollupUnits += r.Units
		rollups[rollupKey{r.Hour.Unix(), r.UserID, r.ServiceID, r.EndpointID, r.ProductID}] = &r
		return nil
	})
	if err != nil {
		return err
	}
	b := &batcher[store.LedgerEntry]{n: n, flush: func(es []store.LedgerEntry) error { return to.ImportLedger(ctx, es) }}
	err = s.ScanLedger(ctx, store.LedgerFilter{}, func(e store.LedgerEntry) error {
		t.Ledger++
		t.LedgerUnits += e.Units
		t.LedgerCost += e.Cost
		r := rollups[rollupKey{e.Time.UTC().Truncate(time.Hour).Unix(), e.UserID, e.ServiceID, e.EndpointID, e.ProductID}]
		if r == nil {
			// Its rollup was forgotten (rollup_retention) and the row
			// kept: the target makes it again from the row.
			t.RollupCalls++
			t.RollupUnits += e.Units
		} else {
			r.Calls--
			r.Units -= e.Units
			r.Overage -= e.Overage
			r.Cost -= e.Cost
			if e.UnitsClaimed != 0 {
				r.Capped--
			}
		}
		return b.add(e)
	})
	if err != nil {
		return err
	}
	if err := b.done(); err != nil {
		return err
	}
	var lastSeq uint64
	if err := s.view(func(tx *bolt.Tx) error {
		lastSeq = max(markerU64(tx.Bucket(bucketMarker), keyLedgerSeq), s.led.LastSeq())
		return nil
	}); err != nil {
		return err
	}
	var pruned []store.Rollup
	for _, r := range rollups {
		if r.Calls > 0 {
			pruned = append(pruned, *r)
		}
	}
	for len(pruned) > n {
		if err := to.ImportLedgerHistory(ctx, pruned[:n], lastSeq); err != nil {
			return err
		}
		pruned = pruned[n:]
	}
	return to.ImportLedgerHistory(ctx, pruned, lastSeq)
}

func exportJobs(ctx context.Context, tx *bolt.Tx, to store.Importer, n int, t *store.Totals) error {
	var jobs []store.Job
	var holds []store.JobHold
	flush := func() error {
		if len(jobs) == 0 {
			return nil
		}
		err := to.ImportJobs(ctx, jobs, holds)
		jobs, holds = jobs[:0], holds[:0]
		return err
	}
	each := func(_ []byte, rec jobRecord) error {
		j := rec.job()
		t.Jobs++
		jobs = append(jobs, j)
		if j.ReservationID != "" && !j.Terminal() {
			// Holds are stored under their number (jobHolds).
			var r reservation
			n, perr := strconv.ParseUint(j.ReservationID, 10, 64)
			if perr != nil {
				return fmt.Errorf("job %s: hold id %q is not a number", j.ID, j.ReservationID)
			}
			if err := getJSON(tx, bucketReservations, u64(n), &r); isDamage(err) {
				return err
			} else if err == nil && r.JobID == j.ID {
				r.Product.Currency = r.Currency
				holds = append(holds, store.JobHold{JobID: j.ID, UserID: r.UserID, ServiceID: r.ServiceID,
					Product: r.Product, Decision: r.Decision.decision(), PeriodKey: r.PeriodKey})
				t.JobHolds++
			}
		}
		if len(jobs) >= n {
			return flush()
		}
		return nil
	}
	// The ended jobs, then the open ones (jobslive.go).
	for _, b := range [][]byte{bucketJobs, bucketLiveJobs} {
		if err := eachJSON(tx, b, each); err != nil {
			return err
		}
	}
	return flush()
}

func exportIdempotency(ctx context.Context, tx *bolt.Tx, to store.Importer, n int, t *store.Totals) error {
	b := &batcher[store.IdempotencyClaim]{n: n, flush: func(cs []store.IdempotencyClaim) error { return to.ImportIdempotency(ctx, cs) }}
	err := eachJSON(tx, bucketIdempotency, func(k []byte, rec idemRecord) error {
		service, key, ok := splitUserService(k)
		if !ok {
			return fmt.Errorf("idempotency key %q has no service", k)
		}
		t.Idempotency++
		return b.add(store.IdempotencyClaim{ServiceID: service, Key: key, Created: rec.Created, Response: rec.Response})
	})
	if err != nil {
		return err
	}
	return b.done()
}

func exportAlerts(ctx context.Context, tx *bolt.Tx, to store.Importer, n int, t *store.Totals) error {
	b := &batcher[store.Alert]{n: n, flush: func(as []store.Alert) error { return to.ImportAlerts(ctx, as) }}
	err := eachJSON(tx, bucketAlerts, func(_ []byte, a store.Alert) error {
		t.Alerts++
		return b.add(a)
	})
	if err != nil {
		return err
	}
	return b.done()
}

func exportAudit(ctx context.Context, tx *bolt.Tx, to store.Importer, n int, t *store.Totals) error {
	b := &batcher[store.AuditEntry]{n: n, flush: func(es []store.AuditEntry) error { return to.ImportAudit(ctx, es) }}
	err := eachJSON(tx, bucketAudit, func(_ []byte, e store.AuditEntry) error {
		t.Audit++
		return b.add(e)
	})
	if err != nil {
		return err
	}
	return b.done()
}
