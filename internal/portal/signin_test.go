package portal

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// TestPortalSignInTokenBoundToServer: a page on another port of the same
// host can set the portal's pre-sign-in cookie (cookies do not isolate
// ports) and post a form with a token of its own and its own key. Such a
// cookie and token pair, which the server did not issue, is refused and
// signs nobody in; so are a server-issued cookie with another form's
// token, a form over an hour old, and a form the browser says came from
// another origin. The pair the server issued works.
func TestPortalSignInTokenBoundToServer(t *testing.T) {
	e := local(t, "sign_in_limit 1000")
	attackerKey, _ := e.user("mallory", "basic")
	u, _ := url.Parse(e.base + "/portal/")
	refused := func(name string, c *client, form url.Values, hdr map[string]string) {
		t.Helper()
		before := sessions.count()
		req, _ := http.NewRequest(http.MethodPost, e.base+"/portal/signin", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, body := c.do(req)
		if resp.StatusCode != http.StatusForbidden || c.cookie(sessionCookie) != nil || sessions.count() != before ||
			!strings.Contains(body, "did not come from this portal") {
			t.Errorf("%s: %d, session cookie set %v, sessions %d -> %d\n%s", name, resp.StatusCode, c.cookie(sessionCookie) != nil,
				before, sessions.count(), body)
		}
	}

	// The attacker's own pairs: the cookie and the token alike, or a
	// token shaped like the server's.
	for _, pair := range [][2]string{
		{"attacker-chosen", "attacker-chosen"},
		{strings.Repeat("A", 43), strings.Repeat("A", 43)},
		{"x", "1700000000.AAAA"},
		{"x", ""},
		{"", ""},
	} {
		c := e.newClient()
		if pair[0] != "" {
			c.c.Jar.SetCookies(u, []*http.Cookie{{Name: preCookie, Value: pair[0], Path: "/portal/"}})
		}
		refused("made-up pair "+pair[0]+"/"+pair[1], c, url.Values{"csrf": {pair[1]}, "key": {attackerKey}}, nil)
	}
	// A token the server issued, under a time of the attacker's choosing:
	// the HMAC covers the time.
	{
		c := e.newClient()
		_, page := c.get("/portal/")
		tok := csrf(t, page)
		_, mac, _ := strings.Cut(tok, ".")
		refused("issued token, another time", c, url.Values{"csrf": {"9999999999." + mac}, "key": {attackerKey}}, nil)
	}
	// A server-issued cookie with the token of another form.
	{
		a, b := e.newClient(), e.newClient()
		a.get("/portal/")
		_, pageB := b.get("/portal/")
		refused("another form's token", a, url.Values{"csrf": {csrf(t, pageB)}, "key": {attackerKey}}, nil)
	}
	// A pair the server issued, posted from another origin (a page on
	// another port is same-site, not same-origin).
	for _, site := range []string{"same-site", "cross-site", "none"} {
		c := e.newClient()
		_, page := c.get("/portal/")
		refused("Sec-Fetch-Site "+site, c, url.Values{"csrf": {csrf(t, page)}, "key": {attackerKey}},
			map[string]string{"Sec-Fetch-Site": site})
	}
	// A pair the server issued over an hour ago.
	{
		c := e.newClient()
		_, page := c.get("/portal/")
		now := time.Now()
		e.setClock(func() time.Time { return now.Add(time.Hour + time.Second) })
		refused("a form over an hour old", c, url.Values{"csrf": {csrf(t, page)}, "key": {attackerKey}}, nil)
		e.setClock(nil)
	}

	// The pair the server issued, from the portal's own page.
	c := e.newClient()
	_, page := c.get("/portal/")
	req, _ := http.NewRequest(http.MethodPost, e.base+"/portal/signin",
		strings.NewReader(url.Values{"csrf": {csrf(t, page)}, "key": {attackerKey}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	if resp, body := c.do(req); resp.StatusCode != http.StatusSeeOther || c.cookie(sessionCookie) == nil {
		t.Fatalf("the server's own pair: %d\n%s", resp.StatusCode, body)
	}
	if _, body := c.get("/portal/"); !strings.Contains(body, "mallory") {
		t.Error("not signed in with the server's own pair")
	}
}
