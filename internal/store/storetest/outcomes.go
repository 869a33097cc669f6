package storetest

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/store"
)

// The call outcomes (store.Outcomes, internal/store/outcomes.go): batches
// add up exactly, a batch sent again is not counted twice, reads come out
// in key order, and retention prunes whole hours. A store without them
// skips these cases.

func outcomesOf(t testing.TB, s store.Store) store.Outcomes {
	t.Helper()
	o, ok := s.(store.Outcomes)
	if !ok {
		t.Skip("the store keeps no call outcomes (store.Outcomes)")
	}
	return o
}

// scanOutcomes reads the rows f selects, checking their order.
func scanOutcomes(t testing.TB, o store.Outcomes, f store.OutcomeFilter) []store.OutcomeRow {
	t.Helper()
	var out []store.OutcomeRow
	if err := o.ScanOutcomes(ctx, f, func(r store.OutcomeRow) error {
		out = append(out, r)
		return nil
	}); err != nil {
		t.Fatalf("ScanOutcomes: %v", err)
	}
	if !slices.IsSortedFunc(out, func(a, b store.OutcomeRow) int { return store.CompareOutcomeKeys(a.OutcomeKey, b.OutcomeKey) }) {
		t.Errorf("ScanOutcomes out of key order: %+v", out)
	}
	return out
}

// outcomeRow is a row of calls calls, each taking gw µs of the gateway's
// time and be of the backend's.
func outcomeRow(hour time.Time, user, service, outcome string, calls, gw, be int64) store.OutcomeRow {
	r := store.OutcomeRow{OutcomeKey: store.OutcomeKey{Hour: hour, UserID: user, ServiceID: service, EndpointID: "ep",
		ProductID: "basic", Outcome: outcome}, Calls: calls}
	r.Gateway.Buckets[store.LatencyBucket(gw)] = calls
	r.Gateway.SumMicros = calls * gw
	if be > 0 {
		r.Backend.Buckets[store.LatencyBucket(be)] = calls
		r.Backend.SumMicros = calls * be
	}
	return r
}

// sumOutcomes adds rows up by key.
func sumOutcomes(rows []store.OutcomeRow) map[store.OutcomeKey]store.OutcomeRow {
	out := map[store.OutcomeKey]store.OutcomeRow{}
	for _, r := range rows {
		k := r.OutcomeKey
		k.Hour = k.Hour.UTC()
		s, ok := out[k]
		if !ok {
			s = store.OutcomeRow{OutcomeKey: k}
		}
		s.Add(r)
		out[k] = s
	}
	return out
}

func sameOutcomes(t testing.TB, what string, got []store.OutcomeRow, want map[store.OutcomeKey]store.OutcomeRow) {
	t.Helper()
	g := sumOutcomes(got)
	if len(g) != len(got) {
		t.Errorf("%s: a key twice in %+v", what, got)
	}
	for k, w := range want {
		if g[k] != w {
			t.Errorf("%s: %+v = %+v, want %+v", what, k, g[k], w)
		}
	}
	for k := range g {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: row %+v, which no batch made", what, g[k])
		}
	}
}

// testOutcomes: batches from two writers add up exactly, a batch sent again
// (same writer, same or older seq) adds nothing, filters select, and the
// rows survive a restart.
func testOutcomes(t *testing.T, c *suite) {
	s := c.store(t)
	o := outcomesOf(t, s)
	h0, h1 := T0.Truncate(time.Hour), T0.Truncate(time.Hour).Add(time.Hour)
	a := []store.OutcomeRow{
		outcomeRow(h0, "u1", "svc", store.Outcome2xx, 5, 40, 900),
		outcomeRow(h0, "u1", "svc", "rate_limited", 2, 30, 0),
		outcomeRow(h0, "", "svc", "invalid_key", 3, 20, 0),
	}
	b := []store.OutcomeRow{
		outcomeRow(h0, "u1", "svc", store.Outcome2xx, 7, 400, 30_000),
		outcomeRow(h1, "u2", "other", store.Outcome5xx, 1, 60, 2_000_000),
		outcomeRow(h1, "u2", "other", store.OutcomeCutOff, 1, 60, 20_000_000),
	}
	add := func(w string, seq uint64, rows []store.OutcomeRow, want bool) {
		t.Helper()
		applied, err := o.AddOutcomes(ctx, store.OutcomeBatch{Writer: w, Seq: seq, Rows: rows})
		if err != nil || applied != want {
			t.Fatalf("AddOutcomes(%s, %d) = %v, %v; want %v", w, seq, applied, err, want)
		}
	}
	add("node-a/1", 1, a, true)
	add("node-b/1", 1, b, true)
	add("node-a/1", 1, a, false) // the answer was lost, the batch sent again
	add("node-a/1", 2, a[:1], true)
	add("node-b/1", 1, a, false) // an older seq never adds either
	want := sumOutcomes(slices.Concat(a, b, a[:1]))
	sameOutcomes(t, "everything", scanOutcomes(t, o, store.OutcomeFilter{}), want)

	filtered := func(f store.OutcomeFilter) map[store.OutcomeKey]store.OutcomeRow {
		out := map[store.OutcomeKey]store.OutcomeRow{}
		for k, r := range want {
			if f.Match(k) {
				out[k] = r
			}
		}
		return out
	}
	for _, f := range []store.OutcomeFilter{
		{UserID: "u1"},
		{ServiceID: "other"},
		{Outcome: "invalid_key"},
		{From: h1},
		{To: h1},
		{From: h0.Add(time.Minute)}, // an hour counts only if it starts inside the range
	} {
		sameOutcomes(t, fmt.Sprintf("filter %+v", f), scanOutcomes(t, o, f), filtered(f))
	}

	for _, bad := range []store.OutcomeBatch{
		{Seq: 1, Rows: a},
		{Writer: "w", Rows: a},
		{Writer: "w", Seq: 1, Rows: []store.OutcomeRow{{OutcomeKey: store.OutcomeKey{Hour: T0.Add(time.Minute), Outcome: "2xx"}}}},
		{Writer: "w", Seq: 1, Rows: []store.OutcomeRow{{OutcomeKey: store.OutcomeKey{Hour: h0}}}},
	} {
		if _, err := o.AddOutcomes(ctx, bad); !errors.Is(err, store.ErrBadOutcomeBatch) {
			t.Errorf("AddOutcomes(%+v) = %v, want ErrBadOutcomeBatch", bad, err)
		}
	}
	sameOutcomes(t, "after bad batches", scanOutcomes(t, o, store.OutcomeFilter{}), want)

	if c.reopen == nil {
		return
	}
	s = c.restart(t, s)
	o = outcomesOf(t, s)
	sameOutcomes(t, "after a restart", scanOutcomes(t, o, store.OutcomeFilter{}), want)
	add("node-a/1", 2, a, false) // the writers' sequence numbers are durable too
}

// testOutcomesConcurrent: writers adding at once to the same keys lose no
// count.
func testOutcomesConcurrent(t *testing.T, c *suite) {
	s := c.store(t)
	o := outcomesOf(t, s)
	h := T0.Truncate(time.Hour)
	const writers, batches = 4, 10
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := uint64(1); seq <= batches; seq++ {
				rows := []store.OutcomeRow{
					outcomeRow(h, "u1", "svc", store.Outcome2xx, 1, 10, 100),
					outcomeRow(h, "u1", "svc", "quota_exceeded", 2, 10, 0),
				}
				if _, err := o.AddOutcomes(ctx, store.OutcomeBatch{Writer: fmt.Sprintf("w%d", w), Seq: seq, Rows: rows}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("AddOutcomes: %v", err)
	}
	var calls int64
	for _, r := range scanOutcomes(t, o, store.OutcomeFilter{}) {
		calls += r.Calls
		if r.Gateway.Buckets[store.LatencyBucket(10)] != r.Calls {
			t.Errorf("%+v: gateway histogram %v does not hold its calls", r.OutcomeKey, r.Gateway.Buckets)
		}
	}
	if want := int64(writers * batches * 3); calls != want {
		t.Errorf("calls = %d, want %d", calls, want)
	}
}

// testPruneOutcomes: the rows of hours before the cutoff's go, counted; the
// rest stay; a bad cutoff removes nothing.
func testPruneOutcomes(t *testing.T, c *suite) {
	s := c.store(t)
	o := outcomesOf(t, s)
	h := T0.Truncate(time.Hour)
	var rows []store.OutcomeRow
	for i := range 4 {
		rows = append(rows, outcomeRow(h.Add(time.Duration(i)*time.Hour), "u1", "svc", store.Outcome2xx, 1, 10, 10))
	}
	if _, err := o.AddOutcomes(ctx, store.OutcomeBatch{Writer: "w", Seq: 1, Rows: rows}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []time.Time{{}, time.Now().Add(time.Hour)} {
		if _, err := o.PruneOutcomes(ctx, bad); !errors.Is(err, store.ErrBadCutoff) {
			t.Errorf("PruneOutcomes(%v) = %v, want ErrBadCutoff", bad, err)
		}
	}
	n, err := o.PruneOutcomes(ctx, h.Add(2*time.Hour+time.Minute))
	if err != nil || n != 2 {
		t.Fatalf("PruneOutcomes = %d, %v; want 2", n, err)
	}
	sameOutcomes(t, "after the prune", scanOutcomes(t, o, store.OutcomeFilter{}), sumOutcomes(rows[2:]))
}
