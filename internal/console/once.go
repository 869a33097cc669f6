package console

import (
	"net/http"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/onceform"
	"github.com/platformgw/gateway/internal/payments"
)

// One-time form values (internal/onceform): every form that changes
// something carries a value made for it when its page was rendered, and
// the console takes each value once, so a double click on "Add credits",
// a reload of the answer that showed a new key or a confirmation posted
// twice changes nothing the second time. The book's key is derived from
// the CSRF key, the values are bound to the operator's name
// (docs/console.md, "Forms").

func newOnceBook(k *csrfKey) *onceform.Book {
	return onceform.New(k.key[:], "platform_console one-time form values")
}

// noticeData is the notice page: what happened to a form, and where to
// see the result.
type noticeData struct {
	Class   string // "done" or "error"
	Message string
	Links   []noticeLink
}

type noticeLink struct{ Href, Text string }

// resultLinks are where the result of the form q posted can be seen: the
// user's page and the audit log's changes to them, or the requests.
func (h *Handler) resultLinks(q *req) []noticeLink {
	p := q.parts
	switch {
	case len(p) >= 2 && p[0] == "users":
		return []noticeLink{
			{h.link(nil, "users", p[1]), "User " + p[1]},
			{h.link(map[string][]string{"target": {p[1]}}, "audit"), "Changes to " + p[1] + " in the audit log"},
		}
	case len(p) >= 1 && p[0] == "revenue":
		return []noticeLink{
			{h.link(nil, "revenue"), "Revenue"},
			{h.link(map[string][]string{"action": {payments.AuditTopUpResolve}}, "audit"), "Top-ups marked resolved in the audit log"},
		}
	case len(p) >= 1 && p[0] == "requests":
		return []noticeLink{
			{h.link(nil, "requests"), "Access requests"},
			{h.link(map[string][]string{"action": {"access.decline"}}, "audit"), "Declines in the audit log"},
		}
	}
	return []noticeLink{{h.link(nil), "Overview"}}
}

// onceRefused answers a POST whose one-time value was not taken: sent
// before, too old, or none of this console's. Nothing is changed.
func (h *Handler) onceRefused(q *req, verdict onceform.Verdict, first onceform.State) {
	d := noticeData{Class: "error", Links: h.resultLinks(q)}
	status, title := http.StatusForbidden, "Form not sent"
	switch verdict {
	case onceform.Taken:
		status, title = http.StatusConflict, "Already sent"
		switch first {
		case onceform.Made:
			d.Class, title = "done", "Already made"
			d.Message = "This change was already made: this form was sent before (a second click, or a reload of the page that answered it). Nothing was changed this time; the result is on the pages linked below."
			if len(q.parts) == 3 && q.parts[2] == "keys" {
				d.Message += " The new key was shown once, on the answer to the first; if it was not copied, revoke that key and create another."
			}
		case onceform.InFlight:
			d.Message = "This form was sent a moment ago and that change is being made now. Nothing was changed by sending it again; see the result on the pages linked below."
		default:
			d.Message = "This form was sent before and that attempt failed (see the server log): the change may or may not have been made. Nothing was changed this time: look at the pages linked below and make the change from there if it is still needed."
		}
	case onceform.Stale:
		d.Message = "This form is too old to send (a form can be sent within " + onceform.TTLWords + " of being shown). Nothing was changed: open the page again and make the change from there if it is still needed."
	default:
		d.Message = "This form lacks its one-time value, or carries one this console did not make. Nothing was changed: open the page again and send its form."
	}
	h.logger.Info("console POST not taken: its one-time form value was spent, stale or missing",
		zap.String("operator", q.who), zap.String("path", q.r.URL.Path), zap.Stringer("verdict", verdict))
	h.render(q, status, "notice", title, d)
}
