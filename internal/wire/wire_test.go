package wire

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/platformgw/gateway/internal/billing"
)

// TestBodies pins each body's bytes, every field set and none: field
// order, null versus absent. They are the bytes the server wrote before
// these types were shared with the SDK.
func TestBodies(t *testing.T) {
	s := "SUBSCRIPTION"
	left := billing.Whole(10)
	bd := billing.Breakdown{UnitsUsed: billing.Whole(2), UnitsRemaining: &left}
	tests := []struct {
		name string
		v    any
		want string
	}{
		{"validation", Validation{Valid: true, ServiceKeyID: "k", UserID: "u", ServiceID: "s", ServiceProductID: "p", Roles: []string{"a"},
			SubscriptionStatus: "ACTIVE", BillingModelType: &s, MeasurementType: &s, UnitLabel: &s, Timestamp: 5, ValidationSchemaVersion: 3},
			`{"valid":true,"serviceKeyId":"k","userId":"u","serviceId":"s","serviceProductId":"p","roles":["a"],"subscriptionStatus":"ACTIVE","billingModelType":"SUBSCRIPTION","measurementType":"SUBSCRIPTION","unitLabel":"SUBSCRIPTION","timestamp":5,"error":null,"validationSchemaVersion":3}`},
		{"validation, owner", Validation{Roles: []string{}},
			`{"valid":false,"serviceKeyId":"","userId":"","serviceId":"","serviceProductId":"","roles":[],"subscriptionStatus":"","billingModelType":null,"measurementType":null,"unitLabel":null,"timestamp":0,"error":null,"validationSchemaVersion":0}`},
		{"validation failure", ValidationFailure{Error: "invalid_key", Code: "invalid_key", Message: "m", RequestID: "r", ValidationSchemaVersion: 3, Timestamp: 7},
			`{"valid":false,"error":"invalid_key","code":"invalid_key","message":"m","requestId":"r","validationSchemaVersion":3,"timestamp":7}`},
		{"validation failure, empty", ValidationFailure{},
			`{"valid":false,"error":"","code":"","message":"","validationSchemaVersion":0,"timestamp":0}`},
		{"estimate", Estimate{SufficientCredits: true, WouldExceedCap: true, WouldAllow: true, EstimatedCost: billing.Whole(1),
			BillingModelType: &s, MeasurementType: &s, UnitLabel: &s, Breakdown: bd, EstimateSchemaVersion: 3, Timestamp: 9,
			Code: "c", Message: "m", RetryAfter: 4, RequestID: "r"},
			`{"sufficientCredits":true,"wouldExceedCap":true,"wouldAllow":true,"estimatedCost":1,"billingModelType":"SUBSCRIPTION","measurementType":"SUBSCRIPTION","unitLabel":"SUBSCRIPTION","breakdown":{"unitsUsed":2,"unitsRemaining":10,"totalUnitsUsedThisCycle":0,"isOverLimit":false,"isOverage":false,"isOverageAllowed":false},"estimateSchemaVersion":3,"timestamp":9,"code":"c","message":"m","retryAfter":4,"requestId":"r"}`},
		{"estimate, empty", Estimate{},
			`{"sufficientCredits":false,"wouldExceedCap":false,"wouldAllow":false,"estimatedCost":0,"billingModelType":null,"measurementType":null,"unitLabel":null,"breakdown":{"unitsUsed":0,"totalUnitsUsedThisCycle":0,"isOverLimit":false,"isOverage":false,"isOverageAllowed":false}}`},
		{"report", Report{UserID: "u", ServiceID: "s", UnitsUsed: billing.Whole(3) / 2, Timestamp: "2026-03-01T12:00:00.000Z", RequestID: "r"},
			`{"userId":"u","serviceId":"s","unitsUsed":1.5,"timestamp":"2026-03-01T12:00:00.000Z","requestId":"r"}`},
		{"report, no request id", Report{UserID: "u", ServiceID: "s", UnitsUsed: billing.Whole(1), Timestamp: "1"},
			`{"userId":"u","serviceId":"s","unitsUsed":1,"timestamp":"1"}`},
		{"report result", ReportResult{ReportSchemaVersion: 2, Status: "ok", Warning: &s, UserID: "u", ServiceID: "s",
			BillingModelType: &s, MeasurementType: &s, UnitLabel: &s, Breakdown: bd},
			`{"reportSchemaVersion":2,"status":"ok","warning":"SUBSCRIPTION","userId":"u","serviceId":"s","billingModelType":"SUBSCRIPTION","measurementType":"SUBSCRIPTION","unitLabel":"SUBSCRIPTION","breakdown":{"unitsUsed":2,"unitsRemaining":10,"totalUnitsUsedThisCycle":0,"isOverLimit":false,"isOverage":false,"isOverageAllowed":false}}`},
		{"report result, empty", ReportResult{},
			`{"reportSchemaVersion":0,"status":"","warning":null,"userId":"","serviceId":"","billingModelType":null,"measurementType":null,"unitLabel":null,"breakdown":{"unitsUsed":0,"totalUnitsUsedThisCycle":0,"isOverLimit":false,"isOverage":false,"isOverageAllowed":false}}`},
		{"job ack", JobAck{RequestID: "r", Status: "RUNNING"}, `{"requestId":"r","status":"RUNNING"}`},
	}
	for _, tt := range tests {
		b, err := json.Marshal(tt.v)
		if err != nil || string(b) != tt.want {
			t.Errorf("%s:\n got %s %v\nwant %s", tt.name, b, err, tt.want)
		}
	}
	if Str(nil) != "" || Str(&s) != s {
		t.Error("Str")
	}
}

func TestRules(t *testing.T) {
	for id, ok := range map[string]bool{
		"u-1": true, "alice@example.com": true, "auth0|abc": true, "Zoë": true, string(make([]byte, 0)): false,
		"a/b": false, " a": false, "a ": false, "a\x00b": false, "a\tb": false, "\xff": false, "a\uFFFDb": false,
		// Path segments a URL resolver removes: /console/users/.. is /console/.
		".": false, "..": false, "...": true, "a..b": true, ".a": true,
	} {
		if ValidUserID(id) != ok {
			t.Errorf("ValidUserID(%q) = %v", id, !ok)
		}
	}
	long := strings.Repeat("x", MaxUserIDLen)
	if !ValidUserID(long) || ValidUserID(long+"x") {
		t.Error("the length limit is not 128 bytes")
	}
	for brand, ok := range map[string]bool{"Platform": true, "Tollara": true, "Acme2": true, "": false, "X-Acme": false, "Ac me": false, "Acmé": false} {
		if (CheckBrand(brand) == nil) != ok {
			t.Errorf("CheckBrand(%q): %v", brand, CheckBrand(brand))
		}
	}
}

func TestHeaders(t *testing.T) {
	h := NewHeaders("Tollara")
	got := []string{h.Prefix, h.Signature, h.Timestamp, h.SigningVersion, h.UserID, h.ServiceProductID, h.Roles,
		h.SubscriptionStatus, h.BillingModel, h.MeasurementType, h.UnitLabel, h.RequestID, h.Units}
	want := []string{"x-tollara-", "X-Tollara-Signature", "X-Tollara-Timestamp", "X-Tollara-Signing-Version", "X-Tollara-User-ID",
		"X-Tollara-Service-Product-ID", "X-Tollara-Roles", "X-Tollara-Subscription-Status", "X-Tollara-Billing-Model",
		"X-Tollara-Measurement-Type", "X-Tollara-Unit-Label", "X-Tollara-Request-ID", "X-Tollara-Units"}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("header %d: %q, want %q", i, got[i], want[i])
		}
	}
}
