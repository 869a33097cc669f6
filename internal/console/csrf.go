package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"net/http"

	"github.com/platformgw/gateway/internal/httpsonly"
)

// CSRF protection: double submit, bound to the operator. The console sets
// a random cookie (HttpOnly, SameSite=Strict, Secure unless plain HTTP on
// loopback: httpsonly.SecureCookie) and puts in every form the
// HMAC of that cookie and the operator's name under a key of this process;
// a POST must carry both and they must match. Another site can neither
// read the token nor, with SameSite=Strict, send the cookie; a token of
// one operator is no good for another. A POST from another site
// (Sec-Fetch-Site: cross-site) is refused before that.

const csrfCookie = "platform_console_csrf"

type csrfKey struct{ key [32]byte }

func newCSRFKey() (*csrfKey, error) {
	k := new(csrfKey)
	_, err := rand.Read(k.key[:])
	return k, err
}

func (k *csrfKey) token(cookie, who string) string {
	m := hmac.New(sha256.New, k.key[:])
	m.Write([]byte(cookie))
	m.Write([]byte{0})
	m.Write([]byte(who))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// ensure returns the form token for the request, setting the cookie first
// when the browser has none.
func (h *Handler) csrfToken(w http.ResponseWriter, r *http.Request, who string) string {
	c, err := r.Cookie(csrfCookie)
	val := ""
	if err == nil && len(c.Value) == 43 {
		val = c.Value
	} else {
		var b [32]byte
		rand.Read(b[:])
		val = base64.RawURLEncoding.EncodeToString(b[:])
		path := h.Prefix
		if path == "" {
			path = "/"
		}
		http.SetCookie(w, &http.Cookie{
			Name: csrfCookie, Value: val, Path: path, HttpOnly: true,
			Secure: httpsonly.SecureCookie(r), SameSite: http.SameSiteStrictMode,
		})
	}
	return h.csrf.token(val, who)
}

// csrfOK checks a POST's token against its cookie.
func (h *Handler) csrfOK(r *http.Request, who string) bool {
	if r.Header.Get("Sec-Fetch-Site") == "cross-site" {
		return false
	}
	c, err := r.Cookie(csrfCookie)
	if err != nil || c.Value == "" {
		return false
	}
	got := r.PostFormValue("csrf")
	want := h.csrf.token(c.Value, who)
	return got != "" && hmac.Equal([]byte(got), []byte(want))
}

// csrfRefused answers a POST the CSRF check refused with the console's
// own page: what happened (most often a form of a page shown before the
// gateway restarted or its configuration was reloaded, whose token is
// under the old key), that nothing was changed, and where to go back to.
// The page has no form, so no token is made for it and the answer sets
// no cookie: a POST from another site cannot replace the operator's.
func (h *Handler) csrfRefused(q *req) {
	q.csrf = "-" // none: the notice page has no form
	h.render(q, http.StatusForbidden, "notice", "Form not sent", noticeData{Class: "error", Links: h.resultLinks(q),
		Message: "Missing or wrong CSRF token: this form's security token is missing, or is not this console's (the gateway restarted or its configuration was reloaded since the page was shown, or the form came from another site). Nothing was changed: open the page again and send its form."})
}
