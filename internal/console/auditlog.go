package console

import (
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/store"
)

// maxAuditScan bounds the entries one filtered audit page reads; past it
// the page offers to search on from where it stopped.
const maxAuditScan = 20000

// auditFilter is the audit page's selection: who, what, about whom, when.
type auditFilter struct {
	Actor, Action, Target string
	FromText, ToText      string
	from, to              time.Time
}

func (f auditFilter) query() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"actor": f.Actor, "action": f.Action, "target": f.Target, "from": f.FromText, "to": f.ToText} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return v
}

// check validates the filter and reads its dates.
func (f *auditFilter) check() *apierror.Error {
	var err error
	if f.Action != "" && !slices.Contains(auditActions, f.Action) {
		return apierror.Invalid("action", "Choose an action from the list.")
	}
	if f.from, err = parseBound(f.FromText, false); err != nil {
		return apierror.Invalid("from", "The start date must be a date such as 2026-11-01.")
	}
	if f.to, err = parseBound(f.ToText, true); err != nil {
		return apierror.Invalid("to", "The end date must be a date such as 2026-11-30.")
	}
	if !f.from.IsZero() && !f.to.IsZero() && !f.from.Before(f.to) {
		return apierror.Invalid("to", "The end date must be after the start date.")
	}
	return nil
}

// match: the actor and target as parts of the text (an operator types
// "alice" or "console:"), the action exactly, the time in [from, to).
func (f auditFilter) match(e store.AuditEntry) bool {
	contains := func(s, sub string) bool { return strings.Contains(strings.ToLower(s), strings.ToLower(sub)) }
	return (f.Actor == "" || contains(e.Actor, f.Actor)) &&
		(f.Action == "" || e.Action == f.Action) &&
		(f.Target == "" || contains(e.UserID, f.Target) || contains(e.ServiceID, f.Target) || contains(e.KeyID, f.Target)) &&
		(f.to.IsZero() || e.Time.Before(f.to))
}

// auditActions are the actions an operator filters on.
var auditActions = []string{ops.AuditKeyCreate, ops.AuditKeyRevoke, ops.AuditSubscriptionPut, ops.AuditCreditsAdd,
	ops.AuditUsagePrune, ops.AuditRollupPrune, ops.AuditConfigChange,
	ops.AuditPortalSignIn, ops.AuditChangeScheduled, ops.AuditAccessRequest, ops.AuditAccessDecline, payments.AuditTopUpResolve,
	payments.AuditTopUpGrantSkipped}

// auditRow is an entry with what its change replaced and what it made.
type auditRow struct {
	store.AuditEntry
	Before, After string
}

// audit: the audit log, newest first, filtered, a page at a time.
func (h *Handler) audit(q *req) error {
	v := q.r.URL.Query()
	f := auditFilter{Actor: strings.TrimSpace(v.Get("actor")), Action: v.Get("action"), Target: strings.TrimSpace(v.Get("target")),
		FromText: v.Get("from"), ToText: v.Get("to")}
	if bad := f.check(); bad != nil {
		// The page again, with what was typed and what is wrong with it.
		h.render(q, apierror.Status(bad.Code), "audit", "Audit log", map[string]any{
			"F": f, "Actions": auditActions, "Error": humanMessage(bad)})
		return nil
	}
	cursor := v.Get("cursor")
	var rows []store.AuditEntry
	var seen []store.AuditEntry // every entry read, for the before of a change
	scanned, next := 0, ""
	for {
		// Ask for no more than the page still lacks, so the cursor of
		// what was read is exactly where the next page starts.
		limit := pageRows - len(rows)
		page, nc, err := h.ops.AuditLog(q.r.Context(), cursor, limit)
		if err != nil {
			return err
		}
		scanned += len(page)
		stop := false
		for _, e := range page {
			seen = append(seen, e)
			if !f.from.IsZero() && e.Time.Before(f.from) {
				stop = true // newest first: everything after is older still
				break
			}
			if f.match(e) {
				rows = append(rows, e)
			}
		}
		next, cursor = nc, nc
		if stop {
			next = ""
			break
		}
		if nc == "" || len(rows) >= pageRows || scanned >= maxAuditScan {
			break
		}
	}
	out := make([]auditRow, len(rows))
	for i, e := range rows {
		out[i] = auditRow{AuditEntry: e}
		out[i].Before, out[i].After = beforeAfter(e, seen, cursor == "")
	}
	nq := f.query()
	if next != "" {
		nq.Set("cursor", next)
	}
	h.render(q, http.StatusOK, "audit", "Audit log", map[string]any{
		"Entries": out, "Next": next, "NextQuery": nq, "F": f, "Actions": auditActions,
		"Scanned": scanned, "Stopped": next != "" && len(rows) < pageRows,
	})
	return nil
}

// beforeAfter says what a change replaced and what it made, from its
// detail and, for a subscription, the change before it among the entries
// read (older entries come later in seen); whole says seen reaches the
// log's first entry, so a subscription with no change before it had none.
func beforeAfter(e store.AuditEntry, seen []store.AuditEntry, whole bool) (before, after string) {
	switch e.Action {
	case ops.AuditKeyCreate:
		return "no key", "key " + e.KeyID + ", " + e.Detail
	case ops.AuditKeyRevoke:
		return "key " + e.KeyID + " active", "revoked"
	case ops.AuditCreditsAdd:
		// "amount A, balance B": the balance before was B - A.
		var amount, balance billing.Units
		a, b, ok := strings.Cut(e.Detail, ", balance ")
		if ok {
			var err1, err2 error
			amount, err1 = billing.ParseStoredUnits(strings.TrimPrefix(a, "amount "))
			balance, err2 = billing.ParseStoredUnits(b)
			if err1 == nil && err2 == nil {
				return "balance " + (balance - amount).String(), "balance " + balance.String() + " (" + signed(amount) + ")"
			}
		}
	case ops.AuditSubscriptionPut:
		after, was, _ := strings.Cut(e.Detail, " (was ")
		after = strings.TrimSpace(after)
		found := false
		for _, o := range seen {
			if found && o.Action == ops.AuditSubscriptionPut && o.UserID == e.UserID && o.ServiceID == e.ServiceID {
				b, _, _ := strings.Cut(o.Detail, " (was ")
				return strings.TrimSpace(b), after
			}
			if o.Seq == e.Seq {
				found = true
			}
		}
		if was != "" {
			return strings.TrimSuffix(was, ")"), after
		}
		if whole {
			return "no subscription", after
		}
		return "(older than the entries read)", after
	}
	return "", e.Detail
}

func signed(u billing.Units) string {
	if u > 0 {
		return "+" + u.String()
	}
	return u.String()
}
