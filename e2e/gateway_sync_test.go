package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/servicekey"
	"github.com/platformgw/gateway/internal/store"
)

func catalogBlock(backend string) string {
	return fmt.Sprintf(`
		max_body_bytes 64KiB
		service svc {
			backend %s/base
			secret %s
			owners owner-1
			endpoint echo {
				path /echo
			}
			endpoint getonly {
				methods GET
				path /echo
			}
			endpoint units {
				methods POST
				path /units
			}
			endpoint fail {
				path /fail
			}
			endpoint bytes {
				methods GET
				path /bytes
			}
			endpoint stream {
				methods GET
				path /stream
				streaming
			}
			endpoint ws {
				path /echo
				allow_upgrade
			}
			product sub {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 5
			}
			product big {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 20
			}
			product tokens {
				billing USAGE_POSTPAID
				measurement PER_TOKEN
				unit token
				price 0.001
				spending_cap 1
			}
			product instant {
				billing USAGE_INSTANT
				measurement PER_REQUEST
				unit request
				price 0.5
			}
			product prepaid {
				billing PREPAID
				measurement PER_REQUEST
				unit request
				price 2
			}
			product bytes {
				billing SUBSCRIPTION
				measurement PER_BYTE
				unit byte
				quota 100000
			}
			product time {
				billing SUBSCRIPTION
				measurement PER_TIME_UNIT
				unit second
				quota 100
			}
			product limited {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				rate_limit 2/m
			}
		}
		service down {
			backend http://127.0.0.1:1
			secret %s
			endpoint echo
			product p {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
			}
		}`, backend, testSecret, testSecret)
}

func TestSyncInvoke(t *testing.T) {
	be := newTestBackend(t, testSecret, "Platform")
	g := startGateway(t, t.TempDir(), catalogBlock(be.URL))
	ctx := context.Background()

	t.Run("forwards a signed request and strips caller identity", func(t *testing.T) {
		key, _ := g.newKey("u-sub", "roleA", "roleB")
		g.subscribe("u-sub", "svc", "sub", "ACTIVE")
		resp, body := call(t, "POST", invokeURL("svc", "echo")+"?a=1&b=two%20words", key, `{"x":1}`,
			"X-Platform-User-ID", "evil",
			"X_Platform_User_ID", "evil2",
			"x-platform-roles", "admin",
			"X-Platform-Signature", "forged",
			"Connection", "X-Platform-Signature, X-Platform-User-ID",
			"Content-Type", "application/json")
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		got := be.last(t)
		if !got.SigOK {
			t.Fatal("backend could not verify the v3 signature")
		}
		if got.Path != "/base/echo" || got.RawQuery != "a=1&b=two%20words" || string(got.Body) != `{"x":1}` {
			t.Errorf("forwarded %s?%s body %q", got.Path, got.RawQuery, got.Body)
		}
		want := map[string]string{
			"X-Platform-User-ID":             "u-sub",
			"X-Platform-Service-Product-ID":  "sub",
			"X-Platform-Roles":               "roleA,roleB",
			"X-Platform-Subscription-Status": "ACTIVE",
			"X-Platform-Billing-Model":       "SUBSCRIPTION",
			"X-Platform-Measurement-Type":    "PER_REQUEST",
			"X-Platform-Unit-Label":          "request",
			"X-Platform-Signing-Version":     "3",
		}
		for h, v := range want {
			if vals := got.Header.Values(h); len(vals) != 1 || vals[0] != v {
				t.Errorf("%s = %q, want exactly %q", h, vals, v)
			}
		}
		for name := range got.Header {
			if strings.Contains(strings.ToLower(name), "x_platform") || strings.EqualFold(name, "Authorization") {
				t.Errorf("caller header %s reached the backend", name)
			}
		}
		if got.Header.Get("X-Platform-Request-ID") == "" || got.Header.Get("X-Platform-Request-ID") != resp.Header.Get("X-Platform-Request-ID") {
			t.Errorf("request id: backend %q, caller %q", got.Header.Get("X-Platform-Request-ID"), resp.Header.Get("X-Platform-Request-ID"))
		}
		if resp.Header.Get("X-Backend") != "yes" || !strings.Contains(string(body), `"ok":true`) {
			t.Errorf("backend response not passed through: %v %s", resp.Header, body)
		}
		if resp.Header.Get("X-RateLimit-Limit") != "5" || resp.Header.Get("X-RateLimit-Remaining") != "4" ||
			!strings.HasPrefix(resp.Header.Get("RateLimit-Policy"), `"quota";q=5;w=`) || !strings.HasPrefix(resp.Header.Get("RateLimit"), `"quota";r=4;t=`) {
			t.Errorf("allowance headers: %v", resp.Header)
		}
		es := g.ledger("u-sub")
		if len(es) != 1 || es[0].Units != billing.Whole(1) || es[0].Source != store.SourceGateway || es[0].RequestID != resp.Header.Get("X-Platform-Request-ID") || es[0].ProductID != "sub" {
			t.Errorf("ledger %+v", es)
		}
	})

	t.Run("empty and binary bodies are signed as received", func(t *testing.T) {
		key, _ := g.newKey("u-bin")
		g.subscribe("u-bin", "svc", "big", "TRIAL")
		resp, body := call(t, "GET", invokeURL("svc", "echo"), key, "")
		if resp.StatusCode != 200 || !be.last(t).SigOK || len(be.last(t).Body) != 0 {
			t.Fatalf("empty body: %d %s", resp.StatusCode, body)
		}
		bin := string([]byte{0, 1, 0xff, 0xfe, '\n', 0x80})
		resp, body = call(t, "PUT", invokeURL("svc", "echo"), key, bin)
		if resp.StatusCode != 200 || !be.last(t).SigOK || string(be.last(t).Body) != bin {
			t.Fatalf("binary body: %d %s", resp.StatusCode, body)
		}
		if got := be.last(t).Header.Get("X-Platform-Subscription-Status"); got != "TRIAL" {
			t.Errorf("status header %q", got)
		}
	})

	t.Run("service owner calls free, without billing headers", func(t *testing.T) {
		key, _ := g.newKey("owner-1")
		resp, body := call(t, "POST", invokeURL("svc", "echo"), key, "hi")
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		got := be.last(t)
		if !got.SigOK || got.Header.Get("X-Platform-Subscription-Status") != "ACTIVE" || got.Header.Get("X-Platform-Service-Product-ID") != "" {
			t.Errorf("owner headers %v", got.Header)
		}
		for _, h := range []string{"X-Platform-Billing-Model", "X-Platform-Measurement-Type", "X-Platform-Unit-Label", "X-Platform-Roles"} {
			if _, present := got.Header[h]; present {
				t.Errorf("%s sent for an owner", h)
			}
		}
		if es := g.ledger("owner-1"); len(es) != 1 || es[0].ProductID != "" || es[0].Cost != 0 {
			t.Errorf("owner ledger %+v", es)
		}
	})

	t.Run("subscription quota is enforced", func(t *testing.T) {
		key, _ := g.newKey("u-quota")
		g.subscribe("u-quota", "svc", "sub", "ACTIVE")
		for i := range 5 {
			if resp, body := call(t, "GET", invokeURL("svc", "echo"), key, ""); resp.StatusCode != 200 {
				t.Fatalf("call %d: %d %s", i, resp.StatusCode, body)
			}
		}
		resp, body := call(t, "GET", invokeURL("svc", "echo"), key, "")
		if resp.StatusCode != 429 || errorCode(t, resp, body) != "quota_exceeded" {
			t.Fatalf("6th call: %d %s", resp.StatusCode, body)
		}
		ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		reset, _ := strconv.Atoi(resp.Header.Get("X-RateLimit-Reset"))
		if ra <= 0 || ra < reset || resp.Header.Get("X-RateLimit-Remaining") != "0" {
			t.Errorf("Retry-After %q, reset %q, remaining %q", resp.Header.Get("Retry-After"), resp.Header.Get("X-RateLimit-Reset"), resp.Header.Get("X-RateLimit-Remaining"))
		}
		if got := ledgerSum(g.ledger("u-quota")); got != billing.Whole(5) {
			t.Errorf("ledger sum %v", got)
		}
	})

	t.Run("backend states token units in a header the caller never sees", func(t *testing.T) {
		key, _ := g.newKey("u-tok")
		g.subscribe("u-tok", "svc", "tokens", "ACTIVE")
		resp, body := call(t, "POST", invokeURL("svc", "units")+"?n=7.5", key, "prompt")
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		if resp.Header.Get("X-Platform-Units") != "" {
			t.Error("units header leaked to the caller")
		}
		es := g.ledger("u-tok")
		if len(es) != 1 || es[0].Units != 7_500_000 || es[0].Cost != 7_500 {
			t.Errorf("ledger %+v", es)
		}
		// A cap of 1 at 0.001 per token: about 992.5 more tokens fit (costs
		// round half up to a millionth), 1000 do not; the charge stops at
		// the cap exactly.
		resp, body = call(t, "POST", invokeURL("svc", "units")+"?n=1000", key, "prompt")
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		es = g.ledger("u-tok")
		last := es[len(es)-1]
		if last.Units < 992_500_000 || last.Units > 992_501_000 || last.UnitsClaimed != billing.Whole(1000) || es[0].Cost+last.Cost != billing.Whole(1) {
			t.Errorf("capped settle %+v", last)
		}
		resp, body = call(t, "POST", invokeURL("svc", "units")+"?n=1", key, "prompt")
		if resp.StatusCode != 429 || errorCode(t, resp, body) != "quota_exceeded" {
			t.Errorf("past the spending cap: %d %s", resp.StatusCode, body)
		}
	})

	t.Run("usage instant is priced per call", func(t *testing.T) {
		key, _ := g.newKey("u-inst")
		g.subscribe("u-inst", "svc", "instant", "ACTIVE")
		call(t, "GET", invokeURL("svc", "echo"), key, "")
		if es := g.ledger("u-inst"); len(es) != 1 || es[0].Cost != 500_000 {
			t.Errorf("ledger %+v", es)
		}
	})

	t.Run("backend 5xx is passed through and not charged", func(t *testing.T) {
		key, _ := g.newKey("u-5xx")
		g.subscribe("u-5xx", "svc", "sub", "ACTIVE")
		resp, body := call(t, "GET", invokeURL("svc", "fail"), key, "")
		if resp.StatusCode != 503 || !strings.Contains(string(body), "backend broke") {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		if es := g.ledger("u-5xx"); len(es) != 0 {
			t.Errorf("charged a failed call: %+v", es)
		}
		st, _ := g.store().State(ctx, store.Account{UserID: "u-5xx", ServiceID: "svc", Product: productOf(t, g, "sub")}, time.Now())
		if st.Reserved != 0 || st.Used != 0 {
			t.Errorf("state after a failed call %+v", st)
		}
	})

	t.Run("prepaid credits", func(t *testing.T) {
		key, _ := g.newKey("u-pre")
		g.subscribe("u-pre", "svc", "prepaid", "ACTIVE")
		g.credits("u-pre", "svc", "5")
		for i := range 2 {
			if resp, body := call(t, "GET", invokeURL("svc", "echo"), key, ""); resp.StatusCode != 200 {
				t.Fatalf("call %d: %d %s", i, resp.StatusCode, body)
			}
		}
		resp, body := call(t, "GET", invokeURL("svc", "echo"), key, "")
		if resp.StatusCode != 403 || errorCode(t, resp, body) != "insufficient_credits" {
			t.Fatalf("3rd call: %d %s", resp.StatusCode, body)
		}
		sub, _ := g.store().GetSubscription(ctx, "u-pre", "svc")
		if sub.Credits != billing.Whole(1) || sub.CreditsHeld != 0 {
			t.Errorf("credits %+v", sub)
		}
	})

	t.Run("per byte counts response bytes", func(t *testing.T) {
		key, _ := g.newKey("u-bytes")
		g.subscribe("u-bytes", "svc", "bytes", "ACTIVE")
		resp, body := call(t, "GET", invokeURL("svc", "bytes"), key, "")
		if resp.StatusCode != 200 || len(body) != 1000 {
			t.Fatalf("%d len %d", resp.StatusCode, len(body))
		}
		if es := g.ledger("u-bytes"); len(es) != 1 || es[0].Units != billing.Whole(1000) {
			t.Errorf("ledger %+v", es)
		}
	})

	t.Run("per time unit: sync JSON refused, streaming allowed", func(t *testing.T) {
		key, _ := g.newKey("u-time")
		g.subscribe("u-time", "svc", "time", "ACTIVE")
		resp, body := call(t, "POST", invokeURL("svc", "echo"), key, "{}")
		if resp.StatusCode != 400 || errorCode(t, resp, body) != "time_unit_invocation_not_allowed" {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		resp, body = call(t, "GET", invokeURL("svc", "stream"), key, "")
		if resp.StatusCode != 200 || !strings.Contains(string(body), "data: 2") {
			t.Fatalf("stream: %d %s", resp.StatusCode, body)
		}
		if es := g.ledger("u-time"); len(es) != 1 || es[0].Units < billing.Whole(1) {
			t.Errorf("ledger %+v", es)
		}
	})

	t.Run("rate limit per key", func(t *testing.T) {
		key, _ := g.newKey("u-rate")
		g.subscribe("u-rate", "svc", "limited", "ACTIVE")
		for i := range 2 {
			if resp, body := call(t, "GET", invokeURL("svc", "echo"), key, ""); resp.StatusCode != 200 {
				t.Fatalf("call %d: %d %s", i, resp.StatusCode, body)
			}
		}
		resp, body := call(t, "GET", invokeURL("svc", "echo"), key, "")
		if resp.StatusCode != 429 || errorCode(t, resp, body) != "rate_limited" {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		if ra, _ := strconv.Atoi(resp.Header.Get("Retry-After")); ra < 1 {
			t.Errorf("Retry-After %q", resp.Header.Get("Retry-After"))
		}
		if len(g.ledger("u-rate")) != 2 {
			t.Error("refused call charged")
		}
	})

	t.Run("unreachable backend is service_error and not charged", func(t *testing.T) {
		key, _ := g.newKey("u-down")
		g.subscribe("u-down", "down", "p", "ACTIVE")
		resp, body := call(t, "GET", invokeURL("down", "echo"), key, "")
		if resp.StatusCode != 502 || errorCode(t, resp, body) != "service_error" || !strings.Contains(string(body), resp.Header.Get("X-Platform-Request-ID")) {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		if len(g.ledger("u-down")) != 0 {
			t.Error("unreachable call charged")
		}
	})

	t.Run("every refusal is the documented JSON error and changes nothing", func(t *testing.T) {
		good, _ := g.newKey("u-err")
		g.subscribe("u-err", "svc", "sub", "ACTIVE")
		revoked, rrec := g.newKey("u-err")
		if _, err := g.store().RevokeKey(ctx, rrec.ID, time.Now()); err != nil {
			t.Fatal(err)
		}
		expired := expiredKey(t, g, "u-err")
		nosub, _ := g.newKey("u-nosub")
		suspended, _ := g.newKey("u-susp")
		g.subscribe("u-susp", "svc", "sub", "SUSPENDED")
		unknown := good[:len(good)-1] + string(rune('A'+(good[len(good)-1]+1)%26)) // bad checksum
		big := strings.Repeat("x", 65*1024)

		subscriptionMessages := map[string]string{
			"no subscription": "no subscription to service svc",
			"suspended":       "the subscription is SUSPENDED",
		}
		cases := []struct {
			name, method, url, key, body string
			hdr                          []string
			status                       int
			code                         string
		}{
			{"no key", "GET", invokeURL("svc", "echo"), "", "", nil, 401, "missing_key"},
			{"basic auth", "GET", invokeURL("svc", "echo"), "", "", []string{"Authorization", "Basic dTpw"}, 401, "missing_key"},
			{"malformed key", "GET", invokeURL("svc", "echo"), "not-a-key", "", nil, 401, "invalid_key"},
			{"bad checksum", "GET", invokeURL("svc", "echo"), unknown, "", nil, 401, "invalid_key"},
			{"revoked key", "GET", invokeURL("svc", "echo"), revoked, "", nil, 401, "key_revoked"},
			{"expired key", "GET", invokeURL("svc", "echo"), expired, "", nil, 401, "key_expired"},
			{"no subscription", "GET", invokeURL("svc", "echo"), nosub, "", nil, 403, "no_subscription"},
			{"suspended", "GET", invokeURL("svc", "echo"), suspended, "", nil, 403, "subscription_inactive"},
			{"unknown service", "GET", invokeURL("nope", "echo"), good, "", nil, 404, "service_not_found"},
			{"unknown endpoint", "GET", invokeURL("svc", "nope"), good, "", nil, 404, "endpoint_not_found"},
			{"method not allowed", "POST", invokeURL("svc", "getonly"), good, "x", nil, 405, "method_not_allowed"},
			{"too large", "POST", invokeURL("svc", "echo"), good, big, nil, 413, "payload_too_large"},
			{"not an invoke path", "GET", gwBase + "/api/service/svc/endpoint/echo/call", good, "", nil, 404, "not_found"},
			{"upgrade refused", "GET", invokeURL("svc", "echo"), good, "", []string{"Upgrade", "websocket", "Connection", "Upgrade"}, 400, "invalid_request"},
			{"async on a sync endpoint", "POST", invokeURL("svc", "echo") + "/async", good, "x", nil, 404, "endpoint_not_found"},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				before := be.count()
				ledgerBefore := len(g.ledger("u-err"))
				resp, body := call(t, tc.method, tc.url, tc.key, tc.body, tc.hdr...)
				if resp.StatusCode != tc.status || errorCode(t, resp, body) != tc.code {
					t.Fatalf("got %d %s, want %d %s", resp.StatusCode, body, tc.status, tc.code)
				}
				// The same messages as validate's (package subscription).
				if want := subscriptionMessages[tc.name]; want != "" && !strings.Contains(string(body), `"message":"`+want+`"`) {
					t.Errorf("body %s, want message %q", body, want)
				}
				if resp.Header.Get("X-Platform-Request-ID") == "" && tc.code != "not_found" {
					t.Error("no request id on a refusal")
				}
				if be.count() != before || len(g.ledger("u-err")) != ledgerBefore {
					t.Error("a refused call reached the backend or the ledger")
				}
			})
		}
		st, _ := g.store().State(ctx, store.Account{UserID: "u-err", ServiceID: "svc", Product: productOf(t, g, "sub")}, time.Now())
		if st.Used != 0 || st.Reserved != 0 {
			t.Errorf("refusals changed the counters: %+v", st)
		}
	})
}

func expiredKey(t *testing.T, g *gateway, user string) string {
	t.Helper()
	key, hash, err := servicekey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	rec := store.KeyRecord{ID: servicekey.NewID(), Hash: hash, UserID: user,
		Created: time.Now().Add(-time.Hour), ExpiresAt: time.Now().Add(-time.Minute)}
	if err := g.store().CreateKey(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	return key
}

func productOf(t *testing.T, g *gateway, id string) billing.Product {
	svc, _ := g.app().Catalog().Service("svc")
	p, ok := svc.Product(id)
	if !ok {
		t.Fatalf("no product %s", id)
	}
	return *p
}

// TestQuotaRace: parallel callers race for the last units of a hard quota;
// exactly the quota succeeds and nothing overshoots.
func TestQuotaRace(t *testing.T) {
	be := newTestBackend(t, testSecret, "Platform")
	g := startGateway(t, t.TempDir(), catalogBlock(be.URL))
	key, _ := g.newKey("u-race")
	g.subscribe("u-race", "svc", "big", "ACTIVE")

	const callers = 60
	var wg sync.WaitGroup
	codes := make(chan int, callers)
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, _ := call(t, "GET", invokeURL("svc", "echo"), key, "")
			codes <- resp.StatusCode
		}()
	}
	wg.Wait()
	close(codes)
	n := map[int]int{}
	for c := range codes {
		n[c]++
	}
	if n[200] != 20 || n[429] != callers-20 {
		t.Errorf("outcomes %v, want 20 × 200 and %d × 429", n, callers-20)
	}
	if got := ledgerSum(g.ledger("u-race")); got != billing.Whole(20) {
		t.Errorf("ledger sum %v, want 20", got)
	}
	st, _ := g.store().State(context.Background(), store.Account{UserID: "u-race", ServiceID: "svc", Product: productOf(t, g, "big")}, time.Now())
	if st.Used != billing.Whole(20) || st.Reserved != 0 {
		t.Errorf("counter %+v", st)
	}
}

// TestRestartKeepsState stops the platform (the store file closes) and
// starts it again on the same file.
func TestRestartKeepsState(t *testing.T) {
	be := newTestBackend(t, testSecret, "Platform")
	dir := t.TempDir()
	g := startGateway(t, dir, catalogBlock(be.URL))
	key, _ := g.newKey("u-restart")
	g.subscribe("u-restart", "svc", "sub", "ACTIVE")
	for range 3 {
		call(t, "GET", invokeURL("svc", "echo"), key, "")
	}
	// A config without the platform app: the store's last user goes away.
	g.tester.InitServer(fmt.Sprintf("{\n\tadmin localhost:%d\n}\n", adminPort), "caddyfile")
	g = startGateway(t, dir, catalogBlock(be.URL))
	resp, body := call(t, "GET", invokeURL("svc", "echo"), key, "")
	if resp.StatusCode != 200 {
		t.Fatalf("after restart: %d %s", resp.StatusCode, body)
	}
	if resp.Header.Get("X-RateLimit-Remaining") != "1" {
		t.Errorf("counter lost: remaining %q", resp.Header.Get("X-RateLimit-Remaining"))
	}
	if got := ledgerSum(g.ledger("u-restart")); got != billing.Whole(4) {
		t.Errorf("ledger %v", got)
	}
}

// TestReloadMidTraffic changes the catalog while calls are in flight: no
// call that should succeed fails, nothing is charged that was not answered,
// and the new service works at once.
//
// Caddy listens with SO_REUSEPORT across a reload: a connection the kernel
// queued on the old listener as it closes is reset before any request is
// read. Clients retry such a connection error (nothing reached the server);
// so does this test, and the ledger proves the retry charged nothing twice.
func TestReloadMidTraffic(t *testing.T) {
	be := newTestBackend(t, testSecret, "Platform")
	dir := t.TempDir()
	g := startGateway(t, dir, catalogBlock(be.URL))
	key, _ := g.newKey("u-reload")
	g.subscribe("u-reload", "svc", "big", "ACTIVE")

	stop := make(chan struct{})
	var failures, calls, ok200, resets int
	var mu sync.Mutex
	var wg sync.WaitGroup
	get := func() (int, error) {
		req, _ := http.NewRequest("GET", invokeURL("svc", "echo"), nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				select {
				case <-stop:
					return
				default:
				}
				status, err := get()
				for try := 0; err != nil && try < 3; try++ {
					mu.Lock()
					resets++
					mu.Unlock()
					status, err = get()
				}
				mu.Lock()
				calls++
				switch {
				case status == 200:
					ok200++
				case status == 429:
				default:
					failures++
					t.Logf("failed during reload: %d %v", status, err)
				}
				mu.Unlock()
			}
		}()
	}
	for i := range 3 {
		extra := fmt.Sprintf("\n\t\tservice extra%d {\n\t\t\tbackend %s\n\t\t\tsecret %s\n\t\t\tendpoint echo\n\t\t}", i, be.URL, testSecret)
		startGateway(t, dir, catalogBlock(be.URL)+extra)
	}
	close(stop)
	wg.Wait()
	if failures > 0 {
		t.Errorf("%d of %d calls failed across reloads", failures, calls)
	}
	t.Logf("%d calls, %d answered 200, %d connection resets retried", calls, ok200, resets)
	if got := ledgerSum(g.ledger("u-reload")); got != billing.Whole(int64(ok200)) {
		t.Errorf("ledger %v, but %d calls were answered 200", got, ok200)
	}
	owner, _ := g.newKey("nobody")
	resp, _ := call(t, "GET", invokeURL("extra2", "echo"), owner, "")
	if resp.StatusCode != 403 { // the new service exists; this user has no subscription
		t.Errorf("new service after reload: %d", resp.StatusCode)
	}
}

// TestBrand: with header_brand Tollara every header is X-Tollara-*.
func TestBrand(t *testing.T) {
	be := newTestBackend(t, testSecret, "Tollara")
	g := startGateway(t, t.TempDir(), "\t\theader_brand Tollara\n"+catalogBlock(be.URL))
	key, _ := g.newKey("u-brand")
	g.subscribe("u-brand", "svc", "tokens", "ACTIVE")
	resp, body := call(t, "POST", invokeURL("svc", "units")+"?n=3", key, "x", "X-Tollara-User-ID", "evil", "X_Tollara_User_ID", "evil")
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	got := be.last(t)
	if !got.SigOK || got.Header.Get("X-Tollara-User-ID") != "u-brand" || len(got.Header.Values("X-Tollara-User-ID")) != 1 {
		t.Errorf("backend headers %v", got.Header)
	}
	if resp.Header.Get("X-Tollara-Request-ID") == "" || resp.Header.Get("X-Tollara-Units") != "" {
		t.Errorf("response headers %v", resp.Header)
	}
	if es := g.ledger("u-brand"); len(es) != 1 || es[0].Units != billing.Whole(3) {
		t.Errorf("ledger %+v", es)
	}
}

// TestRequestBuffersForwardWholeBody: with reverse_proxy's
// request_buffers, which reads the body into a copy before the transport,
// the backend gets the whole signed body and the call is charged once (the
// platform transport hands net/http the call's own bytes; a version of it
// sent the reader request_buffers had already read: 502 for a body within
// the buffer, a truncated body past it).
func TestRequestBuffersForwardWholeBody(t *testing.T) {
	be := newTestBackend(t, testSecret, "Platform")
	body := strings.Repeat("0123456789", 1000) // 10,000 bytes
	for _, buffers := range []string{"1m", "4k"} {
		t.Run(buffers, func(t *testing.T) {
			g := startGatewayWithProxy(t, t.TempDir(), catalogBlock(be.URL), "", "", "\t\trequest_buffers "+buffers)
			key, _ := g.newKey("u-buf")
			g.subscribe("u-buf", "svc", "big", "ACTIVE")
			for _, method := range []string{"POST", "PUT"} {
				resp, got := call(t, method, invokeURL("svc", "echo"), key, body)
				seen := be.last(t)
				if resp.StatusCode != 200 || !seen.SigOK || string(seen.Body) != body {
					t.Fatalf("%s: %d %.200s; the backend read %d bytes (signature ok: %v)", method, resp.StatusCode, got, len(seen.Body), seen.SigOK)
				}
			}
			if es := g.ledger("u-buf"); len(es) != 2 {
				t.Errorf("ledger after two calls: %+v", es)
			}
		})
	}
}

// TestBackendTimeout: a backend that does not answer within the proxy's
// response_header_timeout gives the caller service_timeout (504) with the
// request id, and the call is not charged.
func TestBackendTimeout(t *testing.T) {
	be := newTestBackend(t, testSecret, "Platform")
	block := catalogBlock(be.URL) + fmt.Sprintf(`
		service slow {
			backend %s
			secret %s
			endpoint slow {
				methods GET
				path /slow
			}
			product p {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 10
			}
		}`, be.URL, testSecret)
	g := startGatewayWithTransport(t, t.TempDir(), block, "\t\t\tresponse_header_timeout 100ms")
	key, _ := g.newKey("u-slow")
	g.subscribe("u-slow", "slow", "p", "ACTIVE")
	resp, body := call(t, "GET", invokeURL("slow", "slow"), key, "")
	if resp.StatusCode != 504 || errorCode(t, resp, body) != "service_timeout" ||
		!strings.Contains(string(body), resp.Header.Get("X-Platform-Request-ID")) {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if es := g.ledger("u-slow"); len(es) != 0 {
		t.Errorf("a timed-out call was charged: %+v", es)
	}
	st, err := g.store().State(context.Background(), store.Account{UserID: "u-slow", ServiceID: "slow", Product: productOfService(t, g, "slow", "p")}, time.Now())
	if err != nil || st.Reserved != 0 || st.Used != 0 {
		t.Errorf("state after a timeout %+v %v", st, err)
	}
}

func productOfService(t *testing.T, g *gateway, service, id string) billing.Product {
	t.Helper()
	svc, ok := g.app().Catalog().Service(service)
	if !ok {
		t.Fatalf("no service %s", service)
	}
	p, ok := svc.Product(id)
	if !ok {
		t.Fatalf("no product %s", id)
	}
	return *p
}
