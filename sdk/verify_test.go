package sdk_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/sdk"
)

// hmacBase64 is the signature written out by hand, independent of the
// signing package the SDK uses.
func hmacBase64(secret, message string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(message))
	return base64.StdEncoding.EncodeToString(m.Sum(nil))
}

const (
	secret    = "whsec-test-secret"
	newSecret = "whsec-next-secret"
	nowUnix   = 1767225600 // 2026-01-01T00:00:00Z
)

var now = time.Unix(nowUnix, 0)

func fixedClock() time.Time { return now }

// caller is the context the gateway puts in headers; ctx is the context
// string of docs/wire-contract.md it must produce, written out literally.
type caller struct {
	userID, productID, roles, status, billing, measurement, unit string
	ctx                                                          string
}

var goldenCallers = []struct {
	name string
	c    caller
}{
	{"subscriber with roles and billing", caller{
		"sub-ext-id", "prod-uuid-1", "roleA,roleB", "ACTIVE", "SUBSCRIPTION", "PER_REQUEST", "request",
		"3sub-ext-idprod-uuid-1roleA,roleBACTIVESUBSCRIPTIONPER_REQUESTrequest"}},
	{"no roles, no billing fields", caller{
		"user-1", "prod-1", "", "TRIAL", "", "", "",
		"3user-1prod-1TRIAL"}},
	{"service owner", caller{
		"owner-id", "", "", "ACTIVE", "", "", "",
		"3owner-idACTIVE"}},
}

// signedRequest builds a forward as the gateway sends it: headers for c,
// signed over payload + ts + c.ctx with key.
func signedRequest(brand, key, body, payload, ts string, c caller) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "http://backend.test/work", strings.NewReader(body))
	x := "X-" + brand + "-"
	set := func(name, v string) {
		if v != "" {
			r.Header.Set(x+name, v)
		}
	}
	set("Signature", hmacBase64(key, payload+ts+c.ctx))
	set("Timestamp", ts)
	set("Signing-Version", "3")
	r.Header.Set(x+"User-ID", c.userID)
	r.Header.Set(x+"Service-Product-ID", c.productID)
	r.Header.Set(x+"Subscription-Status", c.status)
	set("Roles", c.roles)
	set("Billing-Model", c.billing)
	set("Measurement-Type", c.measurement)
	set("Unit-Label", c.unit)
	set("Request-ID", "gw-req-1")
	return r
}

func newVerifier(secrets ...string) *sdk.Verifier {
	v := sdk.NewVerifier(secrets...)
	v.Clock = fixedClock
	return v
}

func TestVerifyGoldenContexts(t *testing.T) {
	ts := strconv.Itoa(nowUnix)
	for _, tt := range goldenCallers {
		t.Run(tt.name, func(t *testing.T) {
			body := `{"q":"hello"}`
			r := signedRequest("Platform", secret, body, body, ts, tt.c)
			cc, got, err := newVerifier(secret).VerifyRequest(r)
			if err != nil {
				t.Fatalf("VerifyRequest: %v", err)
			}
			if string(got) != body {
				t.Errorf("body = %q, want %q", got, body)
			}
			if cc.UserID != tt.c.userID || cc.ServiceProductID != tt.c.productID ||
				cc.SubscriptionStatus != tt.c.status || cc.BillingModel != tt.c.billing ||
				cc.MeasurementType != tt.c.measurement || cc.UnitLabel != tt.c.unit {
				t.Errorf("context = %+v, want %+v", cc, tt.c)
			}
			if strings.Join(cc.Roles, ",") != tt.c.roles {
				t.Errorf("roles = %q, want %q", cc.Roles, tt.c.roles)
			}
			if cc.IsSubscriber() != (tt.c.productID != "") {
				t.Errorf("IsSubscriber = %v for product %q", cc.IsSubscriber(), tt.c.productID)
			}
			if cc.RequestID != "gw-req-1" || cc.Job != nil || !cc.Timestamp.Equal(now) || !cc.HasAccess() {
				t.Errorf("request id %q, job %v, timestamp %v, access %v", cc.RequestID, cc.Job, cc.Timestamp, cc.HasAccess())
			}
		})
	}
}

func TestVerifyRefusals(t *testing.T) {
	c := goldenCallers[0].c
	ts := strconv.Itoa(nowUnix)
	body := `{"q":"hello"}`
	tests := []struct {
		name    string
		v       *sdk.Verifier
		req     func() *http.Request
		wantErr error
	}{
		{"wrong secret", newVerifier(secret), func() *http.Request {
			return signedRequest("Platform", "some-other-secret", body, body, ts, c)
		}, sdk.ErrInvalidSignature},
		{"tampered body", newVerifier(secret), func() *http.Request {
			return signedRequest("Platform", secret, `{"q":"hellO"}`, body, ts, c)
		}, sdk.ErrInvalidSignature},
		{"tampered user header", newVerifier(secret), func() *http.Request {
			r := signedRequest("Platform", secret, body, body, ts, c)
			r.Header.Set("X-Platform-User-ID", "someone-else")
			return r
		}, sdk.ErrInvalidSignature},
		{"upgraded subscription status", newVerifier(secret), func() *http.Request {
			cc := goldenCallers[1].c
			r := signedRequest("Platform", secret, body, body, ts, cc)
			r.Header.Set("X-Platform-Subscription-Status", "ACTIVE")
			return r
		}, sdk.ErrInvalidSignature},
		{"dropped role", newVerifier(secret), func() *http.Request {
			r := signedRequest("Platform", secret, body, body, ts, c)
			r.Header.Set("X-Platform-Roles", "roleA")
			return r
		}, sdk.ErrInvalidSignature},
		{"duplicated user header", newVerifier(secret), func() *http.Request {
			r := signedRequest("Platform", secret, body, body, ts, c)
			r.Header.Add("X-Platform-User-ID", "admin")
			return r
		}, sdk.ErrInvalidSignature},
		{"stale timestamp", newVerifier(secret), func() *http.Request {
			old := strconv.Itoa(nowUnix - 301)
			return signedRequest("Platform", secret, body, body, old, c)
		}, sdk.ErrStaleTimestamp},
		{"future timestamp", newVerifier(secret), func() *http.Request {
			future := strconv.Itoa(nowUnix + 301)
			return signedRequest("Platform", secret, body, body, future, c)
		}, sdk.ErrStaleTimestamp},
		{"timestamp not a number", newVerifier(secret), func() *http.Request {
			return signedRequest("Platform", secret, body, body, "2026-01-01T00:00:00Z", c)
		}, sdk.ErrStaleTimestamp},
		{"missing signature", newVerifier(secret), func() *http.Request {
			r := signedRequest("Platform", secret, body, body, ts, c)
			r.Header.Del("X-Platform-Signature")
			return r
		}, sdk.ErrMissingSignature},
		{"missing timestamp", newVerifier(secret), func() *http.Request {
			r := signedRequest("Platform", secret, body, body, ts, c)
			r.Header.Del("X-Platform-Timestamp")
			return r
		}, sdk.ErrMissingSignature},
		{"no headers at all", newVerifier(secret), func() *http.Request {
			return httptest.NewRequest(http.MethodPost, "/work", strings.NewReader(body))
		}, sdk.ErrMissingSignature},
		{"signing version 2", newVerifier(secret), func() *http.Request {
			r := signedRequest("Platform", secret, body, body, ts, c)
			r.Header.Set("X-Platform-Signing-Version", "2")
			return r
		}, sdk.ErrSigningVersion},
		{"other brand's headers", newVerifier(secret), func() *http.Request {
			return signedRequest("Tollara", secret, body, body, ts, c)
		}, sdk.ErrMissingSignature},
		{"no secrets configured", newVerifier(), func() *http.Request {
			return signedRequest("Platform", "", body, body, ts, c)
		}, sdk.ErrInvalidSignature},
		{"body over the limit", func() *sdk.Verifier { v := newVerifier(secret); v.MaxBodyBytes = 4; return v }(), func() *http.Request {
			return signedRequest("Platform", secret, body, body, ts, c)
		}, sdk.ErrBodyTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cc, _, err := tt.v.VerifyRequest(tt.req())
			if !errors.Is(err, tt.wantErr) || !errors.Is(err, sdk.ErrUnverified) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if cc != nil {
				t.Errorf("a refused request yielded a context: %+v", cc)
			}
		})
	}
}

func TestVerifyAccepts(t *testing.T) {
	c := goldenCallers[0].c
	ts := strconv.Itoa(nowUnix)
	body := `{"q":"hello"}`
	tests := []struct {
		name string
		v    *sdk.Verifier
		req  *http.Request
	}{
		{"rotation: signed with the new secret", newVerifier(secret, newSecret),
			signedRequest("Platform", newSecret, body, body, ts, c)},
		{"rotation: signed with the old secret", newVerifier(newSecret, secret),
			signedRequest("Platform", secret, body, body, ts, c)},
		{"timestamp at the edge of the window", newVerifier(secret),
			signedRequest("Platform", secret, body, body, strconv.Itoa(nowUnix-300), c)},
		{"timestamp in milliseconds", newVerifier(secret),
			signedRequest("Platform", secret, body, body, strconv.Itoa(nowUnix*1000+250), c)},
		{"empty body", newVerifier(secret),
			signedRequest("Platform", secret, "", "", ts, c)},
		{"no signing version header", func() *sdk.Verifier { return newVerifier(secret) }(), func() *http.Request {
			r := signedRequest("Platform", secret, body, body, ts, c)
			r.Header.Del("X-Platform-Signing-Version")
			return r
		}()},
		{"Tollara brand", func() *sdk.Verifier { v := newVerifier(secret); v.Brand = "Tollara"; return v }(),
			signedRequest("Tollara", secret, body, body, ts, c)},
		{"lower-case header names on the wire", newVerifier(secret), func() *http.Request {
			r := signedRequest("Platform", secret, body, body, ts, c)
			lower := http.Header{}
			for k, v := range r.Header {
				lower[strings.ToLower(k)] = v
			}
			// What net/http does to names it reads off the wire.
			r.Header = http.Header{}
			for k, v := range lower {
				r.Header[http.CanonicalHeaderKey(k)] = v
			}
			return r
		}()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cc, _, err := tt.v.VerifyRequest(tt.req)
			if err != nil {
				t.Fatalf("VerifyRequest: %v", err)
			}
			if cc.UserID != c.userID {
				t.Errorf("user = %q", cc.UserID)
			}
		})
	}
}

// The async payload with every character whose escaping differs between
// JSON encoders: <, &, quotes, a newline, é and U+2028.
const (
	asyncPayload = "<b>&\"q\"\né\u2028"
	asyncID      = "7f0c2a4e-1b9d-4c3e-8f6a-2d5b9e1c0a77"
	// The canonical form written out by hand: JSON.stringify escapes the
	// quotes and the newline and nothing else.
	asyncCanonical = `{"payload":"<b>&\"q\"\né` + "\u2028" + `","request_id":"7f0c2a4e-1b9d-4c3e-8f6a-2d5b9e1c0a77"}`
)

// asyncEnvelope is the body the gateway forwards, written by hand, with
// the signature and timestamp in the two URLs as the gateway puts them.
func asyncEnvelope(sig, ts string) string {
	q := "?" + url.Values{"signature": {sig}, "timestamp": {ts}}.Encode()
	base := "http://gw.test/api/usage/"
	return `{"request_id":"` + asyncID + `","payload":"<b>&\"q\"\né` + "\u2028" +
		`","progress_url":"` + base + "progress/" + asyncID + q +
		`","callback_url":"` + base + "complete/" + asyncID + q + `"}`
}

func TestVerifyAsyncEnvelope(t *testing.T) {
	c := goldenCallers[0].c
	ts := strconv.Itoa(nowUnix)
	sig := hmacBase64(secret, asyncCanonical+ts+c.ctx)
	body := asyncEnvelope(sig, ts)

	// The same envelope as encoding/json writes it (\u003c, \u0026,
	// \u2028): a backend must rebuild the canonical form from the parsed
	// strings, not from the bytes.
	var parsed map[string]string
	if err := json.Unmarshal([]byte(body), &parsed); err != nil {
		t.Fatal(err)
	}
	reencoded, _ := json.Marshal(parsed)
	if !strings.Contains(string(reencoded), `\u003c`) || !strings.Contains(string(reencoded), `\u2028`) {
		t.Fatalf("re-encoding should escape differently: %s", reencoded)
	}

	for name, b := range map[string]string{"as the gateway writes it": body, "as encoding/json writes it": string(reencoded)} {
		t.Run(name, func(t *testing.T) {
			r := signedRequest("Platform", secret, b, asyncCanonical, ts, c)
			r.Header.Set("X-Platform-Signature", sig)
			cc, got, err := newVerifier(secret).VerifyRequest(r)
			if err != nil {
				t.Fatalf("VerifyRequest: %v", err)
			}
			if string(got) != b {
				t.Errorf("body changed")
			}
			j := cc.Job
			if j == nil {
				t.Fatal("no job for an async envelope")
			}
			if j.RequestID != asyncID || j.Payload != asyncPayload || cc.RequestID != asyncID {
				t.Errorf("job = %+v, request id %q", j, cc.RequestID)
			}
			if !strings.HasPrefix(j.ProgressURL, "http://gw.test/api/usage/progress/"+asyncID+"?") ||
				!strings.HasPrefix(j.CallbackURL, "http://gw.test/api/usage/complete/"+asyncID+"?") {
				t.Errorf("urls = %q, %q", j.ProgressURL, j.CallbackURL)
			}
		})
	}

	t.Run("tampered payload", func(t *testing.T) {
		tampered := strings.Replace(body, `<b>`, `<i>`, 1)
		r := signedRequest("Platform", secret, tampered, asyncCanonical, ts, c)
		if _, _, err := newVerifier(secret).VerifyRequest(r); !errors.Is(err, sdk.ErrInvalidSignature) {
			t.Fatalf("err = %v, want invalid signature", err)
		}
	})
	t.Run("tampered request id", func(t *testing.T) {
		tampered := strings.Replace(body, `"request_id":"7f0c`, `"request_id":"8f0c`, 1)
		r := signedRequest("Platform", secret, tampered, asyncCanonical, ts, c)
		if _, _, err := newVerifier(secret).VerifyRequest(r); !errors.Is(err, sdk.ErrInvalidSignature) {
			t.Fatalf("err = %v, want invalid signature", err)
		}
	})
	t.Run("request_id in another case is not the key", func(t *testing.T) {
		other := strings.Replace(body, `"request_id"`, `"REQUEST_ID"`, 1)
		r := signedRequest("Platform", secret, other, asyncCanonical, ts, c)
		if _, _, err := newVerifier(secret).VerifyRequest(r); !errors.Is(err, sdk.ErrInvalidSignature) {
			t.Fatalf("err = %v, want invalid signature", err)
		}
	})
}

// A caller who sends, synchronously, a body that is itself a canonical
// async form gets it signed as a sync body; it must stay a sync call, or a
// backend could be made to complete someone else's job.
func TestVerifySyncBodyShapedLikeAJob(t *testing.T) {
	c := goldenCallers[0].c
	ts := strconv.Itoa(nowUnix)
	body := `{"payload":"x","request_id":"victim-job"}`
	r := signedRequest("Platform", secret, body, body, ts, c)
	cc, _, err := newVerifier(secret).VerifyRequest(r)
	if err != nil {
		t.Fatalf("VerifyRequest: %v", err)
	}
	if cc.Job != nil || cc.RequestID != "gw-req-1" {
		t.Fatalf("a sync body became job %+v (request id %q)", cc.Job, cc.RequestID)
	}
}

func TestMiddleware(t *testing.T) {
	c := goldenCallers[0].c
	ts := strconv.Itoa(nowUnix)
	var seen *sdk.CallerContext
	var seenBody string
	h := newVerifier(secret).Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cc, ok := sdk.FromContext(r.Context())
		if !ok {
			t.Error("no caller context in a verified request")
		}
		seen = cc
		b, _ := io.ReadAll(r.Body)
		seenBody = string(b)
		w.WriteHeader(http.StatusNoContent)
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()

	send := func(r *http.Request) *http.Response {
		t.Helper()
		u, _ := url.Parse(srv.URL + "/work")
		r.URL, r.RequestURI, r.Host = u, "", u.Host
		resp, err := srv.Client().Do(r)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}

	t.Run("verified sync call reaches the handler", func(t *testing.T) {
		seen, seenBody = nil, ""
		body := `{"q":"hello"}`
		resp := send(signedRequest("Platform", secret, body, body, ts, c))
		if resp.StatusCode != http.StatusNoContent || seen == nil || seen.UserID != c.userID || seenBody != body {
			t.Fatalf("status %d, context %+v, body %q", resp.StatusCode, seen, seenBody)
		}
	})
	t.Run("verified async call carries its job", func(t *testing.T) {
		seen, seenBody = nil, ""
		sig := hmacBase64(secret, asyncCanonical+ts+c.ctx)
		body := asyncEnvelope(sig, ts)
		r := signedRequest("Platform", secret, body, asyncCanonical, ts, c)
		resp := send(r)
		if resp.StatusCode != http.StatusNoContent || seen == nil || seen.Job == nil ||
			seen.Job.Payload != asyncPayload || seenBody != body {
			t.Fatalf("status %d, context %+v", resp.StatusCode, seen)
		}
	})
	for _, tt := range []struct {
		name, code string
		req        *http.Request
	}{
		{"bad signature is 401 invalid_signature", "invalid_signature",
			signedRequest("Platform", "wrong", `{}`, `{}`, ts, c)},
		{"stale timestamp is 401 stale_timestamp", "stale_timestamp",
			signedRequest("Platform", secret, `{}`, `{}`, strconv.Itoa(nowUnix-3600), c)},
		{"unsigned is 401 invalid_signature", "invalid_signature",
			httptest.NewRequest(http.MethodGet, "/work", nil)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			seen = nil
			resp := send(tt.req)
			var e struct{ Code, Message string }
			err := json.NewDecoder(resp.Body).Decode(&e)
			if resp.StatusCode != http.StatusUnauthorized || err != nil || e.Code != tt.code || e.Message == "" ||
				resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("status %d, body %+v (%v), content type %q", resp.StatusCode, e, err, resp.Header.Get("Content-Type"))
			}
			if seen != nil {
				t.Error("the handler ran for a refused request")
			}
		})
	}
}

func TestGrantAccess(t *testing.T) {
	for status, want := range map[string]bool{
		"ACTIVE": true, "TRIAL": true, "CANCELLING": true, "CANCELLING_PENDING": true, "active": true,
		"EXPIRED": false, "CANCELLED": false, "SUSPENDED": false, "": false, "PENDING": false,
	} {
		if got := sdk.GrantAccess(status); got != want {
			t.Errorf("GrantAccess(%q) = %v, want %v", status, got, want)
		}
	}
}

func TestSetUnits(t *testing.T) {
	h := http.Header{}
	u, err := sdk.ParseUnits("12.5")
	if err != nil {
		t.Fatal(err)
	}
	sdk.SetUnits(h, "", u)
	sdk.SetUnits(h, "Tollara", sdk.WholeUnits(3))
	if h.Get("X-Platform-Units") != "12.5" || h.Get("X-Tollara-Units") != "3" {
		t.Errorf("headers = %v", h)
	}
}
