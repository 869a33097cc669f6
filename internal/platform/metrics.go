package platform

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/platformgw/gateway/internal/engine"
)

// metrics are the runtime's collectors (engine.Metrics), as the app's own
// code feeds them: the store's commit observers and the expiry sweep's
// job transitions.
type metrics struct {
	*engine.Metrics
	jobStates *prometheus.CounterVec
}

func newMetrics(reg *prometheus.Registry) *metrics {
	m := engine.SharedMetrics(reg)
	return &metrics{Metrics: m, jobStates: m.JobStates()}
}

func (m *metrics) observeWriteFailures(writes int) { m.ObserveWriteFailures(writes) }

func (m *metrics) observeCommit(d time.Duration, writes int) { m.ObserveCommit(d, writes) }
