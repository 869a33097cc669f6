package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestCoreEstimateUsage(t *testing.T) {
	be := newTestBackend(t, coreSecret, "Platform")
	g := startGateway(t, t.TempDir(), coreCatalog(be.URL))
	keys := map[string]string{}
	for user, product := range map[string]string{
		"u-basic": "basic", "u-over": "overage", "u-pre": "prepaid", "u-meter": "metered",
	} {
		keys[user], _ = g.newKey(user)
		g.subscribe(user, "pre", product, "ACTIVE")
	}
	g.credits("u-pre", "pre", "5")
	ownerKey, _ := g.newKey("owner-1")
	bare, _ := g.newKey("u-bare")
	revoked, revokedRec := g.newKey("u-basic")
	if _, err := g.store().RevokeKey(context.Background(), revokedRec.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	users := []string{"u-basic", "u-over", "u-pre", "u-meter", "owner-1", "u-bare"}
	snapshot := func() map[string]coreState {
		m := map[string]coreState{}
		for _, u := range users {
			m[u] = coreSnapshot(t, g, u, "pre", "other")
		}
		return m
	}
	before := snapshot()

	estimate := func(t *testing.T, user string, units any, extra ...any) coreAnswer {
		t.Helper()
		body := coreBody(t, append([]any{"serviceKey", keys[user], "serviceId", "pre", "estimatedUnits", units}, extra...)...)
		return corePost(t, usageSigned{URL: coreEstimateURL, Secret: coreSecret, Body: body}, coreSecret)
	}

	t.Run("allowed, within the quota", func(t *testing.T) {
		a := estimate(t, "u-basic", 2)
		a.expect(t, 200, "")
		a.mustSigned(t)
		want := `{"sufficientCredits":true,"wouldExceedCap":false,"wouldAllow":true,"estimatedCost":0,` +
			`"billingModelType":"SUBSCRIPTION","measurementType":"PER_REQUEST","unitLabel":"request",` +
			`"breakdown":{"unitsUsed":2,"unitsRemaining":1,"totalUnitsUsedThisCycle":2,"isOverLimit":false,"isOverage":false,"isOverageAllowed":false},` +
			`"estimateSchemaVersion":3,"timestamp":` + a.Timestamp + `}`
		if string(a.Body) != want {
			t.Errorf("body\n got %s\nwant %s", a.Body, want)
		}
	})

	t.Run("over a blocked quota: 429 with Retry-After until the period ends", func(t *testing.T) {
		a := estimate(t, "u-basic", 4)
		a.expect(t, 429, "quota_exceeded")
		a.mustSigned(t)
		ra, err := strconv.Atoi(a.Header.Get("Retry-After"))
		if err != nil || ra < 1 || ra > 31*24*3600 || a.JSON["retryAfter"] != float64(ra) {
			t.Errorf("Retry-After %q, body %s", a.Header.Get("Retry-After"), a.Body)
		}
		if a.JSON["wouldAllow"] != false || a.JSON["wouldExceedCap"] != true || a.JSON["sufficientCredits"] != true {
			t.Errorf("body %s", a.Body)
		}
	})

	t.Run("overage allowed, priced, up to the spending cap", func(t *testing.T) {
		a := estimate(t, "u-over", 12) // 2 past the quota of 10, at 0.5
		a.expect(t, 200, "")
		bd := a.JSON["breakdown"].(map[string]any)
		if a.JSON["estimatedCost"] != 1.0 || bd["isOverage"] != true || bd["remainingSpendingCap"] != 1.0 || bd["isOverLimit"] != false {
			t.Errorf("body %s", a.Body)
		}
		a = estimate(t, "u-over", "14.5") // 4.5 past: 2.25 > the cap of 2
		a.expect(t, 429, "quota_exceeded")
		if a.JSON["wouldExceedCap"] != true || a.JSON["estimatedCost"] != 2.25 || a.Header.Get("Retry-After") == "" {
			t.Errorf("body %s", a.Body)
		}
	})

	t.Run("prepaid credits", func(t *testing.T) {
		a := estimate(t, "u-pre", 2) // 4 of 5 credits
		a.expect(t, 200, "")
		if a.JSON["estimatedCost"] != 4.0 || a.JSON["breakdown"].(map[string]any)["remainingCredits"] != 1.0 {
			t.Errorf("body %s", a.Body)
		}
		a = estimate(t, "u-pre", 3)
		a.expect(t, 403, "insufficient_credits")
		a.mustSigned(t)
		if a.JSON["sufficientCredits"] != false || a.JSON["wouldAllow"] != false || a.JSON["wouldExceedCap"] != false ||
			a.Header.Get("Retry-After") != "" {
			t.Errorf("body %s, Retry-After %q", a.Body, a.Header.Get("Retry-After"))
		}
	})

	t.Run("postpaid with a cap; exact decimals", func(t *testing.T) {
		a := estimate(t, "u-meter", "1000.5") // 1.0005 past the cap of 1
		a.expect(t, 429, "quota_exceeded")
		a = estimate(t, "u-meter", "0.1")
		a.expect(t, 200, "")
		if a.JSON["estimatedCost"] != 0.0001 {
			t.Errorf("body %s", a.Body)
		}
		if want := `"estimatedCost":0.0001,`; !strings.Contains(string(a.Body), want) {
			t.Errorf("cost not written as an exact decimal: %s", a.Body)
		}
	})

	t.Run("a service owner estimates free", func(t *testing.T) {
		keys["owner-1"] = ownerKey
		a := estimate(t, "owner-1", 1e6)
		a.expect(t, 200, "")
		want := `{"sufficientCredits":true,"wouldExceedCap":false,"wouldAllow":true,"estimatedCost":0,"billingModelType":null,` +
			`"measurementType":null,"unitLabel":null,"breakdown":{"unitsUsed":1000000,"totalUnitsUsedThisCycle":0,"isOverLimit":false,` +
			`"isOverage":false,"isOverageAllowed":false},"estimateSchemaVersion":3,"timestamp":` + a.Timestamp + `}`
		if string(a.Body) != want {
			t.Errorf("body\n got %s\nwant %s", a.Body, want)
		}
	})

	t.Run("the serviceSecret authenticates too", func(t *testing.T) {
		body := coreBody(t, "serviceKey", keys["u-basic"], "serviceSecret", coreOldSecret, "estimatedUnits", 1)
		a := corePost(t, usageSigned{URL: gwBase + "/core/api/v1/service-keys/estimate-usage", Body: body}, coreSecret)
		a.expect(t, 200, "")
		a.mustSigned(t)
	})

	t.Run("refusals", func(t *testing.T) {
		keys["u-bare"], keys["u-revoked"] = bare, revoked
		a := estimate(t, "u-revoked", 1)
		a.expect(t, 401, "key_revoked")
		a.mustSigned(t)
		a = estimate(t, "u-bare", 1)
		a.expect(t, 403, "no_subscription")
		a.mustSigned(t)
		body := coreBody(t, "serviceKey", keys["u-basic"], "serviceId", "pre", "serviceSecret", "guess", "estimatedUnits", 1)
		a = corePost(t, usageSigned{URL: coreEstimateURL, Body: body}, coreSecret)
		a.expect(t, 401, "invalid_signature")
		a.mustUnsigned(t)
		body = coreBody(t, "serviceKey", keys["u-basic"], "serviceId", "pre", "estimatedUnits", 1)
		a = corePost(t, usageSigned{URL: coreEstimateURL, Body: body}, coreSecret)
		a.expect(t, 401, "invalid_signature")
		a.mustUnsigned(t)
		for _, units := range []string{`-1`, `"-0.5"`, `"NaN"`, `"Infinity"`, `1e40`, `"abc"`, `true`, `{}`, `0.0000001`, `null`} {
			body := `{"serviceKey":"` + keys["u-basic"] + `","serviceId":"pre","estimatedUnits":` + units + `}`
			a := corePost(t, usageSigned{URL: coreEstimateURL, Secret: coreSecret, Body: body}, coreSecret)
			a.expect(t, 400, "invalid_request", "estimatedUnits")
			a.mustSigned(t)
		}
	})

	t.Run("concurrent estimates change no counter", func(t *testing.T) {
		var wg sync.WaitGroup
		for i := range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				user := users[i%4]
				body := coreBody(t, "serviceKey", keys[user], "serviceId", "pre", "estimatedUnits", i)
				resp, _ := usagePost(t, usageSigned{URL: coreEstimateURL, Secret: coreSecret, Body: body})
				if resp.StatusCode >= 500 {
					t.Errorf("estimate %d: %d", i, resp.StatusCode)
				}
			}()
		}
		wg.Wait()
	})

	after := snapshot()
	for _, u := range users {
		coreUnchanged(t, "estimates of "+u, before[u], after[u])
	}
	if n := be.count(); n != 0 {
		t.Errorf("the backend saw %d requests", n)
	}
}

// TestCoreEstimateAgreesWithGateway: an estimate says what the gateway then
// does, because both run the one billing decision on the same state.
func TestCoreEstimateAgreesWithGateway(t *testing.T) {
	be := newTestBackend(t, coreSecret, "Platform")
	g := startGateway(t, t.TempDir(), coreCatalog(be.URL))
	key, _ := g.newKey("u-agree")
	g.subscribe("u-agree", "pre", "basic", "ACTIVE")
	for i := 0; i < 5; i++ {
		body := coreBody(t, "serviceKey", key, "serviceId", "pre", "estimatedUnits", 1)
		est := corePost(t, usageSigned{URL: coreEstimateURL, Secret: coreSecret, Body: body}, coreSecret)
		resp, out := call(t, "POST", invokeURL("pre", "call"), key, "{}")
		if (est.Status == 200) != (resp.StatusCode == 200) {
			t.Fatalf("call %d: estimate %d %s, invoke %d %s", i, est.Status, est.Body, resp.StatusCode, out)
		}
		if resp.StatusCode == 429 && est.Header.Get("Retry-After") != resp.Header.Get("Retry-After") {
			// The gateway's Retry-After is the quota's reset: the same instant.
			ra1, _ := strconv.Atoi(est.Header.Get("Retry-After"))
			ra2, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
			if ra1-ra2 > 1 || ra2-ra1 > 1 {
				t.Errorf("Retry-After: estimate %d, gateway %d", ra1, ra2)
			}
		}
		if i < 3 && est.Status != 200 || i >= 3 && est.Status != 429 {
			t.Errorf("call %d: estimate %d %s", i, est.Status, est.Body)
		}
		if i < 3 {
			bd := est.JSON["breakdown"].(map[string]any)
			if bd["totalUnitsUsedThisCycle"] != float64(i+1) || bd["unitsRemaining"] != float64(2-i) {
				t.Errorf("call %d: breakdown %v", i, bd)
			}
		}
	}
	if got := ledgerSum(g.ledger("u-agree")); got != 3_000_000 {
		t.Errorf("ledger holds %v units, want 3", got)
	}
}

func TestCoreBillingEstimate(t *testing.T) {
	be := newTestBackend(t, coreSecret, "Platform")
	g := startGateway(t, t.TempDir(), coreCatalog(be.URL))
	key, _ := g.newKey("u-bill")
	g.subscribe("u-bill", "pre", "basic", "ACTIVE")
	otherKey, _ := g.newKey("u-else")
	g.subscribe("u-else", "pre", "basic", "ACTIVE")
	revoked, revokedRec := g.newKey("u-bill")
	if _, err := g.store().RevokeKey(context.Background(), revokedRec.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	before := coreSnapshot(t, g, "u-bill", "pre")
	body := func(user, service string, units any) string {
		return coreBody(t, "userId", user, "serviceId", service, "estimatedUnits", units)
	}
	bearer := func(key string) []string { return []string{"Authorization", "Bearer " + key} }
	wantAllowed := `{"sufficientCredits":true,"wouldExceedCap":false,"wouldAllow":true,"estimatedCost":0,` +
		`"billingModelType":"SUBSCRIPTION","measurementType":"PER_REQUEST","unitLabel":"request",` +
		`"breakdown":{"unitsUsed":1,"unitsRemaining":2,"totalUnitsUsedThisCycle":1,"isOverLimit":false,"isOverage":false,"isOverageAllowed":false}}`

	t.Run("signed by the service: unsigned answer", func(t *testing.T) {
		a := corePost(t, usageSigned{URL: coreBillingURL, Secret: coreSecret, Body: body("u-bill", "pre", 1)}, "")
		a.expect(t, 200, "")
		a.mustUnsigned(t)
		if string(a.Body) != wantAllowed {
			t.Errorf("body\n got %s\nwant %s", a.Body, wantAllowed)
		}
	})

	t.Run("the user's own Bearer key, ECS prefix", func(t *testing.T) {
		a := corePost(t, usageSigned{URL: gwBase + "/core/api/v1/billing/usage/estimate", Body: body("u-bill", "pre", 1), Header: bearer(key)}, "")
		a.expect(t, 200, "")
		a.mustUnsigned(t)
		if string(a.Body) != wantAllowed {
			t.Errorf("body %s", a.Body)
		}
	})

	t.Run("over the quota", func(t *testing.T) {
		a := corePost(t, usageSigned{URL: coreBillingURL, Secret: coreOldSecret, Body: body("u-bill", "pre", 3.5)}, "")
		a.expect(t, 429, "quota_exceeded")
		if a.Header.Get("Retry-After") == "" || a.JSON["estimateSchemaVersion"] != nil || a.JSON["timestamp"] != nil {
			t.Errorf("%v %s", a.Header, a.Body)
		}
	})

	for _, tt := range []struct {
		name   string
		s      usageSigned
		status int
		code   string
	}{
		{"another user's key", usageSigned{Body: body("u-bill", "pre", 1), Header: bearer(otherKey)}, 403, "forbidden"},
		{"a revoked key", usageSigned{Body: body("u-bill", "pre", 1), Header: bearer(revoked)}, 401, "key_revoked"},
		{"a malformed key", usageSigned{Body: body("u-bill", "pre", 1), Header: bearer("nope")}, 401, "invalid_key"},
		{"no credentials", usageSigned{Body: body("u-bill", "pre", 1)}, 401, "invalid_signature"},
		{"signed by another service", usageSigned{Secret: coreSecret2, Body: body("u-bill", "pre", 1)}, 401, "invalid_signature"},
		{"signed, unknown service", usageSigned{Secret: coreSecret, Body: body("u-bill", "nope", 1)}, 401, "invalid_signature"},
		{"a key, unknown service", usageSigned{Body: body("u-bill", "nope", 1), Header: bearer(key)}, 404, "service_not_found"},
		{"no subscription", usageSigned{Secret: coreSecret2, Body: body("u-bill", "other", 1)}, 403, "no_subscription"},
		{"stale", usageSigned{Secret: coreSecret, Body: body("u-bill", "pre", 1), Timestamp: fmt.Sprint(time.Now().Add(time.Hour).Unix())}, 401, "stale_timestamp"},
		{"no userId", usageSigned{Secret: coreSecret, Body: `{"serviceId":"pre","estimatedUnits":1}`}, 400, "invalid_request"},
		{"no serviceId", usageSigned{Secret: coreSecret, Body: `{"userId":"u-bill","estimatedUnits":1}`}, 400, "invalid_request"},
		{"no units", usageSigned{Secret: coreSecret, Body: `{"userId":"u-bill","serviceId":"pre"}`}, 400, "invalid_request"},
		{"units a string of junk", usageSigned{Secret: coreSecret, Body: body("u-bill", "pre", "1,5")}, 400, "invalid_request"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.s.URL = coreBillingURL
			a := corePost(t, tt.s, "")
			a.expect(t, tt.status, tt.code)
			a.mustUnsigned(t)
		})
	}

	resp, out := call(t, "PUT", coreBillingURL, key, body("u-bill", "pre", 1))
	if resp.StatusCode != 405 || resp.Header.Get("Allow") != "POST" || errorCode(t, resp, out) != "method_not_allowed" {
		t.Errorf("PUT: %d %s", resp.StatusCode, out)
	}
	coreUnchanged(t, "billing estimates", before, coreSnapshot(t, g, "u-bill", "pre"))
}
