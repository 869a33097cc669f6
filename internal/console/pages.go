package console

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store"
)

// Bounds on what one page reads, so a huge store never makes a page slow
// without end; a page that hit one says so.
const (
	maxListed      = 10000  // subscriptions or keys gathered for a listing
	maxOverviewRow = 200000 // hourly sums (store.ScanUsage) the overview adds up
	pageRows       = 200    // rows of a table page
)

// allSubscriptions pages through every subscription (of userID when set).
func (h *Handler) allSubscriptions(ctx context.Context, userID string) ([]store.Subscription, bool, error) {
	var out []store.Subscription
	cursor := ""
	for {
		page, next, err := h.rt.Store().ListSubscriptions(ctx, userID, cursor, 1000)
		if err != nil {
			return nil, false, err
		}
		out = append(out, page...)
		if next == "" {
			return out, false, nil
		}
		if len(out) >= maxListed {
			return out, true, nil
		}
		cursor = next
	}
}

type ranked struct {
	Name  string
	Units billing.Units
	Cost  billing.Units
	Calls int64
}

func (x *ranked) add(r store.Rollup) {
	x.Units += r.Units
	x.Cost += r.Cost
	x.Calls += r.Calls
}

func topN(m map[string]*ranked, n int) []ranked {
	out := make([]ranked, 0, len(m))
	for _, r := range m {
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b ranked) int {
		if c := cmp.Compare(b.Units, a.Units); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out[:min(n, len(out))]
}

// overview: calls/s, error shares and added latency of the last minute,
// usage today and this month, top services and users of the month.
func (h *Handler) overview(q *req) error {
	now := h.rt.Now().UTC()
	today := now.Truncate(24 * time.Hour)
	month := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	var d struct {
		Calls                 engine.CallStats
		Today, Month          ranked
		Services, Users       []ranked
		Partial               bool
		MonthStart, TodayDate string
	}
	if h.rt.Calls != nil {
		d.Calls = h.rt.Calls.Recent()
	}
	d.MonthStart, d.TodayDate = month.Format("January 2006"), today.Format(time.DateOnly)
	svcs, users := map[string]*ranked{}, map[string]*ranked{}
	n := 0
	errStop := errors.New("stop")
	// The month's hourly sums (store.ScanUsage): the rollups, where the
	// store keeps them, so a month of millions of rows is a few thousand
	// sums; the month and the day both start on the hour.
	err := store.ScanUsage(q.r.Context(), h.rt.Store(), store.LedgerFilter{From: month}, func(r store.Rollup) error {
		if n++; n > maxOverviewRow {
			d.Partial = true
			return errStop
		}
		add := func(m map[string]*ranked, k string) {
			x := m[k]
			if x == nil {
				x = &ranked{Name: k}
				m[k] = x
			}
			x.add(r)
		}
		add(svcs, r.ServiceID)
		add(users, r.UserID)
		d.Month.add(r)
		if !r.Hour.Before(today) {
			d.Today.add(r)
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return err
	}
	d.Services, d.Users = topN(svcs, 5), topN(users, 5)
	h.renderRefresh(q, http.StatusOK, "overview", "Overview", d, h.RefreshSeconds)
	return nil
}

type serviceRow struct {
	*catalog.Service
	Subscribers []store.Subscription
}

// services: the catalog as configured, with who is subscribed.
func (h *Handler) services(q *req) error {
	subs, partial, err := h.allSubscriptions(q.r.Context(), "")
	if err != nil {
		return err
	}
	var rows []serviceRow
	for _, s := range h.rt.Catalog.Services() {
		row := serviceRow{Service: s}
		for _, sub := range subs {
			if sub.ServiceID == s.ID {
				row.Subscribers = append(row.Subscribers, sub)
			}
		}
		rows = append(rows, row)
	}
	h.render(q, http.StatusOK, "services", "Services and products", map[string]any{"Services": rows, "Partial": partial})
	return nil
}

type userRow struct {
	ID                  string
	Subscriptions, Keys int
	ActiveKeys          int
}

// users: everyone with a key or a subscription.
func (h *Handler) users(q *req) error {
	if id := q.r.URL.Query().Get("id"); id != "" {
		http.Redirect(q.w, q.r, h.link(nil, "users", id), http.StatusSeeOther)
		return nil
	}
	ctx := q.r.Context()
	subs, partial, err := h.allSubscriptions(ctx, "")
	if err != nil {
		return err
	}
	keys, err := h.rt.Store().ListKeys(ctx, "")
	if err != nil {
		return err
	}
	m := map[string]*userRow{}
	get := func(id string) *userRow {
		if m[id] == nil {
			m[id] = &userRow{ID: id}
		}
		return m[id]
	}
	for _, s := range subs {
		get(s.UserID).Subscriptions++
	}
	now := h.rt.Now()
	for _, k := range keys {
		u := get(k.UserID)
		u.Keys++
		if k.ActiveAt(now) {
			u.ActiveKeys++
		}
	}
	rows := make([]userRow, 0, len(m))
	for _, u := range m {
		rows = append(rows, *u)
	}
	slices.SortFunc(rows, func(a, b userRow) int { return strings.Compare(a.ID, b.ID) })
	h.render(q, http.StatusOK, "users", "Users", map[string]any{"Users": rows, "Partial": partial || len(rows) > maxListed})
	return nil
}

// userData is the user page.
type userData struct {
	UserID string
	Keys   []ops.KeyView
	// LastUsed is when each key last authenticated a request on this
	// gateway since it started (kept in memory, per node).
	LastUsed  map[string]time.Time
	Summary   ops.UserSummary
	Services  []*catalog.Service
	Statuses  []string
	NewKey    *ops.KeyView
	Done      string
	Error     string
	ErrorForm string
}

// user: one user's keys, subscriptions with their period, credits.
// newKey is a key just created (shown this once); formErr a refused change.
func (h *Handler) user(q *req, userID string, newKey *ops.KeyView, formErr error) error {
	if !ops.ValidUserID(userID) {
		return apierror.Invalid("userId", "not a valid user id")
	}
	ctx := q.r.Context()
	recs, err := h.rt.Store().ListKeys(ctx, userID)
	if err != nil {
		return err
	}
	slices.SortFunc(recs, func(x, y store.KeyRecord) int { return x.Created.Compare(y.Created) })
	d := userData{UserID: userID, Services: h.rt.Catalog.Services(), Statuses: ops.SubscriptionStatuses(), NewKey: newKey}
	now := h.rt.Now()
	d.LastUsed = map[string]time.Time{}
	for _, k := range recs {
		d.Keys = append(d.Keys, ops.ViewKey(k, now))
		if t, ok := h.ops.KeyLastUsed(k.ID); ok {
			d.LastUsed[k.ID] = t
		}
	}
	d.Summary, err = h.ops.Summary(ctx, userID, "", now.UTC())
	if err != nil {
		return err
	}
	d.Done = doneNotices[q.r.URL.Query().Get("done")]
	status := http.StatusOK
	if formErr != nil {
		var ae *apierror.Error
		if !errors.As(formErr, &ae) {
			return formErr
		}
		d.Error, d.ErrorForm = ae.Message, q.r.PostFormValue("form")
		status = apierror.Status(ae.Code)
	}
	h.render(q, status, "user", "User "+userID, d)
	return nil
}

// actor names the operator in the audit log.
func (q *req) actor() string { return "console:" + q.who }

// doneNotices are what the user's page says after a change, chosen by a
// fixed code in the redirect's query (?done=revoked) so no text from a URL
// is ever rendered: a link anyone can send would otherwise put a line of
// their choosing (a phishing "call this number") on the operator's
// trusted page. An unknown code shows nothing. The page itself shows the
// new state (the key's status, the subscription, the balance).
var doneNotices = map[string]string{
	"revoked":      "The key was revoked.",
	"subscription": "The subscription was set.",
	"credits":      "The credits were added.",
}

// changed answers a change that is done: back to the user's page with a
// GET (post/redirect/get), saying what was done by its code in
// doneNotices.
func (h *Handler) changed(q *req, userID, done string) error {
	http.Redirect(q.w, q.r, h.link(map[string][]string{"done": {done}}, "users", userID), http.StatusSeeOther)
	return nil
}

// refused shows the user's page again with the error, or fails when the
// change was made and only its audit entry failed.
func (h *Handler) refused(q *req, userID string, err error) error {
	var ae *apierror.Error
	if !errors.As(err, &ae) {
		return err
	}
	return h.user(q, userID, nil, err)
}

func (h *Handler) createKey(q *req, userID string) error {
	req := ops.CreateKeyRequest{UserID: userID, Label: q.r.PostFormValue("label")}
	if exp := q.r.PostFormValue("expires"); exp != "" {
		t, err := time.Parse(time.DateOnly, exp)
		if err != nil {
			return h.refused(q, userID, apierror.Invalid("expiresAt", "the expiry must be a date (YYYY-MM-DD)"))
		}
		req.ExpiresAt = t.Format(time.RFC3339)
	}
	if roles := strings.TrimSpace(q.r.PostFormValue("roles")); roles != "" {
		for _, r := range strings.Split(roles, ",") {
			req.Roles = append(req.Roles, strings.TrimSpace(r))
		}
	}
	v, err := h.ops.CreateKey(q.r.Context(), q.actor(), req)
	if v.ID == "" {
		return h.refused(q, userID, err)
	}
	// The key is shown on this answer only, never again: no redirect.
	return h.user(q, userID, &v, nil)
}

func (h *Handler) revokeKey(q *req, userID string) error {
	id := q.r.PostFormValue("keyId")
	k, err := h.rt.Store().KeyByID(q.r.Context(), id)
	if err == nil && k.UserID != userID {
		err = store.ErrNotFound
	}
	if errors.Is(err, store.ErrNotFound) {
		return h.refused(q, userID, apierror.New(apierror.NotFound, "user "+userID+" has no key "+id))
	}
	if err != nil {
		return err
	}
	if _, err := h.ops.RevokeKey(q.r.Context(), q.actor(), id); err != nil {
		return h.refused(q, userID, err)
	}
	return h.changed(q, userID, "revoked")
}

func (h *Handler) putSubscription(q *req, userID string) error {
	f := q.r.PostFormValue
	if _, err := h.ops.PutSubscription(q.r.Context(), q.actor(), userID, f("serviceId"), f("productId"), f("status")); err != nil {
		return h.refused(q, userID, err)
	}
	return h.changed(q, userID, "subscription")
}

func (h *Handler) addCredits(q *req, userID string) error {
	f := q.r.PostFormValue
	amount, err := ops.ParseCreditAmount(strings.TrimSpace(f("amount")))
	if err != nil {
		return h.refused(q, userID, err)
	}
	if _, err := h.ops.AddCredits(q.r.Context(), q.actor(), userID, f("serviceId"), amount); err != nil {
		return h.refused(q, userID, err)
	}
	return h.changed(q, userID, "credits")
}

// jobs: the jobs by state, a page at a time.
func (h *Handler) jobs(q *req) error {
	qs := q.r.URL.Query()
	f := store.JobFilter{Status: strings.ToUpper(qs.Get("status")), UserID: qs.Get("user"), ServiceID: qs.Get("service")}
	if f.Status != "" && !slices.Contains([]string{store.JobPending, store.JobRunning, store.JobCompleted, store.JobFailed}, f.Status) {
		return apierror.Invalid("status", "status must be PENDING, RUNNING, COMPLETED or FAILED")
	}
	jobs, next, err := h.rt.Store().ListJobs(q.r.Context(), f, qs.Get("cursor"), pageRows)
	if errors.Is(err, store.ErrBadCursor) {
		return apierror.Invalid("cursor", "cursor is not one this listing returned; start again without it")
	}
	if err != nil {
		return err
	}
	h.render(q, http.StatusOK, "jobs", "Jobs", map[string]any{
		"Jobs": jobs, "Next": next, "Filter": f,
		"States": []string{store.JobPending, store.JobRunning, store.JobCompleted, store.JobFailed},
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
		return apierror.New(apierror.RequestNotFound, "no job "+id)
	}
	if err != nil {
		return err
	}
	steps := []step{{j.CreatedAt, "created (PENDING)"}}
	if j.Stage != "" || j.PercentageComplete > 0 || j.Status == store.JobRunning {
		what := "latest progress: " + j.Status
		if j.Stage != "" {
			what += ", stage " + j.Stage
		}
		steps = append(steps, step{j.UpdatedAt, what})
	}
	if !j.CompletedAt.IsZero() {
		what := j.Status
		if j.ErrorMessage != "" {
			what += ": " + j.ErrorMessage
		}
		steps = append(steps, step{j.CompletedAt, what})
	}
	h.render(q, http.StatusOK, "job", "Job "+id, map[string]any{"Job": j, "Steps": steps, "Percent": int(j.PercentageComplete)})
	return nil
}

// audit: the audit log, newest first, a page at a time.
func (h *Handler) audit(q *req) error {
	entries, next, err := h.ops.AuditLog(q.r.Context(), q.r.URL.Query().Get("cursor"), pageRows)
	if err != nil {
		return err
	}
	h.render(q, http.StatusOK, "audit", "Audit log", map[string]any{"Entries": entries, "Next": next})
	return nil
}

// alertStatuses are the delivery states an alert listing filters on.
var alertStatuses = []string{"PENDING", "DELIVERED", "FAILED"}

// alerts lists the usage alerts that fired (docs/alerts.md), newest first,
// through the code of the admin API's GET /platform/alerts: the same
// filters, the same validation and errors.
func (h *Handler) alerts(q *req) error {
	v := q.r.URL.Query()
	aq := ops.AlertQuery{
		UserID:    v.Get("userId"),
		ServiceID: v.Get("serviceId"),
		Status:    v.Get("status"),
		Cursor:    v.Get("cursor"),
		Limit:     pageRows,
	}
	page, err := h.ops.ListAlerts(q.r.Context(), aq)
	if err != nil {
		return err
	}
	next := url.Values{}
	for _, k := range []string{"userId", "serviceId", "status"} {
		if x := v.Get(k); x != "" {
			next.Set(k, x)
		}
	}
	if page.NextCursor != "" {
		next.Set("cursor", page.NextCursor)
	}
	h.render(q, http.StatusOK, "alerts", "Alerts", map[string]any{
		"Alerts": page.Alerts, "Next": page.NextCursor, "NextQuery": next,
		"Filter": aq, "Statuses": alertStatuses,
	})
	return nil
}
