package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/servicekey"
)

func TestCoreValidate(t *testing.T) {
	be := newTestBackend(t, coreSecret, "Platform")
	g := startGateway(t, t.TempDir(), coreCatalog(be.URL))
	key, rec := g.newKey("u-val", "roleA", "roleB")
	g.subscribe("u-val", "pre", "basic", "trial")
	ownerKey, ownerRec := g.newKey("owner-1")
	bare, _ := g.newKey("u-nosub")
	lapsed, _ := g.newKey("u-lapsed")
	g.subscribe("u-lapsed", "pre", "basic", "EXPIRED")
	revoked, revokedRec := g.newKey("u-val")
	if _, err := g.store().RevokeKey(context.Background(), revokedRec.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	expired := g.newExpiredKey("u-val")
	unknown, _, err := servicekey.Generate() // well formed, never stored
	if err != nil {
		t.Fatal(err)
	}
	before := coreSnapshot(t, g, "u-val", "pre")

	t.Run("signed by the service", func(t *testing.T) {
		body := coreBody(t, "serviceKey", key, "serviceId", "pre")
		a := corePost(t, usageSigned{URL: coreValidateURL, Secret: coreSecret, Body: body}, coreSecret)
		a.expect(t, 200, "")
		a.mustSigned(t)
		// The upstream fixture's fields in its order, "error": null included.
		want := fmt.Sprintf(`{"valid":true,"serviceKeyId":%q,"userId":"u-val","serviceId":"pre","serviceProductId":"basic",`+
			`"roles":["roleA","roleB"],"subscriptionStatus":"TRIAL","billingModelType":"SUBSCRIPTION",`+
			`"measurementType":"PER_REQUEST","unitLabel":"request","timestamp":%s,"error":null,"validationSchemaVersion":3}`, rec.ID, a.Timestamp)
		if !isUUID(rec.ID) {
			t.Errorf("serviceKeyId %q is not a UUID", rec.ID)
		}
		if string(a.Body) != want {
			t.Errorf("body\n got %s\nwant %s", a.Body, want)
		}
	})

	t.Run("serviceSecret in the body, no serviceId, the previous secret, ECS prefix", func(t *testing.T) {
		body := coreBody(t, "serviceKey", key, "serviceSecret", coreOldSecret)
		a := corePost(t, usageSigned{URL: gwBase + "/core/api/v1/service-keys/validate", Body: body}, coreSecret)
		a.expect(t, 200, "")
		a.mustSigned(t) // with the newest secret, whichever authenticated
		if a.JSON["valid"] != true || a.JSON["serviceId"] != "pre" || a.JSON["userId"] != "u-val" {
			t.Errorf("body %s", a.Body)
		}
	})

	t.Run("serviceSecret with serviceId, and a signature as well", func(t *testing.T) {
		body := coreBody(t, "serviceKey", key, "serviceId", "pre", "serviceSecret", coreSecret)
		a := corePost(t, usageSigned{URL: coreValidateURL, Secret: coreOldSecret, Body: body}, coreSecret)
		a.expect(t, 200, "")
		a.mustSigned(t)
	})

	t.Run("a service owner: no product, ACTIVE, no billing fields", func(t *testing.T) {
		body := coreBody(t, "serviceKey", ownerKey, "serviceId", "pre")
		a := corePost(t, usageSigned{URL: coreValidateURL, Secret: coreSecret, Body: body}, coreSecret)
		a.expect(t, 200, "")
		a.mustSigned(t)
		want := fmt.Sprintf(`{"valid":true,"serviceKeyId":%q,"userId":"owner-1","serviceId":"pre","serviceProductId":"",`+
			`"roles":[],"subscriptionStatus":"ACTIVE","billingModelType":null,`+
			`"measurementType":null,"unitLabel":null,"timestamp":%s,"error":null,"validationSchemaVersion":3}`, ownerRec.ID, a.Timestamp)
		if string(a.Body) != want {
			t.Errorf("body\n got %s\nwant %s", a.Body, want)
		}
	})

	// A key or subscription that does not let the user call: 401, in the
	// validation shape, signed (the caller is the authenticated service).
	// The subscription refusals carry the messages an invoke gets too
	// (package subscription).
	for _, tt := range []struct {
		name, key, code, message string
	}{
		{"revoked key", revoked, "key_revoked", ""},
		{"expired key", expired, "key_expired", ""},
		{"unknown key", unknown, "invalid_key", ""},
		{"malformed key", "not-a-key", "invalid_key", ""},
		{"no subscription", bare, "no_subscription", "no subscription to service pre"},
		{"subscription without access", lapsed, "subscription_inactive", "the subscription is EXPIRED"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			body := coreBody(t, "serviceKey", tt.key, "serviceId", "pre")
			a := corePost(t, usageSigned{URL: coreValidateURL, Secret: coreSecret, Body: body}, coreSecret)
			a.expect(t, 401, tt.code)
			a.mustSigned(t)
			if a.JSON["valid"] != false || a.JSON["error"] != tt.code || a.JSON["validationSchemaVersion"] != 3.0 ||
				a.JSON["requestId"] == "" || a.Header.Get("X-Platform-Request-ID") != a.JSON["requestId"] {
				t.Errorf("body %s", a.Body)
			}
			if tt.message != "" && a.JSON["message"] != tt.message {
				t.Errorf("message %v, want %q", a.JSON["message"], tt.message)
			}
		})
	}

	// The calling service is not authenticated: 401, never signed.
	good := coreBody(t, "serviceKey", key, "serviceId", "pre")
	for _, tt := range []struct {
		name string
		s    usageSigned
		code string
	}{
		{"neither signature nor secret", usageSigned{Body: good}, "invalid_signature"},
		{"serviceSecret that does not match", usageSigned{Body: coreBody(t, "serviceKey", key, "serviceId", "pre", "serviceSecret", "guess")}, "invalid_signature"},
		{"another service's secret in the body", usageSigned{Body: coreBody(t, "serviceKey", key, "serviceId", "pre", "serviceSecret", coreSecret2)}, "invalid_signature"},
		{"serviceSecret naming no service", usageSigned{Body: coreBody(t, "serviceKey", key, "serviceSecret", "guess")}, "invalid_signature"},
		{"a wrong secret beside a good signature", usageSigned{Secret: coreSecret, Body: coreBody(t, "serviceKey", key, "serviceId", "pre", "serviceSecret", "guess")}, "invalid_signature"},
		{"signed by another service", usageSigned{Secret: coreSecret2, Body: good}, "invalid_signature"},
		{"unknown service", usageSigned{Secret: coreSecret, Body: coreBody(t, "serviceKey", key, "serviceId", "nope")}, "invalid_signature"},
		{"stale timestamp", usageSigned{Secret: coreSecret, Body: good, Timestamp: fmt.Sprint(time.Now().Add(-10 * time.Minute).Unix())}, "stale_timestamp"},
		{"body changed after signing", usageSigned{Secret: coreSecret, Body: good, SignBody: ptr(good + " ")}, "invalid_signature"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.s.URL = coreValidateURL
			a := corePost(t, tt.s, coreSecret)
			a.expect(t, 401, tt.code)
			a.mustUnsigned(t)
			if a.JSON["valid"] != false || a.JSON["error"] != tt.code {
				t.Errorf("body %s", a.Body)
			}
		})
	}

	t.Run("bad requests", func(t *testing.T) {
		for _, tt := range []struct {
			name, body, field string
			signed            bool
		}{
			{"not an object", `["x"]`, "body", false},
			{"not JSON", `{"serviceKey":`, "body", false},
			{"serviceId not a string", `{"serviceKey":"k","serviceId":7}`, "serviceId", false},
			{"serviceSecret not a string", `{"serviceKey":"k","serviceSecret":true}`, "serviceSecret", false},
			{"signed without serviceId", coreBody(t, "serviceKey", key), "serviceId", true},
			{"no serviceKey", coreBody(t, "serviceId", "pre"), "serviceKey", true},
			{"serviceKey not a string", `{"serviceId":"pre","serviceKey":["k"]}`, "serviceKey", true},
		} {
			s := usageSigned{URL: coreValidateURL, Body: tt.body}
			if tt.signed {
				s.Secret = coreSecret
			}
			a := corePost(t, s, coreSecret)
			if a.Status != 400 || a.JSON["code"] != "invalid_request" || a.JSON["field"] != tt.field {
				t.Errorf("%s: %d %s", tt.name, a.Status, a.Body)
			}
		}
		a := corePost(t, usageSigned{URL: coreValidateURL, Secret: coreSecret, Body: coreBody(t, "serviceKey", strings.Repeat("k", 3000), "serviceId", "pre")}, coreSecret)
		a.expect(t, 413, "payload_too_large")

		resp, body := call(t, "GET", coreValidateURL, "", "")
		if resp.StatusCode != 405 || resp.Header.Get("Allow") != "POST" || errorCode(t, resp, body) != "method_not_allowed" {
			t.Errorf("GET: %d %v %s", resp.StatusCode, resp.Header, body)
		}
		resp, body = call(t, "POST", gwBase+"/api/v1/service-keys/nope", "", "{}")
		if resp.StatusCode != 404 || errorCode(t, resp, body) != "not_found" {
			t.Errorf("unknown core route: %d %s", resp.StatusCode, body)
		}
	})

	coreUnchanged(t, "validate", before, coreSnapshot(t, g, "u-val", "pre"))
	if n := be.count(); n != 0 {
		t.Errorf("the backend saw %d requests", n)
	}
}

func ptr[T any](v T) *T { return &v }
