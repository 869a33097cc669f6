package ops

import (
	"cmp"
	"context"
	"errors"
	"net/url"
	"slices"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/store"
)

// The hourly call outcomes (store.Outcomes) as the admin API, the CLI,
// the console and the portal read them: series of hourly points grouped by
// one dimension (Outcomes), their query's one set of rules
// (ParseOutcomeQuery), and the export's CSV rows.

// OutcomeDimensions are what OutcomeQuery.By may group by ("" sums
// everything the filter selects into one group).
var OutcomeDimensions = []string{"outcome", "user", "service", "endpoint", "product"}

// OutcomeQuery selects and groups outcome rows.
type OutcomeQuery struct {
	store.OutcomeFilter
	// By is the dimension a point's Group is (OutcomeDimensions), or ""
	// for one group of everything.
	By string
	// Hourly keeps a point per hour and group; otherwise a point per
	// group over the whole range.
	Hourly bool
}

// OutcomePoint is the calls of one group (in one hour, for an hourly
// series), with their latency histograms and what they say: the median
// and the 99th percentile as the upper bound of the bucket they fall in
// (the last bucket's lower bound for a time above every bound), and the
// mean. A backend figure covers the calls that reached the backend
// (BackendCalls).
type OutcomePoint struct {
	Hour         *time.Time    `json:"hour,omitempty"`
	Group        string        `json:"group"`
	Calls        int64         `json:"calls"`
	BackendCalls int64         `json:"backendCalls"`
	Gateway      LatencyFigure `json:"gateway"`
	Backend      LatencyFigure `json:"backend"`
}

// LatencyFigure is a histogram with the figures read from it, in
// microseconds.
type LatencyFigure struct {
	P50Micros  int64 `json:"p50Micros"`
	P99Micros  int64 `json:"p99Micros"`
	MeanMicros int64 `json:"meanMicros"`
	store.Latency
}

// OutcomeSeries is Outcomes' answer: the points in (hour, group) order,
// or by calls, most first, when not hourly.
type OutcomeSeries struct {
	By     string         `json:"by"`
	Hourly bool           `json:"hourly"`
	Points []OutcomePoint `json:"points"`
	// BoundsMicros are the histograms' bucket bounds
	// (store.LatencyBounds); the last bucket holds the rest.
	BoundsMicros []int64 `json:"boundsMicros"`
}

// ErrNoOutcomes is Outcomes' answer for a store that keeps no call
// outcomes (not store.Outcomes).
var ErrNoOutcomes = errors.New("this store keeps no call outcomes")

// Outcomes reads the outcome rows q selects from s and sums them into
// points grouped by q.By: what the console's and the portal's charts of
// calls by outcome read. Every node's counts are in (the store sums
// them); the calls of the last few seconds of each node are not yet
// (OutcomeFlushInterval of the platform app).
func Outcomes(ctx context.Context, s store.Store, q OutcomeQuery) (OutcomeSeries, error) {
	out := OutcomeSeries{By: q.By, Hourly: q.Hourly, Points: []OutcomePoint{}, BoundsMicros: store.LatencyBounds[:]}
	o, ok := s.(store.Outcomes)
	if !ok {
		return out, ErrNoOutcomes
	}
	type key struct {
		hour  time.Time
		group string
	}
	sums := map[key]*store.OutcomeRow{}
	var order []key
	err := o.ScanOutcomes(ctx, q.OutcomeFilter, func(r store.OutcomeRow) error {
		k := key{group: groupOf(r.OutcomeKey, q.By)}
		if q.Hourly {
			k.hour = r.Hour
		}
		sum := sums[k]
		if sum == nil {
			sum = &store.OutcomeRow{}
			sums[k] = sum
			order = append(order, k)
		}
		sum.Add(r)
		return nil
	})
	if err != nil {
		return out, err
	}
	for _, k := range order {
		r := sums[k]
		p := OutcomePoint{Group: k.group, Calls: r.Calls, Gateway: figure(r.Gateway), Backend: figure(r.Backend)}
		for _, n := range r.Backend.Buckets {
			p.BackendCalls += n
		}
		if q.Hourly {
			h := k.hour
			p.Hour = &h
		}
		out.Points = append(out.Points, p)
	}
	slices.SortFunc(out.Points, func(a, b OutcomePoint) int {
		if q.Hourly {
			return cmp.Or(a.Hour.Compare(*b.Hour), cmp.Compare(a.Group, b.Group))
		}
		return cmp.Or(cmp.Compare(b.Calls, a.Calls), cmp.Compare(a.Group, b.Group))
	})
	return out, nil
}

func groupOf(k store.OutcomeKey, by string) string {
	switch by {
	case "outcome":
		return k.Outcome
	case "user":
		return k.UserID
	case "service":
		return k.ServiceID
	case "endpoint":
		return k.ServiceID + "/" + k.EndpointID
	case "product":
		return k.ServiceID + "/" + k.ProductID
	}
	return ""
}

func figure(l store.Latency) LatencyFigure {
	f := LatencyFigure{Latency: l, P50Micros: LatencyQuantile(l, 0.5), P99Micros: LatencyQuantile(l, 0.99)}
	var n int64
	for _, c := range l.Buckets {
		n += c
	}
	if n > 0 {
		f.MeanMicros = l.SumMicros / n
	}
	return f
}

// LatencyQuantile is the upper bound, in microseconds, of the bucket the
// q-quantile of l falls in (the last bound when it is above them all), or
// 0 for an empty histogram.
func LatencyQuantile(l store.Latency, q float64) int64 {
	var total int64
	for _, n := range l.Buckets {
		total += n
	}
	if total == 0 {
		return 0
	}
	rank := int64(q*float64(total) + 0.5)
	rank = max(rank, 1)
	var seen int64
	for i, n := range l.Buckets {
		seen += n
		if seen >= rank {
			return store.LatencyBounds[min(i, len(store.LatencyBounds)-1)]
		}
	}
	return store.LatencyBounds[len(store.LatencyBounds)-1]
}

// ParseOutcomeQuery reads an outcome query from URL parameters (userId,
// serviceId, outcome, from, to, by, hourly), refusing a bad one with the
// invalid_request error that names the field. Parameters it does not
// know are the caller's to refuse.
func ParseOutcomeQuery(q url.Values) (OutcomeQuery, error) {
	var oq OutcomeQuery
	oq.UserID, oq.ServiceID, oq.Outcome, oq.By = q.Get("userId"), q.Get("serviceId"), q.Get("outcome"), q.Get("by")
	if q.Has("userId") {
		if err := CheckUserID("userId", oq.UserID); err != nil {
			return oq, err
		}
	}
	if q.Has("serviceId") && !catalog.ValidID(oq.ServiceID) {
		return oq, apierror.Invalid("serviceId", "serviceId is not a valid id")
	}
	if q.Has("outcome") && !validOutcome(oq.Outcome) {
		return oq, apierror.Invalid("outcome", "outcome must be 1xx, 2xx, 3xx, 4xx, 5xx, cut_off or an error code (lowercase letters, digits and _)")
	}
	var err error
	if oq.From, err = ParseTimeBound(q.Get("from"), false); err != nil {
		return oq, apierror.Invalid("from", "from must be an RFC 3339 time or a date (YYYY-MM-DD)")
	}
	if oq.To, err = ParseTimeBound(q.Get("to"), true); err != nil {
		return oq, apierror.Invalid("to", "to must be an RFC 3339 time or a date (YYYY-MM-DD)")
	}
	if !oq.From.IsZero() && !oq.To.IsZero() && !oq.From.Before(oq.To) {
		return oq, apierror.Invalid("to", "to must be after from")
	}
	if oq.By != "" && !slices.Contains(OutcomeDimensions, oq.By) {
		return oq, apierror.Invalid("by", "by must be outcome, user, service, endpoint or product")
	}
	if q.Has("hourly") {
		if oq.Hourly, err = strconv.ParseBool(q.Get("hourly")); err != nil {
			return oq, apierror.Invalid("hourly", "hourly must be true or false")
		}
	}
	return oq, nil
}

// validOutcome is what an outcome looks like: a status class, cut_off or
// an error code.
func validOutcome(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// outcomeColumns are the CSV columns of an outcome export: the key, the
// calls, then each histogram's sum and buckets (le_<bound> in
// microseconds, le_inf the rest).
var outcomeColumns = func() []string {
	cols := []string{"hour", "userId", "serviceId", "endpointId", "productId", "outcome", "calls"}
	for _, h := range []string{"gateway", "backend"} {
		cols = append(cols, h+"SumMicros")
		for _, b := range store.LatencyBounds {
			cols = append(cols, h+"_le_"+strconv.FormatInt(b, 10))
		}
		cols = append(cols, h+"_le_inf")
	}
	return cols
}()

// OutcomeCSVColumns are the columns of an outcome CSV export.
func OutcomeCSVColumns() []string { return slices.Clone(outcomeColumns) }

// OutcomeCSVRow is an outcome row as a row of a CSV export.
func OutcomeCSVRow(r store.OutcomeRow) []string {
	row := make([]string, 0, len(outcomeColumns))
	row = append(row, csvTime(r.Hour), csvText(r.UserID), csvText(r.ServiceID), csvText(r.EndpointID), csvText(r.ProductID),
		csvText(r.Outcome), strconv.FormatInt(r.Calls, 10))
	for _, l := range []store.Latency{r.Gateway, r.Backend} {
		row = append(row, strconv.FormatInt(l.SumMicros, 10))
		for _, n := range l.Buckets {
			row = append(row, strconv.FormatInt(n, 10))
		}
	}
	return row
}

// Outcomes is Outcomes over the runtime's store, after adding what this
// process has counted (the runtime's OutcomeCounter) to it, so a page
// shows the calls this node answered up to now: what the console and the
// portal call. A failed flush is logged and the read goes on.
func (o *Ops) Outcomes(ctx context.Context, q OutcomeQuery) (OutcomeSeries, error) {
	o.FlushOutcomes(ctx)
	return Outcomes(ctx, o.rt.Store(), q)
}

// FlushOutcomes adds this process's counted outcomes to the store now.
func (o *Ops) FlushOutcomes(ctx context.Context) {
	s, ok := o.rt.Store().(store.Outcomes)
	if !ok || o.rt.Outcomes == nil {
		return
	}
	if err := o.rt.Outcomes.Flush(ctx, s, time.Now()); err != nil {
		o.rt.Logger.Warn("adding this node's call outcomes before a read", zap.Error(err))
	}
}
