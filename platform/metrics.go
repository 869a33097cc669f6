package platform

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are package-level collectors registered into each config's
// registry, so counts carry across reloads and a reload never panics on a
// duplicate registration.
type metrics struct {
	invokes         *prometheus.CounterVec
	rejections      *prometheus.CounterVec
	units           *prometheus.CounterVec
	signatureFails  *prometheus.CounterVec
	jobStates       *prometheus.CounterVec
	commitSeconds   prometheus.Histogram
	commitBatchSize prometheus.Histogram
}

var sharedMetrics = &metrics{
	invokes: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "platform", Name: "invokes_total",
		Help: "Invocations by service, endpoint, mode (sync, async) and outcome (ok, rejected, backend_error).",
	}, []string{"service", "endpoint", "mode", "outcome"}),
	rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "platform", Name: "rejections_total",
		Help: "Requests refused, by error code.",
	}, []string{"code"}),
	units: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "platform", Name: "units_metered_total",
		Help: "Units written to the usage ledger, by service and source (gateway, report, completion).",
	}, []string{"service", "source"}),
	signatureFails: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "platform", Name: "signature_failures_total",
		Help: "Signed requests refused for a bad signature or timestamp, by route.",
	}, []string{"route"}),
	jobStates: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "platform", Name: "job_transitions_total",
		Help: "Async job state transitions, by the state entered.",
	}, []string{"state"}),
	commitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "platform", Name: "store_commit_seconds",
		Help:    "Duration of one durable group commit of the store.",
		Buckets: prometheus.ExponentialBuckets(0.00005, 2, 14),
	}),
	commitBatchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "platform", Name: "store_commit_writes",
		Help:    "Writes carried by one group commit.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 12),
	}),
}

func newMetrics(reg *prometheus.Registry) *metrics {
	m := sharedMetrics
	if reg == nil {
		return m
	}
	for _, c := range []prometheus.Collector{m.invokes, m.rejections, m.units, m.signatureFails, m.jobStates, m.commitSeconds, m.commitBatchSize} {
		if err := reg.Register(c); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
			panic(err) // a programming error: two collectors with one name
		}
	}
	return m
}

func (m *metrics) observeCommit(d time.Duration, writes int) {
	m.commitSeconds.Observe(d.Seconds())
	m.commitBatchSize.Observe(float64(writes))
}

// CountInvoke counts an invocation outcome.
func (a *App) CountInvoke(service, endpoint, mode, outcome string) {
	a.metrics.invokes.WithLabelValues(service, endpoint, mode, outcome).Inc()
}

// CountRejection counts a refused request by its error code.
func (a *App) CountRejection(code string) { a.metrics.rejections.WithLabelValues(code).Inc() }

// CountUnits counts metered units (in whole units, fractions kept).
func (a *App) CountUnits(service, source string, millionths int64) {
	a.metrics.units.WithLabelValues(service, source).Add(float64(millionths) / 1e6)
}

// CountSignatureFailure counts a refused signature on a route.
func (a *App) CountSignatureFailure(route string) {
	a.metrics.signatureFails.WithLabelValues(route).Inc()
}

// CountJobState counts a job entering a state.
func (a *App) CountJobState(state string) { a.metrics.jobStates.WithLabelValues(state).Inc() }
