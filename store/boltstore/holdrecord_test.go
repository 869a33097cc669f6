package boltstore

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/platformgw/gateway/billing"
)

// A hold record written by encodeReservation reads back, with any JSON
// decoder, exactly as one written by json.Marshal.
func TestEncodeReservationMatchesJSON(t *testing.T) {
	s := openTemp(t)
	rl := &billing.RateLimit{Requests: 20, WindowSeconds: 1, Burst: 40}
	products := []billing.Product{quotaBlock, quotaAllow, unlimited, prepaid, postpaid, instant,
		{ID: "rl", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, RateLimit: rl,
			Period: "week", CalendarPeriods: true, UnitLabel: "req \"quoted\" \\ <tag> é"}}
	users := []string{"u1", "user \"with\" quotes\\", "ctl\x01\x1f\ttab", "ünï©ødé", "bad\xffutf8"}
	for _, p := range products {
		for _, u := range users {
			for i, job := range []string{"", "job-1"} {
				d := billing.Decision{Allowed: true, Units: whole(3), Overage: 1, Cost: -5}
				if i == 1 {
					d = billing.Decision{Code: billing.CodeQuotaExceeded, Reason: "a \"reason\"\n", Units: 1_500_000}
				}
				r := reservation{UserID: u, ServiceID: "svc", Product: p, PeriodKey: -1710936000, JobID: job,
					Decision: toDecisionRecord(d)}
				got, err := s.encodeReservation(r)
				if err != nil {
					t.Fatal(err)
				}
				want, _ := json.Marshal(r)
				var a, b any
				if err := json.Unmarshal(got, &a); err != nil {
					t.Fatalf("not JSON: %s: %v", got, err)
				}
				json.Unmarshal(want, &b)
				if !reflect.DeepEqual(a, b) {
					t.Errorf("encodeReservation =\n%s\njson.Marshal =\n%s", got, want)
				}
				var back reservation
				if err := json.Unmarshal(got, &back); err != nil || back.Decision.decision() != r.Decision.decision() {
					t.Errorf("round trip: %+v, %v", back, err)
				}
			}
		}
	}
}

// BenchmarkHoldRecord is the encoding of a sync call's hold record in the
// commit loop; BenchmarkHoldRecordReflect is json.Marshal's, for scale.
func BenchmarkHoldRecord(b *testing.B) {
	s := openTemp(b)
	r := reservation{UserID: "user-1", ServiceID: "svc", Product: quotaAllow, PeriodKey: 1710936000,
		Decision: toDecisionRecord(billing.Decision{Allowed: true, Units: whole(1)})}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.encodeReservation(r); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkHoldRecordReflect(b *testing.B) {
	r := reservation{UserID: "user-1", ServiceID: "svc", Product: quotaAllow, PeriodKey: 1710936000,
		Decision: toDecisionRecord(billing.Decision{Allowed: true, Units: whole(1)})}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := json.Marshal(r); err != nil {
			b.Fatal(err)
		}
	}
}
