package portal

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"strings"
	"time"
)

// The sign-in form's token is bound to the server. The pre-sign-in cookie
// holds a random value; the form carries the time it was issued and an
// HMAC of both under a key only this process knows. A cookie is not
// origin-bound the way a page is (a page on another port of the same host
// can set one for this one), so a form token that merely equalled the
// cookie could be made up by such a page together with its cookie, and
// sign the victim's browser in as someone else (login CSRF). A made-up
// pair now fails the HMAC; a pair the server did issue lasts an hour, and
// a browser that says the form was posted from another origin
// (Sec-Fetch-Site) is refused whatever the pair.

// signInFormTTL is how long a sign-in form may be posted after it was
// served (its cookie's Max-Age too).
const signInFormTTL = time.Hour

// signInKey keys the HMAC. It is the process's, like the sessions: shared
// by every config (a reload keeps forms valid), new on restart (a form
// served before then is shown afresh).
var signInKey = func() []byte {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return b
}()

// signInToken is the form token for the cookie value c, issued at.
func signInToken(c string, issued time.Time) string {
	ts := strconv.FormatInt(issued.Unix(), 10)
	m := hmac.New(sha256.New, signInKey)
	m.Write([]byte("platform_portal sign-in\x00" + ts + "\x00" + c))
	return ts + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// signInTokenOK says whether token is the one this process issued for
// the cookie value c, less than signInFormTTL before now. The HMAC is
// compared in constant time.
func signInTokenOK(c, token string, now time.Time) bool {
	ts, _, found := strings.Cut(token, ".")
	sec, err := strconv.ParseInt(ts, 10, 64)
	if !found || err != nil || c == "" {
		return false
	}
	issued := time.Unix(sec, 0)
	// A minute of slack for a clock stepped back since it was issued.
	if now.Sub(issued) >= signInFormTTL || issued.After(now.Add(time.Minute)) {
		return false
	}
	return hmac.Equal([]byte(signInToken(c, issued)), []byte(token))
}

// crossOrigin says whether the browser marked the request as sent from
// another origin than the portal's (Sec-Fetch-Site other than
// same-origin). Clients that do not send the header (older browsers,
// scripts) are not refused for it: the token still binds them.
func crossOrigin(site string) bool {
	return site != "" && site != "same-origin"
}
