package portal

import (
	"errors"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/httpsonly"
	"github.com/platformgw/gateway/internal/onceform"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store"
)

// Cookie names. The session cookie holds only the random session id; the
// pre-sign-in cookie holds the token the sign-in form must echo, so a
// sign-in cannot be posted from another site (login CSRF).
const (
	sessionCookie = "platform_portal_session"
	preCookie     = "platform_portal_signin"
)

// contentSecurityPolicy allows only the portal's own script file
// (assets/copy.js, the copy buttons): no inline script, nothing from
// elsewhere.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// maxFormBytes caps a form body: the largest form is a key label.
const maxFormBytes = 8 << 10

// Messages shown after a redirect, chosen by a fixed code in the query so
// no text from a URL is ever rendered.
var notices = map[string]string{
	"revoked":   "The key was revoked.",
	"ended":     "Your session ended: the key you signed in with was revoked or expired, or is no longer there. Sign in again.",
	"expired":   "Your session expired. Sign in again.",
	"signedout": "You are signed out.",
}

// request is one request's context for the handlers.
type request struct {
	w    http.ResponseWriter
	r    *http.Request
	base string // the path the portal is mounted at, "" or "/portal"
	now  time.Time
}

// ServeHTTP serves the portal's pages. It never calls next: every path
// below the portal's is the portal's.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	hdr := w.Header()
	csp := h.csp
	if csp == "" {
		csp = contentSecurityPolicy
	}
	hdr.Set("Content-Security-Policy", csp)
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Referrer-Policy", "no-referrer")
	hdr.Set("X-Frame-Options", "DENY")
	q := &request{w: w, r: r, base: basePath(r)}
	if !h.AllowPlainHTTP && httpsonly.PlainFromAfar(r) {
		h.message(q, http.StatusForbidden, "HTTPS required",
			"This portal is served over HTTPS only; its session cookie must not travel in the clear.")
		return nil
	}
	q.now = h.rt.Now().UTC()
	p := r.URL.Path
	if p == "" {
		p = "/"
	}
	if strings.HasPrefix(p, "/assets/") {
		return h.serveAsset(q, strings.TrimPrefix(p, "/assets/"))
	}
	if h.onward(q, p) {
		return nil
	}
	switch {
	case p == "/":
		if !h.allow(q, http.MethodGet, http.MethodHead) {
			return nil
		}
		h.home(q)
	case p == "/signin":
		if !h.allow(q, http.MethodPost) {
			return nil
		}
		h.signIn(q)
	case p == "/oidc/start":
		if !h.allow(q, http.MethodGet, http.MethodHead) {
			return nil
		}
		h.oidcStart(q)
	case p == "/oidc/callback":
		if !h.allow(q, http.MethodGet) {
			return nil
		}
		h.oidcCallback(q)
	case p == "/signout":
		if !h.allow(q, http.MethodPost) {
			return nil
		}
		h.signOut(q)
	case p == "/keys":
		if !h.allow(q, http.MethodPost) {
			return nil
		}
		h.createKey(q)
	case p == "/keys/revoke":
		if !h.allow(q, http.MethodGet, http.MethodHead, http.MethodPost) {
			return nil
		}
		if q.r.Method == http.MethodPost {
			h.revokeKey(q)
		} else {
			h.confirmRevoke(q)
		}
	case p == "/usage.csv":
		if !h.allow(q, http.MethodGet, http.MethodHead) {
			return nil
		}
		h.exportUsage(q)
	case p == "/billing" || strings.HasPrefix(p, "/billing/"):
		h.serveBilling(q, strings.TrimPrefix(p, "/billing"))
	case strings.HasPrefix(p, "/plans/"):
		h.servePlans(q, strings.TrimPrefix(p, "/plans/"))
	case strings.HasPrefix(p, "/jobs/") && strings.Count(p, "/") == 2:
		if !h.allow(q, http.MethodGet, http.MethodHead) {
			return nil
		}
		h.job(q, strings.TrimPrefix(p, "/jobs/"))
	default:
		h.message(q, http.StatusNotFound, "Not found", "There is no such page in the portal.")
	}
	return nil
}

// onward answers a page that goes on by itself to the same address when
// the request is a navigation another site started (Stripe sending a
// caller back from Checkout or its customer portal, a link in a mail)
// and carries no session cookie: the browser does not send the
// SameSite=Strict cookie on such a navigation, so the caller would look
// signed out and lose the page's message. The page's own navigation is
// same-site, and carries it. A browser that does not say where a
// navigation came from (Sec-Fetch-Site) is served as before; the OIDC
// callback answers with such a page itself.
func (h *Handler) onward(q *request, p string) bool {
	r := q.r
	if r.Method != http.MethodGet || r.Header.Get("Sec-Fetch-Site") != "cross-site" ||
		r.Header.Get("Sec-Fetch-Mode") != "navigate" || p == "/oidc/callback" {
		return false
	}
	if _, err := r.Cookie(sessionCookie); err == nil {
		return false
	}
	to := q.base + p
	if !strings.HasPrefix(to, "/") || strings.HasPrefix(to, "//") || strings.ContainsAny(to, "\\\"'<>") {
		return false // never anywhere but a path of this site
	}
	// Written escaped: a browser removes tabs and newlines from a URL
	// before it reads it, so a path "/\t/evil.example/" (asked for as
	// /%09/evil.example/) written as it is would send it to
	// //evil.example/, another site.
	to = (&url.URL{Path: to}).EscapedPath()
	if query := r.URL.Query(); len(query) > 0 {
		to += "?" + query.Encode()
	}
	h.render(q, http.StatusOK, "onward", page{Title: "API portal", Base: q.base, Text: to})
	return true
}

// basePath is where the portal is mounted: the original path less the
// one handle_path left. It is only ever a clean absolute path, so a
// redirect built on it stays on this site.
func basePath(r *http.Request) string {
	orig, ok := r.Context().Value(caddyhttp.OriginalRequestCtxKey).(http.Request)
	if !ok || orig.URL == nil {
		return ""
	}
	base, found := strings.CutSuffix(orig.URL.Path, r.URL.Path)
	if !found {
		return ""
	}
	base = strings.Trim(path.Clean("/"+base), "/")
	if base == "" || strings.ContainsAny(base, "\\?#\"'<>") {
		return ""
	}
	return "/" + base
}

// clientAddress is the address sign-in attempts are counted against:
// Caddy's client IP (which honours trusted_proxies), else the peer.
func clientAddress(r *http.Request) string {
	if ip, ok := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string); ok && ip != "" {
		return ip
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// signInNetwork is what sign-in attempts are counted against: the client
// address, an IPv6 one cut to its /64 (one client, a home connection,
// holds every address of a /64: counted per address, each would be a
// fresh sign_in_limit of attempts), an IPv4-mapped one counted as its
// IPv4 address.
func signInNetwork(r *http.Request) string {
	a := clientAddress(r)
	ip, err := netip.ParseAddr(a)
	if err != nil {
		return a
	}
	ip = ip.Unmap().WithZone("")
	if ip.Is4() {
		return ip.String()
	}
	p, _ := ip.Prefix(64)
	return p.String()
}

// allow answers 405 unless the request's method is one of methods.
func (h *Handler) allow(q *request, methods ...string) bool {
	for _, m := range methods {
		if q.r.Method == m {
			return true
		}
	}
	q.w.Header().Set("Allow", strings.Join(methods, ", "))
	h.message(q, http.StatusMethodNotAllowed, "Method not allowed", q.r.Method+" is not allowed here.")
	return false
}

func (h *Handler) serveAsset(q *request, name string) error {
	if q.r.Method != http.MethodGet && q.r.Method != http.MethodHead {
		h.allow(q, http.MethodGet, http.MethodHead)
		return nil
	}
	b, err := fs.ReadFile(h.assets, name)
	if err != nil || name == "" || strings.Contains(name, "/") {
		h.message(q, http.StatusNotFound, "Not found", "There is no such file in the portal.")
		return nil
	}
	switch path.Ext(name) {
	case ".css":
		q.w.Header().Set("Content-Type", "text/css; charset=utf-8")
	case ".svg":
		q.w.Header().Set("Content-Type", "image/svg+xml")
	case ".js":
		q.w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
	default:
		q.w.Header().Set("Content-Type", "application/octet-stream")
	}
	q.w.Header().Set("Cache-Control", "public, max-age=3600")
	_, err = q.w.Write(b)
	return err
}

// cookie builds a cookie of the portal: HttpOnly, SameSite=Strict, under
// the portal's path, Secure unless the request is plain HTTP on loopback
// (httpsonly.SecureCookie): behind a proxy that terminates TLS too.
func (q *request) cookie(name, value string, maxAge int) *http.Cookie {
	return &http.Cookie{
		Name: name, Value: value, Path: q.base + "/", MaxAge: maxAge,
		HttpOnly: true, Secure: httpsonly.SecureCookie(q.r), SameSite: http.SameSiteStrictMode,
	}
}

func (q *request) redirect(to string) {
	http.Redirect(q.w, q.r, q.base+to, http.StatusSeeOther)
}

// signedIn is the request's session and the key it was opened with,
// checked again now: a key revoked, expired or gone since ends the
// session at once. A session opened with the identity provider has no
// key (sessionKey is empty); it lasts its session_ttl. ok is false when
// there is no live session; the caller has then already answered (a
// redirect to sign in).
func (h *Handler) signedIn(q *request) (id string, sess session, sessionKey store.KeyRecord, ok bool) {
	c, err := q.r.Cookie(sessionCookie)
	if err != nil {
		q.redirect("/")
		return "", session{}, store.KeyRecord{}, false
	}
	sess, ok = sessions.get(c.Value, q.now)
	if !ok {
		http.SetCookie(q.w, q.cookie(sessionCookie, "", -1))
		q.redirect("/?m=expired")
		return "", session{}, store.KeyRecord{}, false
	}
	if sess.KeyID == "" {
		return c.Value, sess, store.KeyRecord{}, true
	}
	sessionKey, err = h.rt.Store().KeyByID(q.r.Context(), sess.KeyID)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		h.logger.Error("portal key lookup", zap.String("key_id", sess.KeyID), zap.Error(err))
		h.message(q, http.StatusInternalServerError, "Something went wrong", "The portal could not read your key; try again.")
		return "", session{}, store.KeyRecord{}, false
	}
	if err != nil || sessionKey.UserID != sess.UserID || !sessionKey.ActiveAt(q.now) {
		sessions.end(c.Value)
		http.SetCookie(q.w, q.cookie(sessionCookie, "", -1))
		q.redirect("/?m=ended")
		return "", session{}, store.KeyRecord{}, false
	}
	return c.Value, sess, sessionKey, true
}

// checkCSRF parses the form and checks its token against want; on failure
// it answers 403 and nothing is changed.
func (h *Handler) checkCSRF(q *request, want string) bool {
	q.r.Body = http.MaxBytesReader(q.w, q.r.Body, maxFormBytes)
	if err := q.r.ParseForm(); err != nil {
		h.message(q, http.StatusBadRequest, "Bad form", "The form could not be read.")
		return false
	}
	if !sameToken(q.r.PostForm.Get("csrf"), want) {
		h.message(q, http.StatusForbidden, "Form refused",
			"This form did not come from your current portal page (its security token is missing or stale). Nothing was changed; go back to the portal and try again.")
		return false
	}
	return true
}

// home is the dashboard of a signed-in caller, else the sign-in page.
func (h *Handler) home(q *request) {
	if c, err := q.r.Cookie(sessionCookie); err == nil {
		if _, live := sessions.get(c.Value, q.now); live {
			_, sess, sessionKey, ok := h.signedIn(q)
			if !ok {
				return
			}
			if next := h.afterSignIn(q); next != "" {
				q.redirect(next)
				return
			}
			h.dashboard(q, sess, sessionKey, dashboardExtras{Notice: notices[q.r.URL.Query().Get("m")]})
			return
		}
		http.SetCookie(q.w, q.cookie(sessionCookie, "", -1))
	}
	h.signInPage(q, http.StatusOK, notices[q.r.URL.Query().Get("m")], "")
}

// signInPage renders the sign-in form with a fresh pre-sign-in cookie and
// the token the server binds to it (signintoken.go).
func (h *Handler) signInPage(q *request, status int, notice, problem string) {
	c := randomToken()
	http.SetCookie(q.w, q.cookie(preCookie, c, int(signInFormTTL/time.Second)))
	p := page{Title: "Sign in", Base: q.base, CSRF: signInToken(c, q.now), Notice: notice, Error: problem}
	if h.OIDC != nil {
		p.Provider = h.OIDC.Name
	}
	h.render(q, status, "signin", p)
}

func (h *Handler) signIn(q *request) {
	limit := &billing.RateLimit{Requests: h.SignInLimit, WindowSeconds: 60}
	if ok, wait, _ := h.rt.AllowClient("portal-sign-in:"+signInNetwork(q.r), limit, q.now); !ok {
		q.w.Header().Set("Retry-After", retryAfter(wait))
		h.signInPage(q, http.StatusTooManyRequests, "", "Too many sign-in attempts from your address; wait a minute and try again.")
		return
	}
	pre := ""
	if c, err := q.r.Cookie(preCookie); err == nil {
		pre = c.Value
	}
	q.r.Body = http.MaxBytesReader(q.w, q.r.Body, maxFormBytes)
	if err := q.r.ParseForm(); err != nil || crossOrigin(q.r.Header.Get("Sec-Fetch-Site")) ||
		!signInTokenOK(pre, q.r.PostForm.Get("csrf"), q.now) {
		// A stale form, one posted from another site or origin, or a
		// cookie and token this server did not issue together: nothing
		// is checked, the form is shown afresh.
		h.signInPage(q, http.StatusForbidden, "", "This sign-in form expired or did not come from this portal; sign in again.")
		return
	}
	token := strings.TrimSpace(q.r.PostForm.Get("key"))
	sessionKey, aerr := h.rt.AuthenticateServiceKey(q.r.Context(), token)
	if aerr != nil {
		status := http.StatusUnauthorized
		msg := "That service key was not accepted."
		switch aerr.Code {
		case apierror.KeyRevoked:
			msg = "That service key was revoked."
		case apierror.KeyExpired:
			msg = "That service key has expired."
		case apierror.InternalError:
			status, msg = http.StatusInternalServerError, "The key could not be checked now; try again."
		}
		h.signInPage(q, status, "", msg)
		return
	}
	sess := session{UserID: sessionKey.UserID, KeyID: sessionKey.ID, Expires: q.now.Add(time.Duration(h.SessionTTL)), CSRF: randomToken()}
	if !h.openSession(q, sess) {
		h.signInPage(q, http.StatusServiceUnavailable, "", "The portal holds too many sessions now; try again later.")
		return
	}
	h.logger.Info("portal sign-in", zap.String("user_id", sessionKey.UserID), zap.String("with", "key"), zap.String("key_id", sessionKey.ID))
	h.auditSignIn(q, sessionKey.UserID, sessionKey.ID, "with service key "+sessionKey.ID)
	http.SetCookie(q.w, q.cookie(preCookie, "", -1))
	q.redirect("/")
}

// openSession stores sess and gives the browser its cookie; false when
// the store is full. A session this browser already had ends: one
// browser, one session.
func (h *Handler) openSession(q *request, sess session) bool {
	id, ok := sessions.create(sess, q.now)
	if !ok {
		return false
	}
	if old, err := q.r.Cookie(sessionCookie); err == nil {
		sessions.end(old.Value)
	}
	http.SetCookie(q.w, q.cookie(sessionCookie, id, int(time.Duration(h.SessionTTL)/time.Second)))
	return true
}

// auditSignIn records a sign-in in the audit log, as the portal's key
// changes are. A failure is logged by RecordAudit; the sign-in stands.
func (h *Handler) auditSignIn(q *request, userID, keyID, detail string) {
	_ = h.ops.RecordAudit(q.r.Context(), store.AuditEntry{
		Actor: "portal:" + userID, Action: ops.AuditPortalSignIn, UserID: userID, KeyID: keyID, Detail: detail,
	})
}

func retryAfter(d time.Duration) string {
	s := int((d + time.Second - 1) / time.Second)
	return strconv.Itoa(max(s, 1))
}

func (h *Handler) signOut(q *request) {
	id, sess, _, ok := h.signedIn(q)
	if !ok {
		return
	}
	if !h.checkCSRF(q, sess.CSRF) {
		return
	}
	sessions.end(id)
	http.SetCookie(q.w, q.cookie(sessionCookie, "", -1))
	q.redirect("/?m=signedout")
}

func (h *Handler) createKey(q *request) {
	_, sess, sessionKey, ok := h.signedIn(q)
	if !ok {
		return
	}
	if !h.checkCSRF(q, sess.CSRF) {
		return
	}
	if !h.AllowKeyManagement {
		h.message(q, http.StatusForbidden, "Key management is off",
			"The operator of this portal does not let callers create or revoke keys here. Nothing was changed.")
		return
	}
	// The form is taken once (once.go): posted again, it makes no
	// second key.
	finish, ok := h.takeForm(q, sess.UserID)
	if !ok {
		return
	}
	spent := onceform.Failed
	defer func() { finish(spent) }()
	label := strings.TrimSpace(q.r.PostForm.Get("label"))
	rec, refusal, err := h.mint(q, sess, sessionKey, label, nil)
	var invalid *apierror.Error
	switch {
	case rec.ID != "" || errors.Is(err, errParentEnded):
		spent = onceform.Made
	case refusal != nil || errors.As(err, &invalid):
		spent = onceform.Unchanged // refused: the same form may be sent again
	}
	if err != nil && rec.ID != "" {
		// The key exists but its audit entry failed (the server log says
		// so): it is shown, once, as the admin API does.
		err = nil
	}
	if refusal != nil {
		if refusal.retryAfter > 0 {
			q.w.Header().Set("Retry-After", retryAfter(refusal.retryAfter))
		}
		h.dashboardStatus(q, refusal.status, sess, sessionKey, dashboardExtras{Error: refusal.message, Label: label})
		return
	}
	if errors.Is(err, errParentEnded) {
		// The key signed in with was revoked while the new one was made;
		// the new one went with it.
		q.redirect("/?m=ended")
		return
	}
	if err != nil {
		var ae *apierror.Error
		if errors.As(err, &ae) {
			h.dashboardStatus(q, http.StatusBadRequest, sess, sessionKey, dashboardExtras{Error: ae.Message, Label: label})
			return
		}
		h.logger.Error("portal key creation", zap.String("user_id", sess.UserID), zap.Error(err))
		h.message(q, http.StatusInternalServerError, "Something went wrong", "The key could not be created; try again.")
		return
	}
	h.logger.Info("service key created in the portal", zap.String("user_id", rec.UserID), zap.String("key_id", rec.ID), zap.String("by_key_id", sessionKey.ID))
	h.dashboardStatus(q, http.StatusCreated, sess, sessionKey, dashboardExtras{NewKey: rec.Key, NewKeyID: rec.ID})
}

func (h *Handler) revokeKey(q *request) {
	_, sess, sessionKey, ok := h.signedIn(q)
	if !ok {
		return
	}
	if !h.checkCSRF(q, sess.CSRF) {
		return
	}
	if !h.AllowKeyManagement {
		h.message(q, http.StatusForbidden, "Key management is off",
			"The operator of this portal does not let callers create or revoke keys here. Nothing was changed.")
		return
	}
	id := q.r.PostForm.Get("key_id")
	target, err := h.rt.Store().KeyByID(q.r.Context(), id)
	// Another user's key is answered exactly like a key that does not
	// exist, so the form cannot even tell whether it does.
	if errors.Is(err, store.ErrNotFound) || err == nil && target.UserID != sess.UserID {
		h.message(q, http.StatusNotFound, "No such key", "None of your keys has that id. Nothing was changed.")
		return
	}
	if err == nil {
		var v ops.KeyView
		// A revocation whose audit entry failed is still done (the
		// server log says so).
		if v, err = h.ops.RevokeKey(q.r.Context(), "portal:"+sess.UserID, target.ID); v.ID != "" {
			err = nil
		}
	}
	if err != nil {
		h.logger.Error("portal key revocation", zap.String("user_id", sess.UserID), zap.Error(err))
		h.message(q, http.StatusInternalServerError, "Something went wrong", "The key could not be revoked; try again.")
		return
	}
	h.logger.Info("service key revoked in the portal", zap.String("user_id", sess.UserID), zap.String("key_id", target.ID), zap.String("by_key_id", sessionKey.ID))
	q.redirect("/?m=revoked#keys")
}

func (h *Handler) job(q *request, escapedID string) {
	_, sess, _, ok := h.signedIn(q)
	if !ok {
		return
	}
	id, err := url.PathUnescape(escapedID)
	var j store.Job
	if err == nil && id != "" {
		j, err = h.rt.Store().GetJob(q.r.Context(), id)
	}
	// Another user's job is answered like one that does not exist.
	if err != nil && !errors.Is(err, store.ErrNotFound) && id != "" {
		h.logger.Error("portal job lookup", zap.Error(err))
		h.message(q, http.StatusInternalServerError, "Something went wrong", "The job could not be read; try again.")
		return
	}
	if err != nil || id == "" || j.UserID != sess.UserID {
		h.message(q, http.StatusNotFound, "No such job", "None of your jobs has that id.")
		return
	}
	h.render(q, http.StatusOK, "job", page{Title: "Job " + j.ID, Base: q.base, CSRF: sess.CSRF, UserID: sess.UserID, Job: &j,
		JobCost: costText(productOf(h.rt.Catalog, j.ServiceID, j.ProductID), j.Cost)})
}

// message renders a short page with a heading and a sentence.
func (h *Handler) message(q *request, status int, title, text string) {
	h.render(q, status, "message", page{Title: title, Base: q.base, Text: text})
}

func (h *Handler) render(q *request, status int, name string, p page) {
	hdr := q.w.Header()
	hdr.Set("Content-Type", "text/html; charset=utf-8")
	hdr.Set("Cache-Control", "no-store")
	p.Payments = h.pay != nil
	var b strings.Builder
	if err := h.pages.ExecuteTemplate(&b, name, p); err != nil {
		h.logger.Error("portal template", zap.String("template", name), zap.Error(err))
		http.Error(q.w, "internal error", http.StatusInternalServerError)
		return
	}
	q.w.WriteHeader(status)
	if q.r.Method != http.MethodHead {
		_, _ = q.w.Write([]byte(b.String()))
	}
}
