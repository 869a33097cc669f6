package e2e

import (
	"context"
	"crypto/hmac"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/e2etest"
	"github.com/platformgw/gateway/internal/store"
)

// Secrets of the usage tests' services. svc is mid-rotation: it verifies
// both of its secrets.
const (
	usageSecret    = "usage-secret-usage-secret-000001"
	usageOldSecret = "usage-old-secret-usage-old-00001"
	usageSecret2   = "other-secret-other-secret-000002"
)

// usageCatalog is the platform block of the usage tests: an async service
// with a tiny result cap and body limit so the caps are easy to reach, a
// second service for cross-service checks and one whose backend is down.
func usageCatalog(backend, otherBackend string) string {
	return fmt.Sprintf(`
		result_max_bytes 64
		usage_max_body_bytes 4KiB
		job_ttl 1h
		service svc {
			backend %s
			secret %s %s
			owners owner-1
			endpoint job {
				async
				path /job
			}
			endpoint refuse {
				async
				path /refuse
			}
			endpoint plain {
				path /job
			}
			product basic {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 100
			}
			product tiny {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 2
			}
			product tokens {
				billing USAGE_POSTPAID
				measurement PER_TOKEN
				unit token
				price 0.001
			}
		}
		service other {
			backend %s
			secret %s
			endpoint job {
				async
				path /job
			}
			product basic {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 100
			}
		}
		service gone {
			backend http://127.0.0.1:1
			secret %s
			endpoint job {
				async
			}
			product basic {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
			}
		}`, backend, usageSecret, usageOldSecret, otherBackend, usageSecret2, usageSecret2)
}

// usageEnvelope is what an async backend receives, with what it checked.
type usageEnvelope struct {
	Raw         []byte
	Header      http.Header
	Path        string
	RequestID   string `json:"request_id"`
	Payload     string `json:"payload"`
	ProgressURL string `json:"progress_url"`
	CallbackURL string `json:"callback_url"`
	SigOK       bool
}

// usageBackend is an async service backend written as a backend developer
// would write one: it parses the envelope, rebuilds the signed canonical
// string with its own JSON.stringify-style escaping and checks the v3
// signature with its own HMAC code. /refuse answers 500.
type usageBackend struct {
	*httptest.Server
	secret string
	jobs   chan usageEnvelope
}

func newUsageBackend(t *testing.T, secret string) *usageBackend {
	b := &usageBackend{secret: secret, jobs: make(chan usageEnvelope, 100)}
	b.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		env := usageEnvelope{Raw: raw, Header: r.Header.Clone(), Path: r.URL.Path}
		if err := json.Unmarshal(raw, &env); err != nil {
			http.Error(w, "not an envelope", http.StatusBadRequest)
			return
		}
		canonical := usageCanonical(env.Payload, env.RequestID)
		want := v3Signature(b.secret, canonical, r.Header.Get("X-Platform-Timestamp"), usageContext(r.Header))
		env.SigOK = r.Header.Get("X-Platform-Signing-Version") == "3" &&
			hmac.Equal([]byte(want), []byte(r.Header.Get("X-Platform-Signature")))
		b.jobs <- env
		if strings.HasSuffix(r.URL.Path, "/refuse") {
			http.Error(w, "cannot take jobs now", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, `{"accepted":true}`)
	}))
	t.Cleanup(b.Close)
	return b
}

// next returns the envelope of the job the backend received last.
func (b *usageBackend) next(t *testing.T) usageEnvelope {
	t.Helper()
	select {
	case env := <-b.jobs:
		return env
	case <-time.After(5 * time.Second):
		t.Fatal("backend received no job")
		return usageEnvelope{}
	}
}

func usageContext(h http.Header) string {
	g := func(n string) string { return h.Get("X-Platform-" + n) }
	return "3" + g("User-ID") + g("Service-Product-ID") + g("Roles") + g("Subscription-Status") +
		g("Billing-Model") + g("Measurement-Type") + g("Unit-Label")
}

// usageCanonical is {"payload":…,"request_id":…} as JavaScript's
// JSON.stringify writes it, written from ECMA-262 QuoteJSONString.
func usageCanonical(payload, id string) []byte {
	return []byte(`{"payload":` + usageJSString(payload) + `,"request_id":` + usageJSString(id) + `}`)
}

func usageJSString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// usageSigned is a backend's request to the usage service.
type usageSigned struct {
	URL       string
	Body      string
	Secret    string // "" sends no signature headers
	Timestamp string // "" means now
	SignBody  *string
	Header    []string
}

func usagePost(t *testing.T, s usageSigned) (*http.Response, []byte) {
	t.Helper()
	ts := s.Timestamp
	if ts == "" {
		ts = fmt.Sprint(time.Now().Unix())
	}
	var hdr []string
	if s.Secret != "" {
		signed := s.Body
		if s.SignBody != nil {
			signed = *s.SignBody
		}
		hdr = append(hdr, "X-Platform-Signature", e2etest.UsageSign(s.Secret, []byte(signed), ts), "X-Platform-Timestamp", ts)
	}
	hdr = append(hdr, "Content-Type", "application/json")
	hdr = append(hdr, s.Header...)
	return call(t, "POST", s.URL, "", s.Body, hdr...)
}

// usageURLTimestamp is the timestamp an SDK takes from a callback URL.
func usageURLTimestamp(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	ts := u.Query().Get("timestamp")
	if ts == "" || u.Query().Get("signature") == "" {
		t.Fatalf("callback URL without signature and timestamp: %s", raw)
	}
	return ts
}

// usageJSON decodes a JSON object body.
func usageJSON(t *testing.T, body []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("not a JSON object: %s", body)
	}
	return m
}

// usageAccepted is the caller's 202.
type usageAccepted struct {
	Status      string `json:"status"`
	RequestID   string `json:"requestId"`
	ProgressURL string `json:"progressUrl"`
	CallbackURL string `json:"callbackUrl"`
}

// usageStart invokes an async endpoint and returns the 202 and the
// envelope the backend got.
func usageStart(t *testing.T, be *usageBackend, url, key, body string) (usageAccepted, usageEnvelope) {
	t.Helper()
	resp, raw := call(t, "POST", url, key, body, "Content-Type", "application/json")
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("async invoke: %d %s", resp.StatusCode, raw)
	}
	var acc usageAccepted
	if err := json.Unmarshal(raw, &acc); err != nil {
		t.Fatal(err)
	}
	if loc := resp.Header.Get("Location"); loc == "" || loc != acc.ProgressURL {
		t.Errorf("Location %q, progressUrl %q", loc, acc.ProgressURL)
	}
	return acc, be.next(t)
}

// usageState is everything a rejected request must leave as it was.
type usageState struct {
	Job    store.Job
	Ledger []store.LedgerEntry
	Usage  billing.State
}

func usageSnapshot(t *testing.T, g *gateway, jobID, user, service string) usageState {
	t.Helper()
	var s usageState
	if jobID != "" {
		j, err := g.store().GetJob(context.Background(), jobID)
		if err != nil {
			t.Fatal(err)
		}
		s.Job = j
	}
	s.Ledger = g.ledger(user)
	if p, ok := usageProduct(g, user, service); ok {
		st, err := g.store().State(context.Background(), store.Account{UserID: user, ServiceID: service, Product: p}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		s.Usage = st
	}
	return s
}

func usageProduct(g *gateway, user, service string) (billing.Product, bool) {
	sub, err := g.store().GetSubscription(context.Background(), user, service)
	if err != nil {
		return billing.Product{}, false
	}
	svc, _ := g.app().Catalog().Service(service)
	p, ok := svc.Product(sub.ProductID)
	if !ok {
		return billing.Product{}, false
	}
	return *p, true
}

// usageUnchanged fails when a rejected request changed anything.
func usageUnchanged(t *testing.T, what string, before, after usageState) {
	t.Helper()
	if !reflect.DeepEqual(before, after) {
		t.Errorf("%s changed state:\nbefore %+v\nafter  %+v", what, before, after)
	}
}

// usageBig is a body over the tests' 4 KiB usage limit.
var usageBig = `{"stage":"` + strings.Repeat("x", 5000) + `","percentageComplete":1,"timestamp":1}`
