package platform

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store"
)

// The operator's views: a user's subscriptions, the current (or any)
// billing period of each, and jobs by user, service and state. Listings
// come in pages (limit, cursor) so a large store is read a bounded piece
// at a time.

// pageParams reads limit and cursor.
func pageParams(q url.Values) (limit int, cursor string, err error) {
	limit = ops.DefaultPageLimit
	if v := q.Get("limit"); q.Has("limit") {
		n, convErr := strconv.Atoi(v)
		if convErr != nil || n < 1 || n > ops.MaxPageLimit {
			return 0, "", apierror.Invalid("limit", fmt.Sprintf("limit must be a whole number from 1 to %d", ops.MaxPageLimit))
		}
		limit = n
	}
	return limit, q.Get("cursor"), nil
}

// subscriptionPage is a page of subscriptions.
type subscriptionPage struct {
	Subscriptions []ops.SubscriptionRecord `json:"subscriptions"`
	NextCursor    string                   `json:"nextCursor,omitempty"`
}

// listSubscriptions: GET /platform/subscriptions[?userId=&limit=&cursor=].
func (a *adminAPI) listSubscriptions(app *App, w http.ResponseWriter, r *http.Request, _ []string) error {
	q := r.URL.Query()
	if err := checkQuery(q, "userId", "limit", "cursor"); err != nil {
		return err
	}
	userID := q.Get("userId")
	if q.Has("userId") {
		if err := ops.CheckUserID("userId", userID); err != nil {
			return err
		}
	}
	return a.writeSubscriptionPage(app, w, r, q, userID)
}

// listUserSubscriptions: GET /platform/subscriptions/{userId}[?limit=&cursor=].
func (a *adminAPI) listUserSubscriptions(app *App, w http.ResponseWriter, r *http.Request, args []string) error {
	q := r.URL.Query()
	if err := checkQuery(q, "limit", "cursor"); err != nil {
		return err
	}
	if err := ops.CheckUserID("userId", args[0]); err != nil {
		return err
	}
	return a.writeSubscriptionPage(app, w, r, q, args[0])
}

func (a *adminAPI) writeSubscriptionPage(app *App, w http.ResponseWriter, r *http.Request, q url.Values, userID string) error {
	limit, cursor, err := pageParams(q)
	if err != nil {
		return err
	}
	subs, next, err := app.DataStore().ListSubscriptions(r.Context(), userID, cursor, limit)
	if e := ops.BadCursor(err); e != nil {
		return e
	}
	if err != nil {
		return fmt.Errorf("list subscriptions: %w", err)
	}
	page := subscriptionPage{Subscriptions: make([]ops.SubscriptionRecord, len(subs)), NextCursor: next}
	for i, s := range subs {
		page.Subscriptions[i] = ops.ViewSubscription(s)
	}
	return writeJSON(w, http.StatusOK, page)
}

// jobStatuses are the states a job listing filters on.
var jobStatuses = []string{store.JobPending, store.JobRunning, store.JobCompleted, store.JobFailed}

// jobPage is a page of jobs.
type jobPage struct {
	Jobs       []ops.JobRecord `json:"jobs"`
	NextCursor string          `json:"nextCursor,omitempty"`
}

// listJobs: GET /platform/jobs[?userId=&serviceId=&status=&limit=&cursor=].
func (a *adminAPI) listJobs(app *App, w http.ResponseWriter, r *http.Request, _ []string) error {
	q := r.URL.Query()
	if err := checkQuery(q, "userId", "serviceId", "status", "limit", "cursor"); err != nil {
		return err
	}
	f := store.JobFilter{UserID: q.Get("userId"), ServiceID: q.Get("serviceId"), Status: strings.ToUpper(q.Get("status"))}
	if q.Has("userId") {
		if err := ops.CheckUserID("userId", f.UserID); err != nil {
			return err
		}
	}
	if q.Has("serviceId") && !catalog.ValidID(f.ServiceID) {
		return apierror.Invalid("serviceId", "serviceId is not a valid id")
	}
	if q.Has("status") && !slices.Contains(jobStatuses, f.Status) {
		return apierror.Invalid("status", "status must be one of "+strings.Join(jobStatuses, ", "))
	}
	limit, cursor, err := pageParams(q)
	if err != nil {
		return err
	}
	jobs, next, err := app.DataStore().ListJobs(r.Context(), f, cursor, limit)
	if e := ops.BadCursor(err); e != nil {
		return e
	}
	if err != nil {
		return fmt.Errorf("list jobs: %w", err)
	}
	page := jobPage{Jobs: make([]ops.JobRecord, len(jobs)), NextCursor: next}
	for i, j := range jobs {
		page.Jobs[i] = ops.ViewJob(j)
		if j.Cost != 0 {
			page.Jobs[i].CostUnit = ops.CostUnit(app.Catalog(), j.ServiceID, j.ProductID)
		}
	}
	return writeJSON(w, http.StatusOK, page)
}

// getUserSummary: GET /platform/users/{userId}/summary[?serviceId=&at=],
// the billing period containing at (now by default) of each of the user's
// subscriptions.
func (a *adminAPI) getUserSummary(app *App, w http.ResponseWriter, r *http.Request, args []string) error {
	q := r.URL.Query()
	if err := checkQuery(q, "serviceId", "at"); err != nil {
		return err
	}
	userID := args[0]
	if err := ops.CheckUserID("userId", userID); err != nil {
		return err
	}
	serviceID := q.Get("serviceId")
	if q.Has("serviceId") && !catalog.ValidID(serviceID) {
		return apierror.Invalid("serviceId", "serviceId is not a valid id")
	}
	at := app.Now().UTC()
	if q.Has("at") {
		t, err := ops.ParseTimeBound(q.Get("at"), false)
		if err != nil || t.IsZero() {
			return apierror.Invalid("at", "at must be an RFC 3339 time or a date (YYYY-MM-DD)")
		}
		at = t.UTC()
	}
	out, err := app.ops.Summary(r.Context(), userID, serviceID, at)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, out)
}
