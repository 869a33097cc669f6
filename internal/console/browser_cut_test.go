package console

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/chromedp/chromedp"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/browsertest"
	"github.com/platformgw/gateway/internal/store"
)

// TestConsoleCutCallsInBrowser: an operator opens the usage explorer of a
// user whose backend stated more units than the quota had left. The totals
// say how many calls a hard limit cut short, the cut row says how much of
// what was stated went uncharged, in the page as a person reads it (and on
// a 390 px phone the row's note stays inside the screen). With
// SCREENSHOTS_DIR set it saves console-usage-cut.png.
func TestConsoleCutCallsInBrowser(t *testing.T) {
	ctx := browsertest.New(t, time.Minute)
	e := local(t)
	h := direct(t, e, false)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		repl := caddy.NewReplacer()
		repl.Set("http.auth.user.id", "operator") // as basic_auth signs one in
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl)), nil)
	}))
	defer srv.Close()

	bg := context.Background()
	if _, err := e.ops.PutSubscription(bg, "test", "alice", "weather", "basic", ""); err != nil {
		t.Fatal(err)
	}
	svc, _ := e.rt.Catalog.Service("weather")
	p, _ := svc.Product("basic")
	a := store.Account{UserID: "alice", ServiceID: "weather", Product: *p}
	now := time.Now().UTC()
	for _, claim := range []int64{97, 2, 5} { // the last states 5 with 1 left
		res, err := e.rt.Store().Reserve(bg, a, billing.Whole(1), now)
		if err != nil || !res.Decision.Allowed {
			t.Fatalf("hold: %v %+v", err, res.Decision)
		}
		if _, err := e.rt.Store().Settle(bg, res, billing.Whole(claim), store.LedgerEntry{Time: now, UserID: "alice",
			ServiceID: "weather", EndpointID: "hello", ProductID: "basic", Source: store.SourceGateway}); err != nil {
			t.Fatal(err)
		}
	}
	do(t, ctx, "usage", chromedp.Navigate(srv.URL+"/console/usage?user=alice"), chromedp.WaitVisible(chromedp.CSS("#usage-cut")))
	if got := text(t, ctx, "#usage-cut"); !strings.Contains(got, "1 cut at a hard limit") {
		t.Errorf("the totals say %q", got)
	}
	if row := text(t, ctx, "#ledger tbody tr"); !strings.Contains(row, "4 of 5 stated left uncharged") {
		t.Errorf("the cut row says %q", row)
	}
	browsertest.Screenshot(t, ctx, "console-usage-cut")
	do(t, ctx, "phone", chromedp.EmulateViewport(390, 844), chromedp.Navigate(srv.URL+"/console/usage?user=alice"),
		chromedp.WaitVisible(chromedp.CSS("#usage-cut")))
	if over := eval[bool](t, ctx, `(() => { const r = document.querySelector("#ledger tbody tr small.cut").getBoundingClientRect(); return r.right > document.documentElement.scrollWidth + 1 })()`); over {
		t.Error("the cut row's note runs past the page on a phone")
	}
}
