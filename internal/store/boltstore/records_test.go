package boltstore

import (
	"encoding/json"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// TestAmountRoundTrip: every quantity the store writes reads back, over the
// whole signed range; nothing else is accepted.
func TestAmountRoundTrip(t *testing.T) {
	for _, v := range []billing.Units{0, 1, -1, 1_500_000, -1_500_000, billing.MaxUnits, 3 * billing.MaxUnits,
		-3 * billing.MaxUnits, math.MaxInt64, math.MinInt64, math.MinInt64 + 1} {
		raw, err := json.Marshal(amount(v))
		if err != nil {
			t.Fatal(err)
		}
		var back amount
		if err := json.Unmarshal(raw, &back); err != nil || billing.Units(back) != v {
			t.Errorf("%d → %s → %d, %v", int64(v), raw, int64(back), err)
		}
	}
	for _, bad := range []string{`""`, `"1"`, `-`, `1e3`, `.5`, `1.1234567`, `9223372036854.775808`, `-9223372036854.775809`,
		`99999999999999999999`, `+1`, `--1`, `1.-5`, `true`} {
		var a amount
		if err := json.Unmarshal([]byte(bad), &a); err == nil {
			t.Errorf("%s read as %d, want an error", bad, int64(a))
		}
	}
}

// TestRecordsKeepTheFileFormat: the store's own record types write the
// names the file has always had (those of the store types' JSON, plus the
// job's digest and hold), and read back what they were given.
func TestRecordsKeepTheFileFormat(t *testing.T) {
	at := time.Date(2026, 11, 23, 12, 0, 0, 5, time.UTC)
	sub := store.Subscription{UserID: "u", ServiceID: "s", ProductID: "p", Status: "ACTIVE", StartedAt: at,
		UpdatedAt: at.Add(time.Hour), Credits: whole(5), CreditsHeld: 250_000, EndsAt: at.Add(48 * time.Hour),
		EndStatus: "CANCELLED"}
	e := store.LedgerEntry{Seq: 7, ID: "led_7", Time: at, UserID: "u", ServiceID: "s", EndpointID: "ep", ProductID: "p",
		RequestID: "r", OccurredAt: at.Add(-time.Second), Units: whole(3), Overage: whole(1), Cost: 500_000,
		Source: store.SourceReport, IdempotencyKey: "k", UnitsClaimed: whole(4)}
	j := store.Job{ID: "j", UserID: "u", KeyID: "key", ServiceID: "s", EndpointID: "ep", ProductID: "p", Free: true,
		Status: store.JobCompleted, Stage: "done", PercentageComplete: 100, ErrorMessage: "none", CreatedAt: at,
		UpdatedAt: at, ExpiresAt: at.Add(time.Hour), CompletedAt: at, Result: "{}", ResultSize: 2, ResultTruncated: true,
		ResultURL: "https://r", ContentType: "application/json", Units: whole(2), Cost: whole(1),
		CompletionDigest: "d", ReservationID: "9"}
	same := func(name string, stored, api any, extra map[string]any) {
		t.Helper()
		var a, b map[string]any
		raw, _ := json.Marshal(stored)
		json.Unmarshal(raw, &a)
		rawAPI, _ := json.Marshal(api)
		json.Unmarshal(rawAPI, &b)
		for k, v := range extra {
			b[k] = v
		}
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s stored as\n%s\nwant the names and values of\n%s plus %v", name, raw, rawAPI, extra)
		}
	}
	k := store.KeyRecord{ID: "key", Hash: [32]byte{1}, UserID: "u", Roles: []string{"a", "b"}, Label: "l", Created: at,
		ExpiresAt: at.Add(time.Hour), RevokedAt: at.Add(time.Minute), ParentKeyID: "parent", EndsWithParent: true}
	same("key", toKeyRecord(k), k, nil)
	if back := toKeyRecord(k).key(); back.ID != k.ID || !reflect.DeepEqual(back.Roles, k.Roles) || back.Hash != ([32]byte{}) ||
		!back.RevokedAt.Equal(k.RevokedAt) || !back.ExpiresAt.Equal(k.ExpiresAt) || back.Label != k.Label ||
		back.ParentKeyID != "parent" || !back.EndsWithParent {
		t.Errorf("key read back as %+v", back)
	}
	// A key record written before keys had a parent reads back as a key
	// an operator made.
	var old keyRecord
	if err := json.Unmarshal([]byte(`{"keyId":"key","userId":"u","createdAt":"2026-11-23T12:00:00Z"}`), &old); err != nil {
		t.Fatal(err)
	}
	if back := old.key(); back.ID != "key" || back.ParentKeyID != "" || back.EndsWithParent {
		t.Errorf("an older key record read back as %+v", back)
	}
	same("subscription", toSubRecord(sub), sub, nil)
	same("ledger entry", toLedgerRecord(e), e, nil)
	same("job", toJobRecord(j), j, map[string]any{"completionDigest": "d", "reservationId": "9"})
	if toSubRecord(sub).subscription() != sub || toLedgerRecord(e).entry() != e || toJobRecord(j).job() != j {
		t.Error("a record does not read back what it was given")
	}
	if raw, _ := encodeLedger(e); !json.Valid(raw) {
		t.Errorf("encodeLedger: %s", raw)
	}
}
