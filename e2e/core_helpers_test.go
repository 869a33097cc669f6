package e2e

import (
	"context"
	"crypto/hmac"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/e2etest"
	"github.com/platformgw/gateway/internal/servicekey"
	"github.com/platformgw/gateway/internal/store"
)

// Secrets of the core tests' services. pre is mid-rotation: both of its
// secrets authenticate a backend, answers are signed with the first.
const (
	coreSecret    = "core-secret-core-secret-core-001"
	coreOldSecret = "core-old-secret-core-old-secret1"
	coreSecret2   = "core-other-secret-core-other-002"
)

// coreCatalog is the platform block of the core tests: one product of each
// kind of limit, a second service, and a small body limit.
func coreCatalog(backend string) string {
	return fmt.Sprintf(`
		usage_max_body_bytes 2KiB
		service pre {
			backend %s
			secret %s %s
			owners owner-1
			endpoint call {
				path /call
			}
			product basic {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 3
			}
			product overage {
				billing SUBSCRIPTION
				measurement PER_TOKEN
				unit token
				quota 10
				overage allow
				price 0.5
				spending_cap 2
			}
			product prepaid {
				billing PREPAID
				measurement PER_REQUEST
				unit request
				price 2
			}
			product metered {
				billing USAGE_POSTPAID
				measurement PER_TOKEN
				unit token
				price 0.001
				spending_cap 1
			}
		}
		service other {
			backend %s
			secret %s
			endpoint call {
				path /call
			}
			product basic {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 100
			}
		}`, backend, coreSecret, coreOldSecret, backend, coreSecret2)
}

var (
	coreValidateURL = gwBase + "/api/v1/service-keys/validate"
	coreEstimateURL = gwBase + "/api/v1/service-keys/estimate-usage"
	coreBillingURL  = gwBase + "/api/v1/billing/usage/estimate"
)

// coreAnswer is a core route's answer with its signature checked by the
// test's own HMAC code, as a backend SDK would check it.
type coreAnswer struct {
	Status    int
	Header    http.Header
	Body      []byte
	JSON      map[string]any
	Signed    bool // carries a signature header
	SigOK     bool // the signature verifies with the secret given
	Timestamp string
}

// corePost sends a backend's request (signed when s.Secret is set) and
// checks the answer's signature with verifySecret: Base64(HMAC-SHA256(
// secret, body + timestamp header)) over the exact bytes received.
func corePost(t *testing.T, s usageSigned, verifySecret string) coreAnswer {
	t.Helper()
	resp, body := usagePost(t, s)
	a := coreAnswer{Status: resp.StatusCode, Header: resp.Header, Body: body}
	if err := json.Unmarshal(body, &a.JSON); err != nil {
		t.Fatalf("answer is not a JSON object: %d %s", resp.StatusCode, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("content type %q", ct)
	}
	sig := resp.Header.Get("X-Platform-Signature")
	a.Timestamp = resp.Header.Get("X-Platform-Timestamp")
	a.Signed = sig != ""
	if a.Signed && verifySecret != "" {
		want := e2etest.UsageSign(verifySecret, body, a.Timestamp)
		a.SigOK = hmac.Equal([]byte(want), []byte(sig))
		ts, err := strconv.ParseInt(a.Timestamp, 10, 64)
		if err != nil || time.Since(time.Unix(ts, 0)).Abs() > time.Minute {
			t.Errorf("answer timestamp %q", a.Timestamp)
		}
	}
	return a
}

// mustSigned fails unless the answer is signed with the service's newest
// secret.
func (a coreAnswer) mustSigned(t *testing.T) {
	t.Helper()
	if !a.Signed || !a.SigOK {
		t.Errorf("answer not signed with the service secret (signed %v, verifies %v): %s", a.Signed, a.SigOK, a.Body)
	}
}

func (a coreAnswer) mustUnsigned(t *testing.T) {
	t.Helper()
	if a.Signed || a.Header.Get("X-Platform-Timestamp") != "" {
		t.Errorf("answer to an unauthenticated caller is signed: %v", a.Header)
	}
}

// expect checks status and, for an error, its code (and field).
func (a coreAnswer) expect(t *testing.T, status int, code string, field ...string) {
	t.Helper()
	if a.Status != status {
		t.Fatalf("status %d, want %d: %s", a.Status, status, a.Body)
	}
	if code != "" && a.JSON["code"] != code {
		t.Errorf("code %v, want %s: %s", a.JSON["code"], code, a.Body)
	}
	if len(field) > 0 && a.JSON["field"] != field[0] {
		t.Errorf("field %v, want %s: %s", a.JSON["field"], field[0], a.Body)
	}
	if a.Status >= 400 && a.JSON["message"] == "" {
		t.Errorf("refusal without message: %s", a.Body)
	}
}

// coreState is everything an estimate must leave as it was: the ledger
// and the period's counters of every subscription of the user.
type coreState struct {
	Ledger []store.LedgerEntry
	Subs   map[string]store.Subscription
	Usage  map[string]billing.State
}

func coreSnapshot(t *testing.T, g *gateway, user string, services ...string) coreState {
	t.Helper()
	s := coreState{Ledger: g.ledger(user), Subs: map[string]store.Subscription{}, Usage: map[string]billing.State{}}
	for _, svc := range services {
		sub, err := g.store().GetSubscription(context.Background(), user, svc)
		if err != nil {
			continue
		}
		s.Subs[svc] = sub
		if p, ok := usageProduct(g, user, svc); ok {
			st, err := g.store().State(context.Background(), store.Account{UserID: user, ServiceID: svc, Product: p}, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			s.Usage[svc] = st
		}
	}
	return s
}

func coreUnchanged(t *testing.T, what string, before, after coreState) {
	t.Helper()
	if !reflect.DeepEqual(before, after) {
		t.Errorf("%s changed the store:\nbefore %+v\nafter  %+v", what, before, after)
	}
}

// coreBody builds a JSON body from alternating names and values.
func coreBody(t *testing.T, kv ...any) string {
	t.Helper()
	m := map[string]any{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// newExpiredKey stores a key of user that expired a minute ago.
func (g *gateway) newExpiredKey(user string) string {
	g.t.Helper()
	key, hash, err := servicekey.Generate()
	if err != nil {
		g.t.Fatal(err)
	}
	now := time.Now().UTC()
	rec := store.KeyRecord{ID: servicekey.NewID(), Hash: hash, UserID: user, Created: now.Add(-time.Hour), ExpiresAt: now.Add(-time.Minute)}
	if err := g.store().CreateKey(context.Background(), rec); err != nil {
		g.t.Fatal(err)
	}
	return key
}
