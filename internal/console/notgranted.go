package console

import (
	"cmp"
	"errors"
	"net/http"
	"net/url"
	"strings"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/onceform"
	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/store"
)

// Marking a top-up paid and not granted resolved (docs/console.md,
// "Revenue"): the operator refunded it in Stripe or granted its credits
// by hand, and says so from its row on the Revenue page, so that it
// leaves the open list for the resolved one (who, when, note) and no one
// refunds or grants it a second time. The mark is on the ignored
// top-up's record (payments.ResolveNotGranted) and in the audit log; the
// money stays counted in Received.

// resolveNotices are what the Revenue page says after a mark, chosen by
// a fixed code in the redirect's query (?done=resolved), as doneNotices.
var resolveNotices = map[string]string{
	"resolved": "The top-up was marked resolved: it is listed under Resolved below, its money still counted in Received.",
	"already":  "That top-up was marked resolved before (the Resolved list below says by whom, when and why): nothing was changed.",
}

// paymentRecords is the store's payment records, or why the console has
// none to mark.
func (h *Handler) paymentRecords() (store.Payments, error) {
	pay, ok := h.rt.Store().(store.Payments)
	if h.payments == nil || !ok {
		return nil, apierror.New(apierror.NotFound, "Payments are not configured, or this store keeps no payment records: there is no top-up to mark. Nothing was changed.")
	}
	return pay, nil
}

// revenueMonthLink is the Revenue page of the month a top-up was paid
// in (when it was recorded, for one from before the payment's time was
// kept), with query q and fragment frag.
func (h *Handler) revenueMonthLink(ig payments.IgnoredTopUp, q url.Values, frag string) string {
	if q == nil {
		q = url.Values{}
	}
	m := cmp.Or(ig.PaidAt, ig.At).UTC().Format(monthLayout)
	q.Set("from", m)
	q.Set("to", m)
	return h.link(q, "revenue") + frag
}

// whatTopUp names a top-up paid and not granted in a sentence: "the
// top-up of ann on pre (10.00 USD, pack retired, Stripe payment pi_1)".
func whatTopUp(ig payments.IgnoredTopUp) string {
	var of []string
	if ig.Amount > 0 && ig.Currency != "" {
		of = append(of, payments.MinorMoney(ig.Amount, ig.Currency).String())
	}
	if ig.Pack != "" {
		of = append(of, "pack "+ig.Pack)
	}
	of = append(of, "Stripe payment "+ig.ID)
	s := "the top-up"
	if ig.UserID != "" {
		s += " of " + ig.UserID
	}
	if ig.ServiceID != "" {
		s += " on " + ig.ServiceID
	}
	return s + " (" + strings.Join(of, ", ") + ")"
}

// confirmResolve asks before a top-up paid and not granted is marked
// resolved, with a field for a note: the row's "Mark resolved…" link
// (GET) and a POST without confirm=yes land here.
func (h *Handler) confirmResolve(q *req) error {
	pay, err := h.paymentRecords()
	if err != nil {
		return err
	}
	ig, err := payments.NotGrantedTopUp(q.r.Context(), pay, q.r.FormValue("id"))
	if err != nil {
		return noChange(err)
	}
	what := whatTopUp(ig)
	c := confirmation{Nav: "revenue", Back: h.revenueMonthLink(ig, nil, ""),
		Question: "Mark " + what + " resolved?",
		Consequence: "It leaves the list of top-ups paid and not granted for the resolved ones, with your name, the time and the note; its money stays counted in Received. " +
			"This does not refund or grant anything: refund it in Stripe, or add its credits on the user's page, first. It cannot be reopened.",
		Action: h.link(nil, "revenue", "resolve"), Button: "Mark it resolved",
		Fields: []formField{{"id", ig.ID}},
		Note: &confirmNote{Label: "Note (optional): what was done", Placeholder: "refunded in Stripe / granted by hand",
			Max: payments.MaxResolveNote, Value: q.r.FormValue("note")}}
	if r := ig.Resolved; r != nil {
		msg := strings.ToUpper(what[:1]) + what[1:] + " was marked resolved already, by " + r.By + " at " + r.At.UTC().Format("2006-01-02 15:04:05 UTC")
		if r.Note != "" {
			msg += ": " + r.Note
		}
		h.render(q, http.StatusOK, "notice", "Marked resolved already", noticeData{Class: "done", Message: msg + ". Nothing to do.",
			Links: []noticeLink{{h.revenueMonthLink(ig, nil, "#notgranted-resolved"), "Revenue, " + cmp.Or(ig.PaidAt, ig.At).UTC().Format("January 2006")}}})
		return nil
	}
	h.render(q, http.StatusOK, "confirm", "Confirm: "+c.Button, c)
	return nil
}

// noChange adds to an operator's error that nothing was changed.
func noChange(err error) error {
	var ae *apierror.Error
	if errors.As(err, &ae) && !strings.Contains(ae.Message, "Nothing was changed") {
		cp := *ae
		cp.Message = strings.TrimSpace(cp.Message) + " Nothing was changed."
		return &cp
	}
	return err
}

// resolveNotGranted marks a top-up paid and not granted resolved once
// the confirmation's button posted confirm=yes, writes the audit entry,
// and goes back to the Revenue page of its month (post/redirect/get).
// One marked before is left as it was, with no entry.
func (h *Handler) resolveNotGranted(q *req) error {
	if q.r.PostFormValue("confirm") != "yes" {
		return h.confirmResolve(q)
	}
	pay, err := h.paymentRecords()
	if err != nil {
		return err
	}
	ctx := q.r.Context()
	ig, made, err := payments.ResolveNotGranted(ctx, pay, q.r.PostFormValue("id"), q.actor(), q.r.PostFormValue("note"), h.rt.Now())
	if err != nil {
		var ae *apierror.Error
		if !errors.As(err, &ae) {
			q.spent = onceform.Failed
		}
		return noChange(err)
	}
	if !made {
		http.Redirect(q.w, q.r, h.revenueMonthLink(ig, url.Values{"done": {"already"}}, "#notgranted-resolved"), http.StatusSeeOther)
		return nil
	}
	q.spent = onceform.Made
	detail := "top-up " + ig.ID + " ("
	if ig.Amount > 0 && ig.Currency != "" {
		detail += payments.MinorMoney(ig.Amount, ig.Currency).String() + ", "
	}
	detail += "pack " + cmp.Or(ig.Pack, "not recorded") + ") marked resolved"
	if ig.Resolved.Note != "" {
		detail += ": " + ig.Resolved.Note
	}
	// The mark is on the payment record, the entry in the audit log: two
	// writes. An entry not written is said, the mark kept.
	if err := h.ops.RecordAudit(ctx, store.AuditEntry{Actor: q.actor(), Action: payments.AuditTopUpResolve,
		UserID: ig.UserID, ServiceID: ig.ServiceID, Detail: detail}); err != nil {
		h.logger.Error("console change made, its audit entry not recorded", zap.String("operator", q.who),
			zap.String("path", q.r.URL.Path), zap.Error(err))
		h.render(q, http.StatusInternalServerError, "notice", "Change made, not audited", noticeData{Class: "error",
			Message: "The top-up " + ig.ID + " was marked resolved, but its entry in the audit log could not be written (see the server log). Do not mark it again: the Revenue page shows it resolved.",
			Links:   h.resultLinks(q)})
		return nil
	}
	http.Redirect(q.w, q.r, h.revenueMonthLink(ig, url.Values{"done": {"resolved"}}, "#notgranted-resolved"), http.StatusSeeOther)
	return nil
}
