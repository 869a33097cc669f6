package platform

import (
	"encoding/csv"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store"
)

// TestAdminOutcomes: the calls this process counted are in the admin API's
// outcome export and summary at once (the read adds them to the store
// first), bad filters are refused with the field named, and the CLI
// prints both.
func TestAdminOutcomes(t *testing.T) {
	admStart(t)
	hour := time.Date(2026, 11, 26, 13, 0, 0, 0, time.UTC)
	count := func(user, outcome string, n int, gateway, backend time.Duration) {
		for range n {
			sharedOutcomes.Count(engine.OutcomeCall{Hour: hour.Unix(), UserID: user, ServiceID: "weather", EndpointID: "forecast",
				Product: "basic", Outcome: outcome}, gateway, backend)
		}
	}
	count("erin", store.Outcome2xx, 3, 40*time.Microsecond, 2*time.Millisecond)
	count("erin", "rate_limited", 2, 20*time.Microsecond, 0)
	count("frank", store.Outcome5xx, 1, 40*time.Microsecond, 30*time.Millisecond)

	r := admJSON(t, http.MethodGet, "/platform/outcomes?from=2026-11-26&to=2026-11-26", "")
	var rows []store.OutcomeRow
	r.decode(t, &rows)
	if r.status != http.StatusOK || len(rows) != 3 {
		t.Fatalf("export: %d %s", r.status, r.body)
	}
	if rows[0].UserID != "erin" || rows[0].Outcome != "2xx" || rows[0].Calls != 3 || rows[0].Backend.Buckets[store.LatencyBucket(2000)] != 3 {
		t.Errorf("first row %+v", rows[0])
	}

	r = admJSON(t, http.MethodGet, "/platform/outcomes/summary?by=outcome&from=2026-11-26", "")
	var series ops.OutcomeSeries
	r.decode(t, &series)
	if r.status != http.StatusOK || len(series.Points) != 3 || series.Points[0].Group != "2xx" || series.Points[0].Calls != 3 ||
		series.Points[0].Gateway.P50Micros != 50 || series.Points[0].Backend.P99Micros != 2500 {
		t.Fatalf("summary: %d %s", r.status, r.body)
	}
	r = admJSON(t, http.MethodGet, "/platform/outcomes/summary?by=user&hourly=true&outcome=rate_limited", "")
	series = ops.OutcomeSeries{}
	r.decode(t, &series)
	if len(series.Points) != 1 || series.Points[0].Group != "erin" || series.Points[0].Hour == nil || !series.Points[0].Hour.Equal(hour) {
		t.Fatalf("hourly by user: %s", r.body)
	}

	for _, tc := range []struct{ query, field string }{
		{"by=colour", "by"},
		{"outcome=Not+A+Code", "outcome"},
		{"from=yesterday", "from"},
		{"userId=", "userId"},
		{"hourly=often", "hourly"},
		{"limit=3", "limit"},
	} {
		admExpectError(t, admJSON(t, http.MethodGet, "/platform/outcomes/summary?"+tc.query, ""), http.StatusBadRequest,
			apierror.InvalidRequest, tc.field)
	}
	admExpectError(t, admJSON(t, http.MethodGet, "/platform/outcomes?format=xml", ""), http.StatusBadRequest,
		apierror.InvalidRequest, "format")

	out := cliMust(t, "outcomes", "--service", "weather")
	if !strings.Contains(out, "OUTCOME") || !strings.Contains(out, "rate_limited") || !strings.Contains(out, "TOTAL") {
		t.Errorf("outcomes printed:\n%s", out)
	}
	out = cliMust(t, "outcomes", "export", "--user", "erin")
	csvRows, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil || len(csvRows) != 3 || !slices.Equal(csvRows[0], ops.OutcomeCSVColumns()) || csvRows[1][6] != "3" {
		t.Fatalf("outcomes export printed %q (%v)", out, err)
	}
	out = cliMust(t, "outcomes", "--by", "user", "--json")
	series = ops.OutcomeSeries{}
	if err := json.Unmarshal([]byte(out), &series); err != nil || len(series.Points) != 2 {
		t.Fatalf("outcomes --json printed %s (%v)", out, err)
	}
}
