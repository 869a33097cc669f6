package sdk

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/platformgw/gateway/internal/signing"
	"github.com/platformgw/gateway/internal/wire"
)

// Final statuses of an async job, the Status of a Completion.
const (
	StatusCompleted = "COMPLETED"
	StatusFailed    = "FAILED"
)

// Progress is an update on an async job: POST {usage}/progress/{id}. The
// first one moves the job from PENDING to RUNNING; callers see the stage and
// percentage when they poll.
type Progress struct {
	Stage              string  // what the job is doing now (required)
	PercentageComplete float64 // 0 to 100
	ErrorMessage       string  // optional
	Timestamp          time.Time
}

// Completion finishes an async job: POST {usage}/complete/{id}. A job
// completes once; the same completion sent again is answered 200 (so a
// retry is safe), a different one 409 request_already_completed.
type Completion struct {
	// Status is StatusCompleted (the default when empty) or StatusFailed.
	Status string
	// Result is the inline result: a short string (a summary, or error
	// text) or any JSON value. The server caps it (16 KiB by default);
	// large outputs belong at ResultURL.
	Result      any
	ResultURL   string // absolute http(s) URL of a large output
	ContentType string // media type of the result, e.g. "text/plain"
	// Units are charged to the job's subscription, exactly once. Nil lets
	// the gateway decide: one call at the endpoint's cost for a
	// PER_REQUEST product, nothing for other measurement types, so their
	// backends state the units. A FAILED job is never charged.
	Units        *Units
	ErrorMessage string // the text a FAILED job shows
	Timestamp    time.Time

	// For the reconciliation log only; never sent.
	UserID           string // the caller, CallerContext.UserID
	BackendRequestID string
	KeyRef           string
	Endpoint         string
}

// JobAck is the usage service's answer to progress or a completion.
type JobAck struct {
	RequestID string `json:"requestId"`
	Status    string `json:"status"` // the job's state now: RUNNING, COMPLETED or FAILED
	Attempts  int    `json:"-"`
}

type progressBody struct {
	Stage              string  `json:"stage"`
	PercentageComplete float64 `json:"percentageComplete"`
	ErrorMessage       string  `json:"errorMessage,omitempty"`
	Timestamp          string  `json:"timestamp"`
}

type completionBody struct {
	Status       string `json:"status"`
	Result       any    `json:"result,omitempty"`
	ResultURL    string `json:"resultUrl,omitempty"`
	ContentType  string `json:"contentType,omitempty"`
	Units        *Units `json:"units,omitempty"`
	ErrorMessage string `json:"errorMessage,omitempty"`
	Timestamp    string `json:"timestamp"`
}

// ReportProgress posts progress on an async job. target is the job's
// progress_url exactly as the gateway handed it over in the async envelope
// (AsyncJob.ProgressURL), or the job's request id.
//
// With the URL, the request is signed with the timestamp in its query, as
// the SDKs of the platform this gateway replaces do (the usage service
// accepts any time from the job's creation), and posted without the query.
// With a request id, the URL is built from the Client's base URL and usage
// prefix and signed with the current time.
func (c *Client) ReportProgress(ctx context.Context, target string, p Progress) (*JobAck, error) {
	const op = "report progress"
	if strings.TrimSpace(p.Stage) == "" {
		return nil, fmt.Errorf("sdk: %s: empty stage", op)
	}
	if !(p.PercentageComplete >= 0 && p.PercentageComplete <= 100) {
		return nil, fmt.Errorf("sdk: %s: percentage %v is not between 0 and 100", op, p.PercentageComplete)
	}
	t, err := c.jobTarget(target, "progress")
	if err != nil {
		return nil, fmt.Errorf("sdk: %s: %w", op, err)
	}
	if p.Timestamp.IsZero() {
		p.Timestamp = c.now()
	}
	body, err := json.Marshal(progressBody{
		Stage:              p.Stage,
		PercentageComplete: p.PercentageComplete,
		ErrorMessage:       p.ErrorMessage,
		Timestamp:          isoTime(p.Timestamp),
	})
	if err != nil {
		return nil, fmt.Errorf("sdk: %s: encode: %w", op, err)
	}
	o := c.do(ctx, exchange{op: op, url: t.url, body: body, timestamp: t.timestamp})
	return c.decodeAck(op, o)
}

// ReportCompletion finishes an async job. target is the job's
// callback_url as handed over (AsyncJob.CallbackURL) or its request id,
// signed as described at ReportProgress. Transient failures are retried:
// the usage service answers the same completion repeated with 200 and
// charges its units once.
func (c *Client) ReportCompletion(ctx context.Context, target string, comp Completion) (*JobAck, error) {
	const op = "report completion"
	t, err := c.jobTarget(target, "complete")
	if err != nil {
		return nil, fmt.Errorf("sdk: %s: %w", op, err)
	}
	if comp.Status == "" {
		comp.Status = StatusCompleted
	}
	if comp.Units != nil && *comp.Units < 0 {
		return nil, fmt.Errorf("sdk: %s: negative units %s", op, comp.Units)
	}
	if comp.Timestamp.IsZero() {
		comp.Timestamp = c.now()
	}
	body, err := json.Marshal(completionBody{
		Status:       comp.Status,
		Result:       comp.Result,
		ResultURL:    comp.ResultURL,
		ContentType:  comp.ContentType,
		Units:        comp.Units,
		ErrorMessage: comp.ErrorMessage,
		Timestamp:    isoTime(comp.Timestamp),
	})
	if err != nil {
		return nil, fmt.Errorf("sdk: %s: encode: %w", op, err)
	}
	o := c.do(ctx, exchange{op: op, url: t.url, body: body, timestamp: t.timestamp})
	ack, err := c.decodeAck(op, o)
	c.record(ReconciliationRecord{
		Operation:         "completion",
		PlatformRequestID: t.requestID,
		BackendRequestID:  comp.BackendRequestID,
		KeyRef:            comp.KeyRef,
		UserID:            comp.UserID,
		ServiceID:         c.serviceID,
		Endpoint:          comp.Endpoint,
		Timestamp:         comp.Timestamp,
		UnitsReported:     comp.Units,
	}, o, err)
	return ack, err
}

func (c *Client) decodeAck(op string, o outcome) (*JobAck, error) {
	if o.err != nil || o.status != http.StatusOK {
		return nil, c.failure(op, o)
	}
	var ack wire.JobAck
	if err := json.Unmarshal(o.body, &ack); err != nil {
		return nil, fmt.Errorf("sdk: %s: the usage service answered 200 with an unreadable body: %w", op, err)
	}
	return &JobAck{RequestID: ack.RequestID, Status: ack.Status, Attempts: o.attempts}, nil
}

// jobTarget is where progress or a completion goes and how it is signed.
type jobTarget struct {
	url       string
	timestamp string // "" signs the current time on each attempt
	requestID string
}

// jobTarget resolves a progress_url, callback_url or request id. kind is
// "progress" or "complete", the path segment before the id: a URL of the
// other kind is refused, since a progress body posted to a completion URL
// would finish the job.
func (c *Client) jobTarget(target, kind string) (jobTarget, error) {
	target = strings.TrimSpace(target)
	if target == "" {
		return jobTarget{}, fmt.Errorf("empty %s URL or request id", kind)
	}
	lower := strings.ToLower(target)
	if !strings.HasPrefix(lower, "http://") && !strings.HasPrefix(lower, "https://") {
		if strings.ContainsAny(target, "/?#") {
			return jobTarget{}, fmt.Errorf("%q is neither an absolute URL nor a request id", target)
		}
		return jobTarget{url: c.usageBase + "/" + kind + "/" + url.PathEscape(target), requestID: target}, nil
	}
	u, err := url.Parse(target)
	if err != nil || u.Host == "" {
		return jobTarget{}, fmt.Errorf("invalid %s URL", kind)
	}
	segs := strings.Split(strings.TrimRight(u.EscapedPath(), "/"), "/")
	if len(segs) < 2 {
		return jobTarget{}, fmt.Errorf("%s URL has no request id in its path", kind)
	}
	id, err := url.PathUnescape(segs[len(segs)-1])
	if err != nil || id == "" {
		return jobTarget{}, fmt.Errorf("%s URL has no request id in its path", kind)
	}
	// The caller's status URL ({gw}/requests/{id}/status) also takes
	// progress; the id is then the segment before "status".
	parent := segs[len(segs)-2]
	switch {
	case parent == kind:
	case kind == "progress" && id == "status" && len(segs) >= 3 && segs[len(segs)-3] == "requests":
		id, _ = url.PathUnescape(parent)
	default:
		return jobTarget{}, fmt.Errorf("%s URL must end in /%s/{requestId}", kind, kind)
	}
	t := jobTarget{requestID: id}
	// The timestamp handed out with the URL is the one to sign with; a
	// malformed one would be refused, so the current time is used instead.
	if ts := u.Query().Get("timestamp"); ts != "" {
		if _, err := signing.ParseTimestamp(ts); err == nil {
			t.timestamp = ts
		}
	}
	if c.rebase {
		t.url = c.usageBase + "/" + kind + "/" + url.PathEscape(id)
		return t, nil
	}
	// The query (signature and timestamp of the gateway's forward) stays
	// here: it is not part of the usage route.
	u.RawQuery, u.ForceQuery, u.Fragment, u.RawFragment = "", false, "", ""
	t.url = u.String()
	return t, nil
}
