package console

import (
	"errors"
	"mime"
	"net/http"
	"net/url"
	"strings"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/onceform"
)

// req is one request as the pages see it.
type req struct {
	w    http.ResponseWriter
	r    *http.Request
	who  string
	csrf string
	// spent is what became of the change a POST asked for, for its
	// one-time value (once.go): 0 while nothing was changed.
	spent onceform.State
	// parts are the unescaped path segments below the prefix.
	parts []string
}

// route dispatches a request by its path below the prefix.
func (h *Handler) route(w http.ResponseWriter, r *http.Request, who string) {
	rest := r.URL.EscapedPath()
	if h.Prefix != "" {
		if p, ok := strings.CutPrefix(rest, h.Prefix); ok && (p == "" || p[0] == '/') {
			rest = p
		}
	}
	var parts []string
	for _, s := range strings.Split(strings.Trim(rest, "/"), "/") {
		u, err := url.PathUnescape(s)
		if err != nil {
			http.NotFound(w, r)
			return
		}
		if u != "" {
			parts = append(parts, u)
		}
	}
	q := &req{w: w, r: r, who: who, parts: parts}
	if len(parts) == 2 && parts[0] == "assets" {
		h.asset(w, r, parts[1])
		return
	}
	if r.Method == http.MethodPost {
		if !h.readForm(q) {
			return
		}
		if !h.csrfOK(r, who) {
			h.logger.Warn("console POST refused: missing or wrong CSRF token",
				zap.String("operator", who), zap.String("path", r.URL.Path), zap.String("remote", r.RemoteAddr))
			h.csrfRefused(q)
			return
		}
		h.post(q)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD, POST")
		http.Error(w, "405 method not allowed", http.StatusMethodNotAllowed)
		return
	}
	q.csrf = h.csrfToken(w, r, who)
	var err error
	switch {
	case len(parts) == 0:
		err = h.overview(q)
	case len(parts) == 1 && parts[0] == "services":
		err = h.services(q)
	case len(parts) == 1 && parts[0] == "users":
		err = h.users(q)
	case len(parts) == 2 && parts[0] == "users":
		err = h.user(q, parts[1], nil, nil)
	case len(parts) == 3 && parts[0] == "users" && parts[2] == "revoke":
		err = h.confirmRevoke(q, parts[1])
	case len(parts) == 1 && parts[0] == "usage":
		err = h.usage(q)
	case len(parts) == 2 && parts[0] == "usage" && parts[1] == "export":
		err = h.export(q)
	case len(parts) == 1 && parts[0] == "jobs":
		err = h.jobs(q)
	case len(parts) == 2 && parts[0] == "jobs":
		err = h.job(q, parts[1])
	case len(parts) == 3 && parts[0] == "jobs" && parts[2] == "result":
		err = h.jobResult(q, parts[1])
	case len(parts) == 1 && parts[0] == "audit":
		err = h.audit(q)
	case len(parts) == 1 && parts[0] == "alerts":
		err = h.alerts(q)
	case len(parts) == 1 && parts[0] == "revenue":
		err = h.revenue(q)
	case len(parts) == 2 && parts[0] == "revenue" && parts[1] == "resolve":
		err = h.confirmResolve(q)
	case len(parts) == 1 && parts[0] == "requests":
		err = h.requests(q)
	default:
		err = errNoSuchPage
	}
	if err != nil {
		h.fail(q, err)
	}
}

// maxFormBytes caps the body of a console POST. The largest form (a key's
// label, roles and expiry, with the CSRF token and one-time value) is
// under 1 KiB.
const maxFormBytes = 16 << 10

// readForm reads a POST's form before anything else looks at it: a form
// as a browser sends it (application/x-www-form-urlencoded), at most
// maxFormBytes. Anything else is refused with a page saying so and
// nothing changed: PostFormValue alone read any body, and spooled a
// multipart upload of any size to disk, before the CSRF check refused it.
func (h *Handler) readForm(q *req) bool {
	refuse := func(status int, why, msg string) bool {
		h.logger.Info("console POST refused: "+why,
			zap.String("operator", q.who), zap.String("path", q.r.URL.Path), zap.String("remote", q.r.RemoteAddr))
		h.render(q, status, "notice", "Form not sent", noticeData{Class: "error", Message: msg, Links: h.resultLinks(q)})
		return false
	}
	if mt, _, _ := mime.ParseMediaType(q.r.Header.Get("Content-Type")); mt != "application/x-www-form-urlencoded" {
		return refuse(http.StatusUnsupportedMediaType, "not a form",
			"The console takes forms as a browser sends them (application/x-www-form-urlencoded): no upload and no other body. Nothing was changed.")
	}
	q.r.Body = http.MaxBytesReader(q.w, q.r.Body, maxFormBytes)
	if err := q.r.ParseForm(); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return refuse(http.StatusRequestEntityTooLarge, "body too large",
				"This form is larger than any of the console's forms (at most 16 KiB). Nothing was changed.")
		}
		return refuse(http.StatusBadRequest, "unreadable form",
			"This form could not be read. Nothing was changed: open the page again and send its form.")
	}
	return true
}

// post dispatches the forms. A form posts to the page it changes; a
// refused change shows that page again with the error. Each form's
// one-time value is taken first: a form posted a second time changes
// nothing and says the change was made already (once.go).
func (h *Handler) post(q *req) {
	id, verdict, state := h.once.Claim(q.r.PostFormValue(onceform.Field), q.who)
	if verdict != onceform.OK {
		h.onceRefused(q, verdict, state)
		return
	}
	defer func() {
		if r := recover(); r != nil {
			h.once.Finish(id, onceform.Failed)
			panic(r)
		}
		h.once.Finish(id, q.spent)
	}()
	p := q.parts
	var err error
	switch {
	case len(p) == 3 && p[0] == "users" && p[2] == "keys":
		err = h.createKey(q, p[1])
	case len(p) == 3 && p[0] == "users" && p[2] == "revoke":
		err = h.revokeKey(q, p[1])
	case len(p) == 3 && p[0] == "users" && p[2] == "subscription":
		err = h.putSubscription(q, p[1])
	case len(p) == 3 && p[0] == "users" && p[2] == "credits":
		err = h.addCredits(q, p[1])
	case len(p) == 2 && p[0] == "requests" && p[1] == "decline":
		err = h.declineRequest(q)
	case len(p) == 2 && p[0] == "revenue" && p[1] == "resolve":
		err = h.resolveNotGranted(q)
	default:
		err = errNoSuchPage
	}
	if err != nil {
		h.fail(q, err)
	}
}

// errNoSuchPage answers an address below the console that is none of its
// pages (a mistyped link, an old bookmark) with the console's error page.
var errNoSuchPage = apierror.New(apierror.NotFound, "There is no such page in the console.")

// fail answers an error page: the operator's mistake as is, anything else
// as a generic message with the details in the log.
func (h *Handler) fail(q *req, err error) {
	var ae *apierror.Error
	status := http.StatusInternalServerError
	msg := "internal error; see the server log"
	if errors.As(err, &ae) {
		status, msg = apierror.Status(ae.Code), humanMessage(ae)
	} else {
		h.logger.Error("console request failed", zap.String("path", q.r.URL.Path), zap.Error(err))
		if q.spent == onceform.Failed {
			msg += ". The change may or may not have been made: look before making it again."
		}
	}
	h.render(q, status, "error", "Error", map[string]any{"Message": msg})
}

// link builds a console URL from path segments and a query.
func (h *Handler) link(query url.Values, parts ...string) string {
	var b strings.Builder
	b.WriteString(h.Prefix)
	for _, p := range parts {
		b.WriteByte('/')
		b.WriteString(url.PathEscape(p))
	}
	if len(parts) == 0 {
		b.WriteByte('/')
	}
	if len(query) > 0 {
		b.WriteByte('?')
		b.WriteString(query.Encode())
	}
	return b.String()
}
