package sdk

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// ReconciliationLog receives one record per usage report and per
// completion a Client sends, after its final outcome: the evidence a
// backend keeps to reconcile what it billed with what the platform
// counted, and to answer a refund, chargeback, audit or dispute.
//
// Keep records at least 24 months after the usage date, and longer while
// a refund, chargeback, audit, fraud review, tax inquiry or legal dispute
// about them is open (docs/sdk.md, "Reconciliation log").
//
// Record is called synchronously from ReportUsage and ReportCompletion,
// possibly from many goroutines at once. Its error never fails the report
// (see WithLogErrorHandler).
type ReconciliationLog interface {
	Record(ReconciliationRecord) error
}

// Outcomes of a reported call, the Status of a ReconciliationRecord.
const (
	// OutcomeRecorded: the usage service answered 200 and counted it.
	OutcomeRecorded = "recorded"
	// OutcomeReplayed: answered 200 as a repeat of an idempotency key
	// recorded before; counted once, earlier.
	OutcomeReplayed = "replayed"
	// OutcomeRefused: answered 4xx; not counted. Sending it again as is
	// will be refused again.
	OutcomeRefused = "refused"
	// OutcomeUnknown: no definitive answer (network failure, 5xx, or the
	// context ended). It may or may not be counted: send the same report
	// again with the same IdempotencyKey, which is counted at most once.
	OutcomeUnknown = "unknown"
)

// ReconciliationRecord is one reported call. It never holds a service key:
// KeyRef is a key id or a hash reference (see KeyReference).
type ReconciliationRecord struct {
	LoggedAt          time.Time `json:"loggedAt"`
	Operation         string    `json:"operation"`                   // "report" or "completion"
	PlatformRequestID string    `json:"platformRequestId,omitempty"` // the gateway's request id, when known
	BackendRequestID  string    `json:"backendRequestId,omitempty"`  // the backend's own id of the call
	KeyRef            string    `json:"keyRef,omitempty"`            // subscriber key reference, never the key
	UserID            string    `json:"userId,omitempty"`
	ServiceID         string    `json:"serviceId"`
	Endpoint          string    `json:"endpoint,omitempty"`
	Timestamp         time.Time `json:"timestamp"` // when the usage happened
	Status            string    `json:"status"`    // an Outcome constant
	// UnitsReported is what the backend stated; nil for a completion
	// without units (the gateway then charges by the product's rule).
	UnitsReported  *Units                 `json:"unitsReported"`
	IdempotencyKey string                 `json:"idempotencyKey,omitempty"`
	Attempts       int                    `json:"attempts"`
	Response       ReconciliationResponse `json:"response"`
}

// ReconciliationResponse is what the usage service answered: the status
// and body of the last attempt, or the error when no answer came.
type ReconciliationResponse struct {
	StatusCode int             `json:"statusCode,omitempty"`
	Body       json.RawMessage `json:"body,omitempty"`
	Error      string          `json:"error,omitempty"`
}

// maxLoggedBody bounds the answer body kept in a record.
const maxLoggedBody = 64 << 10

// record completes rec from the outcome and hands it to the log.
func (c *Client) record(rec ReconciliationRecord, o outcome, err error) {
	if c.log == nil {
		return
	}
	rec.LoggedAt = c.now().UTC()
	rec.Timestamp = rec.Timestamp.UTC()
	rec.KeyRef = safeKeyRef(rec.KeyRef)
	rec.Attempts = o.attempts
	rec.Response.StatusCode = o.status
	rec.Response.Body = loggedBody(o.body)
	switch {
	case o.err == nil && o.status == http.StatusOK:
		rec.Status = OutcomeRecorded
		if strings.EqualFold(o.header.Get("Idempotent-Replayed"), "true") {
			rec.Status = OutcomeReplayed
		}
	case o.err == nil && o.status >= 400 && o.status < 500 && !transientStatus(o.status):
		rec.Status = OutcomeRefused
	default:
		rec.Status = OutcomeUnknown
	}
	if err != nil {
		rec.Response.Error = err.Error()
	}
	if lerr := c.log.Record(rec); lerr != nil {
		c.logError(fmt.Errorf("record %s for user %q: %w", rec.Operation, rec.UserID, lerr))
	}
}

// loggedBody keeps a JSON answer as JSON and anything else as a string.
func loggedBody(b []byte) json.RawMessage {
	if len(b) == 0 {
		return nil
	}
	if len(b) <= maxLoggedBody && json.Valid(b) {
		return json.RawMessage(b)
	}
	s := b
	if len(s) > maxLoggedBody {
		s = s[:maxLoggedBody]
		for len(s) > 0 && !utf8.Valid(s) {
			s = s[:len(s)-1]
		}
	}
	q, _ := json.Marshal(string(s))
	return q
}

// KeyReference returns a reference to a service key that is safe to log
// and store: "sha256:" and the first 16 hex digits of the key's SHA-256.
// The gateway stores keys as their SHA-256, so an operator can match the
// reference to a key id; the key cannot be recovered from it.
func KeyReference(serviceKey string) string {
	sum := sha256.Sum256([]byte(serviceKey))
	return "sha256:" + hex.EncodeToString(sum[:8])
}

// safeKeyRef lets through only what is recognisably not a key: a key id
// (a UUID, or "key_" and base62 as gateways issued before ids were UUIDs)
// or a KeyReference. Anything else, a key passed by mistake above all, is
// logged as its KeyReference.
func safeKeyRef(ref string) string {
	switch {
	case ref == "":
		return ""
	case isUUID(ref):
		return ref
	case strings.HasPrefix(ref, "key_") && len(ref) <= 64 && isAlnum(ref[len("key_"):]):
		return ref
	case strings.HasPrefix(ref, "sha256:") && len(ref) == len("sha256:")+16 && isHex(ref[len("sha256:"):]):
		return ref
	}
	return KeyReference(ref)
}

func isAlnum(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return s != ""
}

// isUUID reports whether s is a UUID in its 36-character form, any case.
func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if i == 8 || i == 13 || i == 18 || i == 23 {
			if c != '-' {
				return false
			}
		} else if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// JSONLinesLog writes each record as one line of JSON to a writer. It is
// safe for concurrent use. When the writer is a regular file, each line is
// synced before Record returns, so a record is durable once the report call
// returns; pipes and terminals (stderr) cannot be synced and are not.
type JSONLinesLog struct {
	mu   sync.Mutex
	w    io.Writer
	sync interface{ Sync() error } // nil when w cannot be synced
}

// NewJSONLinesLog returns a log writing to w: typically a file opened with
// os.O_APPEND|os.O_CREATE|os.O_WRONLY, rotated and archived by your usual
// tooling for the retention period.
func NewJSONLinesLog(w io.Writer) *JSONLinesLog {
	l := &JSONLinesLog{w: w}
	if s, ok := w.(interface{ Sync() error }); ok {
		l.sync = s
		if f, ok := w.(*os.File); ok {
			if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
				l.sync = nil
			}
		}
	}
	return l
}

// Record writes rec as one line, in a single Write.
func (l *JSONLinesLog) Record(rec ReconciliationRecord) error {
	rec.KeyRef = safeKeyRef(rec.KeyRef) // also for records built by hand
	line, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encode reconciliation record: %w", err)
	}
	line = append(line, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := l.w.Write(line); err != nil {
		return fmt.Errorf("write reconciliation record: %w", err)
	}
	if l.sync != nil {
		if err := l.sync.Sync(); err != nil {
			return fmt.Errorf("sync reconciliation log: %w", err)
		}
	}
	return nil
}

var _ ReconciliationLog = (*JSONLinesLog)(nil)

// OpenJSONLinesLog opens a reconciliation log appending to the file at path
// (created with mode 0600), or writing to standard error when path is
// empty. close releases the file.
func OpenJSONLinesLog(path string) (l *JSONLinesLog, close func() error, err error) {
	if path == "" {
		return NewJSONLinesLog(os.Stderr), func() error { return nil }, nil
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("open reconciliation log: %w", err)
	}
	return NewJSONLinesLog(f), f.Close, nil
}
