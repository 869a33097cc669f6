package console

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/store"
)

// TestRevenueNotGrantedMarkResolved: a top-up paid and not granted that
// the operator dealt with (refunded in Stripe, credits added by hand) is
// marked resolved from its row: a link to a confirmation that says what
// it does and takes an optional note, then a POST with the console's
// CSRF token and one-time value. The mark is kept on the ignored
// top-up's record (who, when, note), written to the audit log, and the
// row moves from the open list to the resolved ones, which say who, when
// and the note; the money stays counted in Received. Marking it again
// (another tab's form) changes nothing and writes no entry. An unknown
// id, another gateway's top-up, one granted since, a POST without the
// CSRF token, a note too long or of two lines are refused with the
// console's error page, and nothing changes. The old page kept such a
// row open for good, its "nothing" refunded inviting a second refund or
// hand grant.
func TestRevenueNotGrantedMarkResolved(t *testing.T) {
	e, st := moneyEnv(t)
	pay := st.(store.Payments)
	bg := context.Background()
	paid := time.Date(2026, 11, 4, 9, 0, 0, 0, time.UTC)
	put := func(kind, id string, v any) {
		t.Helper()
		b, _ := json.Marshal(v)
		if err := pay.PutPaymentRecord(bg, kind, id, b, moneyNow); err != nil {
			t.Fatal(err)
		}
	}
	put(payments.KindTopUpIgnored, "pi_ig", payments.IgnoredTopUp{ID: "pi_ig", SessionID: "cs_ig", Reason: "pack retired", At: paid,
		UserID: "ann", ServiceID: "pre", ProductID: "credits", Pack: "retired", Amount: 1000, Currency: "USD", PaidAt: paid, Refunded: 400})
	put(payments.KindTopUpIgnored, "pi_old", payments.IgnoredTopUp{ID: "pi_old", SessionID: "cs_old", Reason: "old reason", At: paid})
	put(payments.KindTopUpIgnored, "pi_foreign", payments.IgnoredTopUp{ID: "pi_foreign", Reason: "not ours", At: paid, Foreign: true,
		Amount: 5000, Currency: "USD", PaidAt: paid})
	put(payments.KindTopUpIgnored, "pi_later", payments.IgnoredTopUp{ID: "pi_later", Reason: "no subscription", At: paid,
		UserID: "ben", ServiceID: "pre", Pack: "ten", Amount: 700, Currency: "USD", PaidAt: paid})
	put(payments.KindTopUp, "pi_later", payments.TopUpRecord{ID: "pi_later", UserID: "ben", ServiceID: "pre", ProductID: "credits", Pack: "ten",
		Credits: "10", Amount: 700, Currency: "USD", PaidAt: paid})
	record := func(id string) payments.IgnoredTopUp {
		t.Helper()
		b, err := pay.GetPaymentRecord(bg, payments.KindTopUpIgnored, id)
		if err != nil {
			t.Fatal(err)
		}
		var ig payments.IgnoredTopUp
		if err := json.Unmarshal(b, &ig); err != nil {
			t.Fatal(err)
		}
		return ig
	}
	h := direct(t, e, false)
	h.payments = &payments.Config{PastDueGrace: caddy.Duration(72 * time.Hour)}
	const totals = "USD 0.00 USD 13.00 USD 13.00 USD 4.00 USD" // 6.00 of pi_ig, 7.00 of pi_later

	body, c := openPage(t, h, "/console/revenue", "operator", nil)
	if !strings.Contains(body, `href="/console/revenue/resolve?id=pi_ig"`) || !strings.Contains(body, `href="/console/revenue/resolve?id=pi_old"`) {
		t.Fatalf("the open rows have no link to mark them resolved:\n%s", body)
	}
	if got := pageText(body); !strings.Contains(got, totals) {
		t.Fatalf("the totals before are not %q:\n%s", totals, got)
	}

	// The confirmation: what it does, a note, a form posting confirm=yes.
	confirm, _ := openPage(t, h, "/console/revenue/resolve?id=pi_ig", "operator", c)
	for _, want := range []string{"Mark the top-up of ann", "10.00 USD", "pi_ig", "resolved?", "does not refund or grant anything", "stays counted"} {
		if !strings.Contains(pageText(confirm), want) {
			t.Errorf("the confirmation does not say %q:\n%s", want, pageText(confirm))
		}
	}
	if !strings.Contains(confirm, `name="note"`) || !strings.Contains(confirm, `href="/console/revenue?from=2026-11&amp;to=2026-11"`) {
		t.Errorf("the confirmation has no note field or no way back to Revenue:\n%s", confirm)
	}
	form := formOf(t, confirm, `id="confirm-form"`)
	if form.Get("id") != "pi_ig" || form.Get("confirm") != "yes" {
		t.Fatalf("the confirmation's form sends %v", form)
	}
	// fresh is the form as another page's would send it, with a one-time
	// value of its own.
	fresh := func(kv ...string) url.Values {
		f := with(form, kv...)
		f.Del("once")
		return f
	}

	// Refused, nothing changed: a note too long, one of two lines, no
	// CSRF token, an unknown id, another gateway's, one granted since.
	for _, bad := range []struct {
		name string
		id   string
		set  []string
		drop string
		code int
		says string
	}{
		{"note too long", "pi_ig", []string{"note", strings.Repeat("é", 201)}, "", http.StatusBadRequest, "at most 200 characters"},
		{"note of two lines", "pi_ig", []string{"note", "refunded\nin Stripe"}, "", http.StatusBadRequest, "one line"},
		{"no CSRF token", "pi_ig", []string{"note", "x"}, "csrf", http.StatusForbidden, "CSRF"},
		{"unknown id", "pi_nope", nil, "", http.StatusNotFound, "No top-up paid and not granted has the Stripe payment pi_nope"},
		{"another gateway's", "pi_foreign", nil, "", http.StatusNotFound, "No top-up paid and not granted"},
		{"granted since", "pi_later", nil, "", http.StatusNotFound, "was granted since"},
	} {
		f := fresh(append([]string{"id", bad.id}, bad.set...)...)
		if bad.drop != "" {
			f.Del(bad.drop)
		}
		w := post(h, "/console/revenue/resolve", f, c, "operator")
		if w.Code != bad.code || !strings.Contains(pageText(w.Body.String()), bad.says) {
			t.Errorf("%s: %d, want %d saying %q:\n%s", bad.name, w.Code, bad.code, bad.says, pageText(w.Body.String()))
		}
		if !strings.Contains(w.Body.String(), "Nothing was changed") && bad.code != http.StatusForbidden {
			t.Errorf("%s: the answer does not say nothing was changed:\n%s", bad.name, pageText(w.Body.String()))
		}
		for _, id := range []string{"pi_ig", "pi_foreign", "pi_later"} {
			if r := record(id); r.Resolved != nil {
				t.Fatalf("%s: %s marked resolved: %+v", bad.name, id, r.Resolved)
			}
		}
	}
	if n := auditCount(t, e, payments.AuditTopUpResolve); n != 0 {
		t.Fatalf("refused marks wrote %d audit entries", n)
	}
	// A POST without confirm=yes (an old form) shows the confirmation.
	if w := post(h, "/console/revenue/resolve", fresh("confirm", ""), c, "operator"); w.Code != 200 ||
		!strings.Contains(w.Body.String(), `id="confirm-form"`) || record("pi_ig").Resolved != nil {
		t.Fatalf("a POST without confirm=yes: %d, resolved %+v\n%s", w.Code, record("pi_ig").Resolved, w.Body)
	}

	// Marked: back to the page of its month, which says so.
	w := post(h, "/console/revenue/resolve", with(form, "note", "  refunded in Stripe "), c, "operator")
	if w.Code != http.StatusSeeOther || w.Header().Get("Location") != "/console/revenue?done=resolved&from=2026-11&to=2026-11#notgranted-resolved" {
		t.Fatalf("marking it resolved: %d to %q\n%s", w.Code, w.Header().Get("Location"), w.Body)
	}
	got := record("pi_ig").Resolved
	if got == nil || got.By != "console:operator" || !got.At.Equal(moneyNow) || got.Note != "refunded in Stripe" {
		t.Fatalf("the record's resolution is %+v", got)
	}
	entries, _, err := e.ops.AuditLog(bg, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if en := entries[0]; en.Action != payments.AuditTopUpResolve || en.Actor != "console:operator" || en.UserID != "ann" || en.ServiceID != "pre" ||
		en.Detail != "top-up pi_ig (10.00 USD, pack retired) marked resolved: refunded in Stripe" {
		t.Errorf("the audit entry is %+v", en)
	}
	page := getPage(t, h, "/console/revenue?done=resolved&from=2026-11&to=2026-11")
	open, resolved, _ := strings.Cut(page, "Resolved:")
	if !strings.Contains(page, "The top-up was marked resolved") || strings.Contains(open, "pi_ig") || !strings.Contains(open, "pi_old") {
		t.Errorf("the open list after the mark:\n%s", page)
	}
	for _, want := range []string{"1 top-up marked resolved", "ann pre (credits) retired 10.00 USD 4.00 USD pack retired", "console:operator",
		"console:operator, 2026-11-15 12:00:00 UTC : refunded in Stripe", "pi_ig"} {
		if !strings.Contains(resolved, want) {
			t.Errorf("the resolved list does not say %q:\n%s", want, resolved)
		}
	}
	if !strings.Contains(page, totals) {
		t.Errorf("marking it resolved changed the totals, want %q:\n%s", totals, page)
	}

	// Again, from another tab's form, with another note: nothing changes.
	confirm, _ = openPage(t, h, "/console/revenue/resolve?id=pi_ig", "operator", c)
	if !strings.Contains(pageText(confirm), "marked resolved already") {
		t.Errorf("the confirmation of one marked already does not say so:\n%s", pageText(confirm))
	}
	w = post(h, "/console/revenue/resolve", fresh("note", "granted by hand"), c, "operator")
	if w.Code != http.StatusSeeOther || !strings.Contains(w.Header().Get("Location"), "done=already") {
		t.Fatalf("marking it again: %d to %q\n%s", w.Code, w.Header().Get("Location"), w.Body)
	}
	if again := record("pi_ig").Resolved; *again != *got {
		t.Errorf("marking it again changed the resolution from %+v to %+v", got, again)
	}
	if n := auditCount(t, e, payments.AuditTopUpResolve); n != 1 {
		t.Errorf("%d audit entries after marking it twice, want 1", n)
	}
	if page := getPage(t, h, "/console/revenue?done=already"); !strings.Contains(page, "marked resolved before") {
		t.Errorf("the page after a second mark does not say it was marked before:\n%s", page)
	}
	// Without a note; the other one too: no open row is left, and the
	// heading stays over the resolved ones.
	w = post(h, "/console/revenue/resolve", fresh("id", "pi_old"), c, "operator")
	if w.Code != http.StatusSeeOther {
		t.Fatalf("marking pi_old: %d\n%s", w.Code, w.Body)
	}
	if r := record("pi_old").Resolved; r == nil || r.Note != "" {
		t.Errorf("pi_old's resolution is %+v", r)
	}
	page = getPage(t, h, "/console/revenue")
	if !strings.Contains(page, "Top-ups paid, not granted") || !strings.Contains(page, "None is open") || !strings.Contains(page, "2 top-ups marked resolved") {
		t.Errorf("with every one resolved the page reads:\n%s", page)
	}
	// The audit log's filter knows the action.
	if a := getPage(t, h, "/console/audit?action="+payments.AuditTopUpResolve); !strings.Contains(a, "top-up pi_old") {
		t.Errorf("the audit log filtered on %s:\n%s", payments.AuditTopUpResolve, a)
	}
}

// recordAuditFails is the operations with an audit log that cannot be
// written (a full disk).
type recordAuditFails struct{ Operations }

func (recordAuditFails) RecordAudit(context.Context, store.AuditEntry) error { return errDiskFull }

// TestRevenueResolveNotAudited: a mark whose audit entry cannot be
// written is kept (it is on the payment record, a write of its own) and
// the answer says it was made and not audited, so that no one marks it
// again; the server log has the error.
func TestRevenueResolveNotAudited(t *testing.T) {
	e, st := moneyEnv(t)
	pay := st.(store.Payments)
	paid := time.Date(2026, 11, 4, 9, 0, 0, 0, time.UTC)
	b, _ := json.Marshal(payments.IgnoredTopUp{ID: "pi_ig", Reason: "pack retired", At: paid, UserID: "ann", ServiceID: "pre",
		Amount: 1000, Currency: "USD", PaidAt: paid})
	if err := pay.PutPaymentRecord(context.Background(), payments.KindTopUpIgnored, "pi_ig", b, moneyNow); err != nil {
		t.Fatal(err)
	}
	h := direct(t, e, false)
	h.payments = &payments.Config{PastDueGrace: caddy.Duration(72 * time.Hour)}
	h.ops = recordAuditFails{h.ops}
	confirm, c := openPage(t, h, "/console/revenue/resolve?id=pi_ig", "operator", nil)
	w := post(h, "/console/revenue/resolve", with(formOf(t, confirm, `id="confirm-form"`), "note", "granted by hand"), c, "operator")
	if w.Code != http.StatusInternalServerError || !strings.Contains(pageText(w.Body.String()), "was marked resolved, but its entry in the audit log could not be written") {
		t.Fatalf("an entry not written: %d\n%s", w.Code, pageText(w.Body.String()))
	}
	body, _ := pay.GetPaymentRecord(context.Background(), payments.KindTopUpIgnored, "pi_ig")
	var ig payments.IgnoredTopUp
	if err := json.Unmarshal(body, &ig); err != nil || ig.Resolved == nil || ig.Resolved.Note != "granted by hand" {
		t.Errorf("the mark: %+v %v", ig.Resolved, err)
	}
}

// TestRevenueResolvedGrantSkipped: a top-up marked resolved whose paid
// event came later, once the config could grant it, was not granted
// (payments' skipResolved: the operator refunded it or granted it by
// hand); its row stays in the resolved list and says so, and the audit
// log's filter knows the action. The old page had no such line: the old
// gateway granted it, and the row left the lists.
func TestRevenueResolvedGrantSkipped(t *testing.T) {
	e, st := moneyEnv(t)
	pay := st.(store.Payments)
	paid := time.Date(2026, 11, 4, 9, 0, 0, 0, time.UTC)
	b, _ := json.Marshal(payments.IgnoredTopUp{ID: "pi_sk", SessionID: "cs_sk", Reason: "no subscription", At: paid,
		UserID: "ann", ServiceID: "pre", ProductID: "credits", Pack: "ten", Amount: 1000, Currency: "USD", PaidAt: paid,
		Resolved:     &payments.TopUpResolution{By: "console:operator", At: paid.Add(time.Hour), Note: "granted by hand"},
		GrantSkipped: &payments.SkippedGrant{Event: "evt_sk", At: paid.Add(2 * time.Hour)}})
	if err := pay.PutPaymentRecord(context.Background(), payments.KindTopUpIgnored, "pi_sk", b, moneyNow); err != nil {
		t.Fatal(err)
	}
	h := direct(t, e, false)
	h.payments = &payments.Config{PastDueGrace: caddy.Duration(72 * time.Hour)}
	page := getPage(t, h, "/console/revenue?from=2026-11&to=2026-11")
	_, resolved, _ := strings.Cut(page, "Resolved:")
	if want := "Its paid event came later ( 2026-11-04 11:00:00 UTC ) and was not granted: it was marked resolved."; !strings.Contains(resolved, want) {
		t.Errorf("the resolved row does not say %q:\n%s", want, resolved)
	}
	if a := getPage(t, h, "/console/audit"); !strings.Contains(a, " "+payments.AuditTopUpGrantSkipped) {
		t.Errorf("the audit log's filter has no %s:\n%s", payments.AuditTopUpGrantSkipped, a)
	}
}
