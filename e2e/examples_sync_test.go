package e2e

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	backendapp "github.com/platformgw/gateway/examples/backend/app"
	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/sdk"
)

// The sync example behind the gateway: the SDK middleware verifies every
// forwarded call, the handler sees the caller the gateway signed, and the
// tokens it states are what the caller is charged.
func TestExampleBackendSync(t *testing.T) {
	be := httptest.NewServer(backendapp.New(sdk.NewVerifier(exampleEchoSecret)))
	t.Cleanup(be.Close)
	g := startGateway(t, t.TempDir(), examplesCatalog(be.URL, "http://127.0.0.1:1", "http://127.0.0.1:1"))
	key, _ := g.newKey("ex-sync", "demo", "beta")
	g.subscribe("ex-sync", "echo", "tokens", "ACTIVE")

	// hello echoes the trusted context; a caller's own identity headers
	// never get through.
	resp, body := call(t, "POST", invokeURL("echo", "hello")+"?name=you", key, `{"hi":1}`,
		"X-Platform-User-ID", "someone-else", "X_Platform_Service_Product_ID", "free")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("hello: %d %s", resp.StatusCode, body)
	}
	var hello backendapp.Hello
	if err := json.Unmarshal(body, &hello); err != nil {
		t.Fatalf("hello answer: %s", body)
	}
	c := hello.Caller
	if hello.Method != "POST" || hello.Query != "name=you" || hello.Body != `{"hi":1}` ||
		c.UserID != "ex-sync" || c.ServiceProductID != "tokens" || !slices.Equal(c.Roles, []string{"demo", "beta"}) ||
		c.SubscriptionStatus != "ACTIVE" || c.BillingModel != "USAGE_POSTPAID" || c.MeasurementType != "PER_TOKEN" ||
		c.UnitLabel != "token" || !c.Subscriber || c.RequestID == "" {
		t.Fatalf("hello: %s", body)
	}
	if got := resp.Header.Get("X-Platform-Request-ID"); got != "" && got != c.RequestID {
		t.Errorf("request id: caller got %s, backend saw %s", got, c.RequestID)
	}

	// complete states its tokens: the gateway charges them and takes the
	// header out.
	resp, body = call(t, "POST", invokeURL("echo", "complete"), key, "write me a short poem please")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("complete: %d %s", resp.StatusCode, body)
	}
	var done backendapp.Completion
	if err := json.Unmarshal(body, &done); err != nil || done.Tokens != 6 || done.Completion != "WRITE ME A SHORT POEM PLEASE" {
		t.Fatalf("complete: %s", body)
	}
	if resp.Header.Get("X-Platform-Units") != "" {
		t.Errorf("the units header reached the caller")
	}
	var charged []store.LedgerEntry
	for _, e := range g.ledger("ex-sync") {
		if e.RequestID == done.Caller.RequestID {
			charged = append(charged, e)
		}
	}
	if len(charged) != 1 || charged[0].Units != billing.Whole(6) || charged[0].EndpointID != "complete" || charged[0].Source != store.SourceGateway {
		t.Errorf("ledger of the completion: %+v", charged)
	}

	// A product that counts requests pays the endpoint's cost, whatever
	// the prompt's length.
	g.subscribe("ex-sync", "echo", "free", "ACTIVE")
	resp, body = call(t, "POST", invokeURL("echo", "complete"), key, "a b c d e")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("complete on free: %d %s", resp.StatusCode, body)
	}
	es := g.ledger("ex-sync")
	if last := es[len(es)-1]; last.Units != billing.Whole(1) || last.ProductID != "free" || last.EndpointID != "complete" {
		t.Errorf("complete on a PER_REQUEST product charged %+v", last)
	}

	// The service's owner calls free: no product, no billing context.
	owner, _ := g.newKey("echo-owner")
	resp, body = call(t, "GET", invokeURL("echo", "hello"), owner, "")
	var free backendapp.Hello
	if err := json.Unmarshal(body, &free); resp.StatusCode != http.StatusOK || err != nil ||
		free.Caller.UserID != "echo-owner" || free.Caller.Subscriber || free.Caller.BillingModel != "" {
		t.Fatalf("owner: %d %s", resp.StatusCode, body)
	}

	// Nobody reaches the backend around the gateway: the middleware
	// refuses what the gateway did not sign.
	for name, hdr := range map[string][]string{
		"unsigned": {"X-Platform-User-ID", "ex-sync"},
		"forged": {"X-Platform-User-ID", "ex-sync", "X-Platform-Timestamp", "1700000000",
			"X-Platform-Signature", "c2lnbmF0dXJl", "X-Platform-Signing-Version", "3"},
	} {
		resp, body := call(t, "GET", be.URL+"/hello", "", "", hdr...)
		if resp.StatusCode != http.StatusUnauthorized || errorCode(t, resp, body) != sdk.CodeInvalidSignature {
			t.Errorf("%s call to the backend: %d %s", name, resp.StatusCode, body)
		}
	}
}

// Under header_brand Tollara the example works unchanged but for its
// HEADER_BRAND: the signature and the units header carry the brand.
func TestExampleBackendTollaraBrand(t *testing.T) {
	v := sdk.NewVerifier(exampleEchoSecret)
	v.Brand = "Tollara"
	be := httptest.NewServer(backendapp.New(v))
	t.Cleanup(be.Close)
	g := startGateway(t, t.TempDir(), "header_brand Tollara\n"+examplesCatalog(be.URL, "http://127.0.0.1:1", "http://127.0.0.1:1"))
	key, _ := g.newKey("ex-tollara")
	g.subscribe("ex-tollara", "echo", "tokens", "ACTIVE")

	resp, body := call(t, "POST", invokeURL("echo", "complete"), key, "one two three")
	var done backendapp.Completion
	if err := json.Unmarshal(body, &done); resp.StatusCode != http.StatusOK || err != nil || done.Caller.UserID != "ex-tollara" {
		t.Fatalf("complete: %d %s", resp.StatusCode, body)
	}
	if resp.Header.Get("X-Tollara-Units") != "" {
		t.Errorf("the units header reached the caller")
	}
	if es := g.ledger("ex-tollara"); len(es) != 1 || es[0].Units != billing.Whole(3) {
		t.Errorf("ledger %+v", es)
	}
}
