// Package wire holds the JSON bodies the usage service and the SDK
// exchange: key validation, usage estimates, usage reports and the
// acknowledgement of a job's progress or completion. The server
// (usagehandler) encodes the answers and the SDK (sdk) decodes them, both
// from these types, so the two sides cannot drift apart; the field order
// and null-versus-absent of each body are part of the contract
// (docs/wire-contract.md) and pinned by wire_test.go. Like billing, whose
// Breakdown the answers carry, it is pure: no Caddy, no store.
package wire

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/platformgw/gateway/internal/billing"
)

// Schema versions of the answers.
const (
	ValidationSchemaVersion = 3
	EstimateSchemaVersion   = 3
	ReportSchemaVersion     = 2
)

// Validation is the 200 body of POST {core}/service-keys/validate: the
// fields, their order and "error": null of the upstream contract's
// fixture (validate-success-v3), so SDKs that compare against it, or read
// error to tell success, see the same body. The product fields are null
// for a service owner.
type Validation struct {
	Valid                   bool     `json:"valid"`
	ServiceKeyID            string   `json:"serviceKeyId"`
	UserID                  string   `json:"userId"`
	ServiceID               string   `json:"serviceId"`
	ServiceProductID        string   `json:"serviceProductId"`
	Roles                   []string `json:"roles"`
	SubscriptionStatus      string   `json:"subscriptionStatus"`
	BillingModelType        *string  `json:"billingModelType"`
	MeasurementType         *string  `json:"measurementType"`
	UnitLabel               *string  `json:"unitLabel"`
	Timestamp               int64    `json:"timestamp"`
	Error                   *string  `json:"error"` // null on success; the code in a ValidationFailure
	ValidationSchemaVersion int      `json:"validationSchemaVersion"`
}

// ValidationFailure is the 401 body of validate: the validation shape
// (valid, error) with the fields of the common error body, so both an SDK
// reading `valid` and a client reading `code` understand it.
type ValidationFailure struct {
	Valid                   bool   `json:"valid"`
	Error                   string `json:"error"`
	Code                    string `json:"code"`
	Message                 string `json:"message"`
	RequestID               string `json:"requestId,omitempty"`
	ValidationSchemaVersion int    `json:"validationSchemaVersion"`
	Timestamp               int64  `json:"timestamp"`
}

// Estimate is the body of both estimates (service-keys/estimate-usage and
// billing/usage/estimate). The billing estimate leaves out the schema
// version and timestamp (zero, omitted). A denied estimate also carries
// the code, message and retryAfter the call itself would be refused with.
type Estimate struct {
	SufficientCredits     bool              `json:"sufficientCredits"`
	WouldExceedCap        bool              `json:"wouldExceedCap"`
	WouldAllow            bool              `json:"wouldAllow"`
	EstimatedCost         billing.Units     `json:"estimatedCost"`
	BillingModelType      *string           `json:"billingModelType"`
	MeasurementType       *string           `json:"measurementType"`
	UnitLabel             *string           `json:"unitLabel"`
	Breakdown             billing.Breakdown `json:"breakdown"`
	EstimateSchemaVersion int               `json:"estimateSchemaVersion,omitempty"`
	Timestamp             int64             `json:"timestamp,omitempty"`
	Code                  string            `json:"code,omitempty"`
	Message               string            `json:"message,omitempty"`
	RetryAfter            int               `json:"retryAfter,omitempty"` // whole seconds
	RequestID             string            `json:"requestId,omitempty"`
}

// Report is the body of POST {usage}/report. Timestamp is when the usage
// happened: ISO 8601 (the SDK writes JavaScript's toISOString form) or
// Unix seconds; the server also accepts unitsUsed as a string.
type Report struct {
	UserID    string        `json:"userId"`
	ServiceID string        `json:"serviceId"`
	UnitsUsed billing.Units `json:"unitsUsed"`
	Timestamp string        `json:"timestamp"`
	RequestID string        `json:"requestId,omitempty"`
}

// ReportResult is the 200 body of a report (schema version 2): the
// subscription after the charge. Warning is set when the usage was
// recorded past a hard limit; the product fields are null for a service
// owner, whose usage is recorded free.
type ReportResult struct {
	ReportSchemaVersion int               `json:"reportSchemaVersion"`
	Status              string            `json:"status"`
	Warning             *string           `json:"warning"`
	UserID              string            `json:"userId"`
	ServiceID           string            `json:"serviceId"`
	BillingModelType    *string           `json:"billingModelType"`
	MeasurementType     *string           `json:"measurementType"`
	UnitLabel           *string           `json:"unitLabel"`
	Breakdown           billing.Breakdown `json:"breakdown"`
}

// JobAck is the 200 body of a job's progress and completion: the job's
// state after it (RUNNING, COMPLETED or FAILED).
type JobAck struct {
	RequestID string `json:"requestId"`
	Status    string `json:"status"`
}

// Str is the text of a nullable string field; "" for null.
func Str(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// TimeMillis is the layout of the times the job routes and a wrapped
// answer write: UTC, RFC 3339 with milliseconds, always three digits.
const TimeMillis = "2006-01-02T15:04:05.000Z"

// UserIDRule says in words what ValidUserID accepts, for error messages.
const UserIDRule = "1 to 128 bytes of printable text without '/' or surrounding spaces, and not '.' or '..'"

// MaxUserIDLen is the longest user id, in bytes.
const MaxUserIDLen = 128

// ValidUserID is the one rule for a user id, wherever one comes in: the
// admin API and the console (keys, subscriptions), the usage routes
// (reports, estimates), the catalog's owners. 1 to 128 bytes of printable
// UTF-8, no '/' (ids are path segments of the admin API) and no leading or
// trailing space. U+FFFD is refused too: it is what a JSON decoder makes
// of bytes that were not text (or of a lone surrogate escape), so an id
// holding it names nobody for sure. "." and ".." are refused: as a path
// segment a browser (and any URL resolver) reads them as this directory
// and the one above, so the console's pages of such a user, and the admin
// API's routes, could never be reached.
func ValidUserID(s string) bool {
	if s == "" || s == "." || s == ".." || len(s) > MaxUserIDLen || !utf8.ValidString(s) || strings.ContainsAny(s, "/\uFFFD") {
		return false
	}
	if s[0] == ' ' || s[len(s)-1] == ' ' {
		return false
	}
	for _, c := range s {
		if !unicode.IsPrint(c) {
			return false
		}
	}
	return true
}

// CheckBrand is the one rule for a header brand, the word in X-<Brand>-*
// headers (the gateway's header_brand, the SDK's WithBrand): letters and
// digits only, so the brand is a single header-name token and the
// "X-<Brand>-" prefix cannot run into another header's name.
func CheckBrand(brand string) error {
	if brand == "" {
		return fmt.Errorf("header_brand is empty")
	}
	for i := 0; i < len(brand); i++ {
		c := brand[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return fmt.Errorf("header_brand '%s': letters and digits only (headers are X-<brand>-Signature and so on)", brand)
		}
	}
	return nil
}
