// Package app is the example non-proxied backend: the handler of
// examples/reporter, kept apart from its main so tests can run it against
// the real gateway.
//
// Callers reach this backend directly, not through the gateway, and send
// their service key themselves. For every request it asks the platform,
// through the SDK client:
//
//  1. ValidateKey: is this a valid key of a user with access to the
//     service? (401 or 403 to the caller when not);
//  2. EstimateUsage: would the units this request needs be allowed now?
//     (403 or 429 to the caller when not, and nothing is reported);
//
// then does the work, and reports the units with ReportUsage, which the
// SDK records in the reconciliation log. The answers of the platform are
// trusted only because the SDK checks their signatures.
//
//	POST /count  counts the words of the body, one unit per word, and
//	             names the most frequent ones
//
// A caller that sends an Idempotency-Key header may retry a request whose
// answer it lost: the same key with the same body is charged once, and
// gets the first answer again.
package app

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/platformgw/gateway/sdk"
)

// DefaultMaxBodyBytes is the largest text a caller may send.
const DefaultMaxBodyBytes = 1 << 20

// Config is what the backend needs.
type Config struct {
	// Client validates keys, asks for estimates and reports usage, all
	// signed with the service secret; give it a reconciliation log.
	Client *sdk.Client
	// MaxBodyBytes bounds a request's text (default DefaultMaxBodyBytes).
	MaxBodyBytes int64
	// Logger receives the failures to reach the platform (default
	// log.Default()).
	Logger *log.Logger
}

// New returns the backend's handler.
func New(cfg Config) http.Handler {
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = log.Default()
	}
	r := &reporter{cfg: cfg, answers: newAnswers(24*time.Hour, 10000)}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /count", r.count)
	return mux
}

type reporter struct {
	cfg     Config
	answers *answers
}

// Count is the answer of /count.
type Count struct {
	RequestID string      `json:"requestId"` // this backend's id of the call, in its reconciliation log
	Words     int64       `json:"words"`
	Top       []WordCount `json:"top"`
	// What the call was charged, and where the subscription stands.
	Units          sdk.Units  `json:"units"`
	UnitLabel      string     `json:"unitLabel,omitempty"`
	UnitsRemaining *sdk.Units `json:"unitsRemaining,omitempty"`
	Warning        string     `json:"warning,omitempty"`
	// Replayed is true when an earlier request with the same
	// Idempotency-Key and body was already charged.
	Replayed bool `json:"replayed,omitempty"`
}

// WordCount is how often a word occurs.
type WordCount struct {
	Word  string `json:"word"`
	Count int    `json:"count"`
}

// Time the checks before the work may take together, and the report
// after it, retries included.
const platformTimeout = 30 * time.Second

func (rp *reporter) count(w http.ResponseWriter, r *http.Request) {
	key, ok := bearer(r.Header.Get("Authorization"))
	if !ok {
		writeError(w, http.StatusUnauthorized, sdk.CodeMissingKey, "send your service key as Authorization: Bearer <key>")
		return
	}
	text, err := io.ReadAll(http.MaxBytesReader(w, r.Body, rp.cfg.MaxBodyBytes))
	if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
		writeError(w, http.StatusRequestEntityTooLarge, sdk.CodePayloadTooLarge, "the text is larger than the limit")
		return
	} else if err != nil {
		writeError(w, http.StatusBadRequest, sdk.CodeInvalidRequest, "the request body could not be read")
		return
	}
	words := strings.Fields(string(text))
	if len(words) == 0 {
		writeError(w, http.StatusBadRequest, sdk.CodeInvalidRequest, "send the text to count as the request body")
		return
	}
	units := sdk.WholeUnits(int64(len(words)))
	ctx, cancel := context.WithTimeout(r.Context(), platformTimeout)
	defer cancel()
	client := rp.cfg.Client

	// 1. Whose key is it, and may they use this service?
	kv, err := client.ValidateKey(ctx, key)
	if err != nil {
		rp.unavailable(w, "validate key", err)
		return
	}
	if !kv.Valid {
		status := http.StatusUnauthorized
		if kv.Code == sdk.CodeNoSubscription || kv.Code == sdk.CodeSubscriptionInactive {
			status = http.StatusForbidden
		}
		writeError(w, status, cmp.Or(kv.Code, sdk.CodeInvalidKey), cmp.Or(kv.Message, "the service key is not valid"))
		return
	}

	// A retry of a request already answered gets that answer: estimating
	// again could refuse a call that was charged, once the quota is used
	// up.
	var idemKey string
	if k := r.Header.Get("Idempotency-Key"); k != "" {
		idemKey = idempotencyKey(kv.UserID, k, text)
		if first, ok := rp.answers.get(idemKey); ok {
			first.Replayed = true
			writeJSON(w, http.StatusOK, first)
			return
		}
	}

	// 2. Would the units be allowed? Nothing is counted yet.
	est, err := client.EstimateUsage(ctx, key, units)
	var apiErr *sdk.APIError
	switch {
	case errors.As(err, &apiErr) && apiErr.Status >= 400 && apiErr.Status < 500 && !apiErr.Retryable():
		writeError(w, apiErr.Status, apiErr.Code, apiErr.Message) // the key's user may not use the service
		return
	case err != nil:
		rp.unavailable(w, "estimate usage", err)
		return
	case !est.WouldAllow:
		if est.RetryAfter > 0 {
			w.Header().Set("Retry-After", strconv.FormatInt(int64(math.Ceil(est.RetryAfter.Seconds())), 10))
		}
		writeError(w, est.Status, cmp.Or(est.Code, sdk.CodeQuotaExceeded), cmp.Or(est.Message, "this request would go over your plan's limits"))
		return
	}

	// 3. The work.
	answer := Count{RequestID: newID(), Words: int64(len(words)), Top: top(words, 3), Units: units}

	// 4. Report what it used. The estimate was advice: concurrent calls
	// may have used the quota up since, in which case the usage is still
	// recorded, with a warning. It is reported even if the caller hangs
	// up now: the work is done.
	reportCtx, cancelReport := context.WithTimeout(context.WithoutCancel(r.Context()), platformTimeout)
	defer cancelReport()
	res, err := client.ReportUsage(reportCtx, sdk.Report{
		UserID:    kv.UserID,
		UnitsUsed: units,
		// With the caller's key, a retry the answers above have forgotten
		// (after a restart) is still counted once by the usage service;
		// without one, the SDK makes a key for this report.
		IdempotencyKey:   idemKey,
		BackendRequestID: answer.RequestID,
		KeyRef:           kv.ServiceKeyID, // the key's id, never the key
		Endpoint:         "POST /count",
	})
	switch {
	case errors.As(err, &apiErr) && !apiErr.Retryable():
		// Refused: nothing was counted, so nothing is handed over. A
		// subscription that ended since the estimate is the caller's
		// matter; anything else is this backend's.
		rp.cfg.Logger.Printf("ERROR count %s: usage refused: %v", answer.RequestID, err)
		if apiErr.Status == http.StatusForbidden {
			writeError(w, http.StatusForbidden, apiErr.Code, apiErr.Message)
		} else {
			writeError(w, http.StatusInternalServerError, sdk.CodeInternalError, "your usage could not be recorded; you were not charged")
		}
		return
	case err != nil:
		// No definitive answer: the usage may or may not be counted. The
		// reconciliation log holds the report and its idempotency key, to
		// be sent again later; the caller gets the work it was promised.
		rp.cfg.Logger.Printf("ERROR count %s: usage outcome unknown, resend it from the reconciliation log: %v", answer.RequestID, err)
	default:
		answer.UnitLabel = res.UnitLabel
		answer.UnitsRemaining = res.Breakdown.UnitsRemaining
		answer.Warning = res.Warning
		answer.Replayed = res.Replayed
		if idemKey != "" {
			rp.answers.put(idemKey, answer)
		}
	}
	writeJSON(w, http.StatusOK, answer)
}

// unavailable answers when the platform gave no trustworthy answer: the
// request is refused rather than served unchecked.
func (rp *reporter) unavailable(w http.ResponseWriter, what string, err error) {
	rp.cfg.Logger.Printf("%s: %v", what, err)
	w.Header().Set("Retry-After", "5")
	writeError(w, http.StatusServiceUnavailable, "service_unavailable", "your key could not be checked now; try again shortly")
}

// bearer takes the key out of an Authorization header.
func bearer(h string) (string, bool) {
	scheme, key, ok := strings.Cut(strings.TrimSpace(h), " ")
	key = strings.TrimSpace(key)
	return key, ok && strings.EqualFold(scheme, "Bearer") && key != ""
}

// idempotencyKey scopes a caller's Idempotency-Key to its user and request
// body: the usage service keeps keys per service, and two users, or one
// user's two different requests, must not share a charge.
func idempotencyKey(userID, callerKey string, body []byte) string {
	h := sha256.New()
	for _, part := range [][]byte{[]byte(userID), []byte(callerKey), body} {
		h.Write([]byte(strconv.Itoa(len(part)) + ":"))
		h.Write(part)
	}
	return "count-" + hex.EncodeToString(h.Sum(nil)[:16])
}

// top returns the n most frequent words, ignoring case and punctuation
// around them, the most frequent first and ties in alphabetical order.
func top(words []string, n int) []WordCount {
	counts := map[string]int{}
	for _, w := range words {
		w = strings.ToLower(strings.TrimFunc(w, func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsNumber(r) }))
		if w != "" {
			counts[w]++
		}
	}
	out := make([]WordCount, 0, len(counts))
	for w, c := range counts {
		out = append(out, WordCount{w, c})
	}
	slices.SortFunc(out, func(a, b WordCount) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), strings.Compare(a.Word, b.Word))
	})
	return out[:min(n, len(out))]
}

func newID() string {
	var b [8]byte
	rand.Read(b[:])
	return "cnt_" + hex.EncodeToString(b[:])
}

// answers remembers, for a while, the answers to requests sent with an
// Idempotency-Key. It lives in memory, which is enough for an example; a
// production backend keeps them in its database, next to its work.
type answers struct {
	ttl time.Duration
	max int

	mu sync.Mutex
	m  map[string]remembered
}

type remembered struct {
	answer Count
	until  time.Time
}

func newAnswers(ttl time.Duration, max int) *answers {
	return &answers{ttl: ttl, max: max, m: make(map[string]remembered)}
}

func (a *answers) get(key string) (Count, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, ok := a.m[key]
	if !ok || time.Now().After(r.until) {
		return Count{}, false
	}
	return r.answer, true
}

// put remembers an answer. When full even after forgetting the expired
// ones, it remembers nothing: a retry then goes to the usage service,
// which still counts it once.
func (a *answers) put(key string, answer Count) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	if len(a.m) >= a.max {
		for k, r := range a.m {
			if now.After(r.until) {
				delete(a.m, k)
			}
		}
		if len(a.m) >= a.max {
			return
		}
	}
	a.m[key] = remembered{answer: answer, until: now.Add(a.ttl)}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, message string) {
	writeJSON(w, status, map[string]string{"code": code, "message": message})
}
