package ops

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// TestRecordViewsJSON pins the admin API's JSON of stored records, every
// field set and none: the bytes operators got when the API wrote the
// store's types directly, so its own view types changed nothing.
func TestRecordViewsJSON(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 500, time.UTC)
	tests := []struct {
		name string
		view any
		want string
	}{
		{"subscription", ViewSubscription(store.Subscription{UserID: "u", ServiceID: "s", ProductID: "p", Status: "ACTIVE",
			StartedAt: at, UpdatedAt: at.Add(time.Hour), Credits: billing.Whole(5), CreditsHeld: billing.Whole(1) / 2}),
			`{"userId":"u","serviceId":"s","productId":"p","status":"ACTIVE","startedAt":"2026-03-01T12:00:00.0000005Z","updatedAt":"2026-03-01T13:00:00.0000005Z","credits":5,"creditsHeld":0.5}`},
		{"job", ViewJob(store.Job{ID: "r", UserID: "u", KeyID: "k", ServiceID: "s", EndpointID: "e", ProductID: "p", Free: true,
			Status: "COMPLETED", Stage: "st", PercentageComplete: 50.5, ErrorMessage: "m", CreatedAt: at, UpdatedAt: at, ExpiresAt: at,
			CompletedAt: at, Result: "res", ResultSize: 9, ResultTruncated: true, ResultURL: "https://x", ContentType: "text/plain",
			Units: billing.Whole(2), Cost: billing.Whole(3), CompletionDigest: "d", ReservationID: "h"}),
			`{"requestId":"r","userId":"u","keyId":"k","serviceId":"s","endpointId":"e","productId":"p","free":true,"status":"COMPLETED","currentStage":"st","percentageComplete":50.5,"errorMessage":"m","startTime":"2026-03-01T12:00:00.0000005Z","updatedAt":"2026-03-01T12:00:00.0000005Z","expiresAt":"2026-03-01T12:00:00.0000005Z","completedAt":"2026-03-01T12:00:00.0000005Z","result":"res","size":9,"resultTruncated":true,"resultUrl":"https://x","contentType":"text/plain","units":2,"cost":3}`},
		{"ledger entry", ViewLedgerEntry(store.LedgerEntry{Seq: 7, ID: "i", Time: at, UserID: "u", ServiceID: "s", EndpointID: "e",
			ProductID: "p", RequestID: "r", OccurredAt: at, Units: billing.Whole(1), Overage: billing.Whole(1), Cost: billing.Whole(1),
			Source: "report", IdempotencyKey: "ik", UnitsClaimed: billing.Whole(4)}),
			`{"seq":7,"id":"i","time":"2026-03-01T12:00:00.0000005Z","userId":"u","serviceId":"s","endpointId":"e","productId":"p","requestId":"r","occurredAt":"2026-03-01T12:00:00.0000005Z","units":1,"overage":1,"cost":1,"source":"report","idempotencyKey":"ik","unitsClaimed":4,"unitsUncharged":3}`},
		{"audit entry", ViewAuditEntry(store.AuditEntry{Seq: 3, Time: at, Actor: "a", Action: "key.create", UserID: "u", ServiceID: "s", KeyID: "k", Detail: "d"}),
			`{"seq":3,"time":"2026-03-01T12:00:00.0000005Z","actor":"a","action":"key.create","userId":"u","serviceId":"s","keyId":"k","detail":"d"}`},
		{"alert", ViewAlert(store.Alert{ID: "a", UserID: "u", ServiceID: "s", ProductID: "p", PeriodStart: at, Threshold: "quota 80%",
			Value: billing.Whole(8), Limit: billing.Whole(10), Created: at, Status: "FAILED", Attempts: 3, LastError: "e", NextAttempt: at, DeliveredAt: at}),
			`{"alertId":"a","userId":"u","serviceId":"s","productId":"p","periodStart":"2026-03-01T12:00:00.0000005Z","threshold":"quota 80%","value":8,"limit":10,"createdAt":"2026-03-01T12:00:00.0000005Z","status":"FAILED","attempts":3,"lastError":"e","nextAttemptAt":"2026-03-01T12:00:00.0000005Z","deliveredAt":"2026-03-01T12:00:00.0000005Z"}`},
		// Money with its currency, credits said to be credits: the
		// alert listing dropped them, bare numbers of unknown kind.
		{"spending cap alert", ViewAlert(store.Alert{ID: "a", Threshold: "spending_cap 90%", Value: billing.Whole(91) / 2,
			Limit: billing.Whole(45), Currency: "EUR", Created: at, Status: "PENDING"}),
			`{"alertId":"a","userId":"","serviceId":"","productId":"","periodStart":"0001-01-01T00:00:00Z","threshold":"spending_cap 90%","value":45.5,"limit":45,"currency":"EUR","createdAt":"2026-03-01T12:00:00.0000005Z","status":"PENDING","attempts":0}`},
		{"credits alert", ViewAlert(store.Alert{ID: "a", Threshold: "credits_below 10", Value: billing.Whole(7),
			Limit: billing.Whole(10), Unit: "credits", Created: at, Status: "PENDING"}),
			`{"alertId":"a","userId":"","serviceId":"","productId":"","periodStart":"0001-01-01T00:00:00Z","threshold":"credits_below 10","value":7,"limit":10,"unit":"credits","createdAt":"2026-03-01T12:00:00.0000005Z","status":"PENDING","attempts":0}`},
		{"empty alert", ViewAlert(store.Alert{}),
			`{"alertId":"","userId":"","serviceId":"","productId":"","periodStart":"0001-01-01T00:00:00Z","threshold":"","value":0,"limit":0,"createdAt":"0001-01-01T00:00:00Z","status":"","attempts":0}`},
		{"empty subscription", ViewSubscription(store.Subscription{}),
			`{"userId":"","serviceId":"","productId":"","status":"","startedAt":"0001-01-01T00:00:00Z","updatedAt":"0001-01-01T00:00:00Z","credits":0,"creditsHeld":0}`},
		{"empty job", ViewJob(store.Job{}),
			`{"requestId":"","userId":"","serviceId":"","endpointId":"","status":"","percentageComplete":0,"startTime":"0001-01-01T00:00:00Z","updatedAt":"0001-01-01T00:00:00Z","expiresAt":"0001-01-01T00:00:00Z"}`},
		{"empty ledger entry", ViewLedgerEntry(store.LedgerEntry{}),
			`{"seq":0,"id":"","time":"0001-01-01T00:00:00Z","userId":"","serviceId":"","units":0,"source":""}`},
		{"empty audit entry", ViewAuditEntry(store.AuditEntry{}),
			`{"seq":0,"time":"0001-01-01T00:00:00Z","actor":"","action":""}`},
	}
	for _, tt := range tests {
		b, err := json.Marshal(tt.view)
		if err != nil || string(b) != tt.want {
			t.Errorf("%s:\n got %s %v\nwant %s", tt.name, b, err, tt.want)
		}
	}
}
