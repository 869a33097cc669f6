package ops

import (
	"context"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
)

// TestOutcomesSeries: rows are summed into points by the chosen
// dimension, per hour or over the range, with their latency figures.
func TestOutcomesSeries(t *testing.T) {
	s, err := boltstore.Open(filepath.Join(t.TempDir(), "platform.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	h0 := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	row := func(hour time.Time, user, endpoint, outcome string, calls int64, gatewayUs int64) store.OutcomeRow {
		r := store.OutcomeRow{OutcomeKey: store.OutcomeKey{Hour: hour, UserID: user, ServiceID: "svc", EndpointID: endpoint,
			ProductID: "basic", Outcome: outcome}, Calls: calls}
		r.Gateway.Buckets[store.LatencyBucket(gatewayUs)] = calls
		r.Gateway.SumMicros = calls * gatewayUs
		return r
	}
	rows := []store.OutcomeRow{
		row(h0, "alice", "a", "2xx", 90, 40),
		row(h0, "alice", "a", "rate_limited", 10, 20),
		row(h0.Add(time.Hour), "bob", "b", "2xx", 5, 400),
		row(h0.Add(time.Hour), "bob", "a", "5xx", 1, 40),
	}
	if _, err := s.AddOutcomes(context.Background(), store.OutcomeBatch{Writer: "w", Seq: 1, Rows: rows}); err != nil {
		t.Fatal(err)
	}
	got, err := Outcomes(context.Background(), s, OutcomeQuery{By: "outcome"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Points) != 3 || got.Points[0].Group != "2xx" || got.Points[0].Calls != 95 || got.Points[0].Hour != nil ||
		got.Points[0].Gateway.P50Micros != 50 || got.Points[0].Gateway.P99Micros != 500 || got.Points[0].BackendCalls != 0 {
		t.Errorf("by outcome: %+v", got.Points)
	}
	got, err = Outcomes(context.Background(), s, OutcomeQuery{By: "endpoint", Hourly: true})
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		hour  time.Time
		group string
		calls int64
	}{{h0, "svc/a", 100}, {h0.Add(time.Hour), "svc/a", 1}, {h0.Add(time.Hour), "svc/b", 5}}
	if len(got.Points) != len(want) {
		t.Fatalf("hourly by endpoint: %+v", got.Points)
	}
	for i, w := range want {
		if p := got.Points[i]; !p.Hour.Equal(w.hour) || p.Group != w.group || p.Calls != w.calls {
			t.Errorf("point %d: %v %s %d, want %v %s %d", i, p.Hour, p.Group, p.Calls, w.hour, w.group, w.calls)
		}
	}
	got, err = Outcomes(context.Background(), s, OutcomeQuery{OutcomeFilter: store.OutcomeFilter{UserID: "alice"}})
	if err != nil || len(got.Points) != 1 || got.Points[0].Calls != 100 || got.Points[0].Gateway.MeanMicros != (90*40+10*20)/100 {
		t.Errorf("alice, one group: %+v, %v", got.Points, err)
	}
}

func TestParseOutcomeQuery(t *testing.T) {
	q, err := ParseOutcomeQuery(url.Values{"by": {"user"}, "hourly": {"true"}, "outcome": {"quota_exceeded"},
		"from": {"2026-11-01"}, "to": {"2026-11-30"}})
	if err != nil || q.By != "user" || !q.Hourly || q.Outcome != "quota_exceeded" || !q.To.Equal(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("%+v, %v", q, err)
	}
	for _, bad := range []url.Values{
		{"by": {"hour"}}, {"outcome": {"2XX"}}, {"outcome": {""}}, {"serviceId": {"a b"}}, {"hourly": {"yes please"}},
		{"from": {"2026-11-02"}, "to": {"2026-11-01"}},
	} {
		if _, err := ParseOutcomeQuery(bad); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

func TestLatencyQuantile(t *testing.T) {
	var l store.Latency
	if LatencyQuantile(l, 0.5) != 0 {
		t.Error("an empty histogram has a median")
	}
	l.Buckets[0], l.Buckets[3], l.Buckets[store.LatencyBuckets-1] = 50, 49, 1
	for _, tc := range []struct {
		q    float64
		want int64
	}{{0.5, 50}, {0.51, 500}, {0.99, 500}, {1, store.LatencyBounds[len(store.LatencyBounds)-1]}} {
		if got := LatencyQuantile(l, tc.q); got != tc.want {
			t.Errorf("quantile %v = %d, want %d", tc.q, got, tc.want)
		}
	}
}
