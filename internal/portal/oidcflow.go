package portal

import (
	"context"
	"errors"
	"net/http"
	"regexp"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"go.uber.org/zap"
	"golang.org/x/oauth2"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/httpsonly"
)

// oidcCookie carries a sign-in from /oidc/start to /oidc/callback
// (oidcstate.go).
const oidcCookie = "platform_portal_oidc"

// flowCookie is the state cookie: HttpOnly, limited to the portal's
// /oidc/ paths, and SameSite=Lax rather than Strict, since the callback
// is a top-level navigation from the provider's site. It is Secure
// unless the request is plain HTTP on loopback (httpsonly.SecureCookie).
func (q *request) flowCookie(value string, maxAge int) *http.Cookie {
	return &http.Cookie{
		Name: oidcCookie, Value: value, Path: q.base + "/oidc/", MaxAge: maxAge,
		HttpOnly: true, Secure: httpsonly.SecureCookie(q.r), SameSite: http.SameSiteLaxMode,
	}
}

// returnPath is a portal page a sign-in may come back to: the dashboard
// or a job. Anything else comes back to the dashboard.
var returnPath = regexp.MustCompile(`^/(jobs/[A-Za-z0-9._~-]{1,200})?$`)

// oidcStart sends the browser to the provider with a fresh state, nonce
// and PKCE challenge, sealed in the state cookie.
func (h *Handler) oidcStart(q *request) {
	if h.oidc == nil {
		h.message(q, http.StatusNotFound, "Not found", "There is no such page in the portal.")
		return
	}
	prov, ok := h.oidc.ready()
	if !ok {
		h.message(q, http.StatusServiceUnavailable, "Sign-in with "+h.OIDC.Name+" is not available",
			"The portal cannot reach "+h.OIDC.Name+" right now. Try again in a few minutes, or sign in with a service key.")
		return
	}
	ret := q.r.URL.Query().Get("return")
	if !returnPath.MatchString(ret) {
		ret = "/"
	}
	f := oidcFlow{State: randomToken(), Nonce: randomToken(), Verifier: oauth2.GenerateVerifier(),
		Return: ret, Expires: q.now.Add(oidcFlowTTL)}
	http.SetCookie(q.w, q.flowCookie(sealFlow(f), int(oidcFlowTTL/time.Second)))
	to := h.oidc.oauth2Config(prov).AuthCodeURL(f.State, oidc.Nonce(f.Nonce), oauth2.S256ChallengeOption(f.Verifier))
	http.Redirect(q.w, q.r, to, http.StatusSeeOther)
}

// oidcCallback finishes a sign-in: the state against the cookie (once),
// the code exchanged with the PKCE verifier, the ID token verified
// (signature, issuer, audience, expiry by go-oidc, the nonce here), the
// claim mapped to the user id, and the portal's own session opened.
func (h *Handler) oidcCallback(q *request) {
	if h.oidc == nil {
		h.message(q, http.StatusNotFound, "Not found", "There is no such page in the portal.")
		return
	}
	name := h.OIDC.Name
	limit := &billing.RateLimit{Requests: h.SignInLimit, WindowSeconds: 60}
	if ok, wait, _ := h.rt.AllowClient("portal-sign-in:"+signInNetwork(q.r), limit, q.now); !ok {
		q.w.Header().Set("Retry-After", retryAfter(wait))
		h.oidcRefused(q, http.StatusTooManyRequests, "too many attempts", "Too many sign-in attempts from your address; wait a minute and try again.")
		return
	}
	query := q.r.URL.Query()
	var f oidcFlow
	c, err := q.r.Cookie(oidcCookie)
	if err == nil {
		f, err = openFlow(c.Value, q.now)
	}
	// The cookie serves one callback, whatever comes of it.
	http.SetCookie(q.w, q.flowCookie("", -1))
	if err != nil {
		h.oidcRefused(q, http.StatusBadRequest, "no valid state cookie",
			"This sign-in was not started in this browser, or was started too long ago. Start again.")
		return
	}
	if !sameToken(query.Get("state"), f.State) {
		h.oidcRefused(q, http.StatusForbidden, "state does not match the cookie's",
			"This answer from "+name+" does not belong to the sign-in this browser started. Start again.")
		return
	}
	switch err := spent.spend(f.State, f.Expires, q.now); {
	case errors.Is(err, errStateSpent):
		h.oidcRefused(q, http.StatusForbidden, "state already used",
			"This sign-in was already used. Start again.")
		return
	case err != nil:
		h.oidcRefused(q, http.StatusServiceUnavailable, "too many sign-ins under way",
			"The portal has too many sign-ins under way now; try again in a few minutes.")
		return
	}
	if e := query.Get("error"); e != "" {
		msg := name + " did not sign you in. Start again, or sign in with a service key."
		if e == "access_denied" {
			msg = "Signing in at " + name + " was cancelled or refused. Start again, or sign in with a service key."
		}
		// The provider's error code is one of a fixed set of words; it is
		// logged, never shown.
		h.oidcRefused(q, http.StatusUnauthorized, "the provider answered an error: "+oauthErrorCode(e), msg)
		return
	}
	// RFC 9207: a provider that names itself in the answer must be the
	// one the sign-in went to, or the code may be another's (mix-up).
	if iss := query.Get("iss"); iss != "" && iss != h.OIDC.Issuer {
		h.oidcRefused(q, http.StatusForbidden, "the answer names another issuer",
			"This answer did not come from "+name+". Start again.")
		return
	}
	code := query.Get("code")
	if code == "" {
		h.oidcRefused(q, http.StatusBadRequest, "no code", name+" sent no sign-in back. Start again.")
		return
	}
	prov, ok := h.oidc.ready()
	if !ok {
		h.oidcRefused(q, http.StatusServiceUnavailable, "provider not discovered",
			"The portal cannot reach "+name+" right now. Try again in a few minutes, or sign in with a service key.")
		return
	}
	ctx, cancel := context.WithTimeout(oidc.ClientContext(q.r.Context(), h.oidc.client), discoveryTimeout)
	defer cancel()
	tok, err := h.oidc.oauth2Config(prov).Exchange(ctx, code, oauth2.VerifierOption(f.Verifier))
	if err != nil {
		h.oidcRefused(q, http.StatusBadGateway, "code exchange failed: "+exchangeError(err),
			name+" did not confirm the sign-in. Start again.")
		return
	}
	raw, _ := tok.Extra("id_token").(string)
	if raw == "" {
		h.oidcRefused(q, http.StatusBadGateway, "no ID token in the token response",
			name+" did not say who you are. Start again.")
		return
	}
	verifier := prov.Verifier(&oidc.Config{ClientID: h.OIDC.ClientID, Now: func() time.Time { return q.now }})
	idt, err := verifier.Verify(ctx, raw)
	if err != nil {
		h.oidcRefused(q, http.StatusUnauthorized, "ID token refused: "+err.Error(),
			"The sign-in from "+name+" could not be verified (it may have expired). Start again.")
		return
	}
	if !sameToken(idt.Nonce, f.Nonce) {
		h.oidcRefused(q, http.StatusUnauthorized, "ID token refused: nonce does not match the cookie's",
			"The sign-in from "+name+" could not be verified. Start again.")
		return
	}
	var claims idClaims
	if err := idt.Claims(&claims); err != nil {
		h.oidcRefused(q, http.StatusBadGateway, "ID token claims unreadable", name+" did not say who you are. Start again.")
		return
	}
	userID, err := userFromClaims(h.OIDC, claims)
	if err != nil {
		h.oidcRefused(q, http.StatusForbidden, "claims refused: "+err.Error(), err.Error())
		return
	}
	sess := session{UserID: userID, Provider: name, Expires: q.now.Add(time.Duration(h.SessionTTL)), CSRF: randomToken()}
	if !h.openSession(q, sess) {
		h.message(q, http.StatusServiceUnavailable, "Try again later", "The portal holds too many sessions now; try again later.")
		return
	}
	h.logger.Info("portal sign-in", zap.String("user_id", userID), zap.String("with", "oidc"),
		zap.String("issuer", h.OIDC.Issuer), zap.String("subject", claims.Subject))
	h.auditSignIn(q, userID, "", "with "+name+" (OpenID Connect, issuer "+h.OIDC.Issuer+", subject "+claims.Subject+")")
	// A page, not a redirect: the session cookie is SameSite=Strict, and
	// a browser does not send it on a redirect chain that began on the
	// provider's site. The page's own navigation is same-site.
	h.render(q, http.StatusOK, "signedin", page{Title: "Signed in", Base: q.base, Text: f.Return})
}

// oidcRefused logs why a sign-in with the provider was refused (never a
// token, code or cookie) and shows the person a sentence and a way on.
func (h *Handler) oidcRefused(q *request, status int, reason, message string) {
	h.logger.Info("portal sign-in refused", zap.String("with", "oidc"), zap.String("issuer", h.OIDC.Issuer),
		zap.String("client_address", clientAddress(q.r)), zap.String("reason", reason))
	h.render(q, status, "oidcrefused", page{Title: "Not signed in", Base: q.base, Error: message, Provider: h.OIDC.Name})
}

// oauthErrorCode is an OAuth error code fit for a log line: the codes of
// RFC 6749 as they are, anything else as "other".
func oauthErrorCode(e string) string {
	switch e {
	case "invalid_request", "unauthorized_client", "access_denied", "unsupported_response_type",
		"invalid_scope", "server_error", "temporarily_unavailable", "login_required",
		"consent_required", "interaction_required", "account_selection_required",
		"invalid_grant", "invalid_client", "unsupported_grant_type":
		return e
	}
	return "other"
}

// exchangeError says why the token endpoint refused, without its body.
func exchangeError(err error) string {
	var re *oauth2.RetrieveError
	if errors.As(err, &re) {
		s := oauthErrorCode(re.ErrorCode)
		if re.Response != nil {
			s += " (HTTP " + re.Response.Status + ")"
		}
		return s
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "timed out"
	}
	return "the token endpoint could not be reached"
}
