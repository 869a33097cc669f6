package platform

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/store"
)

// The operator's views: a user's subscriptions, the current (or any)
// billing period of each, and jobs by user, service and state. Listings
// come in pages (limit, cursor) so a large store is read a bounded piece
// at a time.

// Page sizes of the listings.
const (
	defaultPageLimit = 100
	maxPageLimit     = 1000
)

// pageParams reads limit and cursor.
func pageParams(q url.Values) (limit int, cursor string, err error) {
	limit = defaultPageLimit
	if v := q.Get("limit"); q.Has("limit") {
		n, convErr := strconv.Atoi(v)
		if convErr != nil || n < 1 || n > maxPageLimit {
			return 0, "", apierror.Invalid("limit", fmt.Sprintf("limit must be a whole number from 1 to %d", maxPageLimit))
		}
		limit = n
	}
	return limit, q.Get("cursor"), nil
}

func badCursor(err error) error {
	if errors.Is(err, store.ErrBadCursor) {
		return apierror.Invalid("cursor", "cursor is not one this listing returned; start again without it")
	}
	return nil
}

// subscriptionPage is a page of subscriptions.
type subscriptionPage struct {
	Subscriptions []subscriptionRecord `json:"subscriptions"`
	NextCursor    string               `json:"nextCursor,omitempty"`
}

// listSubscriptions: GET /platform/subscriptions[?userId=&limit=&cursor=].
func (a *adminAPI) listSubscriptions(app *App, w http.ResponseWriter, r *http.Request, _ []string) error {
	q := r.URL.Query()
	if err := checkQuery(q, "userId", "limit", "cursor"); err != nil {
		return err
	}
	userID := q.Get("userId")
	if q.Has("userId") {
		if err := checkUserID("userId", userID); err != nil {
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
	if err := checkUserID("userId", args[0]); err != nil {
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
	if e := badCursor(err); e != nil {
		return e
	}
	if err != nil {
		return fmt.Errorf("list subscriptions: %w", err)
	}
	page := subscriptionPage{Subscriptions: make([]subscriptionRecord, len(subs)), NextCursor: next}
	for i, s := range subs {
		page.Subscriptions[i] = viewSubscription(s)
	}
	return writeJSON(w, http.StatusOK, page)
}

// jobStatuses are the states a job listing filters on.
var jobStatuses = []string{store.JobPending, store.JobRunning, store.JobCompleted, store.JobFailed}

// jobPage is a page of jobs.
type jobPage struct {
	Jobs       []jobRecord `json:"jobs"`
	NextCursor string      `json:"nextCursor,omitempty"`
}

// listJobs: GET /platform/jobs[?userId=&serviceId=&status=&limit=&cursor=].
func (a *adminAPI) listJobs(app *App, w http.ResponseWriter, r *http.Request, _ []string) error {
	q := r.URL.Query()
	if err := checkQuery(q, "userId", "serviceId", "status", "limit", "cursor"); err != nil {
		return err
	}
	f := store.JobFilter{UserID: q.Get("userId"), ServiceID: q.Get("serviceId"), Status: strings.ToUpper(q.Get("status"))}
	if q.Has("userId") {
		if err := checkUserID("userId", f.UserID); err != nil {
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
	if e := badCursor(err); e != nil {
		return e
	}
	if err != nil {
		return fmt.Errorf("list jobs: %w", err)
	}
	page := jobPage{Jobs: make([]jobRecord, len(jobs)), NextCursor: next}
	for i, j := range jobs {
		page.Jobs[i] = viewJob(j)
	}
	return writeJSON(w, http.StatusOK, page)
}

// periodSummary is one subscription's billing period as an operator reads
// it: what was used and held, what is left of the quota, the credits, and
// the spend against the cap. Fields that do not apply to the product are
// left out.
type periodSummary struct {
	ServiceID       string    `json:"serviceId"`
	ProductID       string    `json:"productId"`
	Status          string    `json:"status"`
	BillingModel    string    `json:"billingModel,omitempty"`
	MeasurementType string    `json:"measurementType,omitempty"`
	UnitLabel       string    `json:"unitLabel,omitempty"`
	PeriodStart     time.Time `json:"periodStart,omitzero"`
	PeriodEnd       time.Time `json:"periodEnd,omitzero"`
	// ProductMissing: the product is no longer in the catalog, so the
	// period and its figures cannot be told (calls are refused).
	ProductMissing bool           `json:"productMissing,omitempty"`
	UnitsUsed      billing.Units  `json:"unitsUsed"`
	UnitsHeld      billing.Units  `json:"unitsHeld"`
	Quota          *billing.Units `json:"quota,omitempty"`
	UnitsRemaining *billing.Units `json:"unitsRemaining,omitempty"`
	OverageUnits   *billing.Units `json:"overageUnits,omitempty"`
	Credits        billing.Units  `json:"credits"`
	CreditsHeld    billing.Units  `json:"creditsHeld"`
	Spend          billing.Units  `json:"spend"`
	SpendHeld      billing.Units  `json:"spendHeld"`
	SpendingCap    *billing.Units `json:"spendingCap,omitempty"`
	SpendRemaining *billing.Units `json:"spendingCapRemaining,omitempty"`
	// CallsCutAtLimit counts the period's calls, reports and completions
	// whose backend stated more units than a hard limit let the gateway
	// charge (their rows carry unitsClaimed and unitsUncharged).
	CallsCutAtLimit int64 `json:"callsCutAtLimit,omitempty"`
}

// summarize reads the period of sub that contains at, under the product
// of the running catalog.
func summarize(ctx context.Context, app *App, sub store.Subscription, at time.Time) (periodSummary, error) {
	ps := periodSummary{
		ServiceID: sub.ServiceID, ProductID: sub.ProductID, Status: sub.Status,
		Credits: sub.Credits, CreditsHeld: sub.CreditsHeld,
	}
	var p *billing.Product
	if svc, ok := app.Catalog().Service(sub.ServiceID); ok {
		p, _ = svc.Product(sub.ProductID)
	}
	if p == nil {
		ps.ProductMissing = true
		return ps, nil
	}
	ps.BillingModel, ps.MeasurementType, ps.UnitLabel = p.BillingModel, p.MeasurementType, p.UnitLabel
	ps.PeriodStart, ps.PeriodEnd = billing.PeriodBounds(p.Period, p.CalendarPeriods, sub.StartedAt, at)
	st, err := app.DataStore().State(ctx, store.Account{UserID: sub.UserID, ServiceID: sub.ServiceID, Product: *p}, at)
	if err != nil {
		return ps, err
	}
	ps.UnitsUsed, ps.UnitsHeld = st.Used, st.Reserved
	ps.Spend, ps.SpendHeld = st.Spend, st.ReservedSpend
	ps.Credits, ps.CreditsHeld = st.Credits, st.CreditsHeld
	if p.Quota != nil {
		q := *p.Quota
		left := st.QuotaLeft(q)
		over := max(0, st.Used-q)
		ps.Quota, ps.UnitsRemaining, ps.OverageUnits = &q, &left, &over
	}
	if p.SpendingCap != nil {
		c := *p.SpendingCap
		left := st.SpendingCapLeft(c)
		ps.SpendingCap, ps.SpendRemaining = &c, &left
	}
	if hasHardLimit(*p) {
		// From the hourly rollups: a handful of reads for a month.
		f := store.LedgerFilter{UserID: sub.UserID, ServiceID: sub.ServiceID, From: ps.PeriodStart, To: at.Add(time.Nanosecond)}
		err := store.ScanUsage(ctx, app.DataStore(), f, func(r store.Rollup) error {
			ps.CallsCutAtLimit += r.Capped
			return nil
		})
		if err != nil {
			return ps, fmt.Errorf("count the calls cut at a limit: %w", err)
		}
	}
	return ps, nil
}

// hasHardLimit tells whether a product can cut a claim short: a blocked
// quota, a prepaid balance or a spending cap.
func hasHardLimit(p billing.Product) bool {
	return p.Quota != nil && !p.OverageAllowed() || p.BillingModel == billing.Prepaid || p.SpendingCap != nil
}

// userSummary is the answer of GET /platform/users/{userId}/summary.
type userSummary struct {
	UserID        string          `json:"userId"`
	At            time.Time       `json:"at"`
	Subscriptions []periodSummary `json:"subscriptions"`
}

// maxSummarySubscriptions bounds the subscriptions of one summary; a user
// has one per service, so this is the size of a very large catalog.
const maxSummarySubscriptions = 10000

// getUserSummary: GET /platform/users/{userId}/summary[?serviceId=&at=],
// the billing period containing at (now by default) of each of the user's
// subscriptions.
func (a *adminAPI) getUserSummary(app *App, w http.ResponseWriter, r *http.Request, args []string) error {
	q := r.URL.Query()
	if err := checkQuery(q, "serviceId", "at"); err != nil {
		return err
	}
	userID := args[0]
	if err := checkUserID("userId", userID); err != nil {
		return err
	}
	serviceID := q.Get("serviceId")
	if q.Has("serviceId") && !catalog.ValidID(serviceID) {
		return apierror.Invalid("serviceId", "serviceId is not a valid id")
	}
	at := app.Now().UTC()
	if q.Has("at") {
		t, err := parseTimeBound(q.Get("at"), false)
		if err != nil || t.IsZero() {
			return apierror.Invalid("at", "at must be an RFC 3339 time or a date (YYYY-MM-DD)")
		}
		at = t.UTC()
	}
	out, err := app.Summary(r.Context(), userID, serviceID, at)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, out)
}

// subscriptionChange is the answer to PUT /platform/subscriptions/{userId}/{serviceId}:
// the subscription, and its current billing period under the product it
// now has, so the operator sees at once what a change of product did to
// the period's usage (the units used so far count against the new quota).
type subscriptionChange struct {
	subscriptionRecord
	// PreviousProductID is the product before this change, when it was
	// another one.
	PreviousProductID string         `json:"previousProductId,omitempty"`
	CurrentPeriod     *periodSummary `json:"currentPeriod,omitempty"`
}

// describeChange builds the answer to a subscription change. A failure to
// read the period leaves it out: the change itself is done.
func (app *App) describeChange(ctx context.Context, prev string, sub store.Subscription) subscriptionChange {
	out := subscriptionChange{subscriptionRecord: viewSubscription(sub)}
	if prev != "" && prev != sub.ProductID {
		out.PreviousProductID = prev
	}
	ps, err := summarize(ctx, app, sub, app.Now().UTC())
	if err != nil {
		app.logger.Error("read the period of a changed subscription", zap.String("user_id", sub.UserID), zap.String("service_id", sub.ServiceID), zap.Error(err))
		return out
	}
	out.CurrentPeriod = &ps
	return out
}
