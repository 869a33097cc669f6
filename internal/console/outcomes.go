package console

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store"
)

// What the console reads of the call outcome rollups (ops.Outcomes, with
// this node's unflushed counts): the usage explorer's chart of calls by
// outcome, the overview's calls, errors by code and latency over a range,
// and the failing backends of "needs attention". Every read is of hourly
// sums, never of raw rows, so the pages stay fast on a large store.

// Failing backends: a service whose failed calls are at least
// failingShare of its calls that went to the backend, over this hour and
// the hour before, once there are at least failingMinCalls of them (a
// couple of failures in a quiet hour are not an outage).
const (
	failingShare    = 0.05
	failingMinCalls = 20
)

// backendFailed are the outcomes of a call that failed at the backend:
// it answered 5xx, or could not be reached, or did not answer in time.
func backendFailed(outcome string) bool {
	return outcome == store.Outcome5xx || outcome == apierror.ServiceError || outcome == apierror.ServiceTimeout
}

// wentToBackend says whether a call with outcome was sent to the backend
// (answered, failed or cut off there), not refused by the gateway first.
func wentToBackend(outcome string) bool {
	switch outcome {
	case store.Outcome1xx, store.Outcome2xx, store.Outcome3xx, store.Outcome4xx, store.OutcomeCutOff:
		return true
	}
	return backendFailed(outcome)
}

// answered says whether an outcome is a call the backend answered
// without error (1xx to 3xx): what the overview's errors leave out.
func answered(outcome string) bool {
	return outcome == store.Outcome1xx || outcome == store.Outcome2xx || outcome == store.Outcome3xx
}

// addOutcomeChart adds the chart of calls per bucket by outcome of the
// explorer's selection to c. The rollups know no endpoint filter of
// their own: with one, each outcome is read by endpoint and the
// endpoint's kept. A store without outcomes draws no such chart.
func (h *Handler) addOutcomeChart(ctx context.Context, c *usageCharts, f usageFilter) error {
	if c == nil {
		return nil
	}
	q := ops.OutcomeQuery{OutcomeFilter: store.OutcomeFilter{UserID: f.User, ServiceID: f.Service,
		From: f.ledger.From.Truncate(time.Hour), To: f.ledger.To}, By: "outcome", Hourly: true}
	series, err := h.ops.Outcomes(ctx, q)
	if errors.Is(err, ops.ErrNoOutcomes) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read call outcomes: %w", err)
	}
	if f.Endpoint == "" {
		for _, p := range series.Points {
			c.addCalls(notBefore(*p.Hour, f.ledger.From), p.Group, p.Calls)
		}
		return nil
	}
	var outcomes []string
	for _, p := range series.Points {
		if !slices.Contains(outcomes, p.Group) {
			outcomes = append(outcomes, p.Group)
		}
	}
	for _, o := range outcomes {
		q.Outcome, q.By = o, "endpoint"
		byEndpoint, err := h.ops.Outcomes(ctx, q)
		if err != nil {
			return fmt.Errorf("read call outcomes: %w", err)
		}
		for _, p := range byEndpoint.Points {
			if p.Group == f.Service+"/"+f.Endpoint || (f.Service == "" && endpointOf(p.Group) == f.Endpoint) {
				c.addCalls(notBefore(*p.Hour, f.ledger.From), o, p.Calls)
			}
		}
	}
	return nil
}

// notBefore is t, or from for an hour that started before it (a partial
// first hour of the range, whose calls are counted in its first bucket).
func notBefore(t, from time.Time) time.Time {
	if t.Before(from) {
		return from
	}
	return t
}

// endpointOf is the endpoint of an "endpoint" group (service/endpoint).
func endpointOf(group string) string {
	_, ep, _ := strings.Cut(group, "/")
	return ep
}

// overviewRange is a range the overview's call figures cover.
type overviewRange struct {
	Param, Name string
	span        time.Duration
	step        time.Duration
}

// overviewRanges are the overview's ranges; the first is the default.
var overviewRanges = []overviewRange{
	{"24h", "Last 24 hours", 24 * time.Hour, time.Hour},
	{"7d", "Last 7 days", 7 * 24 * time.Hour, 24 * time.Hour},
	{"30d", "Last 30 days", 30 * 24 * time.Hour, 24 * time.Hour},
}

// errorCount is one line of the overview's errors by code.
type errorCount struct {
	Code  string
	Calls int64
	Share float64
}

// callFigures are the overview's figures of a range from the outcome
// rollups.
type callFigures struct {
	Kept     bool // the store keeps call outcomes
	Calls    int64
	Errors   []errorCount
	Chart    []chartView
	Gateway  ops.LatencyFigure
	Backend  ops.LatencyFigure
	Backends int64 // calls that reached a backend: the backend figures'
}

// callFigures reads the range's calls per bucket by outcome, the errors
// by code, and the time the gateway added and the backends took.
func (h *Handler) callFigures(ctx context.Context, r overviewRange, now time.Time) (callFigures, error) {
	var out callFigures
	from := now.Add(-r.span).Truncate(r.step)
	if r.step == time.Hour {
		from = now.Truncate(time.Hour).Add(-r.span + time.Hour)
	}
	filter := store.OutcomeFilter{From: from}
	series, err := h.ops.Outcomes(ctx, ops.OutcomeQuery{OutcomeFilter: filter, By: "outcome", Hourly: true})
	if errors.Is(err, ops.ErrNoOutcomes) {
		return out, nil
	}
	if err != nil {
		return out, fmt.Errorf("read call outcomes: %w", err)
	}
	out.Kept = true
	c := newCharts(from, now, r.step, groupings[""])
	byCode := map[string]int64{}
	for _, p := range series.Points {
		c.addCalls(*p.Hour, p.Group, p.Calls)
		out.Calls += p.Calls
		if !answered(p.Group) {
			byCode[p.Group] += p.Calls
		}
	}
	out.Chart = c.views()
	for i := range out.Chart {
		out.Chart[i].ID = "calls-chart"
	}
	for code, n := range byCode {
		out.Errors = append(out.Errors, errorCount{Code: code, Calls: n, Share: float64(n) / float64(out.Calls)})
	}
	slices.SortFunc(out.Errors, func(a, b errorCount) int {
		return cmp.Or(cmp.Compare(b.Calls, a.Calls), strings.Compare(a.Code, b.Code))
	})
	all, err := h.ops.Outcomes(ctx, ops.OutcomeQuery{OutcomeFilter: filter})
	if err != nil {
		return out, fmt.Errorf("read call outcomes: %w", err)
	}
	if len(all.Points) > 0 {
		p := all.Points[0]
		out.Gateway, out.Backend, out.Backends = p.Gateway, p.Backend, p.BackendCalls
	}
	return out, nil
}

// failingBackends are the concerns of services whose backends fail
// (failingShare of failingMinCalls or more) this hour and the hour
// before.
func (h *Handler) failingBackends(ctx context.Context, now time.Time) ([]concern, error) {
	s, ok := h.rt.Store().(store.Outcomes)
	if !ok {
		return nil, nil
	}
	from := now.Truncate(time.Hour).Add(-time.Hour)
	// One flush of this node's counts and one read of the two hours'
	// rows, summed per service: not a flush and a read per service.
	h.ops.FlushOutcomes(ctx)
	type tally struct{ sent, failed int64 }
	per := map[string]*tally{}
	err := s.ScanOutcomes(ctx, store.OutcomeFilter{From: from}, func(r store.OutcomeRow) error {
		t := per[r.ServiceID]
		if t == nil {
			t = new(tally)
			per[r.ServiceID] = t
		}
		if wentToBackend(r.Outcome) {
			t.sent += r.Calls
		}
		if backendFailed(r.Outcome) {
			t.failed += r.Calls
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read call outcomes: %w", err)
	}
	var out []concern
	for _, svc := range h.rt.Catalog.Services() {
		t := per[svc.ID]
		if t == nil {
			continue
		}
		sent, failed := t.sent, t.failed
		if sent < failingMinCalls || float64(failed) < failingShare*float64(sent) {
			continue
		}
		out = append(out, concern{Level: levelRed, Tag: "Backend failing",
			What: fmt.Sprintf("%s: %d of %d calls to its backend failed (5xx, unreachable or timed out) since %s UTC (%.0f%%)",
				svc.ID, failed, sent, from.Format("15:04"), 100*float64(failed)/float64(sent)),
			Link:   h.link(map[string][]string{"service": {svc.ID}, "group": {"outcome"}, "from": {from.Format(minuteLayout)}, "bucket": {"hour"}}, "usage"),
			LinkTo: "Calls by outcome"})
	}
	return out, nil
}
