package console

import (
	"cmp"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/store"
)

// jobStates are the states a job listing filters on.
var jobStates = []string{store.JobPending, store.JobRunning, store.JobCompleted, store.JobFailed}

// jobStateWords says a job's state as an operator reads it.
func jobStateWords(status string) string {
	switch status {
	case store.JobPending:
		return "waiting to start"
	case store.JobRunning:
		return "running"
	case store.JobCompleted:
		return "completed"
	case store.JobFailed:
		return "failed"
	}
	return strings.ToLower(status)
}

// previewBytes is how much of an inline result the job page shows; the
// rest is one link away, so a long result never makes the page long.
const previewBytes = 2000

// maxJobsSorted bounds the jobs a listing reads to sort them by creation
// time (the store lists them in job id order, which is no order a person
// reads); past it the listing says it is partial.
const maxJobsSorted = 10000

// jobs: the jobs, newest first, a page at a time.
func (h *Handler) jobs(q *req) error {
	qs := q.r.URL.Query()
	f := store.JobFilter{Status: strings.ToUpper(qs.Get("status")), UserID: qs.Get("user"), ServiceID: qs.Get("service")}
	if f.Status != "" && !slices.Contains(jobStates, f.Status) {
		return apierror.Invalid("status", "Choose a state from the list: waiting, running, completed or failed.")
	}
	pageNo := 1
	if p := qs.Get("page"); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 {
			return apierror.Invalid("page", "The page number must be a whole number from 1.")
		}
		pageNo = n
	}
	var all []store.Job
	partial := false
	cursor := ""
	for {
		page, next, err := h.rt.Store().ListJobs(q.r.Context(), f, cursor, 1000)
		if errors.Is(err, store.ErrBadCursor) {
			return apierror.Invalid("cursor", "That listing is out of date; open Jobs again.")
		}
		if err != nil {
			return err
		}
		all = append(all, page...)
		if next == "" {
			break
		}
		if len(all) >= maxJobsSorted {
			partial = true
			break
		}
		cursor = next
	}
	slices.SortFunc(all, func(a, b store.Job) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	lo := min(len(all), (pageNo-1)*pageRows)
	hi := min(len(all), lo+pageRows)
	next := ""
	if hi < len(all) {
		next = strconv.Itoa(pageNo + 1)
	}
	prev := ""
	if pageNo > 1 {
		prev = strconv.Itoa(pageNo - 1)
	}
	h.render(q, http.StatusOK, "jobs", "Jobs", map[string]any{
		"Jobs": all[lo:hi], "Next": next, "Prev": prev, "Filter": f, "Partial": partial,
		"States": jobStates, "Now": h.rt.Now(), "StuckAfter": stuckAfter,
	})
	return nil
}

type step struct {
	At   time.Time
	What string
}

// job: one job and its timeline. The store keeps a job's latest stage and
// percentage, not each progress report, so the timeline has the creation,
// the latest progress and the end.
func (h *Handler) job(q *req, id string) error {
	j, err := h.rt.Store().GetJob(q.r.Context(), id)
	if errors.Is(err, store.ErrNotFound) {
		return apierror.New(apierror.RequestNotFound, "There is no job "+id+" (it may have expired).")
	}
	if err != nil {
		return err
	}
	steps := []step{{j.CreatedAt, "created, waiting to start"}}
	switch {
	case !j.Terminal() && (j.Stage != "" || j.PercentageComplete > 0 || j.Status == store.JobRunning):
		what := "latest progress: " + jobStateWords(j.Status)
		if j.Stage != "" {
			what += ", stage " + j.Stage
		}
		steps = append(steps, step{j.UpdatedAt, what})
	case j.Terminal() && j.Stage != "" && j.UpdatedAt.Before(j.CompletedAt):
		// The last stage reported before the end, not the end again.
		steps = append(steps, step{j.UpdatedAt, "last stage reported: " + j.Stage})
	}
	if !j.CompletedAt.IsZero() {
		what := jobStateWords(j.Status)
		if j.ErrorMessage != "" {
			what += ": " + j.ErrorMessage
		}
		steps = append(steps, step{j.CompletedAt, what})
	}
	preview, cut := j.Result, false
	if len(preview) > previewBytes {
		preview, cut = strings.ToValidUTF8(preview[:previewBytes], ""), true
	}
	h.render(q, http.StatusOK, "job", "Job "+id, map[string]any{
		"Job": j, "Steps": steps, "Percent": int(j.PercentageComplete),
		"State": jobStateWords(j.Status), "Preview": preview, "PreviewCut": cut,
		"CostKind": h.costKindOf(j.ServiceID, j.ProductID),
	})
	return nil
}

// jobResult serves a job's whole inline result as plain text, for the
// link under the job page's preview: the browser shows it in a page of
// its own, never as HTML (nosniff, and the console's CSP).
func (h *Handler) jobResult(q *req, id string) error {
	j, err := h.rt.Store().GetJob(q.r.Context(), id)
	if errors.Is(err, store.ErrNotFound) {
		return apierror.New(apierror.RequestNotFound, "There is no job "+id+" (it may have expired).")
	}
	if err != nil {
		return err
	}
	q.w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	q.w.Write([]byte(j.Result))
	return nil
}
