package sdk

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/signing"
	"github.com/platformgw/gateway/internal/wire"
)

// KeyValidation is the answer to ValidateKey (validation schema 3).
type KeyValidation struct {
	// Valid is false when the key is unknown, revoked or expired, or its
	// user has no subscription granting access; Code then says which
	// (invalid_key, key_revoked, key_expired, no_subscription,
	// subscription_inactive, …) and Message explains it.
	Valid            bool
	UserID           string
	ServiceID        string
	ServiceKeyID     string // the key's public id: log it instead of the key
	ServiceProductID string // empty for a service owner
	Roles            []string
	// ValidationSchemaVersion is 3.
	ValidationSchemaVersion int
	SubscriptionStatus      string // upper case; ACTIVE for a service owner
	BillingModelType        string // empty for a service owner
	MeasurementType         string
	UnitLabel               string
	Timestamp               time.Time // when the usage service answered

	Code, Message, RequestID string // why a key is not valid
}

// IsSubscriber reports whether the key's user is a subscriber (not the
// service's owner, who calls it free).
func (k *KeyValidation) IsSubscriber() bool { return k.ServiceProductID != "" }

// Estimate is the answer to EstimateUsage (estimate schema 3): whether the
// units would be allowed now, and what they would cost. Nothing is counted.
type Estimate struct {
	WouldAllow        bool
	SufficientCredits bool // false: a PREPAID balance could not pay (403)
	WouldExceedCap    bool // true: the quota or spending cap would be exceeded (429)
	EstimatedCost     Units
	BillingModelType  string
	MeasurementType   string
	UnitLabel         string
	Breakdown         Breakdown
	// EstimateSchemaVersion is 3.
	EstimateSchemaVersion int
	Timestamp             time.Time

	// Status is the HTTP status: 200 allowed, 403 insufficient credits,
	// 429 quota or cap. A denial also says why, and when the quota renews.
	Status     int
	Code       string
	Message    string
	RetryAfter time.Duration
	RequestID  string
}

// estimateAnswer reads an estimate (wire.Estimate), telling an estimate
// from an error body by whether wouldAllow is there at all, and leaving
// retryAfter to decodeAPIError (a proxy's may not be a number).
type estimateAnswer struct {
	wire.Estimate
	WouldAllow *bool           `json:"wouldAllow"`
	RetryAfter json.RawMessage `json:"retryAfter"`
	// EstimatedCost is read as an answer's amount: a cost that saturated
	// is past what Units' decoder takes as input (billing.ParseAnswerUnits).
	EstimatedCost json.RawMessage `json:"estimatedCost"`
}

// ValidateKey asks the core service whether serviceKey, presented to this
// backend by a caller, is a valid key of a user with access to the
// Client's service: POST {core}/service-keys/validate. The answer's
// signature is verified before it is trusted.
//
// A key that is not valid is an answer, not an error: the result has Valid
// false and a Code. An error means no trustworthy answer came: an
// *APIError when this service's own request was refused (a wrong secret,
// say), ErrResponseSignature when the answer did not verify.
func (c *Client) ValidateKey(ctx context.Context, serviceKey string) (*KeyValidation, error) {
	const op = "validate key"
	if serviceKey == "" {
		return nil, fmt.Errorf("sdk: %s: empty service key", op)
	}
	body, err := json.Marshal(struct {
		ServiceKey string `json:"serviceKey"`
		ServiceID  string `json:"serviceId"`
	}{serviceKey, c.serviceID})
	if err != nil {
		return nil, fmt.Errorf("sdk: %s: encode: %w", op, err)
	}
	o := c.do(ctx, exchange{op: op, url: c.coreBase + "/service-keys/validate", body: body})
	if o.err != nil {
		return nil, c.failure(op, o)
	}
	// A 401 is signed only once the usage service has authenticated this
	// service: then it is the verdict on the key. Unsigned, it refuses
	// this service's own request.
	signed := o.header.Get(c.headers.Signature) != ""
	if o.status != http.StatusOK && !(o.status == http.StatusUnauthorized && signed) {
		return nil, c.failure(op, o)
	}
	if err := c.verifyAnswer(o); err != nil {
		return nil, fmt.Errorf("sdk: %s: %w", op, err)
	}
	// The body is a wire.Validation (200) or a wire.ValidationFailure
	// (401); the fields of both are read, those absent stay empty.
	var a wire.Validation
	var f wire.ValidationFailure
	if err := json.Unmarshal(o.body, &a); err != nil {
		return nil, fmt.Errorf("sdk: %s: unreadable answer: %w", op, err)
	}
	if err := json.Unmarshal(o.body, &f); err != nil {
		return nil, fmt.Errorf("sdk: %s: unreadable answer: %w", op, err)
	}
	v := &KeyValidation{
		Valid:                   a.Valid && o.status == http.StatusOK,
		UserID:                  a.UserID,
		ServiceID:               a.ServiceID,
		ServiceKeyID:            a.ServiceKeyID,
		ServiceProductID:        a.ServiceProductID,
		Roles:                   a.Roles,
		ValidationSchemaVersion: a.ValidationSchemaVersion,
		SubscriptionStatus:      a.SubscriptionStatus,
		BillingModelType:        wire.Str(a.BillingModelType),
		MeasurementType:         wire.Str(a.MeasurementType),
		UnitLabel:               wire.Str(a.UnitLabel),
		Timestamp:               time.Unix(a.Timestamp, 0),
		Code:                    f.Code,
		Message:                 f.Message,
		RequestID:               f.RequestID,
	}
	if v.Code == "" {
		v.Code = wire.Str(a.Error)
	}
	if v.Valid && v.ServiceID != "" && v.ServiceID != c.serviceID {
		// A signed answer about another service is not an answer to
		// this question.
		return nil, fmt.Errorf("sdk: %s: the answer is about service %q, not %q", op, v.ServiceID, c.serviceID)
	}
	return v, nil
}

// EstimateUsage asks whether the user holding serviceKey could consume
// estimatedUnits of the Client's service now, and what they would cost:
// POST {core}/service-keys/estimate-usage. Nothing is counted. The answer's
// signature is verified before it is trusted.
//
// A denial is an answer: 403 (insufficient credits) and 429 (quota or
// spending cap) give an Estimate with WouldAllow false. A bad key (401),
// or a user with no subscription granting access (403), is an *APIError.
func (c *Client) EstimateUsage(ctx context.Context, serviceKey string, estimatedUnits Units) (*Estimate, error) {
	const op = "estimate usage"
	if serviceKey == "" {
		return nil, fmt.Errorf("sdk: %s: empty service key", op)
	}
	if estimatedUnits < 0 {
		return nil, fmt.Errorf("sdk: %s: negative units %s", op, estimatedUnits)
	}
	body, err := json.Marshal(struct {
		ServiceKey     string `json:"serviceKey"`
		ServiceID      string `json:"serviceId"`
		EstimatedUnits Units  `json:"estimatedUnits"`
	}{serviceKey, c.serviceID, estimatedUnits})
	if err != nil {
		return nil, fmt.Errorf("sdk: %s: encode: %w", op, err)
	}
	o := c.do(ctx, exchange{
		op: op, url: c.coreBase + "/service-keys/estimate-usage", body: body,
		// Here 429 means "would exceed the quota": an answer, not a
		// reason to try again.
		answers: map[int]bool{http.StatusTooManyRequests: true},
	})
	return c.estimateFrom(op, o, true)
}

// EstimateUsageWithJWT asks whether userID could consume estimatedUnits of
// the Client's service now, authenticated by the end user's JWT (token) as
// the upstream SDKs' estimateUsageWithJwt is: POST
// {core}/billing/usage/estimate with Authorization: Bearer <token>, the
// request unsigned. The token must be the user's own (its user claim equal
// to userID; 403 forbidden otherwise) and verify against the keys the
// gateway's jwt block configures (401 invalid_token otherwise). The answer
// is not signed (the platform's JWT answers never are); trust it as far as
// the TLS connection to the gateway. Denials are answers, as for
// EstimateUsage.
func (c *Client) EstimateUsageWithJWT(ctx context.Context, token, userID string, estimatedUnits Units) (*Estimate, error) {
	const op = "estimate usage with JWT"
	if token == "" || userID == "" {
		return nil, fmt.Errorf("sdk: %s: empty token or user id", op)
	}
	if estimatedUnits < 0 {
		return nil, fmt.Errorf("sdk: %s: negative units %s", op, estimatedUnits)
	}
	body, err := json.Marshal(struct {
		UserID         string `json:"userId"`
		ServiceID      string `json:"serviceId"`
		EstimatedUnits Units  `json:"estimatedUnits"`
	}{userID, c.serviceID, estimatedUnits})
	if err != nil {
		return nil, fmt.Errorf("sdk: %s: encode: %w", op, err)
	}
	o := c.do(ctx, exchange{
		op: op, url: c.coreBase + "/billing/usage/estimate", body: body, bearer: token,
		answers: map[int]bool{http.StatusTooManyRequests: true},
	})
	return c.estimateFrom(op, o, false)
}

// estimateFrom reads an estimate answer; signed answers are verified.
func (c *Client) estimateFrom(op string, o outcome, signed bool) (*Estimate, error) {
	if o.err != nil {
		return nil, c.failure(op, o)
	}
	switch o.status {
	case http.StatusOK, http.StatusForbidden, http.StatusTooManyRequests:
	default:
		return nil, c.failure(op, o)
	}
	var a estimateAnswer
	isEstimate := json.Unmarshal(o.body, &a) == nil && a.WouldAllow != nil
	if !isEstimate && o.status != http.StatusOK {
		// 403 for no subscription, or a 429 rate limit from a proxy:
		// errors in the common shape, not estimates.
		return nil, c.failure(op, o)
	}
	if signed {
		if err := c.verifyAnswer(o); err != nil {
			return nil, fmt.Errorf("sdk: %s: %w", op, err)
		}
	}
	if !isEstimate {
		return nil, fmt.Errorf("sdk: %s: the answer is not an estimate", op)
	}
	var cost Units
	if len(a.EstimatedCost) > 0 && string(a.EstimatedCost) != "null" {
		var err error
		if cost, err = billing.ParseAnswerUnits(a.EstimatedCost); err != nil {
			return nil, fmt.Errorf("sdk: %s: estimatedCost: %w", op, err)
		}
	}
	e := &Estimate{
		WouldAllow:            *a.WouldAllow && o.status == http.StatusOK,
		SufficientCredits:     a.SufficientCredits,
		WouldExceedCap:        a.WouldExceedCap,
		EstimatedCost:         cost,
		BillingModelType:      wire.Str(a.BillingModelType),
		MeasurementType:       wire.Str(a.MeasurementType),
		UnitLabel:             wire.Str(a.UnitLabel),
		Breakdown:             a.Breakdown,
		EstimateSchemaVersion: a.EstimateSchemaVersion,
		Status:                o.status,
		Code:                  a.Code,
		Message:               a.Message,
		RequestID:             a.RequestID,
	}
	if a.Timestamp != 0 { // the billing estimate's answer has none
		e.Timestamp = time.Unix(a.Timestamp, 0)
	}
	if o.status != http.StatusOK {
		e.RetryAfter = decodeAPIError(o.status, o.header, o.body, c.now()).RetryAfter
	}
	return e, nil
}

// verifyAnswer checks a pre-flight answer's signature:
// X-<Brand>-Signature = Base64(HMAC(secret, body + X-<Brand>-Timestamp)),
// with a timestamp within the tolerance of the local clock, so an answer
// recorded earlier cannot be replayed.
func (c *Client) verifyAnswer(o outcome) error {
	sig := o.header.Get(c.headers.Signature)
	ts := o.header.Get(c.headers.Timestamp)
	if sig == "" || ts == "" {
		return fmt.Errorf("%w: the answer is not signed", ErrResponseSignature)
	}
	if !signing.Verify(c.verifySecrets, sig, o.body, []byte(ts)) {
		return fmt.Errorf("%w: no secret of the service made it", ErrResponseSignature)
	}
	at, err := signing.ParseTimestamp(ts)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrResponseSignature, err)
	}
	now := c.now()
	if !signing.Within(at, now, now, c.tolerance) {
		return fmt.Errorf("%w: signed at %s, more than %s from the local clock", ErrResponseSignature, at.UTC().Format(time.RFC3339), c.tolerance)
	}
	return nil
}
