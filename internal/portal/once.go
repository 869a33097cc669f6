package portal

import (
	"net/http"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/onceform"
)

// forms hands out the one-time values of the forms that make something
// (internal/onceform, as the operator console's forms): the create-key
// form carries one, bound to the caller, and the portal takes it once,
// so a double click or a reload of the page that showed the new key
// makes no second key. Like the sessions it is shared by every config (a
// reload keeps open forms good) and lost on restart, and each node of a
// fleet has its own, as it has its own sessions.
var forms = newForms()

func newForms() *onceform.Book {
	b, err := onceform.NewRandom("platform_portal one-time form values")
	if err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return b
}

// takeForm takes the one-time value of the form q posted for userID. It
// returns finish, which records what became of the POST (Unchanged gives
// the value back), and false when the value was not taken: the answer
// (409 when the form was sent before, 403 when it is too old or none of
// this portal's) is then written and nothing is changed.
func (h *Handler) takeForm(q *request, userID string) (finish func(onceform.State), ok bool) {
	id, verdict, first := forms.Claim(q.r.PostForm.Get(onceform.Field), userID)
	if verdict == onceform.OK {
		return func(s onceform.State) { forms.Finish(id, s) }, true
	}
	h.logger.Info("portal POST not taken: its one-time form value was spent, stale or missing",
		zap.String("user_id", userID), zap.String("path", q.r.URL.Path), zap.Stringer("verdict", verdict))
	status, title, text := http.StatusForbidden, "Form not sent",
		"This form lacks its one-time value, or carries one this portal did not make for you. Nothing was changed: open the portal again and send its form."
	switch verdict {
	case onceform.Taken:
		status, title = http.StatusConflict, "Already sent"
		switch first {
		case onceform.Made:
			title = "Already made"
			text = "This key was already made: this form was sent before (a second click, or a reload of the page that answered it). Nothing was changed this time. The new key was shown once, on the answer to the first; if it was not copied, revoke that key on your dashboard and create another."
		case onceform.InFlight:
			text = "This form was sent a moment ago and that key is being made now. Nothing was changed by sending it again; see your keys on your dashboard."
		default:
			text = "This form was sent before and that attempt failed: the key may or may not have been made. Nothing was changed this time: look at your keys on your dashboard and create one from there if it is still needed."
		}
	case onceform.Stale:
		text = "This form is too old to send (a form can be sent within " + onceform.TTLWords + " of being shown). Nothing was changed: open the portal again and send its form."
	}
	h.message(q, status, title, text)
	return nil, false
}
