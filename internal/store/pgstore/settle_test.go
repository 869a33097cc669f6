package pgstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/store"
)

// A batch is written without looking its calls up first; one that finds
// some of them in the ledger already (a commit whose answer was lost, a
// settlement log replayed after a crash) is rolled back and written again
// with the lookup: every call charged once, with the ledger number it got
// the first time, the counters and the rollups equal to the rows.
func TestSettlementBatchSentTwice(t *testing.T) {
	dsn := newDatabase(t)
	s := openNode(t, dsn, "a")
	subscribe(t, s, "u", "svc", "q")
	ctx := context.Background()
	sub, err := s.GetSubscription(ctx, "u", "svc")
	if err != nil {
		t.Fatal(err)
	}
	p := quotaProduct(1000)
	now := time.Now().UTC().Truncate(time.Microsecond)
	key := AllowanceKey{"u", "svc", periodOf(p, sub.StartedAt, now)}
	batch := func(from, to int) []*settlement {
		var b []*settlement
		for i := from; i < to; i++ {
			b = append(b, &settlement{callID: fmt.Sprintf("call-%03d", i), key: key, product: p, units: units(2),
				entry: store.LedgerEntry{UserID: "u", ServiceID: "svc", EndpointID: "e", ProductID: p.ID,
					Source: store.SourceGateway, Time: now}})
		}
		return b
	}
	used := func() int64 {
		t.Helper()
		var n int64
		if err := s.pool.QueryRow(ctx, `SELECT used FROM allowances WHERE user_id = 'u' AND service_id = 'svc' AND period = $1`,
			key.Period).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
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
		seqs[st.callID] = st.out.Seq
	}
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
}
