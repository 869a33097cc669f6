package sdk

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/platformgw/gateway/internal/wire"
)

// Report is usage a backend reports for a user of its service: POST
// {usage}/report. The fields after Timestamp are optional.
type Report struct {
	UserID string // the user who consumed the units (required)
	// ServiceID is the service the usage belongs to; empty means the
	// Client's own service, the only one its secret may report for.
	ServiceID string
	UnitsUsed Units // greater than zero; ParseUnits("12.5") for a decimal
	// Timestamp is when the usage happened; zero means now.
	Timestamp time.Time

	// RequestID is the platform's request id of the call the usage
	// belongs to, when there is one (X-<Brand>-Request-ID, or an async
	// job's request_id). It is sent and stored with the usage.
	RequestID string
	// IdempotencyKey names this logical report: the usage service counts a
	// key once, however often it arrives. Empty means a random key, made
	// once per ReportUsage call and reused by its retries. Set your own
	// (derived from your request id, say) to make a report safe to send
	// again from a later process, for example after a crash.
	IdempotencyKey string

	// For the reconciliation log only; never sent.
	BackendRequestID string // your own id of the call
	KeyRef           string // the caller's key id (KeyValidation.ServiceKeyID) or KeyReference(key)
	Endpoint         string // which of your endpoints was used
}

// ReportResult is the usage service's answer to a report (schema 2).
type ReportResult struct {
	ReportSchemaVersion int
	Status              string // "ok"
	// Warning is set when the usage was recorded past a hard limit (quota,
	// prepaid credits, spending cap): it was counted, but the user is over.
	Warning          string
	UserID           string
	ServiceID        string
	BillingModelType string // empty for a service owner, who uses the service free
	MeasurementType  string
	UnitLabel        string
	Breakdown        Breakdown

	// Replayed is true when the usage service had already recorded this
	// idempotency key (an earlier attempt got through): the units were
	// counted once, and this is the first answer again.
	Replayed       bool
	IdempotencyKey string // the key the report was sent with
	Attempts       int    // how many attempts it took
}

// ReportUsage reports units a user consumed. It signs the exact body it
// sends and retries transient failures under the Client's RetryPolicy with
// one Idempotency-Key, so the units are counted exactly once even when an
// answer is lost. A refusal is an *APIError; a failure with no answer
// (network) leaves the outcome unknown: send the same report again with the
// same IdempotencyKey, which the reconciliation log records, and it will be
// counted at most once.
func (c *Client) ReportUsage(ctx context.Context, r Report) (*ReportResult, error) {
	const op = "report usage"
	if r.UserID == "" {
		return nil, fmt.Errorf("sdk: %s: empty user id", op)
	}
	if r.UnitsUsed <= 0 {
		return nil, fmt.Errorf("sdk: %s: units used must be greater than zero, got %s", op, r.UnitsUsed)
	}
	if r.ServiceID == "" {
		r.ServiceID = c.serviceID
	}
	if r.Timestamp.IsZero() {
		r.Timestamp = c.now()
	}
	if r.IdempotencyKey == "" {
		key, err := newIdempotencyKey()
		if err != nil {
			return nil, fmt.Errorf("sdk: %s: %w", op, err)
		}
		r.IdempotencyKey = key
	}
	body, err := json.Marshal(wire.Report{
		UserID:    r.UserID,
		ServiceID: r.ServiceID,
		UnitsUsed: r.UnitsUsed,
		Timestamp: isoTime(r.Timestamp),
		RequestID: r.RequestID,
	})
	if err != nil {
		return nil, fmt.Errorf("sdk: %s: encode: %w", op, err)
	}
	o := c.do(ctx, exchange{op: op, url: c.usageBase + "/report", body: body, idempotencyKey: r.IdempotencyKey})

	units := r.UnitsUsed
	rec := ReconciliationRecord{
		Operation:         "report",
		PlatformRequestID: r.RequestID,
		BackendRequestID:  r.BackendRequestID,
		KeyRef:            r.KeyRef,
		UserID:            r.UserID,
		ServiceID:         r.ServiceID,
		Endpoint:          r.Endpoint,
		Timestamp:         r.Timestamp,
		UnitsReported:     &units,
		IdempotencyKey:    r.IdempotencyKey,
	}
	res, err := c.decodeReport(op, o, r.IdempotencyKey)
	c.record(rec, o, err)
	return res, err
}

func (c *Client) decodeReport(op string, o outcome, key string) (*ReportResult, error) {
	if o.err != nil || o.status != http.StatusOK {
		return nil, c.failure(op, o)
	}
	var a wire.ReportResult
	if err := json.Unmarshal(o.body, &a); err != nil {
		return nil, fmt.Errorf("sdk: %s: the usage service answered 200 with an unreadable body: %w", op, err)
	}
	return &ReportResult{
		ReportSchemaVersion: a.ReportSchemaVersion,
		Status:              a.Status,
		Warning:             wire.Str(a.Warning),
		UserID:              a.UserID,
		ServiceID:           a.ServiceID,
		BillingModelType:    wire.Str(a.BillingModelType),
		MeasurementType:     wire.Str(a.MeasurementType),
		UnitLabel:           wire.Str(a.UnitLabel),
		Breakdown:           a.Breakdown,
		Replayed:            strings.EqualFold(o.header.Get("Idempotent-Replayed"), "true"),
		IdempotencyKey:      key,
		Attempts:            o.attempts,
	}, nil
}

// isoTime renders a body timestamp as JavaScript's toISOString does:
// UTC, milliseconds, "Z".
func isoTime(t time.Time) string {
	return t.UTC().Format("2006-01-02T15:04:05.000Z07:00")
}

// newIdempotencyKey returns a random UUID (version 4).
func newIdempotencyKey() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", errors.New("generate idempotency key: " + err.Error())
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32], nil
}
