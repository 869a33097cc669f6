package usagehandler

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/platformgw/gateway/internal/store"
)

// TestReportRequestIDChecked: a report's optional requestId, when given,
// is a string of printable text of at most 255 bytes, or the report is
// refused, 400 invalid_request naming requestId, and nothing is recorded.
// A number, an object, an id of control characters or of bytes that are
// not text, or one too long, were dropped and the report charged without
// it, so the backend never learnt that the usage it sent could not be
// matched to its call; an id with '/' was dropped too although it is
// plain text. null and "" count as absent.
func TestReportRequestIDChecked(t *testing.T) {
	f := newFlightServer(t)
	f.key("alice")
	ctx := context.Background()
	body := func(id string) string {
		return `{"userId":"alice","serviceId":"svc","unitsUsed":1,"timestamp":1772366400,"requestId":` + id + `}`
	}
	ledger := func() []store.LedgerEntry {
		t.Helper()
		var es []store.LedgerEntry
		if err := f.st.ScanLedger(ctx, store.LedgerFilter{UserID: "alice"}, func(e store.LedgerEntry) error {
			es = append(es, e)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return es
	}
	for _, id := range []string{
		`1`, `12.5`, `{}`, `{"id":"r-1"}`, `["r-1"]`, `true`,
		`"` + strings.Repeat("r", 256) + `"`,
		`"r\n1"`, `"r\t1"`, `"r\u0007"`, `"r\u007f"`, `"r\u0085"`, `"r\u0000"`,
		"\"r\xff\"", `"r\ud800"`, `"r\ufffd"`, `"r\u202e1"`,
	} {
		a := f.post("/api/usage/report", body(id), flightSecret)
		var e struct{ Code, Field string }
		json.Unmarshal([]byte(a.body), &e)
		if a.status != 400 || e.Code != "invalid_request" || e.Field != "requestId" {
			t.Errorf("requestId %s: %d %s, want 400 invalid_request field requestId", id, a.status, a.body)
		}
	}
	if es := ledger(); len(es) != 0 {
		t.Fatalf("the refused reports recorded %d entries: %+v", len(es), es)
	}

	// Valid ids are kept as sent; null and "" are no id.
	long := strings.Repeat("r", 255)
	for _, tc := range []struct{ id, want string }{
		{`"7d0c5b0e-3f1a-4c8e-9a61-2b7f4d9e0c15"`, "7d0c5b0e-3f1a-4c8e-9a61-2b7f4d9e0c15"},
		{`"call/42"`, "call/42"},
		{`" r 1 "`, " r 1 "},
		{`"réf-ü-✓"`, "réf-ü-✓"},
		{`"` + long + `"`, long},
		{`null`, ""},
		{`""`, ""},
	} {
		n := len(ledger())
		a := f.post("/api/usage/report", body(tc.id), flightSecret)
		if a.status != 200 {
			t.Errorf("requestId %s: %d %s, want 200", tc.id, a.status, a.body)
			continue
		}
		es := ledger()
		if len(es) != n+1 || es[n].RequestID != tc.want {
			t.Errorf("requestId %s: ledger %+v, want one more entry with requestId %q", tc.id, es, tc.want)
		}
	}
}
