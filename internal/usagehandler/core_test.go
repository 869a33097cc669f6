package usagehandler

import (
	"encoding/json"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/wire"
)

func TestCoreRoutes(t *testing.T) {
	p := engine.DefaultPrefixes()
	for path, want := range map[string]coreKind{
		"/api/v1/service-keys/validate":            coreValidate,
		"/core/api/v1/service-keys/validate":       coreValidate,
		"/api/v1/service-keys/estimate-usage":      coreKeyEstimate,
		"/core/api/v1/billing/usage/estimate":      coreBillingEstimate,
		"/api/v1/billing/usage/estimate":           coreBillingEstimate,
		"/api/v1/service-keys/validate/":           coreUnknown,
		"/api/v1/service-keys":                     coreUnknown,
		"/api/v1/billing/usage/estimate/x":         coreUnknown,
		"/core/api/v1/service-keys/estimate-usage": coreKeyEstimate,
	} {
		r, ok := matchRoute(p, path)
		if !ok || r.kind != routeCore || r.core != want {
			t.Errorf("%s: %+v %v, want core kind %v", path, r, ok, want)
		}
	}
	// The usage prefix lies inside the gateway prefix, the core prefix too,
	// and neither is the other's.
	if r, _ := matchRoute(p, "/api/usage/report"); r.kind != routeReport {
		t.Errorf("report: %+v", r)
	}
}

func units(s string) billing.Units {
	u, err := billing.ParseUnits(s)
	if err != nil {
		panic(err)
	}
	return u
}

func unitsPtr(s string) *billing.Units { u := units(s); return &u }

// TestEstimateOf pins down how the one billing decision becomes the
// estimate's flags and status, for each kind of limit.
func TestEstimateOf(t *testing.T) {
	quota := billing.Product{ID: "q", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, UnitLabel: "request", Quota: unitsPtr("10")}
	overage := quota
	overage.Overage, overage.Price, overage.SpendingCap = "allow", units("0.5"), unitsPtr("2")
	prepaid := billing.Product{ID: "p", BillingModel: billing.Prepaid, MeasurementType: billing.PerRequest, UnitLabel: "request", Price: units("2")}
	metered := billing.Product{ID: "m", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerToken, UnitLabel: "token", Price: units("0.001"), SpendingCap: unitsPtr("1")}

	tests := []struct {
		name                           string
		p                              *billing.Product
		st                             billing.State
		units                          string
		allow, credits, exceedCap      bool
		cost                           string
		status                         int
		remaining, remainingCredits    string // "" when absent
		totalThisCycle                 string
		isOverage, isOverLimit, allowO bool
	}{
		{name: "owner", p: nil, units: "1000", allow: true, credits: true, cost: "0", status: 200, totalThisCycle: "0"},
		{name: "quota left", p: &quota, st: billing.State{Used: units("4")}, units: "6", allow: true, credits: true, cost: "0", status: 200, remaining: "0", totalThisCycle: "10"},
		{name: "quota held by calls in flight", p: &quota, st: billing.State{Used: units("4"), Reserved: units("5")}, units: "2", exceedCap: true, credits: true, cost: "0", status: 429, remaining: "0", totalThisCycle: "6"},
		{name: "quota blocked", p: &quota, st: billing.State{Used: units("10")}, units: "0.5", exceedCap: true, credits: true, cost: "0", status: 429, remaining: "0", totalThisCycle: "10.5", isOverage: true, isOverLimit: true},
		{name: "zero units on a used-up quota", p: &quota, st: billing.State{Used: units("10")}, units: "0", allow: true, credits: true, cost: "0", status: 200, remaining: "0", totalThisCycle: "10"},
		{name: "overage priced", p: &overage, st: billing.State{Used: units("9")}, units: "3", allow: true, credits: true, cost: "1", status: 200, remaining: "0", totalThisCycle: "12", isOverage: true, allowO: true},
		{name: "overage past the cap", p: &overage, st: billing.State{Used: units("10"), Spend: units("1.5")}, units: "2", exceedCap: true, credits: true, cost: "1", status: 429, remaining: "0", totalThisCycle: "12", isOverage: true, isOverLimit: true, allowO: true},
		{name: "prepaid enough", p: &prepaid, st: billing.State{Credits: units("5")}, units: "2", allow: true, credits: true, cost: "4", status: 200, remainingCredits: "1", totalThisCycle: "2"},
		{name: "prepaid held", p: &prepaid, st: billing.State{Credits: units("5"), CreditsHeld: units("2")}, units: "2", cost: "4", status: 403, remainingCredits: "-1", totalThisCycle: "2"},
		{name: "prepaid short", p: &prepaid, st: billing.State{Credits: units("5")}, units: "3", cost: "6", status: 403, remainingCredits: "-1", totalThisCycle: "3", isOverLimit: true},
		{name: "metered at the cap exactly", p: &metered, st: billing.State{}, units: "1000", allow: true, credits: true, cost: "1", status: 200, totalThisCycle: "1000"},
		{name: "metered past the cap", p: &metered, st: billing.State{}, units: "1000.5", exceedCap: true, credits: true, cost: "1.0005", status: 429, totalThisCycle: "1000.5", isOverLimit: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := tt.st
			out, d := estimateOf(tt.p, st, units(tt.units))
			if st != tt.st {
				t.Error("estimateOf changed the state it was given")
			}
			status := 200
			if !d.Allowed {
				status = apierror.Status(d.Code)
			}
			if out.WouldAllow != tt.allow || out.SufficientCredits != tt.credits || out.WouldExceedCap != tt.exceedCap ||
				out.EstimatedCost != units(tt.cost) || status != tt.status {
				t.Errorf("got allow %v credits %v exceedCap %v cost %v status %d", out.WouldAllow, out.SufficientCredits, out.WouldExceedCap, out.EstimatedCost, status)
			}
			if tt.p != nil {
				if d2 := billing.Decide(*tt.p, tt.st, units(tt.units)); d2 != d {
					t.Errorf("decision %+v differs from billing.Decide %+v", d, d2)
				}
				if !reflect.DeepEqual(out.Breakdown, billing.Summarize(*tt.p, tt.st, units(tt.units), false)) {
					t.Errorf("breakdown is not billing.Summarize's")
				}
				if (out.Code != "") == out.WouldAllow || !out.WouldAllow && out.Message == "" {
					t.Errorf("refusal code %q message %q", out.Code, out.Message)
				}
			}
			b := out.Breakdown
			if b.UnitsUsed != units(tt.units) || b.TotalUnitsUsedThisCycle != units(tt.totalThisCycle) ||
				b.IsOverage != tt.isOverage || b.IsOverageAllowed != tt.allowO {
				t.Errorf("breakdown %+v", b)
			}
			if b.IsOverLimit != tt.isOverLimit {
				t.Errorf("isOverLimit %v", b.IsOverLimit)
			}
			checkOptional(t, "unitsRemaining", b.UnitsRemaining, tt.remaining)
			checkOptional(t, "remainingCredits", b.RemainingCredits, tt.remainingCredits)
		})
	}
}

func checkOptional(t *testing.T, name string, got *billing.Units, want string) {
	t.Helper()
	switch {
	case want == "" && got != nil:
		t.Errorf("%s = %v, want absent", name, *got)
	case want != "" && got == nil:
		t.Errorf("%s absent, want %s", name, want)
	case want != "" && got.String() != want:
		t.Errorf("%s = %v, want %s", name, *got, want)
	}
}

func TestEstimateBody(t *testing.T) {
	p := billing.Product{ID: "q", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, UnitLabel: "request", Quota: unitsPtr("3")}
	out, _ := estimateOf(&p, billing.State{}, units("1"))
	b, _ := json.Marshal(out)
	want := `{"sufficientCredits":true,"wouldExceedCap":false,"wouldAllow":true,"estimatedCost":0,"billingModelType":"SUBSCRIPTION",` +
		`"measurementType":"PER_REQUEST","unitLabel":"request","breakdown":{"unitsUsed":1,"unitsRemaining":2,` +
		`"totalUnitsUsedThisCycle":1,"isOverLimit":false,"isOverage":false,"isOverageAllowed":false}}`
	if string(b) != want {
		t.Errorf("billing estimate body\n got %s\nwant %s", b, want)
	}
	owner, _ := estimateOf(nil, billing.State{}, units("2"))
	owner.EstimateSchemaVersion, owner.Timestamp = EstimateSchemaVersion, 1718000000
	b, _ = json.Marshal(owner)
	want = `{"sufficientCredits":true,"wouldExceedCap":false,"wouldAllow":true,"estimatedCost":0,"billingModelType":null,` +
		`"measurementType":null,"unitLabel":null,"breakdown":{"unitsUsed":2,"totalUnitsUsedThisCycle":0,"isOverLimit":false,` +
		`"isOverage":false,"isOverageAllowed":false},"estimateSchemaVersion":3,"timestamp":1718000000}`
	if string(b) != want {
		t.Errorf("owner body\n got %s\nwant %s", b, want)
	}
	fail, _ := json.Marshal(wire.ValidationFailure{Error: "key_revoked", Code: "key_revoked", Message: "m", ValidationSchemaVersion: 3, Timestamp: 1})
	if string(fail) != `{"valid":false,"error":"key_revoked","code":"key_revoked","message":"m","validationSchemaVersion":3,"timestamp":1}` {
		t.Errorf("validation failure %s", fail)
	}
}

func TestSecretMatches(t *testing.T) {
	svc := &catalog.Service{
		ID: "svc", Backend: "http://127.0.0.1:1",
		Secrets:   []string{"new-secret-new-secret-0001", "old-secret-old-secret-0001"},
		Endpoints: []*catalog.Endpoint{{ID: "e"}},
	}
	if _, err := catalog.Compile([]*catalog.Service{svc}, nil); err != nil {
		t.Fatal(err)
	}
	for secret, want := range map[string]bool{
		"new-secret-new-secret-0001":  true,
		"old-secret-old-secret-0001":  true,
		"new-secret-new-secret-000":   false,
		"new-secret-new-secret-00011": false,
		"":                            false,
	} {
		if got := secretMatches(svc, secret); got != want {
			t.Errorf("secretMatches(%q) = %v", secret, got)
		}
	}
}

func TestCoreFields(t *testing.T) {
	for body, want := range map[string]string{
		`{"serviceKey":" sk_abc "}`: "sk_abc",
		`{"serviceKey":"sk_abc"}`:   "sk_abc",
	} {
		f, _ := parseObject([]byte(body))
		if got, e := f.serviceKey(); e != nil || got != want {
			t.Errorf("%s: %q %v", body, got, e)
		}
	}
	for _, body := range []string{`{}`, `{"serviceKey":""}`, `{"serviceKey":"  "}`, `{"serviceKey":null}`, `{"serviceKey":1}`} {
		f, _ := parseObject([]byte(body))
		if _, e := f.serviceKey(); e == nil || e.Field != "serviceKey" {
			t.Errorf("%s: %v", body, e)
		}
	}
	for body, want := range map[string]string{
		`{"estimatedUnits":0}`:          "0",
		`{"estimatedUnits":12.5}`:       "12.5",
		`{"estimatedUnits":"0.000001"}`: "0.000001",
		`{"estimatedUnits":1e3}`:        "1000",
	} {
		f, _ := parseObject([]byte(body))
		if got, e := f.estimatedUnits(); e != nil || got.String() != want {
			t.Errorf("%s: %v %v", body, got, e)
		}
	}
	for _, body := range []string{
		`{}`, `{"estimatedUnits":null}`, `{"estimatedUnits":-1}`, `{"estimatedUnits":"-1"}`, `{"estimatedUnits":"NaN"}`,
		`{"estimatedUnits":"Infinity"}`, `{"estimatedUnits":1e13}`, `{"estimatedUnits":0.0000001}`, `{"estimatedUnits":true}`,
		`{"estimatedUnits":[1]}`, `{"estimatedUnits":"1 000"}`,
	} {
		f, _ := parseObject([]byte(body))
		if _, e := f.estimatedUnits(); e == nil || e.Field != "estimatedUnits" || e.Code != apierror.InvalidRequest {
			t.Errorf("%s: %v", body, e)
		}
	}
}

func TestRequestIDOutsideCaddy(t *testing.T) {
	r := httptest.NewRequest("POST", "/api/v1/service-keys/validate", nil)
	a, b := requestID(r), requestID(r)
	if _, err := uuid.Parse(a); err != nil || a == b {
		t.Errorf("request ids %q %q", a, b)
	}
}

// TestValidationMatchesUpstreamFixture: a successful validation has the
// fields of the upstream contract's fixture validate-success-v3, in its
// order, "error": null included.
func TestValidationMatchesUpstreamFixture(t *testing.T) {
	pm, mt, ul := "SUBSCRIPTION", "PER_REQUEST", "request"
	b, err := json.Marshal(wire.Validation{
		Valid: true, ServiceKeyID: "6ba7b810-9dad-11d1-80b4-00c04fd430c8", UserID: "user-123",
		ServiceID: "550e8400-e29b-41d4-a716-446655440000", ServiceProductID: "7c9e6679-7425-40de-944b-e07fc1f90ae7",
		Roles: []string{"user"}, SubscriptionStatus: "ACTIVE", BillingModelType: &pm, MeasurementType: &mt,
		UnitLabel: &ul, Timestamp: 1700000000, ValidationSchemaVersion: 3,
	})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"valid":true,"serviceKeyId":"6ba7b810-9dad-11d1-80b4-00c04fd430c8","userId":"user-123",` +
		`"serviceId":"550e8400-e29b-41d4-a716-446655440000","serviceProductId":"7c9e6679-7425-40de-944b-e07fc1f90ae7",` +
		`"roles":["user"],"subscriptionStatus":"ACTIVE","billingModelType":"SUBSCRIPTION","measurementType":"PER_REQUEST",` +
		`"unitLabel":"request","timestamp":1700000000,"error":null,"validationSchemaVersion":3}`
	if string(b) != want {
		t.Errorf("validation\n got %s\nwant %s", b, want)
	}
}

// TestCoreAnswersWithoutHTMLEscapes: the pre-flight routes' answers and
// refusals write '<', '>' and '&' as themselves, as the wire contract says
// of every body (json.Marshal wrote a refusal's quoted id as "a\u003cb"
// and a unit label "Q&A <token>" as "Q\u0026A \u003ctoken\u003e"). The
// signature covers the bytes written.
func TestCoreAnswersWithoutHTMLEscapes(t *testing.T) {
	h := &Handler{rt: engine.New(engine.Runtime{})}
	c := &coreCall{requestID: "rid"}
	w := httptest.NewRecorder()
	h.coreWrite(w, c, 404, apierror.New(apierror.ServiceNotFound, `no service "a<b&c>"`))
	if got := w.Body.String(); !strings.Contains(got, `no service \"a<b&c>\"`) || strings.HasSuffix(got, "\n") {
		t.Errorf("refusal body %q: want the id as written, no trailing newline", got)
	}
	p := billing.Product{ID: "p", BillingModel: billing.Prepaid, MeasurementType: billing.PerToken, UnitLabel: "Q&A <token>", Price: units("1")}
	out, _ := estimateOf(&p, billing.State{}, units("2"))
	w = httptest.NewRecorder()
	h.coreWrite(w, c, 403, out)
	if got := w.Body.String(); !strings.Contains(got, `"unitLabel":"Q&A <token>"`) {
		t.Errorf("estimate body %q: want the unit label as written", got)
	}
	var back struct{ UnitLabel string }
	if err := json.Unmarshal(w.Body.Bytes(), &back); err != nil || back.UnitLabel != "Q&A <token>" {
		t.Errorf("the body does not read back: %v %+v", err, back)
	}
}
