package e2e

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	reporterapp "github.com/platformgw/gateway/examples/reporter/app"
	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// The non-proxied example: callers bring their service key to the
// reporter, which validates it, asks for an estimate, does the work and
// reports the words; the gateway's ledger holds them once, and a refused
// estimate means no work and no report.
func TestExampleReporter(t *testing.T) {
	log := &exampleLog{}
	rp := httptest.NewServer(reporterapp.New(reporterapp.Config{
		Client: exampleClient(t, "wordcount", exampleWordcountSecret, log),
	}))
	t.Cleanup(rp.Close)
	g := startGateway(t, t.TempDir(), examplesCatalog("http://127.0.0.1:1", "http://127.0.0.1:1", rp.URL))
	key, keyRec := g.newKey("ex-words")
	g.subscribe("ex-words", "wordcount", "words", "ACTIVE") // 10 words, then blocked
	count := func(t *testing.T, key, text string, hdr ...string) (*http.Response, []byte) {
		t.Helper()
		return call(t, "POST", rp.URL+"/count", key, text, hdr...)
	}
	reports := func() []store.LedgerEntry {
		var out []store.LedgerEntry
		for _, e := range g.ledger("ex-words") {
			if e.Source != store.SourceReport || e.ServiceID != "wordcount" {
				t.Errorf("unexpected ledger entry %+v", e)
			}
			out = append(out, e)
		}
		return out
	}

	resp, body := count(t, key, "The cat, the hat and THE bat.")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("count: %d %s", resp.StatusCode, body)
	}
	var got reporterapp.Count
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("count answer: %s", body)
	}
	if got.Words != 7 || got.Units != billing.Whole(7) || got.UnitLabel != "word" ||
		got.UnitsRemaining == nil || *got.UnitsRemaining != billing.Whole(3) || got.Replayed || got.RequestID == "" ||
		len(got.Top) != 3 || got.Top[0] != (reporterapp.WordCount{Word: "the", Count: 3}) || got.Top[1].Word != "and" {
		t.Fatalf("count answer: %s", body)
	}
	es := reports()
	if len(es) != 1 || es[0].Units != billing.Whole(7) {
		t.Fatalf("ledger after one call: %+v", es)
	}
	recs := log.records(t)
	if len(recs) != 1 {
		t.Fatalf("reconciliation log: %s", log)
	}
	r := recs[0]
	if r["operation"] != "report" || r["status"] != "recorded" || r["keyRef"] != keyRec.ID || r["userId"] != "ex-words" ||
		r["serviceId"] != "wordcount" || r["endpoint"] != "POST /count" || r["unitsReported"] != 7.0 ||
		r["backendRequestId"] != got.RequestID || r["idempotencyKey"] == "" || r["idempotencyKey"] != es[0].IdempotencyKey {
		t.Errorf("reconciliation record: %v", r)
	}
	if strings.Contains(log.String(), key) || strings.Contains(log.String(), exampleWordcountSecret) {
		t.Errorf("the reconciliation log holds the key or the secret: %s", log)
	}

	t.Run("a retry with the same Idempotency-Key is charged once", func(t *testing.T) {
		for i, want := range []bool{false, true} {
			resp, body := count(t, key, "two words", "Idempotency-Key", "retry-1")
			var got reporterapp.Count
			if err := json.Unmarshal(body, &got); resp.StatusCode != http.StatusOK || err != nil || got.Replayed != want {
				t.Fatalf("attempt %d: %d %s", i+1, resp.StatusCode, body)
			}
		}
		if es := reports(); len(es) != 2 || ledgerSum(es) != billing.Whole(9) {
			t.Fatalf("ledger after a retried call: %+v", es)
		}
		// The same key with another text is another request.
		resp, body := count(t, key, "one", "Idempotency-Key", "retry-1")
		if resp.StatusCode != http.StatusOK || strings.Contains(string(body), `"replayed"`) {
			t.Fatalf("same key, other text: %d %s", resp.StatusCode, body)
		}
		if es := reports(); len(es) != 3 || ledgerSum(es) != billing.Whole(10) {
			t.Fatalf("ledger: %+v", es)
		}
	})

	t.Run("a refused estimate: no work, no report", func(t *testing.T) {
		lines := len(log.records(t))
		resp, body := count(t, key, "one word too many")
		if resp.StatusCode != http.StatusTooManyRequests || errorCode(t, resp, body) != "quota_exceeded" {
			t.Fatalf("over quota: %d %s", resp.StatusCode, body)
		}
		if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || ra <= 0 {
			t.Errorf("Retry-After %q", resp.Header.Get("Retry-After"))
		}
		if es := reports(); len(es) != 3 || ledgerSum(es) != billing.Whole(10) {
			t.Errorf("a refused call was reported: %+v", es)
		}
		if n := len(log.records(t)); n != lines {
			t.Errorf("a refused call was logged as reported: %s", log)
		}
	})

	t.Run("keys the platform does not accept", func(t *testing.T) {
		before := len(log.records(t))
		stranger, _ := g.newKey("ex-stranger") // no subscription
		revoked, rec := g.newKey("ex-words")
		if _, err := g.store().RevokeKey(t.Context(), rec.ID, time.Now()); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			key    string
			status int
			code   string
		}{
			{"", http.StatusUnauthorized, "missing_key"},
			{"psk_notakeyatall", http.StatusUnauthorized, "invalid_key"},
			{revoked, http.StatusUnauthorized, "key_revoked"},
			{stranger, http.StatusForbidden, "no_subscription"},
		} {
			resp, body := count(t, c.key, "some words")
			if resp.StatusCode != c.status || errorCode(t, resp, body) != c.code {
				t.Errorf("key %.12s…: %d %s, want %d %s", c.key, resp.StatusCode, body, c.status, c.code)
			}
		}
		if es := reports(); len(es) != 3 {
			t.Errorf("a refused key was reported: %+v", es)
		}
		if n := len(log.records(t)); n != before {
			t.Errorf("a refused key was logged: %s", log)
		}
	})
}
