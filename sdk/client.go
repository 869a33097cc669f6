package sdk

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/signing"
	"github.com/platformgw/gateway/internal/wire"
)

// Default settings of a Client.
const (
	DefaultBrand       = "Platform"
	DefaultUsagePrefix = "/api/usage"
	DefaultCorePrefix  = "/api/v1"
	// DefaultTolerance is how far a signed timestamp may lie from the
	// local clock, the usage service's own default window.
	DefaultTolerance = 5 * time.Minute
)

// Version is the SDK version sent in the User-Agent header.
const Version = "0.1.0"

// maxResponseBytes bounds how much of an answer the Client reads; the
// usage service's answers are a few hundred bytes.
const maxResponseBytes = 1 << 20

// Units is an exact decimal quantity (millionths in an int64), the type of
// units reported and of every quantity in an answer. Make one with
// [ParseUnits] ("12.5") or [WholeUnits] (3).
type Units = billing.Units

// Breakdown describes a subscription's standing after a report or under an
// estimate: units used, remaining, overage, credits and spending cap, as
// they apply to its billing model.
type Breakdown = billing.Breakdown

// ParseUnits parses a non-negative decimal with at most six fractional
// digits ("12", "0.5", "1e3") exactly, never through a float.
func ParseUnits(s string) (Units, error) { return billing.ParseUnits(s) }

// MustUnits is ParseUnits for a constant: it panics on an invalid
// decimal, as regexp.MustCompile does on an invalid pattern.
func MustUnits(s string) Units {
	u, err := billing.ParseUnits(s)
	if err != nil {
		panic("sdk.MustUnits: " + err.Error())
	}
	return u
}

// WholeUnits returns n whole units.
func WholeUnits(n int64) Units { return billing.Whole(n) }

// Client talks to the usage service and the core pre-flight routes on
// behalf of one service, signing every request with the service secret.
// It is safe for concurrent use.
type Client struct {
	usageBase string // scheme://host[/path] + usage prefix, no trailing slash
	coreBase  string // the same for the core prefix
	serviceID string
	secret    []byte
	// verifySecrets check the signature of pre-flight answers: the secret
	// first, then any given with WithResponseSecrets (rotation).
	verifySecrets [][]byte
	headers       wire.Headers
	http          *http.Client
	retry         RetryPolicy
	now           func() time.Time
	sleep         func(context.Context, time.Duration) error
	tolerance     time.Duration
	log           ReconciliationLog
	logError      func(error)
	rebase        bool
	userAgent     string
}

// Option configures a Client.
type Option func(*settings)

// settings collects the options before NewClient validates them.
type settings struct {
	usagePrefix, corePrefix string
	coreBaseURL             string
	brand                   string
	httpClient              *http.Client
	retry                   RetryPolicy
	now                     func() time.Time
	sleep                   func(context.Context, time.Duration) error
	tolerance               time.Duration
	log                     ReconciliationLog
	logError                func(error)
	responseSecrets         []string
	rebase                  bool
	userAgent               string
	rootCAs                 *x509.CertPool
	// err collects what options found wrong, for NewClient to return.
	err error
}

// WithUsagePrefix sets the path prefix of the usage service: /api/usage by
// default, /usage/api/v1 under the ECS layout.
func WithUsagePrefix(prefix string) Option { return func(s *settings) { s.usagePrefix = prefix } }

// WithCorePrefix sets the path prefix of the core routes (key validation,
// estimates): /api/v1 by default, /core/api/v1 under the ECS layout.
func WithCorePrefix(prefix string) Option { return func(s *settings) { s.corePrefix = prefix } }

// WithECSPrefixes selects the prefixes of the ECS deployment layout:
// /usage/api/v1 for the usage service and /core/api/v1 for the core routes.
func WithECSPrefixes() Option {
	return func(s *settings) { s.usagePrefix, s.corePrefix = "/usage/api/v1", "/core/api/v1" }
}

// WithCoreBaseURL serves the core routes from another address than the
// usage service (the base URL given to NewClient by default).
func WithCoreBaseURL(baseURL string) Option { return func(s *settings) { s.coreBaseURL = baseURL } }

// WithBrand sets the brand word of the header names: X-<brand>-Signature.
// The default is Platform; backends of the platform this gateway replaces
// use Tollara. It must match the gateway's header_brand.
func WithBrand(brand string) Option { return func(s *settings) { s.brand = brand } }

// WithHTTPClient sets the http.Client requests go through (transport,
// proxy, TLS, per-attempt timeout). The default has a 30 s timeout.
func WithHTTPClient(c *http.Client) Option { return func(s *settings) { s.httpClient = c } }

// WithRetry sets how transient failures are retried; zero fields take the
// defaults of [DefaultRetryPolicy]. MaxAttempts 1 turns retries off.
func WithRetry(p RetryPolicy) Option { return func(s *settings) { s.retry = p } }

// WithClock sets the clock that timestamps requests and checks the
// timestamps of answers (tests, or a host with a known-bad clock).
func WithClock(now func() time.Time) Option { return func(s *settings) { s.now = now } }

// WithSleep sets how the Client waits between attempts. It must return
// early with ctx.Err() when ctx ends. Tests pass one that records the
// delays and returns at once.
func WithSleep(sleep func(ctx context.Context, d time.Duration) error) Option {
	return func(s *settings) { s.sleep = sleep }
}

// WithTolerance sets how far the timestamp of a signed pre-flight answer
// may lie from the local clock (default 5 minutes). Older answers are
// refused as possible replays.
func WithTolerance(d time.Duration) Option { return func(s *settings) { s.tolerance = d } }

// WithReconciliationLog records one entry per usage report and completion
// in log (see [ReconciliationLog]).
func WithReconciliationLog(l ReconciliationLog) Option { return func(s *settings) { s.log = l } }

// WithLogErrorHandler receives the errors of the reconciliation log. A
// failed log write never fails the report itself (the usage is already
// counted, and retrying it under a new idempotency key would count it
// twice). The default writes them with the standard library's log package.
func WithLogErrorHandler(fn func(error)) Option { return func(s *settings) { s.logError = fn } }

// WithResponseSecrets adds secrets that pre-flight answers may also be
// signed with. The gateway signs with the newest secret of a service, so
// during a rotation a backend that still signs with the old secret lists
// the new one here (see docs/sdk.md, "Rotating the secret").
func WithResponseSecrets(secrets ...string) Option {
	return func(s *settings) { s.responseSecrets = append(s.responseSecrets, secrets...) }
}

// WithCallbacksViaBaseURL posts progress and completion given as a full
// progress_url or callback_url to this Client's base URL instead of the
// host in that URL, keeping its request id and timestamp. Use it when the
// gateway's public address is not reachable from the backend (an internal
// network), or to never send a signed request to a host named in a message.
func WithCallbacksViaBaseURL() Option { return func(s *settings) { s.rebase = true } }

// WithUserAgent appends a product token to the User-Agent header.
func WithUserAgent(product string) Option { return func(s *settings) { s.userAgent = product } }

// NewClient returns a Client for the service serviceID, whose secret is
// secret, talking to the gateway at baseURL (scheme and host, optionally a
// path, e.g. "https://api.example.com").
func NewClient(baseURL, serviceID, secret string, opts ...Option) (*Client, error) {
	s := settings{
		usagePrefix: DefaultUsagePrefix,
		corePrefix:  DefaultCorePrefix,
		brand:       DefaultBrand,
		tolerance:   DefaultTolerance,
	}
	for _, opt := range opts {
		opt(&s)
	}
	if s.err != nil {
		return nil, fmt.Errorf("sdk: NewClient: %w", s.err)
	}
	if s.rootCAs != nil && s.httpClient != nil {
		return nil, errors.New("sdk: NewClient: WithRootCAs/WithCAFile and WithHTTPClient both given; set RootCAs in the TLS config of your client's transport instead")
	}
	if s.rootCAs != nil {
		s.httpClient = httpClientWithRoots(s.rootCAs)
	}
	if serviceID == "" {
		return nil, errors.New("sdk: NewClient: empty service id")
	}
	if secret == "" {
		return nil, errors.New("sdk: NewClient: empty service secret")
	}
	if err := checkBrand(s.brand); err != nil {
		return nil, fmt.Errorf("sdk: NewClient: %w", err)
	}
	base, err := cleanBaseURL(baseURL)
	if err != nil {
		return nil, fmt.Errorf("sdk: NewClient: base URL: %w", err)
	}
	coreBase := base
	if s.coreBaseURL != "" {
		if coreBase, err = cleanBaseURL(s.coreBaseURL); err != nil {
			return nil, fmt.Errorf("sdk: NewClient: core base URL: %w", err)
		}
	}
	c := &Client{
		usageBase: base + cleanPrefix(s.usagePrefix),
		coreBase:  coreBase + cleanPrefix(s.corePrefix),
		serviceID: serviceID,
		secret:    []byte(secret),
		headers:   newHeaderNames(s.brand),
		http:      s.httpClient,
		retry:     s.retry.withDefaults(),
		now:       s.now,
		sleep:     s.sleep,
		tolerance: s.tolerance,
		log:       s.log,
		logError:  s.logError,
		rebase:    s.rebase,
		userAgent: "platformgw-sdk-go/" + Version,
	}
	c.verifySecrets = [][]byte{c.secret}
	for _, rs := range s.responseSecrets {
		if rs != "" {
			c.verifySecrets = append(c.verifySecrets, []byte(rs))
		}
	}
	if s.userAgent != "" {
		c.userAgent += " " + s.userAgent
	}
	if c.http == nil {
		c.http = &http.Client{Timeout: 30 * time.Second}
	}
	if c.now == nil {
		c.now = time.Now
	}
	if c.sleep == nil {
		c.sleep = sleepContext
	}
	if c.tolerance <= 0 {
		c.tolerance = DefaultTolerance
	}
	if c.logError == nil {
		c.logError = func(err error) { log.Printf("platform sdk: reconciliation log: %v", err) }
	}
	return c, nil
}

// ServiceID is the service this Client signs for.
func (c *Client) ServiceID() string { return c.serviceID }

// cleanBaseURL checks an absolute http(s) URL and drops its trailing
// slash, query and fragment.
func cleanBaseURL(raw string) (string, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return "", err
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("%q is not an absolute http or https URL", raw)
	}
	u.RawQuery, u.Fragment, u.RawFragment = "", "", ""
	return strings.TrimRight(u.String(), "/"), nil
}

// cleanPrefix gives a prefix one leading slash and no trailing one.
func cleanPrefix(p string) string {
	p = strings.Trim(strings.TrimSpace(p), "/")
	if p == "" {
		return ""
	}
	return "/" + p
}

// sleepContext waits d or until ctx ends.
func sleepContext(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// exchange is one logical request: sent once, then again on transient
// failures, always with the same body.
type exchange struct {
	op  string // "report usage", for errors
	url string
	// body is the exact bytes sent and signed, identical on every attempt.
	body []byte
	// timestamp, when set, is signed on every attempt (the one handed out
	// in a progress or callback URL); else each attempt signs the current
	// time, so a retry after a long Retry-After is not stale.
	timestamp      string
	idempotencyKey string
	// bearer, when set, is sent as Authorization: Bearer and the request
	// is not signed: the bearer (an end user's JWT) is the credential, and
	// a signature would take precedence over it.
	bearer string
	// answers lists statuses that are answers to return, not failures to
	// retry (the estimate's 429 says the quota would be exceeded).
	answers map[int]bool
}

// outcome is what the last attempt of an exchange got.
type outcome struct {
	status   int
	header   http.Header
	body     []byte
	attempts int
	err      error // a transport error, or ctx's, when no answer came
}

// do runs an exchange under the retry policy. It returns the last answer
// received, whatever its status, or the last transport error.
func (c *Client) do(ctx context.Context, x exchange) outcome {
	var last outcome
	for attempt := 1; ; attempt++ {
		last = c.attempt(ctx, x)
		last.attempts = attempt
		// An answer that arrived is kept even if ctx ends now: a report
		// answered 200 was counted, whatever happens to the caller.
		if !c.shouldRetry(x, last) || attempt >= c.retry.MaxAttempts || ctx.Err() != nil {
			return last
		}
		wait := c.retry.backoff(attempt)
		if last.err == nil && last.status == http.StatusTooManyRequests {
			ra := decodeAPIError(last.status, last.header, last.body, c.now()).RetryAfter
			if ra > c.retry.MaxRetryAfter {
				// Waiting that long is the caller's decision: the
				// APIError carries RetryAfter.
				return last
			}
			wait = max(wait, ra)
		}
		if dl, ok := ctx.Deadline(); ok && c.now().Add(wait).After(dl) {
			return last // the next attempt could not finish in time
		}
		if err := c.sleep(ctx, wait); err != nil {
			return last
		}
	}
}

func (c *Client) shouldRetry(x exchange, o outcome) bool {
	if o.err != nil {
		var nr notRetryable
		return !errors.As(o.err, &nr)
	}
	return transientStatus(o.status) && !x.answers[o.status]
}

// notRetryable marks a failure that would happen again: a malformed URL,
// a certificate this host does not trust.
type notRetryable struct{ error }

func (n notRetryable) Unwrap() error { return n.error }

// attempt sends the exchange once and reads the whole answer.
func (c *Client) attempt(ctx context.Context, x exchange) outcome {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, x.url, nil)
	if err != nil {
		return outcome{err: notRetryable{err}}
	}
	body := x.body
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	req.ContentLength = int64(len(body))
	ts := x.timestamp
	if ts == "" {
		ts = signing.Timestamp(c.now())
	}
	h := req.Header
	h.Set("Content-Type", "application/json")
	h.Set("Accept", "application/json")
	h.Set("User-Agent", c.userAgent)
	if x.bearer != "" {
		h.Set("Authorization", "Bearer "+x.bearer)
	} else {
		h.Set(c.headers.Signature, signBody(c.secret, body, ts))
		h.Set(c.headers.Timestamp, ts)
	}
	if x.idempotencyKey != "" {
		h.Set("Idempotency-Key", x.idempotencyKey)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		// A certificate this host does not trust will not be trusted on
		// the next attempt either: say so, and what to do, at once.
		if hint := certificateHint(err); hint != nil {
			return outcome{err: notRetryable{hint}}
		}
		return outcome{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err == nil && len(b) > maxResponseBytes {
		err = fmt.Errorf("answer larger than %d bytes", maxResponseBytes)
	}
	if err != nil {
		// The status line came but the answer was cut: for a report that
		// may already be recorded, which the idempotency key covers.
		return outcome{status: 0, err: fmt.Errorf("read answer (HTTP %d): %w", resp.StatusCode, err)}
	}
	return outcome{status: resp.StatusCode, header: resp.Header, body: b}
}

// failure turns a non-2xx outcome into the error returned to the caller.
func (c *Client) failure(op string, o outcome) error {
	if o.err != nil {
		if o.attempts > 1 {
			return fmt.Errorf("sdk: %s: after %d attempts: %w", op, o.attempts, o.err)
		}
		return fmt.Errorf("sdk: %s: %w", op, o.err)
	}
	e := decodeAPIError(o.status, o.header, o.body, c.now())
	if e.RequestID == "" {
		e.RequestID = o.header.Get(c.headers.RequestID)
	}
	return fmt.Errorf("sdk: %s: %w", op, e)
}
