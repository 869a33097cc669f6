package payments

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v82"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// Reconciliation compares, for a period, the gateway's metered usage per
// Stripe customer and meter with Stripe's meter event summaries
// (`caddy platform stripe reconcile`). Amounts are billing.Units: the
// gateway's cost in millionths of the currency, as the meter events carry
// it.
type Reconciliation struct {
	From time.Time      `json:"from"`
	To   time.Time      `json:"to"`
	Rows []ReconcileRow `json:"rows"`
	// Differ counts the rows whose ledger and Stripe totals differ.
	Differ int `json:"differ"`
}

// ReconcileRow is one customer and meter.
type ReconcileRow struct {
	Customer  string `json:"customer,omitempty"`
	UserID    string `json:"userId"`
	EventName string `json:"eventName"`
	MeterID   string `json:"meterId,omitempty"`
	Currency  string `json:"currency,omitempty"`
	// Ledger is the cost of the period's usage in the ledger; Sent what
	// the shipper sent for the period's hours; Stripe what Stripe's event
	// summaries of the period add up to.
	Ledger billing.Units `json:"ledger"`
	Sent   billing.Units `json:"sent"`
	Stripe billing.Units `json:"stripe"`
	// Abandoned is what Stripe refused for longer than its meter window
	// and the shipper gave up on (it is not in Sent).
	Abandoned billing.Units `json:"abandoned,omitempty"`
	Differs   bool          `json:"differs"`
	// Reason says what a difference most likely is.
	Reason string `json:"reason,omitempty"`
}

// ParsePeriod reads a reconcile period: a month (2026-11), or from..to
// where each side is a date (to included: 2026-11-01..2026-11-15) or an
// RFC 3339 time on the hour (to excluded). Times are UTC.
func ParsePeriod(s string, now time.Time) (from, to time.Time, err error) {
	bad := func(msg string) (time.Time, time.Time, error) {
		return time.Time{}, time.Time{}, fmt.Errorf("period %q: %s", s, msg)
	}
	if m, err := time.Parse("2006-01", s); err == nil {
		if m.After(now) {
			return bad("the period starts in the future")
		}
		return m, m.AddDate(0, 1, 0), nil
	}
	a, b, ok := strings.Cut(s, "..")
	if !ok {
		return bad("want a month (2026-11) or from..to (2026-11-01..2026-11-15)")
	}
	side := func(v string, end bool) (time.Time, bool) {
		if d, err := time.Parse(time.DateOnly, v); err == nil {
			if end {
				d = d.AddDate(0, 0, 1)
			}
			return d, true
		}
		t, err := time.Parse(time.RFC3339, v)
		if err != nil || !t.Equal(t.Truncate(time.Hour)) {
			return time.Time{}, false
		}
		return t.UTC(), true
	}
	if from, ok = side(a, false); !ok {
		return bad("the start is not a date or an RFC 3339 time on the hour")
	}
	if to, ok = side(b, true); !ok {
		return bad("the end is not a date or an RFC 3339 time on the hour")
	}
	if !from.Before(to) {
		return bad("the start is not before the end")
	}
	if from.After(now) {
		return bad("the period starts in the future")
	}
	return from, to, nil
}

// Reconcile compares the period's totals.
func (s *Service) Reconcile(ctx context.Context, from, to time.Time) (Reconciliation, error) {
	out := Reconciliation{From: from.UTC(), To: to.UTC(), Rows: []ReconcileRow{}}
	pay, err := s.Payments()
	if err != nil {
		return out, err
	}
	products := s.meteredProducts()
	type key struct{ user, event string }
	rows := map[key]*ReconcileRow{}
	row := func(user, event string) *ReconcileRow {
		k := key{user, event}
		if r := rows[k]; r != nil {
			return r
		}
		r := &ReconcileRow{UserID: user, EventName: event}
		for _, m := range products {
			if m.eventName == event {
				r.Currency = m.currency
			}
		}
		rows[k] = r
		return r
	}
	// The ledger.
	services := map[string]bool{}
	for k := range products {
		services[k[0]] = true
	}
	for svc := range services {
		err := store.ScanUsage(ctx, s.Store(), store.LedgerFilter{ServiceID: svc, From: from, To: to}, func(ru store.Rollup) error {
			if m, ok := products[[2]string{ru.ServiceID, ru.ProductID}]; ok && ru.Cost > 0 {
				row(ru.UserID, m.eventName).Ledger += ru.Cost
			}
			return nil
		})
		if err != nil {
			return out, fmt.Errorf("reading the usage: %w", err)
		}
	}
	// What was sent for the period's hours.
	for rec, err := range store.PaymentRecords(ctx, pay, KindMeterSent, hourID(from)) {
		if err != nil {
			return out, err
		}
		var ev MeterEvent
		if err := json.Unmarshal(rec.Body, &ev); err != nil {
			return out, fmt.Errorf("record %s does not parse: %w", rec.ID, err)
		}
		if !ev.Hour.Before(to) {
			break
		}
		if !ev.Hour.Before(from) {
			if ev.Abandoned {
				row(ev.UserID, ev.EventName).Abandoned += ev.Value
			} else {
				row(ev.UserID, ev.EventName).Sent += ev.Value
			}
		}
	}
	// Every customer, with or without usage, on every meter.
	events := map[string]bool{}
	for _, m := range products {
		events[m.eventName] = true
	}
	for rec, err := range store.PaymentRecords(ctx, pay, KindCustomer, "") {
		if err != nil {
			return out, err
		}
		for ev := range events {
			row(rec.ID, ev)
		}
	}
	// Stripe's meters, by event name.
	meters := map[string]string{}
	for m, err := range s.sc.V1BillingMeters.List(ctx, &stripe.BillingMeterListParams{}) {
		if err != nil {
			return out, &StripeError{Op: "listing the meters", Err: err}
		}
		if _, seen := meters[m.EventName]; !seen || m.Status == stripe.BillingMeterStatusActive {
			meters[m.EventName] = m.ID
		}
	}
	for _, r := range rows {
		if r.Customer, err = s.customerOf(ctx, r.UserID); err != nil {
			return out, err
		}
		r.MeterID = meters[r.EventName]
		switch {
		case r.Customer == "":
			r.Reason = "no Stripe customer: the usage waits until the user has one"
		case r.MeterID == "":
			r.Reason = "Stripe has no meter with this event name"
		default:
			v, err := s.summary(ctx, r.MeterID, r.Customer, from, to)
			if err != nil {
				return out, err
			}
			r.Stripe = v
		}
		r.Differs = r.Ledger != r.Stripe
		if r.Differs && r.Reason == "" {
			switch {
			case r.Abandoned > 0 && r.Sent+r.Abandoned >= r.Ledger:
				r.Reason = fmt.Sprintf("%s refused by Stripe for longer than its meter window and abandoned (see the log): bill it by hand", r.Abandoned)
			case r.Sent < r.Ledger:
				r.Reason = fmt.Sprintf("%s not sent yet (the shipper sends it within meter_interval, or it is held: see the log)", r.Ledger-r.Sent)
			case r.Stripe < r.Sent:
				r.Reason = "Stripe has less than was sent: it may still be aggregating, or it refused events (see its meter error reports)"
			default:
				r.Reason = "Stripe has more than the ledger: events from elsewhere, a resend after Stripe's 24-hour deduplication, or usage sent late with a timestamp in this period"
			}
		}
		if r.Ledger == 0 && r.Sent == 0 && r.Stripe == 0 {
			continue // a customer without usage on this meter
		}
		out.Rows = append(out.Rows, *r)
		if r.Differs {
			out.Differ++
		}
	}
	slices.SortFunc(out.Rows, func(a, b ReconcileRow) int {
		return cmp.Or(cmp.Compare(a.Customer, b.Customer), cmp.Compare(a.UserID, b.UserID), cmp.Compare(a.EventName, b.EventName))
	})
	return out, nil
}

// summary is Stripe's aggregated value of a customer's meter events in
// [from, to), back in billing.Units.
func (s *Service) summary(ctx context.Context, meterID, customer string, from, to time.Time) (billing.Units, error) {
	var sum float64
	p := &stripe.BillingMeterEventSummaryListParams{ID: stripe.String(meterID), Customer: stripe.String(customer),
		StartTime: stripe.Int64(from.Unix()), EndTime: stripe.Int64(to.Unix())}
	for es, err := range s.sc.V1BillingMeterEventSummaries.List(ctx, p) {
		if err != nil {
			return 0, &StripeError{Op: fmt.Sprintf("the event summaries of meter %s for %s", meterID, customer), Err: err}
		}
		sum += es.AggregatedValue
	}
	return billing.Units(math.Round(sum)), nil
}

// StripeError is a request to Stripe that failed (Stripe down, a refusal,
// a wrong key): the admin API answers it as service_error.
type StripeError struct {
	Op  string
	Err error
}

func (e *StripeError) Error() string {
	var se *stripe.Error
	if errors.As(e.Err, &se) {
		return fmt.Sprintf("Stripe: %s: HTTP %d: %s", e.Op, se.HTTPStatusCode, se.Msg)
	}
	return fmt.Sprintf("Stripe: %s: %v", e.Op, e.Err)
}

func (e *StripeError) Unwrap() error { return e.Err }
