package console

import (
	"context"
	"errors"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/onceform"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/subscription"
)

// userRow is a line of the users list.
type userRow struct {
	ID                  string
	Subscriptions, Keys int
	ActiveKeys          int
	// Status is the user's standing in a word: "active" while a
	// subscription grants access, else the subscriptions' statuses, or
	// "keys only" / "no access".
	Status   string
	Statuses []string
	// Spend is this month's cost, by what it is counted in (money,
	// credits): never added together.
	Spend []measured
	// LastSeen is the latest of the last call in the ledger's hourly sums
	// of the month (to the hour) and a key's last use on this node since
	// it started (to the second).
	LastSeen time.Time
}

// costKindOf is what the cost of a product is counted in, from the
// running catalog (kindFor).
func (h *Handler) costKindOf(serviceID, productID string) string {
	_, kind := h.measureOf(serviceID, productID)
	return kind
}

// users: everyone with a key or a subscription, with their standing,
// this month's spend and when they were last seen; q filters by id.
func (h *Handler) users(q *req) error {
	ctx := q.r.Context()
	v := q.r.URL.Query()
	open := strings.TrimSpace(v.Get("id"))
	search := strings.TrimSpace(v.Get("q"))
	rows, partial, err := h.userRows(ctx)
	if err != nil {
		return err
	}
	d := map[string]any{"Partial": partial, "Q": search}
	if open != "" {
		if _, ok := findUser(rows, open); ok {
			http.Redirect(q.w, q.r, h.link(nil, "users", open), http.StatusSeeOther)
			return nil
		}
		search = open
		d["Q"] = open
	}
	if search != "" {
		low := strings.ToLower(search)
		rows = slices.DeleteFunc(rows, func(u userRow) bool { return !strings.Contains(strings.ToLower(u.ID), low) })
		if _, ok := findUser(rows, search); !ok {
			d["Missing"] = search
			d["CanCreate"] = ops.ValidUserID(search)
		}
	}
	d["Users"] = rows
	h.render(q, http.StatusOK, "users", "Users", d)
	return nil
}

func findUser(rows []userRow, id string) (userRow, bool) {
	i, ok := slices.BinarySearchFunc(rows, id, func(u userRow, id string) int { return strings.Compare(u.ID, id) })
	if !ok {
		return userRow{}, false
	}
	return rows[i], true
}

// userRows builds the users list, sorted by id.
func (h *Handler) userRows(ctx context.Context) ([]userRow, bool, error) {
	subs, partial, err := h.allSubscriptions(ctx, "")
	if err != nil {
		return nil, false, err
	}
	keys, err := h.rt.Store().ListKeys(ctx, "")
	if err != nil {
		return nil, false, err
	}
	m := map[string]*userRow{}
	get := func(id string) *userRow {
		if m[id] == nil {
			m[id] = &userRow{ID: id}
		}
		return m[id]
	}
	active := map[string]bool{}
	now := h.rt.Now()
	for _, s := range subs {
		u := get(s.UserID)
		u.Subscriptions++
		st := string(subscription.EffectiveStatus(s, now))
		if !slices.Contains(u.Statuses, st) {
			u.Statuses = append(u.Statuses, st)
		}
		if subscription.Status(st).GrantsAccess() {
			active[s.UserID] = true
		}
	}
	for _, k := range keys {
		u := get(k.UserID)
		u.Keys++
		if k.ActiveAt(now) {
			u.ActiveKeys++
		}
		if t, ok := h.ops.KeyLastUsed(k.ID); ok && t.After(u.LastSeen) {
			u.LastSeen = t
		}
	}
	// This month's spend and last call, from the hourly sums.
	month := time.Date(now.UTC().Year(), now.UTC().Month(), 1, 0, 0, 0, 0, time.UTC)
	spend := map[string]map[string]billing.Units{}
	n := 0
	errStop := errors.New("stop")
	err = store.ScanUsage(ctx, h.rt.Store(), store.LedgerFilter{From: month}, func(r store.Rollup) error {
		if n++; n > maxOverviewRow {
			partial = true
			return errStop
		}
		u := m[r.UserID]
		if u == nil {
			return nil
		}
		if r.Hour.After(u.LastSeen) {
			u.LastSeen = r.Hour
		}
		if r.Cost != 0 {
			if spend[r.UserID] == nil {
				spend[r.UserID] = map[string]billing.Units{}
			}
			k := h.costKindOf(r.ServiceID, r.ProductID)
			spend[r.UserID][k] = billing.SatAdd(spend[r.UserID][k], r.Cost)
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return nil, false, err
	}
	rows := make([]userRow, 0, len(m))
	for id, u := range m {
		for _, kind := range slices.Sorted(maps.Keys(spend[id])) {
			u.Spend = append(u.Spend, measured{spend[id][kind], kind})
		}
		sort.Strings(u.Statuses)
		switch {
		case active[id]:
			u.Status = "active"
		case len(u.Statuses) > 0:
			u.Status = strings.ToLower(strings.Join(u.Statuses, ", "))
		case u.ActiveKeys > 0:
			u.Status = "keys only, no subscription"
		default:
			u.Status = "no access"
		}
		rows = append(rows, *u)
	}
	slices.SortFunc(rows, func(a, b userRow) int { return strings.Compare(a.ID, b.ID) })
	return rows, partial || len(rows) > maxListed, nil
}

// userData is the user page.
type userData struct {
	UserID string
	// Missing: nobody by this id has a key or a subscription, and the
	// operator did not ask to start one (?new=1).
	Missing bool
	Keys    []ops.KeyView
	// LastUsed is when each key last authenticated a request on this
	// gateway since it started (kept in memory, per node).
	LastUsed map[string]time.Time
	Summary  ops.UserSummary
	// Subs are the subscriptions with their limit bars and the products
	// their service offers, for the form that changes each.
	Subs []subRow
	// Unsubscribed are the services the user has no subscription to.
	Unsubscribed []*catalog.Service
	Services     []*catalog.Service
	Statuses     []string
	NewKey       *ops.KeyView
	// AuditFailed: the new key was made but its audit entry was not
	// written.
	AuditFailed bool
	Done        string
	Error       string
	ErrorForm   string
	// Posted are the refused form's fields, shown again.
	Posted url.Values
}

// subRow is a subscription on the user's page.
type subRow struct {
	ops.PeriodSummary
	Limits   []limit
	Products []string
	CostKind string
}

// Ended reports whether the subscription has an end that has come.
func (r subRow) Ended() bool {
	return !r.EndsAt.IsZero() && !subscription.Status(r.Status).GrantsAccess()
}

// StatusText is the subscription's status with its end: "Trial — ends
// 2026-12-26", "Cancelling — ends …" while it grants access, the status
// it ended in (CANCELLED, EXPIRED) after.
func (r subRow) StatusText() string {
	st := subscription.Status(r.Status)
	if r.EndsAt.IsZero() || !st.GrantsAccess() {
		return r.Status
	}
	words := "Active"
	switch st {
	case subscription.Trial:
		words = "Trial"
	case subscription.Cancelling, subscription.CancellingPending:
		words = "Cancelling"
	}
	return words + " — ends " + r.EndsAt.UTC().Format(time.DateOnly)
}

// user: one user's keys, subscriptions with their period, credits.
// newKey is a key just created (shown this once); formErr a refused change.
func (h *Handler) user(q *req, userID string, newKey *ops.KeyView, formErr error) error {
	if !ops.ValidUserID(userID) {
		return apierror.Invalid("userId", "\""+userID+"\" is not a user id: "+userIDWords)
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
	subscribed := map[string]bool{}
	for _, ps := range d.Summary.Subscriptions {
		row := subRow{PeriodSummary: ps, Limits: limits(ps, h.overageAllowed(ps.ServiceID, ps.ProductID), h.costKindOf(ps.ServiceID, ps.ProductID)), CostKind: h.costKindOf(ps.ServiceID, ps.ProductID)}
		if svc, ok := h.rt.Catalog.Service(ps.ServiceID); ok {
			for _, p := range svc.Products {
				row.Products = append(row.Products, p.ID)
			}
		}
		if ps.ProductMissing {
			row.Products = append(row.Products, ps.ProductID)
		}
		d.Subs = append(d.Subs, row)
		subscribed[ps.ServiceID] = true
	}
	for _, s := range d.Services {
		if !subscribed[s.ID] {
			d.Unsubscribed = append(d.Unsubscribed, s)
		}
	}
	status := http.StatusOK
	if len(recs) == 0 && len(d.Subs) == 0 && newKey == nil && q.r.Method != http.MethodPost && q.r.URL.Query().Get("new") != "1" {
		// A mistyped id is not a new customer: say so, and offer to
		// start one only when asked.
		d.Missing, status = true, http.StatusNotFound
		h.render(q, status, "user", "No user "+userID, d)
		return nil
	}
	d.Done = doneNotices[q.r.URL.Query().Get("done")]
	if newKey != nil && errors.Is(formErr, ops.ErrAuditNotRecorded) {
		d.AuditFailed, formErr = true, nil
	}
	if formErr != nil {
		var ae *apierror.Error
		if !errors.As(formErr, &ae) {
			return formErr
		}
		d.Error, d.ErrorForm = humanMessage(ae), q.r.PostFormValue("form")
		d.Posted = q.r.PostForm
		status = apierror.Status(ae.Code)
	}
	h.render(q, status, "user", "User "+userID, d)
	return nil
}

// userIDWords says what a user id may be, for a person.
const userIDWords = "1 to 128 characters of printable text, without '/' or spaces around it."

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

// result answers what the operations did with a change (err is their
// error). Made: back to the user's page with a GET (post/redirect/get),
// saying what was done by its code in doneNotices. Made but not audited:
// a page that says the change was made, so that nobody makes it again.
// Refused: the user's page again with the error (refused). Either of the
// first two spends the form's one-time value.
func (h *Handler) result(q *req, userID, done string, err error) error {
	switch {
	case err == nil:
		q.spent = onceform.Made
		http.Redirect(q.w, q.r, h.link(map[string][]string{"done": {done}}, "users", userID), http.StatusSeeOther)
		return nil
	case errors.Is(err, ops.ErrAuditNotRecorded):
		q.spent = onceform.Made
		h.logger.Error("console change made, its audit entry not recorded", zap.String("operator", q.who),
			zap.String("path", q.r.URL.Path), zap.Error(err))
		h.render(q, http.StatusInternalServerError, "notice", "Change made, not audited", noticeData{Class: "error",
			Message: doneNotices[done] + " The change itself was made, but its entry in the audit log could not be written (see the server log). Do not make it again: the user's page shows it.",
			Links:   h.resultLinks(q)})
		return nil
	}
	return h.refused(q, userID, err)
}

// refused shows the user's page again with the error and the form as it
// was filled; nothing was changed. An error that is not the operator's
// (a store failure) is the error page, and the form's one-time value
// stays spent: the change may or may not have been made.
func (h *Handler) refused(q *req, userID string, err error) error {
	var ae *apierror.Error
	if !errors.As(err, &ae) {
		q.spent = onceform.Failed
		return err
	}
	return h.user(q, userID, nil, err)
}

func (h *Handler) createKey(q *req, userID string) error {
	req := ops.CreateKeyRequest{UserID: userID, Label: q.r.PostFormValue("label")}
	if exp := q.r.PostFormValue("expires"); exp != "" {
		t, err := time.Parse(time.DateOnly, exp)
		if err != nil {
			return h.refused(q, userID, apierror.Invalid("expiresAt", "The expiry must be a date such as 2027-01-31."))
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
	// The key is shown on this answer only, never again: no redirect. A
	// reload posts the form again, with its one-time value spent: no
	// second key. An audit entry not written is said on the page (err).
	q.spent = onceform.Made
	if err != nil {
		h.logger.Error("console key made, its audit entry not recorded", zap.String("operator", q.who),
			zap.String("key_id", v.ID), zap.Error(err))
	}
	return h.user(q, userID, &v, err)
}

// userKey reads a key of the user, or says it has none by that id.
func (h *Handler) userKey(q *req, userID, id string) (store.KeyRecord, error) {
	k, err := h.rt.Store().KeyByID(q.r.Context(), id)
	if err == nil && k.UserID != userID {
		err = store.ErrNotFound
	}
	if errors.Is(err, store.ErrNotFound) {
		return k, apierror.New(apierror.NotFound, "User "+userID+" has no key "+id+".")
	}
	return k, err
}

// confirmation is the second step of a change that takes something away
// from a customer (a key, their access, credits): a page that says what
// will happen, with a button that posts the same form again with
// confirm=yes, and a link back that changes nothing. No script.
type confirmation struct {
	UserID      string
	Question    string
	Consequence string
	Action      string // the form's URL
	Fields      []formField
	Button      string
	// Nav is the page the confirmation belongs to in the navigation
	// ("users" when empty); Back where its cancel link goes (the
	// user's page when empty); Note, when set, a text field it asks for.
	Nav, Back string
	Note      *confirmNote
}

// confirmNote is a text field on a confirmation: a short note.
type confirmNote struct {
	Label, Placeholder, Value string
	Max                       int
}

type formField struct{ Name, Value string }

// confirmed tells whether a form's change was confirmed; when not, it
// shows the confirmation (the form's fields carried over) and the caller
// changes nothing.
func (h *Handler) confirmed(q *req, c confirmation, names ...string) bool {
	if q.r.Method == http.MethodPost && q.r.PostFormValue("confirm") == "yes" {
		return true
	}
	for _, n := range names {
		v := q.r.FormValue(n)
		if q.r.Method == http.MethodPost {
			v = q.r.PostFormValue(n)
		}
		c.Fields = append(c.Fields, formField{n, v})
	}
	h.render(q, http.StatusOK, "confirm", "Confirm: "+c.Button, c)
	return false
}

// confirmRevoke asks before a key is revoked: the revoke button of the
// user's page is a link here (GET), and a POST without confirm=yes (an
// old form) lands here too.
func (h *Handler) confirmRevoke(q *req, userID string) error {
	id := q.r.FormValue("keyId")
	k, err := h.userKey(q, userID, id)
	if err != nil {
		return h.refused(q, userID, err)
	}
	what := "key " + k.ID
	if k.Label != "" {
		what += " (\"" + k.Label + "\")"
	}
	h.confirmed(q, confirmation{UserID: userID,
		Question:    "Revoke " + what + " of user " + userID + "?",
		Consequence: "Every call, job poll and validation with this key is refused from now on. This cannot be undone: the user needs a new key.",
		Action:      h.link(nil, "users", userID, "revoke"), Button: "Revoke the key",
		Fields: []formField{{"form", "revoke"}}}, "keyId")
	return nil
}

// revokeKey revokes a key once the confirmation's button posted
// confirm=yes.
func (h *Handler) revokeKey(q *req, userID string) error {
	if q.r.PostFormValue("confirm") != "yes" {
		return h.confirmRevoke(q, userID)
	}
	id := q.r.PostFormValue("keyId")
	if _, err := h.userKey(q, userID, id); err != nil {
		return h.refused(q, userID, err)
	}
	_, err := h.ops.RevokeKey(q.r.Context(), q.actor(), id)
	return h.result(q, userID, "revoked", err)
}

func (h *Handler) putSubscription(q *req, userID string) error {
	f := q.r.PostFormValue
	if f("serviceId") == "" {
		return h.refused(q, userID, apierror.Invalid("serviceId", "Choose a service."))
	}
	if f("productId") == "" {
		return h.refused(q, userID, apierror.Invalid("productId", "Choose a product."))
	}
	// Taking access away (a status that grants none, where the user had
	// it) is confirmed first, and so is moving a user off a plan they pay
	// for through Stripe, which goes on charging for it; the operations
	// validate the rest.
	status := f("status")
	takesAccess := status != "" && !subscription.GrantsAccess(status) && subscription.Status(strings.ToUpper(status)).Valid()
	if cur, err := h.rt.Store().GetSubscription(q.r.Context(), userID, f("serviceId")); err == nil && subscription.EffectiveStatus(cur, h.rt.Now()).GrantsAccess() {
		paid := h.stripeBilled(cur.ServiceID, cur.ProductID)
		c := confirmation{UserID: userID, Action: h.link(nil, "users", userID, "subscription")}
		switch {
		case takesAccess:
			c.Question = "Set " + userID + "'s subscription to " + f("serviceId") + " to " + strings.ToUpper(status) + "?"
			c.Consequence = "Their calls to " + f("serviceId") + " are refused from now on, until the subscription is set to a status that grants access again."
			c.Button = "Set it to " + strings.ToUpper(status)
		case paid != "" && f("productId") != cur.ProductID:
			c.Question = "Move " + userID + " from " + cur.ProductID + " to " + f("productId") + " on " + f("serviceId") + "?"
			c.Button = "Move them to " + f("productId")
		}
		if c.Question != "" && paid != "" {
			c.Consequence = strings.TrimSpace(c.Consequence + " " + cur.ProductID + " is sold through Stripe (" + paid +
				"): this changes what the gateway serves, not what Stripe charges. If " + userID + " pays for it there, Stripe keeps charging them for " +
				cur.ProductID + " until their subscription is changed or cancelled in the Stripe Dashboard.")
		}
		if c.Question != "" && !h.confirmed(q, c, "form", "serviceId", "productId", "status") {
			return nil
		}
	}
	_, err := h.ops.PutSubscription(q.r.Context(), q.actor(), userID, f("serviceId"), f("productId"), f("status"))
	return h.result(q, userID, "subscription", err)
}

// stripeBilled is what a plan costs when it is sold through Stripe (the
// payments block names a Stripe Price for it, as the portal's Checkout
// charges), "29.00 USD a month"; empty when Stripe does not bill it.
func (h *Handler) stripeBilled(serviceID, productID string) string {
	if h.payments == nil {
		return ""
	}
	if p := h.payments.PriceFor(serviceID, productID); p == nil || p.Price == "" {
		return ""
	}
	svc, ok := h.rt.Catalog.Service(serviceID)
	if !ok {
		return ""
	}
	prod, ok := svc.Product(productID)
	if !ok {
		return ""
	}
	if t := (serviceRow{Service: svc}).PriceText(prod); t != "—" {
		return t
	}
	return "Stripe Price " + h.payments.PriceFor(serviceID, productID).Price
}

func (h *Handler) addCredits(q *req, userID string) error {
	f := q.r.PostFormValue
	amount, err := ops.ParseCreditAmount(strings.TrimSpace(f("amount")))
	if err != nil {
		return h.refused(q, userID, err)
	}
	if amount < 0 && !h.confirmed(q, confirmation{UserID: userID,
		Question:    "Take " + (-amount).String() + " credits from " + userID + " on " + f("serviceId") + "?",
		Consequence: "Their balance goes down by " + (-amount).String() + " credits; calls are refused once it reaches zero.",
		Action:      h.link(nil, "users", userID, "credits"), Button: "Take the credits",
	}, "form", "serviceId", "amount") {
		return nil
	}
	_, err = h.ops.AddCredits(q.r.Context(), q.actor(), userID, f("serviceId"), amount)
	return h.result(q, userID, "credits", err)
}
