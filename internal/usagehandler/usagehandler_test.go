package usagehandler

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/store"
)

func TestMatchRoute(t *testing.T) {
	p := engine.DefaultPrefixes()
	tests := []struct {
		path string
		ok   bool
		kind routeKind
		id   string
	}{
		{"/api/usage/report", true, routeReport, ""},
		{"/usage/api/v1/report", true, routeReport, ""},
		{"/api/usage/progress/abc", true, routeProgress, "abc"},
		{"/api/usage/complete/abc", true, routeComplete, "abc"},
		{"/usage/api/v1/complete/abc", true, routeComplete, "abc"},
		{"/api/requests/abc/status", true, routeStatus, "abc"},
		{"/gateway/api/v1/requests/abc/result", true, routeResult, "abc"},
		{"/api/usage/complete/", true, routeUnknown, ""},
		{"/api/usage/complete/a/b", true, routeUnknown, ""},
		{"/api/usage/report/", true, routeUnknown, ""},
		{"/api/requests/abc", true, routeUnknown, ""},
		{"/api/requests//status", true, routeUnknown, ""},
		{"/api/v1/service-keys/validate", true, routeCore, ""},
		{"/core/api/v1/billing/usage/estimate", true, routeCore, ""},
		{"/api/service/svc/endpoint/e/invoke", false, 0, ""},
		{"/api/usage", false, 0, ""},
		{"/health", false, 0, ""},
		{"/apiusage/report", false, 0, ""},
	}
	for _, tt := range tests {
		r, ok := matchRoute(p, tt.path)
		if ok != tt.ok || ok && (r.kind != tt.kind || r.id != tt.id) {
			t.Errorf("%s: got %+v %v, want kind %d id %q %v", tt.path, r, ok, tt.kind, tt.id, tt.ok)
		}
	}
}

func TestParseTime(t *testing.T) {
	want := time.Date(2024, 6, 10, 6, 13, 20, 0, time.UTC) // 1718000000
	tests := []struct {
		in   string
		want time.Time
	}{
		{"2024-06-10T06:13:20Z", want},
		{"2024-06-10T06:13:20.250Z", want.Add(250 * time.Millisecond)},
		{"2024-06-10T08:13:20+02:00", want},
		{"2024-06-10T08:13:20+0200", want},
		{"2024-06-10T06:13:20", want},
		{"2024-06-10T06:13:20.123456789", want.Add(123456789)},
		{"2024-06-10T06:13", want.Add(-20 * time.Second)},
		{"2024-06-10 06:13:20", want},
		{"1718000000", want},
		{"1718000000.5", want.Add(500 * time.Millisecond)},
		{"1718000000250", want.Add(250 * time.Millisecond)},
		{"1718000000250.5", want.Add(250*time.Millisecond + 500*time.Microsecond)},
	}
	for _, tt := range tests {
		got, err := parseTime(tt.in)
		if err != nil || !got.Equal(tt.want) {
			t.Errorf("parseTime(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
	for _, bad := range []string{"", "yesterday", "2024-13-01T00:00:00Z", "1718000000.", "1718000000.x", "1.7e9", "-1718000000", "2024-06-10"} {
		if got, err := parseTime(bad); err == nil {
			t.Errorf("parseTime(%q) = %v, want an error", bad, got)
		}
	}
}

func TestCut(t *testing.T) {
	s := "ab" + "é" + "😀" // 2 + 2 + 4 bytes
	for n := 0; n <= len(s)+1; n++ {
		got, cutShort := cut(s, n)
		if len(got) > n || !utf8.ValidString(got) || !strings.HasPrefix(s, got) || cutShort != (n < len(s)) {
			t.Errorf("cut(%d) = %q, %v", n, got, cutShort)
		}
	}
	if got, _ := cut(s, 7); got != "abé" {
		t.Errorf("cut inside the emoji = %q", got)
	}
}

func TestParseCompletion(t *testing.T) {
	now := time.Unix(1718000000, 0)
	parse := func(body string) completion {
		t.Helper()
		c, e := parseCompletion([]byte(body), now, time.Minute)
		if e != nil {
			t.Fatalf("%s: %v", body, e)
		}
		return c
	}
	for body, status := range map[string]string{
		`{"timestamp":1718000000}`:                      store.JobCompleted,
		`{"status":"","timestamp":1718000000}`:          store.JobCompleted,
		`{"status":"done","timestamp":1718000000}`:      store.JobCompleted,
		`{"status":null,"timestamp":1718000000}`:        store.JobCompleted,
		`{"status":"failed","timestamp":1718000000}`:    store.JobFailed,
		`{"status":" Failed ","timestamp":1718000000}`:  store.JobFailed,
		`{"status":"COMPLETED","timestamp":1718000000}`: store.JobCompleted,
	} {
		if got := parse(body).Status; got != status {
			t.Errorf("%s: status %s, want %s", body, got, status)
		}
	}
	obj := parse(`{"result":{"a": [1, 2]},"timestamp":1718000000}`)
	if obj.Result != `{"a":[1,2]}` || obj.ContentType != "application/json" {
		t.Errorf("object result %+v", obj)
	}
	// The digest ignores how the completion was written and when it was
	// signed, not what it says.
	a := parse(`{"status":"COMPLETED","result":"r","units":2,"timestamp":1718000000}`)
	b := parse(`{"timestamp":"2024-06-10T06:13:00Z","units":"2.000","result":"r","status":"completed"}`)
	c := parse(`{"status":"COMPLETED","result":"r","units":3,"timestamp":1718000000}`)
	d := parse(`{"status":"COMPLETED","result":"r","timestamp":1718000000}`)
	if a.digest() != b.digest() || a.digest() == c.digest() || a.digest() == d.digest() {
		t.Error("completion digests do not identify completions")
	}
	for body, field := range map[string]string{
		`{"status":1,"timestamp":1718000000}`:                           "status",
		`{"resultUrl":"file:///etc/passwd","timestamp":1718000000}`:     "resultUrl",
		`{"resultUrl":"https://","timestamp":1718000000}`:               "resultUrl",
		`{"resultUrl":"https://u:p@x.example/","timestamp":1718000000}`: "resultUrl",
		`{"contentType":"not a type","timestamp":1718000000}`:           "contentType",
		`{"units":"lots","timestamp":1718000000}`:                       "units",
		`{"units":1}`:                            "timestamp",
		`{"timestamp":1718003600}`:               "timestamp",
		`{"timestamp":true}`:                     "timestamp",
		`"COMPLETED"`:                            "body",
		`{"status":"COMPLETED","timestamp":1} x`: "body",
	} {
		_, e := parseCompletion([]byte(body), now, time.Minute)
		if e == nil || e.Field != field {
			t.Errorf("%s: %v, want invalid %s", body, e, field)
		}
	}
}

func TestChargedUnits(t *testing.T) {
	two := billing.Whole(2)
	ep := &catalog.Endpoint{ID: "job", Cost: &two}
	perRequest := &billing.Product{MeasurementType: billing.PerRequest}
	perToken := &billing.Product{MeasurementType: billing.PerToken}
	tests := []struct {
		name string
		c    completion
		p    *billing.Product
		want billing.Units
	}{
		{"stated units", completion{Status: store.JobCompleted, Units: 5, HasUnits: true}, perToken, 5},
		{"stated zero", completion{Status: store.JobCompleted, HasUnits: true}, perRequest, 0},
		{"per request default", completion{Status: store.JobCompleted}, perRequest, two},
		{"owner default", completion{Status: store.JobCompleted}, nil, two},
		{"measured, none stated", completion{Status: store.JobCompleted}, perToken, 0},
		{"failed", completion{Status: store.JobFailed, Units: 5, HasUnits: true}, perToken, 0},
	}
	for _, tt := range tests {
		if got := chargedUnits(tt.c, jobTerms{product: tt.p, cost: ep.UnitCost(), hasCost: true}); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
	// A job stored without terms whose endpoint left the catalog.
	if got := chargedUnits(completion{Status: store.JobCompleted}, jobTerms{product: perRequest}); got != 0 {
		t.Errorf("no endpoint cost known: %v, want 0", got)
	}
}

// TestJobTermsAdmission: a job that carries its terms is charged under
// them, however the catalog changed: the product and endpoint it was
// accepted under are gone from this one.
func TestJobTermsAdmission(t *testing.T) {
	h := &Handler{}
	svc := &catalog.Service{ID: "svc"} // no products, no endpoints left
	pre := billing.Product{ID: "pre", BillingModel: billing.Prepaid, MeasurementType: billing.PerRequest, Price: billing.Whole(1)}
	job := store.Job{ID: "j", UserID: "u", ServiceID: "svc", EndpointID: "gone", ProductID: "pre",
		Terms: &store.JobTerms{Product: &pre, EndpointCost: billing.Whole(3)}}
	got := h.jobTerms(job, svc)
	if got.account.Free || got.account.Product != pre || got.account.UserID != "u" || got.product == nil || got.product.ID != "pre" {
		t.Fatalf("jobTerms = %+v, want charged under the product it was accepted with", got)
	}
	if u := chargedUnits(completion{Status: store.JobCompleted}, got); u != billing.Whole(3) {
		t.Errorf("PER_REQUEST job without units: %v, want the endpoint's cost then (3)", u)
	}
	owner := job
	owner.Free, owner.Terms = true, &store.JobTerms{EndpointCost: billing.Whole(2)}
	got = h.jobTerms(owner, svc)
	if !got.account.Free || got.product != nil || chargedUnits(completion{Status: store.JobCompleted}, got) != billing.Whole(2) {
		t.Errorf("owner's job: %+v, want free, one call at the cost then", got)
	}
}

func TestParseProgress(t *testing.T) {
	now := time.Unix(1718000000, 0)
	p, e := parseProgress([]byte(`{"stage":"s","percentageComplete":100,"errorMessage":"`+strings.Repeat("é", 3000)+`","timestamp":1718000000,"extra":{}}`), now, 0)
	if e != nil || p.Percentage != 100 || !p.HasError || len(p.ErrorMessage) > maxErrorMessageBytes || !utf8.ValidString(p.ErrorMessage) {
		t.Fatalf("%+v %v", p, e)
	}
	p, e = parseProgress([]byte(`{"stage":"s","percentageComplete":0,"errorMessage":null,"timestamp":1718000000}`), now, 0)
	if e != nil || p.HasError {
		t.Fatalf("null errorMessage: %+v %v", p, e)
	}
	for body, field := range map[string]string{
		`{"stage":"s","percentageComplete":100.01,"timestamp":1718000000}`:             "percentageComplete",
		`{"stage":"s","percentageComplete":null,"timestamp":1718000000}`:               "percentageComplete",
		`{"stage":" ","percentageComplete":1,"timestamp":1718000000}`:                  "stage",
		`{"stage":"s","percentageComplete":1,"errorMessage":1,"timestamp":1718000000}`: "errorMessage",
	} {
		if _, e := parseProgress([]byte(body), now, 0); e == nil || e.Field != field {
			t.Errorf("%s: %v, want invalid %s", body, e, field)
		}
	}
}

func TestStatusOf(t *testing.T) {
	start := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	j := store.Job{ID: "r", Status: store.JobRunning, CreatedAt: start, ExpiresAt: start.Add(24 * time.Hour)}
	if s := statusOf(effective(j, start.Add(90*time.Minute)), start.Add(90*time.Minute)); s.ElapsedHours != 1.5 || s.Status != store.JobRunning || s.CurrentStage != nil {
		t.Errorf("running: %+v", s)
	}
	// Past its deadline but not yet swept, a job shows as expired, and its
	// elapsed time stops at the deadline.
	s := statusOf(effective(j, start.Add(30*time.Hour)), start.Add(30*time.Hour))
	if s.Status != store.JobFailed || s.ErrorMessage == nil || *s.ErrorMessage != engine.JobExpiredMessage || s.ElapsedHours != 24 {
		t.Errorf("overdue: %+v", s)
	}
	// startTime always has three decimals, whatever the store kept: it
	// had 0 to 9 (nanoseconds in bbolt, microseconds in PostgreSQL).
	for at, want := range map[time.Time]string{
		start:                                  `"2024-01-01T00:00:00.000Z"`,
		start.Add(123456789 * time.Nanosecond): `"2024-01-01T00:00:00.123Z"`,
		start.Add(5 * time.Microsecond).In(time.FixedZone("x", 3600)): `"2024-01-01T00:00:00.000Z"`,
	} {
		j.CreatedAt = at
		b, _ := json.Marshal(statusOf(j, start))
		if !strings.Contains(string(b), `"startTime":`+want+`,`) {
			t.Errorf("created %s: %s, want startTime %s", at, b, want)
		}
	}
}
