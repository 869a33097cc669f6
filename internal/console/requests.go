package console

import (
	"net/http"

	"github.com/platformgw/gateway/internal/onceform"
	"github.com/platformgw/gateway/internal/ops"
)

// Access requests: callers who asked in the portal for a plan that costs
// money while payments are not configured. The request is an entry of
// the audit log (ops.RequestAccess); approving it is the user page's own
// set-subscription form, prefilled, so it is audited as any subscription
// change and settles the request; declining records the operator's no.

// requestsData is the access requests page.
type requestsData struct {
	Requests []ops.AccessRequest
	Done     string
	Error    string
}

var requestNotices = map[string]string{
	"declined": "The request was declined; the caller sees it no longer waits.",
}

// requests lists the access requests waiting for an answer.
func (h *Handler) requests(q *req) error {
	return h.renderRequests(q, http.StatusOK, "")
}

func (h *Handler) renderRequests(q *req, status int, problem string) error {
	rs, err := h.ops.PendingAccessRequests(q.r.Context(), "")
	if err != nil {
		return err
	}
	h.render(q, status, "requests", "Access requests", requestsData{Requests: rs, Done: requestNotices[q.r.URL.Query().Get("done")], Error: problem})
	return nil
}

// declineRequest ends a caller's waiting request, as the operator.
func (h *Handler) declineRequest(q *req) error {
	f := q.r.PostFormValue
	userID, serviceID, productID := f("userId"), f("serviceId"), f("productId")
	pending, err := h.ops.PendingAccessRequests(q.r.Context(), userID)
	if err != nil {
		return err
	}
	found := false
	for _, r := range pending {
		found = found || userID != "" && r.ServiceID == serviceID && r.ProductID == productID
	}
	if !found {
		return h.renderRequests(q, http.StatusConflict, "That request is not waiting any more: it was answered meanwhile. Nothing was changed.")
	}
	// The decline is its audit entry: if that failed, nothing was
	// recorded and the error page says so.
	if err := h.ops.DeclineAccess(q.r.Context(), q.actor(), userID, serviceID, productID); err != nil {
		q.spent = onceform.Failed
		return err
	}
	q.spent = onceform.Made
	http.Redirect(q.w, q.r, h.link(map[string][]string{"done": {"declined"}}, "requests"), http.StatusSeeOther)
	return nil
}
