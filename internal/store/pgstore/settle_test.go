package pgstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

// A batch is written without looking its calls up first; one that finds
// some of them in the ledger already (a commit whose answer was lost, a
// settlement log replayed after a crash) is rolled back and written again
// with the lookup: every call charged once, with the ledger number it got
// the first time, the counters and the rollups equal to the rows. Both
// kinds of batch: numbered by a node's settlement log, and numbered by the
// database (settle commit).
func TestSettlementBatchSentTwice(t *testing.T) {
	for _, numbered := range []bool{false, true} {
		t.Run(fmt.Sprint("numbered=", numbered), func(t *testing.T) { testSettlementBatchSentTwice(t, numbered) })
	}
}

func testSettlementBatchSentTwice(t *testing.T, numbered bool) {
	_, s, p, key, now := quotaNode(t)
	ctx := context.Background()
	sub, err := s.GetSubscription(ctx, "u", "svc")
	if err != nil {
		t.Fatal(err)
	}
	// The calls of a batch fall in up to three hours and on two
	// endpoints, so that its rollups are several rows.
	batch := func(from, to int) []*settlement {
		var b []*settlement
		for i := from; i < to; i++ {
			at := now.Add(-time.Duration(i%3) * time.Hour)
			if periodOf(p, sub.StartedAt, at) != key.Period {
				at = now
			}
			st := &settlement{callID: fmt.Sprintf("call-%03d", i), key: key, product: p, units: units(2),
				entry: store.LedgerEntry{UserID: "u", ServiceID: "svc", EndpointID: fmt.Sprint("e", i%2), ProductID: p.ID,
					Source: store.SourceGateway, Time: at}}
			if numbered {
				st.seq = int64(5000 + i)
			}
			b = append(b, st)
		}
		return b
	}
	for _, at := range []time.Time{now, now.Add(-time.Hour), now.Add(-2 * time.Hour)} {
		if err := s.ensurePartition(ctx, at); err != nil {
			t.Fatal(err)
		}
	}
	// The rollups as the ledger's rows sum up (the backfill's query).
	rollupsEqualRows := func() {
		t.Helper()
		var diff int64
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM (
			(SELECT hour, user_id, service_id, endpoint_id, product_id, calls, units, overage, cost, capped FROM ledger_rollups
			 EXCEPT ALL
			 `+rollupsOfRowsSQL+`)
			UNION ALL
			(`+rollupsOfRowsSQL+`
			 EXCEPT ALL
			 SELECT hour, user_id, service_id, endpoint_id, product_id, calls, units, overage, cost, capped FROM ledger_rollups)) d`).Scan(&diff); err != nil {
			t.Fatal(err)
		}
		if diff != 0 {
			t.Fatalf("%d rollup rows differ from the ledger's rows summed", diff)
		}
	}
	used := func() int64 { t.Helper(); return usedOf(t, s.pool, key) }
	count := func(sql string) int64 {
		t.Helper()
		var n int64
		if err := s.pool.QueryRow(ctx, sql).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	first := batch(0, 10)
	if err := s.commitSettlements(first); err != nil {
		t.Fatal(err)
	}
	seqs := map[string]uint64{}
	for _, st := range first {
		if st.out.Seq == 0 || st.out.Units != units(2) {
			t.Fatalf("%s: %+v", st.callID, st.out)
		}
		if numbered && st.out.Seq != uint64(st.seq) {
			t.Fatalf("%s: ledger number %d, the log gave %d", st.callID, st.out.Seq, st.seq)
		}
		seqs[st.callID] = st.out.Seq
	}
	rollupsEqualRows()
	if got := used(); got != int64(units(20)) {
		t.Fatalf("used after the first batch: %d, want %d", got, int64(units(20)))
	}

	// The same ten again, with ten new ones: only the new ones are charged;
	// the ten keep the ledger numbers they were given.
	again := batch(0, 20)
	if err := s.commitSettlements(again); err != nil {
		t.Fatal(err)
	}
	for _, st := range again {
		if st.out.Units != units(2) || st.out.Seq == 0 {
			t.Fatalf("%s: %+v", st.callID, st.out)
		}
		if want, ok := seqs[st.callID]; ok && st.out.Seq != want {
			t.Fatalf("%s: ledger number %d, first written as %d", st.callID, st.out.Seq, want)
		}
	}
	if got := used(); got != int64(units(40)) {
		t.Fatalf("used after the batch sent again: %d, want %d (20 calls of 2)", got, int64(units(40)))
	}
	if n := count(`SELECT count(*) FROM ledger`); n != 20 {
		t.Fatalf("ledger rows: %d, want 20", n)
	}
	if n := count(`SELECT coalesce(sum(calls), 0) FROM ledger_rollups`); n != 20 {
		t.Fatalf("rollup calls: %d, want 20", n)
	}
	if n := count(`SELECT count(*) FROM ledger_rollups`); n < 2 {
		t.Fatalf("%d rollup rows: the batch was meant to span several", n)
	}
	rollupsEqualRows()

	// Wholly sent before: nothing changes.
	if err := s.commitSettlements(batch(0, 20)); err != nil {
		t.Fatal(err)
	}
	if got := used(); got != int64(units(40)) {
		t.Fatalf("used after the whole batch again: %d", got)
	}
	if n := count(`SELECT count(*) FROM ledger`); n != 20 {
		t.Fatalf("ledger rows after the whole batch again: %d", n)
	}
	if n := count(`SELECT coalesce(sum(calls), 0) FROM ledger_rollups`); n != 20 {
		t.Fatalf("rollup calls after the whole batch again: %d", n)
	}
	rollupsEqualRows()
}

// The same call twice in one batch (a settlement log replayed over records
// that were also queued) is charged once: the ledger row and the counters
// alike. The batch as a whole is refused and rolled back, and the
// settlement loops write its calls one by one (as settle.go's and
// shiplog.go's do after a statement fails): the second finds the first.
func TestSettlementBatchWithACallTwice(t *testing.T) {
	_, s, p, key, now := quotaNode(t)
	ctx := context.Background()
	for _, numbered := range []bool{false, true} {
		var batch []*settlement
		for _, i := range []int{1, 2, 1} {
			st := &settlement{callID: fmt.Sprintf("call-%v-%d", numbered, i), key: key, product: p, units: units(3),
				entry: store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: p.ID, Source: store.SourceGateway, Time: now}}
			if numbered {
				st.seq = int64(9000 + i)
			}
			batch = append(batch, st)
		}
		if err := s.commitSettlements(batch); err != nil {
			for _, st := range batch {
				if err := s.commitSettlements([]*settlement{st}); err != nil {
					t.Fatalf("%s alone: %v", st.callID, err)
				}
			}
		}
	}
	used := usedOf(t, s.pool, key)
	var rows, rolled int64
	if err := s.pool.QueryRow(ctx, `SELECT count(*), (SELECT coalesce(sum(calls), 0) FROM ledger_rollups) FROM ledger`).Scan(&rows, &rolled); err != nil {
		t.Fatal(err)
	}
	if rows != 4 || rolled != 4 || used != int64(units(12)) {
		t.Fatalf("ledger rows %d, rollup calls %d, used %d; want 4, 4 and %d (four calls of 3)", rows, rolled, used, int64(units(12)))
	}
}

// quotaNode is a node on a database of its own with user u subscribed to
// service svc under a quota of 1,000, the allowance key of the current
// period, and now (to the microsecond, as the store keeps times).
func quotaNode(t *testing.T) (dsn string, s *Store, p billing.Product, key AllowanceKey, now time.Time) {
	t.Helper()
	dsn = pgtest.DB(t)
	s = openNode(t, dsn, "a")
	subscribe(t, s, "u", "svc", "q")
	sub, err := s.GetSubscription(context.Background(), "u", "svc")
	if err != nil {
		t.Fatal(err)
	}
	p = quotaProduct(1000)
	now = time.Now().UTC().Truncate(time.Microsecond)
	return dsn, s, p, AllowanceKey{"u", "svc", periodOf(p, sub.StartedAt, now)}, now
}

// usedOf is what the allowance row of key has used, as q reads it.
func usedOf(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, key AllowanceKey) int64 {
	t.Helper()
	var n int64
	if err := q.QueryRow(context.Background(), `SELECT used FROM allowances WHERE user_id = $1 AND service_id = $2 AND period = $3`,
		key.UserID, key.ServiceID, key.Period).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// rollupsOfRowsSQL sums the ledger's rows as the rollups sum them, from
// the entries' JSON (the schema's backfill reads them the same way): the
// tests compare it with ledger_rollups.
const rollupsOfRowsSQL = `SELECT date_trunc('hour', time AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', user_id, service_id,
	coalesce(entry->>'endpointId', ''), coalesce(entry->>'productId', ''), count(*),
	coalesce(sum(round((entry->>'units')::numeric * 1000000)), 0)::bigint,
	coalesce(sum(round((entry->>'overage')::numeric * 1000000)), 0)::bigint,
	coalesce(sum(round((entry->>'cost')::numeric * 1000000)), 0)::bigint,
	count(*) FILTER (WHERE coalesce((entry->>'unitsClaimed')::numeric, 0) <> 0)
	FROM ledger GROUP BY 1, 2, 3, 4, 5`
