package console

import (
	"context"
	"errors"
	"fmt"
	"html"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/onceform"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store"
)

// openPage GETs a console page as who with the CSRF cookie c (the one
// the page sets when c is nil) and returns its body and the cookie.
func openPage(t *testing.T, h *Handler, path, who string, c *http.Cookie) (string, *http.Cookie) {
	t.Helper()
	r := httptest.NewRequest("GET", path, nil)
	if c != nil {
		r.AddCookie(c)
	}
	w := serve(h, r, who)
	if w.Code != 200 {
		t.Fatalf("GET %s: %d %s", path, w.Code, w.Body)
	}
	for _, ck := range w.Result().Cookies() {
		if ck.Name == csrfCookie {
			c = ck
		}
	}
	return w.Body.String(), c
}

var (
	formRE   = regexp.MustCompile(`(?s)<form [^>]*>.*?</form>`)
	hiddenRE = regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`)
)

// formOf is the hidden fields of the page's form whose opening tag holds
// mark (`id="credits"`, an action): what the browser sends with it.
func formOf(t *testing.T, body, mark string) url.Values {
	t.Helper()
	for _, f := range formRE.FindAllString(body, -1) {
		if open, _, _ := strings.Cut(f, ">"); !strings.Contains(open, mark) {
			continue
		}
		v := url.Values{}
		for _, m := range hiddenRE.FindAllStringSubmatch(f, -1) {
			v.Add(html.UnescapeString(m[1]), html.UnescapeString(m[2]))
		}
		if v.Get("csrf") == "" || v.Get(onceform.Field) == "" {
			t.Fatalf("form %s has no CSRF token or one-time value:\n%s", mark, f)
		}
		return v
	}
	t.Fatalf("no form %s on the page:\n%s", mark, body)
	return nil
}

func with(v url.Values, kv ...string) url.Values {
	out := url.Values{}
	for k, vs := range v {
		out[k] = append([]string(nil), vs...)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out.Set(kv[i], kv[i+1])
	}
	return out
}

func auditCount(t *testing.T, e *env, action string) int {
	t.Helper()
	entries, _, err := e.ops.AuditLog(context.Background(), "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, en := range entries {
		if en.Action == action && strings.HasPrefix(en.Actor, "console:") {
			n++
		}
	}
	return n
}

func credits(t *testing.T, e *env, user string) string {
	t.Helper()
	sub, err := e.rt.Store().GetSubscription(context.Background(), user, "weather")
	if err != nil {
		t.Fatal(err)
	}
	return sub.Credits.String()
}

// alreadyMade checks the answer to a form sent a second time: 409, the
// words, a link to where the result is.
func alreadyMade(t *testing.T, w *httptest.ResponseRecorder, user string) {
	t.Helper()
	body := w.Body.String()
	if w.Code != http.StatusConflict || !strings.Contains(body, "This change was already made") ||
		!strings.Contains(body, `<a href="/console/users/`+user+`">User `+user+`</a>`) || !strings.Contains(body, "Nothing was changed this time") {
		t.Fatalf("the form sent again: %d\n%s", w.Code, body)
	}
}

// TestConsoleCreditsPostedTwice: "Add credits" sent twice (a double
// click, the answer reloaded) adds them once: the second POST carries
// the form's one-time value, already taken, and is answered "this change
// was already made", changing nothing. Many at once make one change too.
// A fresh page's form adds again. Before, each POST added the credits
// and wrote its own credits.add.
func TestConsoleCreditsPostedTwice(t *testing.T) {
	e := local(t)
	h := direct(t, e, false)
	if _, err := e.ops.PutSubscription(context.Background(), "test", "alice", "weather", "credits", ""); err != nil {
		t.Fatal(err)
	}
	body, c := openPage(t, h, "/console/users/alice", "bob", nil)
	form := with(formOf(t, body, `id="credits"`), "serviceId", "weather", "amount", "5")
	if w := post(h, "/console/users/alice/credits", form, c, "bob"); w.Code != http.StatusSeeOther {
		t.Fatalf("first POST: %d %s", w.Code, w.Body)
	}
	alreadyMade(t, post(h, "/console/users/alice/credits", form, c, "bob"), "alice")
	if got, n := credits(t, e, "alice"), auditCount(t, e, ops.AuditCreditsAdd); got != "5" || n != 1 {
		t.Fatalf("after the form sent twice: balance %s, %d credits.add entries; want 5 and 1", got, n)
	}

	// Eight at once, as a browser's repeated clicks: one change.
	body, c = openPage(t, h, "/console/users/alice", "bob", c)
	form = with(formOf(t, body, `id="credits"`), "serviceId", "weather", "amount", "5")
	codes := make([]int, 8)
	var wg sync.WaitGroup
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i] = post(h, "/console/users/alice/credits", form, c, "bob").Code
		}()
	}
	wg.Wait()
	made := 0
	for _, code := range codes {
		switch code {
		case http.StatusSeeOther:
			made++
		case http.StatusConflict:
		default:
			t.Errorf("a concurrent POST answered %d", code)
		}
	}
	if got := credits(t, e, "alice"); made != 1 || got != "10" {
		t.Fatalf("eight POSTs of one form at once: %d made, balance %s; want 1 and 10", made, got)
	}

	// The page after the change (post/redirect/get) has a fresh form.
	body, c = openPage(t, h, "/console/users/alice?done=credits", "bob", c)
	if w := post(h, "/console/users/alice/credits", with(formOf(t, body, `id="credits"`), "serviceId", "weather", "amount", "1"), c, "bob"); w.Code != http.StatusSeeOther {
		t.Fatalf("a fresh form: %d %s", w.Code, w.Body)
	}
	if got, n := credits(t, e, "alice"), auditCount(t, e, ops.AuditCreditsAdd); got != "11" || n != 3 {
		t.Fatalf("after a fresh form: balance %s, %d credits.add entries; want 11 and 3", got, n)
	}
}

// TestConsoleCorrectionConfirmedTwice: a negative amount asks first; the
// confirmation's button sent twice takes the credits once. Asking
// changed nothing, so the first form can still be sent.
func TestConsoleCorrectionConfirmedTwice(t *testing.T) {
	e := local(t)
	h := direct(t, e, false)
	if _, err := e.ops.PutSubscription(context.Background(), "test", "alice", "weather", "credits", ""); err != nil {
		t.Fatal(err)
	}
	body, c := openPage(t, h, "/console/users/alice", "bob", nil)
	first := with(formOf(t, body, `id="credits"`), "serviceId", "weather", "amount", "-2")
	w := post(h, "/console/users/alice/credits", first, c, "bob")
	if w.Code != 200 || !strings.Contains(w.Body.String(), "Take 2 credits from alice") {
		t.Fatalf("a negative amount: %d %s", w.Code, w.Body)
	}
	confirm := formOf(t, w.Body.String(), `id="confirm-form"`)
	if confirm.Get(onceform.Field) == first.Get(onceform.Field) || confirm.Get("amount") != "-2" || confirm.Get("confirm") != "yes" {
		t.Fatalf("the confirmation's form: %v", confirm)
	}
	if w := post(h, "/console/users/alice/credits", confirm, c, "bob"); w.Code != http.StatusSeeOther {
		t.Fatalf("confirmed: %d %s", w.Code, w.Body)
	}
	alreadyMade(t, post(h, "/console/users/alice/credits", confirm, c, "bob"), "alice")
	if got, n := credits(t, e, "alice"), auditCount(t, e, ops.AuditCreditsAdd); got != "-2" || n != 1 {
		t.Fatalf("a correction confirmed twice: balance %s, %d entries; want -2 and 1", got, n)
	}
	// The first form asked only: sent again it asks again.
	if w := post(h, "/console/users/alice/credits", first, c, "bob"); w.Code != 200 || !strings.Contains(w.Body.String(), `id="confirm-form"`) {
		t.Fatalf("the first form again: %d %s", w.Code, w.Body)
	}
}

// TestConsoleKeyRepostRefused: the new key is the answer to its POST
// (shown once, no redirect), so reloading that page posts the form
// again: refused as already made, no second key, the key not shown
// again. Before, each reload made another active key.
func TestConsoleKeyRepostRefused(t *testing.T) {
	e := local(t)
	h := direct(t, e, false)
	body, c := openPage(t, h, "/console/users/alice?new=1", "bob", nil)
	form := with(formOf(t, body, `id="create-key"`), "label", "ci")
	w := post(h, "/console/users/alice/keys", form, c, "bob")
	key := regexp.MustCompile(`<code id="new-key">([^<]+)</code>`).FindStringSubmatch(w.Body.String())
	if w.Code != 200 || key == nil {
		t.Fatalf("create: %d %s", w.Code, w.Body)
	}
	// The page with the key has forms of its own, fresh.
	if next := formOf(t, w.Body.String(), `id="create-key"`); next.Get(onceform.Field) == form.Get(onceform.Field) {
		t.Error("the answer's key form carries the value just taken")
	}
	w = post(h, "/console/users/alice/keys", form, c, "bob")
	alreadyMade(t, w, "alice")
	if b := w.Body.String(); strings.Contains(b, key[1]) || !strings.Contains(b, "revoke that key and create another") {
		t.Errorf("the refused reload:\n%s", b)
	}
	if keys, _ := e.rt.Store().ListKeys(context.Background(), "alice"); len(keys) != 1 || auditCount(t, e, ops.AuditKeyCreate) != 1 {
		t.Fatalf("after the reload: %d keys, %d key.create", len(keys), auditCount(t, e, ops.AuditKeyCreate))
	}
}

// TestConsoleSubscriptionRepostRefused: a subscription's form, and the
// requests page's Approve (the same form, prefilled), sent twice make
// one change and one subscription.put.
func TestConsoleSubscriptionRepostRefused(t *testing.T) {
	e := local(t)
	h := direct(t, e, false)
	ctx := context.Background()
	if _, err := e.ops.PutSubscription(ctx, "test", "alice", "weather", "basic", ""); err != nil {
		t.Fatal(err)
	}
	body, c := openPage(t, h, "/console/users/alice", "bob", nil)
	form := with(formOf(t, body, `id="sub-weather"`), "productId", "credits", "status", "ACTIVE")
	if w := post(h, "/console/users/alice/subscription", form, c, "bob"); w.Code != http.StatusSeeOther {
		t.Fatalf("first POST: %d %s", w.Code, w.Body)
	}
	// Changed meanwhile (by the admin API): the old form sent again must
	// not put it back.
	if _, err := e.ops.PutSubscription(ctx, "admin-api", "alice", "weather", "basic", "TRIAL"); err != nil {
		t.Fatal(err)
	}
	alreadyMade(t, post(h, "/console/users/alice/subscription", form, c, "bob"), "alice")
	if s, _ := e.rt.Store().GetSubscription(ctx, "alice", "weather"); s.ProductID != "basic" || s.Status != "TRIAL" || auditCount(t, e, ops.AuditSubscriptionPut) != 1 {
		t.Fatalf("after the form sent twice: %s %s, %d console subscription.put", s.ProductID, s.Status, auditCount(t, e, ops.AuditSubscriptionPut))
	}

	if err := e.ops.RequestAccess(ctx, "portal:ann", "ann", "weather", "credits"); err != nil {
		t.Fatal(err)
	}
	body, c = openPage(t, h, "/console/requests", "bob", c)
	approve := formOf(t, body, `action="/console/users/ann/subscription"`)
	if w := post(h, "/console/users/ann/subscription", approve, c, "bob"); w.Code != http.StatusSeeOther {
		t.Fatalf("approve: %d %s", w.Code, w.Body)
	}
	alreadyMade(t, post(h, "/console/users/ann/subscription", approve, c, "bob"), "ann")
	if n := auditCount(t, e, ops.AuditSubscriptionPut); n != 2 {
		t.Fatalf("approve sent twice: %d console subscription.put, want 2", n)
	}
}

// TestConsoleRefusedFormKeepsInput: a refused form (nothing changed) is
// shown again with what was typed and a fresh one-time value; its value
// is given back, so the same form corrected (or sent again after Back)
// is taken.
func TestConsoleRefusedFormKeepsInput(t *testing.T) {
	e := local(t)
	h := direct(t, e, false)
	if _, err := e.ops.PutSubscription(context.Background(), "test", "alice", "weather", "credits", ""); err != nil {
		t.Fatal(err)
	}
	body, c := openPage(t, h, "/console/users/alice", "bob", nil)
	form := with(formOf(t, body, `id="credits"`), "serviceId", "weather", "amount", "12,5")
	w := post(h, "/console/users/alice/credits", form, c, "bob")
	if w.Code != 400 || !strings.Contains(w.Body.String(), `value="12,5"`) || !strings.Contains(w.Body.String(), "Nothing was changed.") {
		t.Fatalf("a bad amount: %d %s", w.Code, w.Body)
	}
	if again := formOf(t, w.Body.String(), `id="credits"`); again.Get(onceform.Field) == form.Get(onceform.Field) {
		t.Error("the form shown again carries the value just sent")
	}
	if w := post(h, "/console/users/alice/credits", with(form, "amount", "12.5"), c, "bob"); w.Code != http.StatusSeeOther {
		t.Fatalf("the same form corrected: %d %s", w.Code, w.Body)
	}
	if got := credits(t, e, "alice"); got != "12.5" {
		t.Fatalf("balance %s, want 12.5", got)
	}
}

// TestConsoleFormValueRefusals: a POST with a good CSRF token but no
// one-time value, one this console did not make, another operator's, or
// one older than onceform.TTL changes nothing.
func TestConsoleFormValueRefusals(t *testing.T) {
	e := local(t)
	h := direct(t, e, false)
	if _, err := e.ops.PutSubscription(context.Background(), "test", "alice", "weather", "credits", ""); err != nil {
		t.Fatal(err)
	}
	body, c := openPage(t, h, "/console/users/alice", "bob", nil)
	form := with(formOf(t, body, `id="credits"`), "serviceId", "weather", "amount", "5")
	other := direct(t, e, false) // another process: another key
	for name, v := range map[string]string{
		"none":               "",
		"not ours":           other.once.Mint("bob"),
		"another operator's": h.once.Mint("carol"),
		"cut short":          form.Get(onceform.Field)[:20],
	} {
		f := with(form)
		f.Del(onceform.Field)
		if v != "" {
			f.Set(onceform.Field, v)
		}
		r := httptest.NewRequest("POST", "/console/users/alice/credits", strings.NewReader(f.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.AddCookie(c)
		if w := serve(h, r, "bob"); w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), "lacks its one-time value") {
			t.Errorf("%s: %d %s", name, w.Code, w.Body)
		}
	}
	h.once.Now = func() time.Time { return time.Now().Add(onceform.TTL + time.Minute) }
	if w := post(h, "/console/users/alice/credits", form, c, "bob"); w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), "too old to send") {
		t.Errorf("a day-old form: %d %s", w.Code, w.Body)
	}
	if got := credits(t, e, "alice"); got != "0" {
		t.Fatalf("refused POSTs changed the balance to %s", got)
	}
}

// auditFails is the operations with an audit log that cannot be
// written: each change is made, its entry not.
type auditFails struct{ Operations }

var errDiskFull = fmt.Errorf("%w: %w", ops.ErrAuditNotRecorded, errors.New("disk full"))

func (a auditFails) AddCredits(ctx context.Context, actor, userID, serviceID string, amount billing.Units) (store.Subscription, error) {
	s, err := a.Operations.AddCredits(ctx, actor, userID, serviceID, amount)
	if err != nil {
		return s, err
	}
	return s, errDiskFull
}

func (a auditFails) CreateKey(ctx context.Context, actor string, req ops.CreateKeyRequest) (ops.KeyView, error) {
	v, err := a.Operations.CreateKey(ctx, actor, req)
	if err != nil {
		return v, err
	}
	return v, errDiskFull
}

// TestConsoleAuditFailureSaysMade: when a change is made but its audit
// entry cannot be written, the page says the change was made (not only
// "internal error"), and the form sent again is refused as made; a new
// key is still shown, with the same warning.
func TestConsoleAuditFailureSaysMade(t *testing.T) {
	e := local(t)
	h := &Handler{Prefix: "/console"}
	if err := h.setup(e.rt, auditFails{e.ops}, zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.ops.PutSubscription(context.Background(), "test", "alice", "weather", "credits", ""); err != nil {
		t.Fatal(err)
	}
	body, c := openPage(t, h, "/console/users/alice", "bob", nil)
	form := with(formOf(t, body, `id="credits"`), "serviceId", "weather", "amount", "5")
	w := post(h, "/console/users/alice/credits", form, c, "bob")
	if b := w.Body.String(); w.Code != http.StatusInternalServerError || !strings.Contains(b, "The credits were added. The change itself was made") ||
		!strings.Contains(b, "Do not make it again") || !strings.Contains(b, `href="/console/users/alice"`) {
		t.Fatalf("audit failure: %d %s", w.Code, b)
	}
	alreadyMade(t, post(h, "/console/users/alice/credits", form, c, "bob"), "alice")
	if got := credits(t, e, "alice"); got != "5" {
		t.Fatalf("balance %s, want 5", got)
	}

	w = post(h, "/console/users/alice/keys", with(formOf(t, body, `id="create-key"`)), c, "bob")
	if b := w.Body.String(); w.Code != 200 || !strings.Contains(b, `<code id="new-key">`) || !strings.Contains(b, `id="audit-failed"`) ||
		!strings.Contains(b, "The change itself was made: do not create the key again.") {
		t.Fatalf("a key made, not audited: %d %s", w.Code, b)
	}
}
