package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

// TestOutcomesAcrossNodes: two nodes count the same calls' key into rows
// of their own, a read sums them, and a batch a node sends again after a
// lost answer (or the node after it restarted with its writer's batches)
// adds nothing.
func TestOutcomesAcrossNodes(t *testing.T) {
	dsn := pgtest.DB(t)
	a, b := openNode(t, dsn, "node-a"), openNode(t, dsn, "node-b")
	ctx := context.Background()
	hour := time.Date(2026, 11, 26, 13, 0, 0, 0, time.UTC)
	row := func(calls int64) store.OutcomeRow {
		r := store.OutcomeRow{OutcomeKey: store.OutcomeKey{Hour: hour, UserID: "u", ServiceID: "svc", EndpointID: "ep",
			ProductID: "basic", Outcome: "quota_exceeded"}, Calls: calls}
		r.Gateway.Buckets[0], r.Gateway.SumMicros = calls, calls*10
		return r
	}
	for _, step := range []struct {
		s       *Store
		writer  string
		seq     uint64
		calls   int64
		applied bool
	}{
		{a, "a1", 1, 3, true},
		{b, "b1", 1, 5, true},
		{a, "a1", 1, 3, false}, // sent again: the first answer was lost
		{a, "a1", 2, 1, true},
		{b, "a1", 2, 1, false}, // the same writer's batch through another node
	} {
		applied, err := step.s.AddOutcomes(ctx, store.OutcomeBatch{Writer: step.writer, Seq: step.seq, Rows: []store.OutcomeRow{row(step.calls)}})
		if err != nil || applied != step.applied {
			t.Fatalf("%s batch %d: applied %v, %v; want %v", step.writer, step.seq, applied, err, step.applied)
		}
	}
	if n := pgtest.Query(t, dsn, "SELECT count(*) FROM call_outcomes"); n != "2" {
		t.Errorf("%s stored rows, want one per node", n)
	}
	var got []store.OutcomeRow
	if err := b.ScanOutcomes(ctx, store.OutcomeFilter{}, func(r store.OutcomeRow) error {
		got = append(got, r)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != row(9) {
		t.Errorf("read %+v, want the nodes' sum %+v", got, row(9))
	}
}
