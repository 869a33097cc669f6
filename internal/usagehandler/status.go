package usagehandler

import (
	"errors"
	"math"
	"net/http"
	"time"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/wire"
)

// statusResponse is a job's state as its caller polls it.
type statusResponse struct {
	RequestID          string        `json:"requestId"`
	Status             string        `json:"status"`
	StartTime          millisTime    `json:"startTime"`
	CurrentStage       *string       `json:"currentStage"`
	PercentageComplete float64       `json:"percentageComplete"`
	ErrorMessage       *string       `json:"errorMessage"`
	ElapsedHours       float64       `json:"elapsedHours"`
	CurrentCost        billing.Units `json:"currentCost"`
}

// millisTime is a time as the job routes write it: UTC, RFC 3339 with
// milliseconds, always three digits ("2026-05-01T10:00:00.000Z"), as a
// wrapped answer's completedAt. time.Time wrote 0 to 9 digits, as many as
// the store kept (nanoseconds in bbolt, microseconds in PostgreSQL).
type millisTime time.Time

func (t millisTime) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 26)
	b = append(b, '"')
	b = time.Time(t).UTC().AppendFormat(b, wire.TimeMillis)
	return append(b, '"'), nil
}

// resultResponse is a completed job's result.
type resultResponse struct {
	RequestID   string     `json:"requestId"`
	Status      string     `json:"status"`
	Result      *string    `json:"result"`
	ContentType *string    `json:"contentType"`
	ResultURL   *string    `json:"resultUrl"`
	CompletedAt millisTime `json:"completedAt"`
	// Size is the result's length in bytes as the backend sent it, before
	// the inline cap; Truncated says the inline result was cut.
	Size      int  `json:"size"`
	Truncated bool `json:"truncated"`
}

// callerJob authenticates the caller and finds one of its jobs. Another
// user's job answers like an unknown one.
func (h *Handler) callerJob(r *http.Request, id string) (store.Job, *apierror.Error) {
	key, e := h.rt.AuthenticateKey(r)
	if e != nil {
		return store.Job{}, e
	}
	job, err := h.rt.Jobs().GetJob(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) || err == nil && job.UserID != key.UserID {
		return store.Job{}, apierror.New(apierror.RequestNotFound, "no request "+apierror.QuoteID(id))
	}
	if err != nil {
		return store.Job{}, h.storeError(err, "job lookup failed", "job lookup")
	}
	return effective(job, h.rt.Now()), nil
}

// effective shows a job past its deadline as the expiry sweep will leave
// it, so callers never see a job running beyond its TTL between sweeps.
func effective(j store.Job, now time.Time) store.Job {
	if !j.Terminal() && j.Expired(now) {
		j.Status = store.JobFailed
		j.ErrorMessage = engine.JobExpiredMessage
		j.CompletedAt = j.ExpiresAt
	}
	return j
}

// status answers GET {gw}/requests/{id}/status (and GET on the progress URL).
func (h *Handler) status(w http.ResponseWriter, r *http.Request, id string) {
	job, e := h.callerJob(r, id)
	if e != nil {
		h.refuse(w, r, e)
		return
	}
	body, _ := marshal(statusOf(job, h.rt.Now()))
	writeJobJSON(w, http.StatusOK, body)
}

// result answers GET {gw}/requests/{id}/result: the result once COMPLETED,
// 202 with the status while the job runs, 500 with the status when it
// FAILED.
func (h *Handler) result(w http.ResponseWriter, r *http.Request, id string) {
	job, e := h.callerJob(r, id)
	if e != nil {
		h.refuse(w, r, e)
		return
	}
	switch job.Status {
	case store.JobCompleted:
		body, _ := marshal(resultResponse{
			RequestID:   job.ID,
			Status:      job.Status,
			Result:      nonEmpty(job.Result),
			ContentType: nonEmpty(job.ContentType),
			ResultURL:   nonEmpty(job.ResultURL),
			CompletedAt: millisTime(job.CompletedAt),
			Size:        job.ResultSize,
			Truncated:   job.ResultTruncated,
		})
		writeJobJSON(w, http.StatusOK, body)
	case store.JobFailed:
		body, _ := marshal(statusOf(job, h.rt.Now()))
		writeJobJSON(w, http.StatusInternalServerError, body)
	default:
		body, _ := marshal(statusOf(job, h.rt.Now()))
		writeJobJSON(w, http.StatusAccepted, body)
	}
}

func statusOf(j store.Job, now time.Time) statusResponse {
	end := now
	if j.Terminal() && !j.CompletedAt.IsZero() {
		end = j.CompletedAt
	}
	hours := max(0, end.Sub(j.CreatedAt).Hours())
	return statusResponse{
		RequestID:          j.ID,
		Status:             j.Status,
		StartTime:          millisTime(j.CreatedAt),
		CurrentStage:       nonEmpty(j.Stage),
		PercentageComplete: j.PercentageComplete,
		ErrorMessage:       nonEmpty(j.ErrorMessage),
		ElapsedHours:       math.Round(hours*1e4) / 1e4,
		CurrentCost:        j.Cost,
	}
}

func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// writeJobJSON sends a job's status or result. A result is the backend's
// text and may be HTML: these headers keep a browser from ever rendering
// or sniffing it as a page.
func writeJobJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Security-Policy", "default-src 'none'; sandbox")
	writeJSON(w, status, body)
}
