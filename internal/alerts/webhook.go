package alerts

import (
	"encoding/json"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/signing"
)

// EventType is the type of every alert webhook.
const EventType = "usage.alert"

// Event is the body of an alert webhook (docs/wire-contract.md, "Usage
// alert webhook"). It names the subscription and the threshold; it never
// carries a service key, a secret or a signature.
type Event struct {
	// EventID is the alert's id: the same on every retry of one alert, so
	// a receiver that has seen it can drop a repeat.
	EventID     string        `json:"eventId"`
	Type        string        `json:"type"`
	CreatedAt   time.Time     `json:"createdAt"`
	UserID      string        `json:"userId"`
	ServiceID   string        `json:"serviceId"`
	ProductID   string        `json:"productId"`
	PeriodStart time.Time     `json:"periodStart"`
	Threshold   string        `json:"threshold"`
	Metric      string        `json:"metric"`
	Value       billing.Units `json:"value"`
	Limit       billing.Units `json:"limit"`
	// Currency is the ISO 4217 code of Value and Limit when they are
	// money (a spending cap of a product whose listing names one); Unit
	// what they count otherwise: "credits", or the quota's unit. At most
	// one is set; neither for an alert recorded before they were, nor for
	// the spending cap of a product without a currency. They come last:
	// every field before them is where it always was.
	Currency string `json:"currency,omitempty"`
	Unit     string `json:"unit,omitempty"`
}

// Body renders the event as sent: compact JSON, fields in the order above.
func (e Event) Body() ([]byte, error) {
	e.Type = EventType
	e.CreatedAt = e.CreatedAt.UTC()
	e.PeriodStart = e.PeriodStart.UTC()
	return json.Marshal(e)
}

// Sign returns the X-<Brand>-Signature and X-<Brand>-Timestamp of a
// webhook body sent at t: Base64(HMAC-SHA256(secret, body + timestamp)),
// the scheme a backend signs its usage reports with, so a receiver
// verifies it with the code it already has.
func Sign(secret, body []byte, t time.Time) (signature, timestamp string) {
	timestamp = signing.Timestamp(t)
	return signing.Sign(secret, body, []byte(timestamp)), timestamp
}

// Schedule is the retry schedule of a delivery: the wait after the first
// failed attempt is Initial, doubling after each further failure up to Max;
// an alert still undelivered GiveUpAfter its creation is given up.
type Schedule struct {
	Initial     time.Duration
	Max         time.Duration
	GiveUpAfter time.Duration
}

// DefaultSchedule retries for a day: 30s, 1m, 2m, … then hourly.
var DefaultSchedule = Schedule{Initial: 30 * time.Second, Max: time.Hour, GiveUpAfter: 24 * time.Hour}

// Next returns when to try again after the failed attempt number attempts
// (1 for the first) made at t, and false when the alert, created at
// created, is to be given up instead. The last try is at GiveUpAfter
// exactly: a wait that would pass it is cut to it, so a receiver back
// within GiveUpAfter still gets the alert; a failure at or past it gives
// up.
func (s Schedule) Next(created, t time.Time, attempts int) (time.Time, bool) {
	deadline := created.Add(s.GiveUpAfter)
	if !t.Before(deadline) {
		return time.Time{}, false
	}
	wait := s.Initial
	for i := 1; i < attempts && wait < s.Max; i++ {
		wait *= 2
	}
	wait = min(wait, s.Max)
	next := t.Add(wait)
	if next.After(deadline) {
		next = deadline
	}
	return next, true
}
