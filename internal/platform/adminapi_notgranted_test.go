package platform

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/payments/stripetest"
	"github.com/platformgw/gateway/internal/store"
)

// TestAdminListNotGranted: GET /platform/stripe/notgranted lists the
// top-ups paid and not granted as the console's Revenue page does (not
// another gateway's, not one granted since), open and resolved, with who
// marked one resolved, when and the note; status=open or resolved
// narrows it; pages follow nextCursor. A bad status, a cursor of no
// such listing, an unknown parameter and a POST are refused; a config
// without payments is not_found.
func TestAdminListNotGranted(t *testing.T) {
	mock := stripetest.Start(t)
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	dbJSON, _ := json.Marshal(filepath.Join(dir, "platform.db"))
	config := fmt.Sprintf(`{
		"admin": {"listen": %q},
		"apps": {
			"platform": {
				"store": %s,
				"payments": {"provider": "stripe", "secret_key": "sk_test_notgranted", "webhook_secret": "whsec_notgranted", "api_base": %q},
				"services": [{
					"id": "pre",
					"backend": "http://127.0.0.1:1",
					"secrets": ["0123456789abcdef0123456789abcdef"],
					"endpoints": [{"id": "get"}],
					"products": [{"id": "credits", "billing_model": "PREPAID", "measurement_type": "PER_REQUEST", "price": 1}]
				}]
			},
			"http": {"servers": {"srv0": {
				"listen": ["127.0.0.1:%d"],
				"routes": [{"handle": [{"handler": "static_response", "body": "ok"}]}]
			}}}
		}
	}`, admAddr, dbJSON, mock.URL, port)
	admTester(t).InitServer(config, "json")
	if t.Failed() {
		t.FailNow()
	}
	env := &admEnv{t: t}
	t.Cleanup(env.stop)
	pay := admActiveApp(t).DataStore().(store.Payments)
	ctx := context.Background()
	paid := time.Date(2026, 11, 4, 9, 0, 0, 0, time.UTC)
	put := func(kind, id string, v any) {
		t.Helper()
		b, _ := json.Marshal(v)
		if err := pay.PutPaymentRecord(ctx, kind, id, b, paid); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"pi_a", "pi_b", "pi_c", "pi_d", "pi_e"} {
		put(payments.KindTopUpIgnored, id, payments.IgnoredTopUp{ID: id, Reason: "pack retired", At: paid, UserID: "ann", ServiceID: "pre",
			Pack: "retired", Amount: 1000, Currency: "USD", PaidAt: paid, Foreign: id == "pi_c"})
	}
	put(payments.KindTopUp, "pi_d", payments.TopUpRecord{ID: "pi_d", UserID: "ann", ServiceID: "pre", ProductID: "credits", Pack: "ten",
		Credits: "10", Amount: 1000, Currency: "USD", PaidAt: paid})
	if _, made, err := payments.ResolveNotGranted(ctx, pay, "pi_b", "console:operator", "refunded in Stripe", paid.Add(time.Hour)); err != nil || !made {
		t.Fatalf("resolve pi_b: %v %v", made, err)
	}
	type page struct {
		TopUps     []payments.IgnoredTopUp `json:"topUps"`
		NextCursor string                  `json:"nextCursor"`
	}
	list := func(query string) page {
		t.Helper()
		r := admJSON(t, "GET", "/platform/stripe/notgranted"+query, "")
		if r.status != 200 {
			t.Fatalf("GET %s: %d %s", query, r.status, r.body)
		}
		var p page
		r.decode(t, &p)
		return p
	}
	ids := func(p page) []string {
		var out []string
		for _, ig := range p.TopUps {
			out = append(out, ig.ID)
		}
		return out
	}
	all := list("")
	if got := ids(all); !slices.Equal(got, []string{"pi_a", "pi_b", "pi_e"}) || all.NextCursor != "" {
		t.Fatalf("all: %v, next %q", got, all.NextCursor)
	}
	if r := all.TopUps[1].Resolved; r == nil || r.By != "console:operator" || r.Note != "refunded in Stripe" || !r.At.Equal(paid.Add(time.Hour)) ||
		all.TopUps[0].Resolved != nil || all.TopUps[0].Amount != 1000 || all.TopUps[0].Currency != "USD" {
		t.Errorf("the rows: %+v", all.TopUps)
	}
	if got := ids(list("?status=open")); !slices.Equal(got, []string{"pi_a", "pi_e"}) {
		t.Errorf("open: %v", got)
	}
	if got := ids(list("?status=resolved")); !slices.Equal(got, []string{"pi_b"}) {
		t.Errorf("resolved: %v", got)
	}
	var paged []string
	for q, n := "?limit=1", 0; ; n++ {
		p := list(q)
		paged = append(paged, ids(p)...)
		if p.NextCursor == "" || n > 5 {
			break
		}
		q = "?limit=1&cursor=" + url.QueryEscape(p.NextCursor)
	}
	if !slices.Equal(paged, []string{"pi_a", "pi_b", "pi_e"}) {
		t.Errorf("paged by one: %v", paged)
	}
	admExpectError(t, admJSON(t, "GET", "/platform/stripe/notgranted?status=done", ""), 400, "invalid_request", "status")
	admExpectError(t, admJSON(t, "GET", "/platform/stripe/notgranted?cursor=42", ""), 400, "invalid_request", "cursor")
	admExpectError(t, admJSON(t, "GET", "/platform/stripe/notgranted?x=1", ""), 400, "invalid_request", "x")
	admExpectError(t, admJSON(t, "POST", "/platform/stripe/notgranted", ""), 405, "method_not_allowed", "")

	env.stop()
	admStart(t)
	admExpectError(t, admJSON(t, "GET", "/platform/stripe/notgranted", ""), 404, "not_found", "")
}
