package engine

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are package-level collectors registered into each config's
// registry, so counts carry across reloads and a reload never panics on a
// duplicate registration.
type Metrics struct {
	invokes         *prometheus.CounterVec
	rejections      *prometheus.CounterVec
	units           *prometheus.CounterVec
	signatureFails  *prometheus.CounterVec
	jobStates       *prometheus.CounterVec
	preflights      *prometheus.CounterVec
	commitSeconds   prometheus.Histogram
	commitBatchSize prometheus.Histogram
	writeFailures   prometheus.Counter
}

var sharedMetrics = &Metrics{
	invokes: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "platform", Name: "invokes_total",
		Help: "Invocations by service, endpoint, mode (sync, async) and outcome (ok, rejected, backend_error, caller_gone).",
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
	preflights: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "platform", Name: "preflights_total",
		Help: "Core pre-flight requests (validate, estimate_usage, billing_estimate) by the service that asked and outcome (ok, or the refusal or denial code).",
	}, []string{"route", "service", "outcome"}),
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
	writeFailures: prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "platform", Name: "store_write_failures_total",
		Help: "Writes whose commit to the store failed (a full disk, an I/O error); the log sums them up once per burst.",
	}),
}

// SharedMetrics returns the process's collectors, registered into reg
// (each config's registry; nil registers them nowhere).
func SharedMetrics(reg *prometheus.Registry) *Metrics {
	m := sharedMetrics
	if reg == nil {
		return m
	}
	for _, c := range []prometheus.Collector{m.invokes, m.rejections, m.units, m.signatureFails, m.jobStates, m.preflights, m.commitSeconds, m.commitBatchSize, m.writeFailures} {
		if err := reg.Register(c); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
			panic(err) // a programming error: two collectors with one name
		}
	}
	return m
}

// ObserveWriteFailures counts writes whose commit failed (the store's
// observer).
func (m *Metrics) ObserveWriteFailures(writes int) { m.writeFailures.Add(float64(writes)) }

// ObserveCommit records one group commit of the store (its observer).
func (m *Metrics) ObserveCommit(d time.Duration, writes int) {
	m.commitSeconds.Observe(d.Seconds())
	m.commitBatchSize.Observe(float64(writes))
}

// JobStates is the job transitions counter, by the state entered (the
// app's expiry sweep adds its expired jobs to it).
func (m *Metrics) JobStates() *prometheus.CounterVec { return m.jobStates }

// CountInvoke counts an invocation outcome. Ids the catalog does not
// know are counted as "" (callers choose the path, and one series per
// made-up id would grow the registry without bound).
func (rt *Runtime) CountInvoke(service, endpoint, mode, outcome string) {
	service, endpoint = rt.knownLabels(service, endpoint)
	rt.Metrics.invokes.WithLabelValues(service, endpoint, mode, outcome).Inc()
}

// CountKnownInvoke is CountInvoke for ids the catalog gave (an admitted
// call's service and endpoint): it skips the two catalog lookups that
// CountInvoke makes to keep made-up ids out of the labels.
func (rt *Runtime) CountKnownInvoke(service, endpoint, mode, outcome string) {
	rt.Metrics.invokes.WithLabelValues(service, endpoint, mode, outcome).Inc()
}

// knownLabels keeps a service and endpoint id only if the catalog has it.
func (rt *Runtime) knownLabels(service, endpoint string) (string, string) {
	svc, ok := rt.Catalog.Service(service)
	if !ok {
		return "", ""
	}
	if _, ok := svc.Endpoint(endpoint); !ok {
		endpoint = ""
	}
	return service, endpoint
}

// CountPreflight counts a core pre-flight request: route is validate,
// estimate_usage or billing_estimate; service the authenticated caller's
// or the estimated service ("" before one is known); outcome "ok" or the
// code of the refusal or denial.
func (rt *Runtime) CountPreflight(route, service, outcome string) {
	service, _ = rt.knownLabels(service, "")
	rt.Metrics.preflights.WithLabelValues(route, service, outcome).Inc()
}

// CountRejection counts a refused request by its error code.
func (rt *Runtime) CountRejection(code string) { rt.Metrics.rejections.WithLabelValues(code).Inc() }

// CountUnits counts metered units (in whole units, fractions kept).
func (rt *Runtime) CountUnits(service, source string, millionths int64) {
	rt.Metrics.units.WithLabelValues(service, source).Add(float64(millionths) / 1e6)
}

// CountSignatureFailure counts a refused signature on a route.
func (rt *Runtime) CountSignatureFailure(route string) {
	rt.Metrics.signatureFails.WithLabelValues(route).Inc()
}

// CountJobState counts a job entering a state.
func (rt *Runtime) CountJobState(state string) { rt.Metrics.jobStates.WithLabelValues(state).Inc() }
