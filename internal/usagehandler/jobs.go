package usagehandler

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/wire"
)

// Limits of the short texts a backend sends about a job.
const (
	maxStageBytes        = 1 << 10
	maxErrorMessageBytes = 4 << 10
	maxResultURLBytes    = 8 << 10
	maxContentTypeBytes  = 255
)

// Sentinels that stop a job update without writing anything.
var (
	// errExpired: the job ran past its deadline and is failed (or about
	// to be, by the sweep): 409 to the backend.
	errExpired = errors.New("job expired")
	// errSameCompletion: the job completed with this very completion
	// before; the backend's retry is answered 200 again. The store runs
	// fn only on a job whose last change is durable (a retry that comes
	// while the first is still being written waits for it), so the 200
	// never acknowledges a completion the store may yet refuse.
	errSameCompletion = errors.New("same completion again")
)

// signedJob authenticates a backend's request about a job: the job must
// exist and the signer must be the job's service. A signature the job's
// service did not make is 401 invalid_signature, whoever made it: it is
// checked against that service's secrets only, so a refused request costs
// the same whatever the catalog holds (checking it against every other
// service's secrets, to tell "another service signed", made each forged
// request hash its body once per service). The timestamp may be as old as
// the job, since SDKs reuse the one handed to them in the callback URL.
func (h *Handler) signedJob(r *http.Request, id, route string) (signedRequest, store.Job, *catalog.Service, *apierror.Error) {
	s, e := h.readSigned(r)
	if e != nil {
		return s, store.Job{}, nil, e
	}
	notFound := apierror.New(apierror.RequestNotFound, "no request "+apierror.QuoteID(id))
	job, err := h.rt.Jobs().GetJob(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) {
		return s, job, nil, notFound
	}
	if err != nil {
		return s, job, nil, h.storeError(err, "job lookup failed", "job lookup")
	}
	svc, ok := h.rt.Catalog.Service(job.ServiceID)
	if !ok { // the service left the catalog: nobody can sign for the job
		return s, job, nil, notFound
	}
	if e := h.verify(s, svc, job.CreatedAt, h.rt.Now(), route); e != nil {
		return s, job, nil, e
	}
	return s, job, svc, nil
}

// progress records a backend's progress on a job: PENDING becomes RUNNING.
func (h *Handler) progress(w http.ResponseWriter, r *http.Request, id string) {
	s, _, _, e := h.signedJob(r, id, "progress")
	if e != nil {
		h.refuse(w, r, e)
		return
	}
	now := h.rt.Now()
	p, e := parseProgress(s.body, now, time.Duration(h.rt.Limits.TimestampTolerance))
	if e != nil {
		h.refuse(w, r, e)
		return
	}
	var started bool
	job, err := h.rt.Jobs().UpdateJob(r.Context(), id, func(j *store.Job) error {
		if j.Terminal() {
			return engine.ErrJobFinished
		}
		if j.Expired(now) {
			return errExpired
		}
		started = j.Status == store.JobPending
		j.Status = store.JobRunning
		j.Stage = p.Stage
		j.PercentageComplete = p.Percentage
		if p.HasError {
			j.ErrorMessage = p.ErrorMessage
		}
		j.UpdatedAt = now.UTC()
		return nil
	})
	if e := h.jobWriteError(err, id); e != nil {
		h.refuse(w, r, e)
		return
	}
	if started {
		h.rt.CountJobState(store.JobRunning)
	}
	body, _ := json.Marshal(wire.JobAck{RequestID: job.ID, Status: job.Status})
	writeJSON(w, http.StatusOK, body)
}

// jobWriteError maps the outcome of a job update to the backend's answer.
func (h *Handler) jobWriteError(err error, id string) *apierror.Error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, engine.ErrJobFinished):
		return apierror.New(apierror.RequestAlreadyCompleted, "request "+apierror.QuoteID(id)+" has already finished")
	case errors.Is(err, errExpired):
		return apierror.New(apierror.RequestAlreadyCompleted, "request "+apierror.QuoteID(id)+" expired: "+engine.JobExpiredMessage)
	case errors.Is(err, store.ErrNotFound):
		return apierror.New(apierror.RequestNotFound, "no request "+apierror.QuoteID(id))
	}
	return h.storeError(err, "the job could not be updated", "job update", zap.String("request_id", id))
}

// progressUpdate is a validated progress body.
type progressUpdate struct {
	Stage        string
	Percentage   float64
	ErrorMessage string
	HasError     bool
}

func parseProgress(body []byte, now time.Time, skew time.Duration) (progressUpdate, *apierror.Error) {
	var p progressUpdate
	f, e := parseObject(body)
	if e != nil {
		return p, e
	}
	stage, ok, e := f.str("stage")
	if e != nil {
		return p, e
	}
	if !ok || strings.TrimSpace(stage) == "" {
		return p, apierror.Invalid("stage", "stage is required")
	}
	if len(stage) > maxStageBytes {
		return p, apierror.Invalid("stage", "stage is longer than 1 KiB")
	}
	p.Stage = storable(stage) // measured as sent: what a store file took before
	pct, ok, e := f.number("percentageComplete")
	if e != nil {
		return p, e
	}
	if !ok {
		return p, apierror.Invalid("percentageComplete", "percentageComplete is required")
	}
	if pct < 0 || pct > 100 {
		return p, apierror.Invalid("percentageComplete", "percentageComplete must be between 0 and 100")
	}
	p.Percentage = pct
	msg, ok, e := f.str("errorMessage")
	if e != nil {
		return p, e
	}
	p.ErrorMessage, _ = cut(storable(msg), maxErrorMessageBytes)
	p.HasError = ok
	if _, e := f.timestamp(now, skew); e != nil {
		return p, e
	}
	return p, nil
}

// completion is a validated completion body.
type completion struct {
	Status       string // COMPLETED or FAILED
	Result       string // as sent, before the cap
	HasResult    bool
	ResultURL    string
	ContentType  string
	Units        billing.Units
	HasUnits     bool
	ErrorMessage string
}

// parseCompletion validates a completion. A status other than FAILED
// (any case), blank or unknown, counts as COMPLETED. A result that is not
// a string (an object, say) is kept as its JSON text, typed
// application/json unless the backend said otherwise.
func parseCompletion(body []byte, now time.Time, skew time.Duration) (completion, *apierror.Error) {
	var c completion
	f, e := parseObject(body)
	if e != nil {
		return c, e
	}
	status, _, e := f.str("status")
	if e != nil {
		return c, e
	}
	c.Status = store.JobCompleted
	if strings.EqualFold(strings.TrimSpace(status), store.JobFailed) {
		c.Status = store.JobFailed
	}
	raw, ok, e := f.get("result")
	if e != nil {
		return c, e
	}
	if ok {
		c.HasResult = true
		if raw[0] == '"' {
			if err := json.Unmarshal(raw, &c.Result); err != nil {
				return c, apierror.Invalid("result", "result must be a string or JSON value")
			}
			c.Result = storable(c.Result)
		} else {
			c.Result = validText(compactJSON(raw))
			c.ContentType = "application/json"
		}
	}
	if u, ok, e := f.str("resultUrl"); e != nil {
		return c, e
	} else if ok && u != "" {
		if !webURL(u) {
			return c, apierror.Invalid("resultUrl", "resultUrl must be an absolute http or https URL of at most 8 KiB")
		}
		c.ResultURL = u
	}
	if ct, ok, e := f.str("contentType"); e != nil {
		return c, e
	} else if ok && ct != "" {
		if _, _, err := mime.ParseMediaType(ct); err != nil || len(ct) > maxContentTypeBytes {
			return c, apierror.Invalid("contentType", "contentType must be a media type such as application/json")
		}
		c.ContentType = storable(ct) // a quoted parameter may hold U+0000
	}
	if c.Units, c.HasUnits, e = f.units("units"); e != nil {
		return c, e
	}
	// The usage report's name for the units, in any case: read as an
	// unknown field, {"unitsUsed":7} completed a PER_TOKEN job with its
	// units never charged (TestUsageFieldNamesInAnotherCase).
	if _, named, _ := f.get("unitsUsed"); named {
		return c, apierror.Invalid("units", "a completion states its units in units; unitsUsed is the usage report's field")
	}
	msg, _, e := f.str("errorMessage")
	if e != nil {
		return c, e
	}
	c.ErrorMessage, _ = cut(storable(msg), maxErrorMessageBytes)
	if _, e := f.timestamp(now, skew); e != nil {
		return c, e
	}
	return c, nil
}

func compactJSON(raw json.RawMessage) string {
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return string(raw)
	}
	return b.String()
}

// validText is s with each byte that is not UTF-8 written as U+FFFD, as
// encoding/json writes a string (and both stores keep a job's texts):
// a result sent as a JSON value is raw body bytes, which a string result
// never is, so its size and cap were counted on bytes no store kept.
func validText(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			b.WriteString("\uFFFD")
		} else {
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// webURL accepts an absolute http or https URL with a host.
func webURL(s string) bool {
	if len(s) > maxResultURLBytes {
		return false
	}
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || u.User != nil {
		return false
	}
	scheme := strings.ToLower(u.Scheme)
	return scheme == "http" || scheme == "https"
}

// digest identifies a completion by what it says, not how it was written
// or signed (the timestamp is left out), so a backend's retry of the same
// completion is recognised.
func (c completion) digest() string {
	norm := struct {
		Status, Result, ResultURL, ContentType, ErrorMessage string
		HasResult, HasUnits                                  bool
		Units                                                billing.Units
	}{c.Status, c.Result, c.ResultURL, c.ContentType, c.ErrorMessage, c.HasResult, c.HasUnits, c.Units}
	b, _ := json.Marshal(norm)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// chargedUnits is what a completion meters: the units the backend states;
// when it states none, a COMPLETED job of a PER_REQUEST product (or a
// service owner's free job) is one call at the endpoint's cost, t.cost
// (none when t.hasCost is false: the endpoint left the catalog of a job
// stored without terms). A FAILED job is not charged, as a sync call the
// backend fails is not.
func chargedUnits(c completion, t jobTerms) billing.Units {
	if c.Status == store.JobFailed {
		return 0
	}
	if c.HasUnits {
		return c.Units
	}
	if t.hasCost && (t.product == nil || t.product.MeasurementType == billing.PerRequest) {
		return t.cost
	}
	return 0
}

// complete records a job's completion and meters its units, once: the
// store settles them against the job's hold in the same transaction,
// charging at most what the hard limits allow, and a FAILED job only
// releases its hold.
func (h *Handler) complete(w http.ResponseWriter, r *http.Request, id string) {
	s, job, svc, e := h.signedJob(r, id, "complete")
	if e != nil {
		h.refuse(w, r, e)
		return
	}
	now := h.rt.Now()
	c, e := parseCompletion(s.body, now, time.Duration(h.rt.Limits.TimestampTolerance))
	if e != nil {
		h.refuse(w, r, e)
		return
	}
	terms := h.jobTerms(job, svc)
	account := terms.account
	ep, _ := svc.Endpoint(job.EndpointID) // nil when a reload removed it
	entry := store.LedgerEntry{
		Time:       now.UTC(),
		UserID:     job.UserID,
		ServiceID:  job.ServiceID,
		EndpointID: job.EndpointID,
		RequestID:  job.ID,
		Units:      chargedUnits(c, terms),
		Source:     store.SourceCompletion,
	}
	if terms.product != nil {
		entry.ProductID = terms.product.ID
	}
	digest := c.digest()
	resultCap := h.rt.Limits.ResultMaxBytes
	done, err := h.rt.Jobs().CompleteJob(r.Context(), id, account, entry, func(j *store.Job) error {
		if j.Terminal() {
			if j.CompletionDigest != "" && j.CompletionDigest == digest {
				return errSameCompletion
			}
			return engine.ErrJobFinished
		}
		if j.Expired(now) {
			return errExpired
		}
		t := now.UTC()
		j.Status = c.Status
		j.UpdatedAt, j.CompletedAt = t, t
		j.CompletionDigest = digest
		j.Result, j.ResultTruncated = cut(c.Result, resultCap)
		j.ResultSize = len(c.Result)
		j.ResultURL = c.ResultURL
		j.ContentType = c.ContentType
		if c.Status == store.JobCompleted {
			j.PercentageComplete = 100
		} else {
			j.ErrorMessage = failureMessage(c, j.ErrorMessage)
		}
		return nil
	})
	if errors.Is(err, errSameCompletion) {
		body, _ := json.Marshal(wire.JobAck{RequestID: id, Status: c.Status})
		writeJSON(w, http.StatusOK, body)
		return
	}
	if e := h.jobWriteError(err, id); e != nil {
		h.refuse(w, r, e)
		return
	}
	// The caller's next jobs hold what this one claimed (before a hard
	// limit cut it), once the completion is taken: a completion refused
	// (the job ended or expired, a store error) charged nothing and
	// raised those holds all the same, refusing the next job for quota.
	if ep != nil && entry.Units > 0 {
		h.rt.NoteCharge(account, ep, entry.Units)
	}
	h.rt.CountJobState(done.Status)
	if done.Units > 0 { // what was charged, which a hard limit may have cut
		h.rt.CountUnits(job.ServiceID, store.SourceCompletion, int64(done.Units))
	}
	body, _ := json.Marshal(wire.JobAck{RequestID: done.ID, Status: done.Status})
	writeJSON(w, http.StatusOK, body)
}

// failureMessage is the errorMessage of a job its backend failed: what the
// backend said, else its inline result (the spec lets error text travel
// there), else the last progress error, else a generic text.
func failureMessage(c completion, previous string) string {
	switch {
	case c.ErrorMessage != "":
		return c.ErrorMessage
	case c.Result != "":
		msg, _ := cut(c.Result, maxErrorMessageBytes)
		return msg
	case previous != "":
		return previous
	}
	return "the service reported the job as failed"
}

// jobTerms is what a job's completion is charged with.
type jobTerms struct {
	account store.Account
	product *billing.Product // nil: recorded free
	cost    billing.Units    // the endpoint's per-call cost
	hasCost bool
}

// jobTerms are the terms a job is charged under: those it was accepted
// under (store.Job.Terms: the product and the endpoint's cost then),
// whatever a reload or a plan change did since, as a sync call admitted
// at the same instant is charged. The store charges the job under them
// whatever account it is handed (store.Job.Charge); they are read here
// for the units a completion without any is charged (chargedUnits).
//
// A job stored without terms (by a version before they were kept) is
// charged as that version charged it: under the product it was started
// with as the catalog offers it now, or, when the catalog no longer
// offers it, the subscription's current product, else free; and at the
// endpoint's current cost, none when the endpoint is gone. A service
// owner's job is recorded free.
func (h *Handler) jobTerms(job store.Job, svc *catalog.Service) jobTerms {
	t := jobTerms{account: store.Account{UserID: job.UserID, ServiceID: job.ServiceID}}
	if job.Terms != nil {
		t.cost, t.hasCost = job.Terms.EndpointCost, true
		t.account, _ = job.Charge(t.account, store.LedgerEntry{}) // the store's one reading of the terms
		if !t.account.Free {
			p := t.account.Product
			t.product = &p
		}
		return t
	}
	if ep, ok := svc.Endpoint(job.EndpointID); ok {
		t.cost, t.hasCost = ep.UnitCost(), true
	}
	if job.Free {
		t.account.Free = true
		return t
	}
	p, ok := svc.Product(job.ProductID)
	if !ok {
		if sub, err := h.rt.Subscriptions().GetSubscription(context.Background(), job.UserID, job.ServiceID); err == nil {
			p, ok = svc.Product(sub.ProductID)
		}
	}
	if !ok {
		// Nothing left to price the units with: record them free rather
		// than refuse a completion the backend cannot change.
		h.logger.Error("job's product is no longer offered; its units are recorded unpriced",
			zap.String("request_id", job.ID), zap.String("product", job.ProductID))
		t.account.Free = true
		return t
	}
	t.account.Product, t.product = *p, p
	return t
}
