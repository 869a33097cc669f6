package usagehandler

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// reportBodyOf is a report of units (raw JSON) for user at the server's
// clock.
func (f *flightServer) reportBodyOf(user, units string) string {
	return fmt.Sprintf(`{"userId":%q,"serviceId":"svc","unitsUsed":%s,"timestamp":%d}`, user, units, f.at.Unix())
}

// TestAttackReportUnitsSpellings: a report's unitsUsed at the edges of
// the decimal the contract allows (docs/wire-contract.md, "Usage report":
// a decimal greater than 0, at most 6 decimal places, a number or a
// string holding one) is either counted exactly, to the millionth, or
// refused 400 with nothing recorded: never rounded, wrapped or read as
// another number. Exponent forms, a leading '+' in a string, leading and
// trailing zeros by the thousand are read exactly; negative zero, "1e309",
// more than a trillion, a seventh decimal, escapes and non-ASCII digits
// are refused.
func TestAttackReportUnitsSpellings(t *testing.T) {
	onBothStores(t, func(t *testing.T, f *flightServer) {
		for i, tc := range []struct {
			units string
			want  billing.Units // 0: refused 400 (field unitsUsed, or body when not JSON)
		}{
			{`1`, billing.Whole(1)},
			{`"0.000001"`, 1},
			{`1e-6`, 1},
			{`1.0e-6`, 1},
			{`0.1e1`, billing.Whole(1)},
			{`100e-2`, billing.Whole(1)},
			{`1E+2`, billing.Whole(100)},
			{`"1E+2"`, billing.Whole(100)},
			{`"+5"`, billing.Whole(5)},
			{`".5"`, billing.Scale / 2},
			{`"5."`, billing.Whole(5)},
			{`123456789012.123456`, 123456789012123456},
			{`1000000000000`, billing.MaxUnits},
			{`1e12`, billing.MaxUnits},
			{`"0.1` + strings.Repeat("0", 20000) + `"`, billing.Scale / 10},
			{`"` + strings.Repeat("0", 20000) + `7"`, billing.Whole(7)},
			{`+5`, 0},
			{`-0`, 0},
			{`"-0"`, 0},
			{`-0.0`, 0},
			{`0`, 0},
			{`"0e5"`, 0},
			{`-1`, 0},
			{`1e309`, 0},
			{`"1e309"`, 0},
			{`1e-7`, 0},
			{`1.5e-6`, 0},
			{`0.0000001`, 0},
			{`1000000000000.000001`, 0},
			{`1e13`, 0},
			{`"9223372036854.775807"`, 0},
			{`"18446744073709551617"`, 0},
			{`"` + strings.Repeat("9", 20000) + `"`, 0},
			{`"0.` + strings.Repeat("0", 20000) + `1"`, 0},
			{`"1e99999999999999999999"`, 0},
			{`"\u0035"`, 0},
			{`" 5"`, 0},
			{`"5 "`, 0},
			{`"0x10"`, 0},
			{`"1_000"`, 0},
			{`"Infinity"`, 0},
			{`"NaN"`, 0},
			{`"١"`, 0},
			{`true`, 0},
			{`[1]`, 0},
			{`{"value":1}`, 0},
		} {
			user := fmt.Sprintf("spell-%d", i)
			f.keyFor(user, "basic")
			a := f.send("/api/usage/report", f.reportBodyOf(user, tc.units), flightSecret, "")
			label := tc.units
			if len(label) > 40 {
				label = label[:40] + "…"
			}
			es := f.ledger(user)
			used := f.state(basicAccount(user)).Used
			if tc.want == 0 {
				if a.status != 400 || !strings.Contains(a.body, `"invalid_request"`) || len(es) != 0 || used != 0 {
					t.Errorf("unitsUsed %s: %d %s, %d ledger rows, used %v; want 400 invalid_request, nothing recorded", label, a.status, a.body, len(es), used)
				}
				continue
			}
			if a.status != 200 || len(es) != 1 || es[0].Units != tc.want || used != tc.want {
				t.Errorf("unitsUsed %s: %d %s, ledger %+v, used %v; want 200 and %v counted once", label, a.status, a.body, es, used, tc.want)
			}
		}
	})
}

// TestAttackReportIdempotentAcrossProductChange: a report retried under
// its Idempotency-Key after the user's subscription moved to another
// product (here from a quota to a prepaid balance) is the first answer
// again, byte for byte, and charges neither product; a retry spelling the
// units otherwise ("3", 3.000000, 3e0) or signed afresh with another
// requestId is the same report; a retry for another user or other units
// is refused and records nothing (docs/wire-contract.md, "Usage report").
func TestAttackReportIdempotentAcrossProductChange(t *testing.T) {
	onBothStores(t, func(t *testing.T, f *flightServer) {
		ctx := context.Background()
		f.keyFor("mover", "basic")
		f.keyFor("other", "basic")
		first := f.send("/api/usage/report", f.reportBodyOf("mover", "3"), flightSecret, "", "Idempotency-Key", "k-move")
		if first.status != 200 {
			t.Fatalf("first report: %d %s", first.status, first.body)
		}
		sub, err := f.st.GetSubscription(ctx, "mover", "svc")
		if err != nil {
			t.Fatal(err)
		}
		sub.ProductID, sub.UpdatedAt = "pre", f.at
		if _, err := f.st.PutSubscription(ctx, sub); err != nil {
			t.Fatal(err)
		}
		if _, err := f.st.AddCredits(ctx, "mover", "svc", billing.Whole(100), f.at); err != nil {
			t.Fatal(err)
		}
		pre := store.Account{UserID: "mover", ServiceID: "svc", Product: flightPrepaid}
		before := f.state(pre)
		for i, units := range []string{`3`, `"3"`, `3.000000`, `3e0`} {
			body := strings.Replace(f.reportBodyOf("mover", units), `}`, fmt.Sprintf(`,"requestId":"retry-%d"}`, i), 1)
			a := f.send("/api/usage/report", body, flightSecret, "", "Idempotency-Key", "k-move")
			if a.status != 200 || a.body != first.body || a.header.Get("Idempotent-Replayed") != "true" {
				t.Errorf("retry %s after the product change: %d %s, want the first answer %s replayed", units, a.status, a.body, first.body)
			}
		}
		for _, body := range []string{f.reportBodyOf("mover", "4"), f.reportBodyOf("other", "3")} {
			if a := f.send("/api/usage/report", body, flightSecret, "", "Idempotency-Key", "k-move"); a.status != 400 || !strings.Contains(a.body, `"field":"Idempotency-Key"`) {
				t.Errorf("another report under the key: %d %s, want 400 on Idempotency-Key", a.status, a.body)
			}
		}
		if after := f.state(pre); after != before {
			t.Errorf("prepaid account changed by retries: %+v, was %+v", after, before)
		}
		if used := f.state(basicAccount("mover")).Used; used != billing.Whole(3) {
			t.Errorf("quota account used %v, want 3", used)
		}
		if es := f.ledger("mover"); len(es) != 1 || es[0].ProductID != "basic" || es[0].Units != billing.Whole(3) {
			t.Errorf("ledger %+v, want one row of 3 under basic", es)
		}
		if es := f.ledger("other"); len(es) != 0 {
			t.Errorf("other's ledger %+v, want empty", es)
		}
	})
}

// TestAttackReportIdempotentConcurrent: 24 posts of one Idempotency-Key at
// once, half the same report (2 units) and half another (5 units), count
// exactly one report: every post of the winning report is 200 with one
// body (all but one Idempotent-Replayed), every post of the other is 400
// on Idempotency-Key, and the ledger has one row.
func TestAttackReportIdempotentConcurrent(t *testing.T) {
	onBothStores(t, func(t *testing.T, f *flightServer) {
		f.keyFor("racer", "basic")
		const n = 24
		answers := make([]rawAnswer, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				units := "2"
				if i%2 == 1 {
					units = "5"
				}
				answers[i] = f.send("/api/usage/report", f.reportBodyOf("racer", units), flightSecret, "", "Idempotency-Key", "k-race")
			}()
		}
		wg.Wait()
		es := f.ledger("racer")
		if len(es) != 1 {
			t.Fatalf("ledger %+v, want one row", es)
		}
		won := 0 // the parity of the recorded report
		if es[0].Units == billing.Whole(5) {
			won = 1
		}
		fresh, body := 0, ""
		for i, a := range answers {
			if i%2 != won {
				if a.status != 400 || !strings.Contains(a.body, `"field":"Idempotency-Key"`) {
					t.Errorf("post %d (the other report): %d %s, want 400 on Idempotency-Key", i, a.status, a.body)
				}
				continue
			}
			if a.status != 200 || body != "" && a.body != body {
				t.Errorf("post %d: %d %s, want 200 %s", i, a.status, a.body, body)
			}
			body = a.body
			if a.header.Get("Idempotent-Replayed") == "" {
				fresh++
			}
		}
		if fresh != 1 {
			t.Errorf("%d answers not replayed, want 1", fresh)
		}
		if used := f.state(basicAccount("racer")).Used; used != es[0].Units {
			t.Errorf("used %v, ledger %v", used, es[0].Units)
		}
	})
}

// TestAttackReportSignedForAnotherService: a report naming svc signed with
// another service's secret (and the reverse) is 401 invalid_signature and
// records nothing, as is one whose body or timestamp header was changed
// after signing.
func TestAttackReportSignedForAnotherService(t *testing.T) {
	onBothStores(t, func(t *testing.T, f *flightServer) {
		f.keyFor("victim", "basic")
		body := f.reportBodyOf("victim", "7")
		hidden := strings.Replace(body, `"svc"`, `"hidden"`, 1)
		for name, a := range map[string]rawAnswer{
			"svc signed by hidden": f.send("/api/usage/report", body, flightHiddenSecret, ""),
			"hidden signed by svc": f.send("/api/usage/report", hidden, flightSecret, ""),
		} {
			if a.status != 401 || !strings.Contains(a.body, `"invalid_signature"`) {
				t.Errorf("%s: %d %s, want 401 invalid_signature", name, a.status, a.body)
			}
		}
		if es := f.ledger("victim"); len(es) != 0 {
			t.Errorf("ledger %+v, want empty", es)
		}
	})
}

// TestAttackReportBodyEnvelope: the usage service reads the body as sent,
// whatever its Content-Type (none, text/plain, a form, multipart): the
// signature is over the bytes. A gzip-encoded body is not decoded (not a
// JSON object: 400). A body of exactly usage_max_body_bytes is read; one
// byte more is 413; nothing refused is
// recorded.
func TestAttackReportBodyEnvelope(t *testing.T) {
	onBothStores(t, func(t *testing.T, f *flightServer) {
		f.keyFor("env", "basic")
		body := f.reportBodyOf("env", "1")
		want := billing.Units(0)
		for _, ct := range []string{"", "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/json; charset=utf-16"} {
			var h []string
			if ct != "" {
				h = []string{"Content-Type", ct}
			}
			a := f.send("/api/usage/report", body, flightSecret, "", h...)
			if a.status != 200 {
				t.Errorf("Content-Type %q: %d %s, want 200", ct, a.status, a.body)
			}
			want += billing.Whole(1)
		}
		var gz bytes.Buffer
		zw := gzip.NewWriter(&gz)
		zw.Write([]byte(body))
		zw.Close()
		if a := f.send("/api/usage/report", gz.String(), flightSecret, "", "Content-Encoding", "gzip"); a.status != 400 {
			t.Errorf("gzip body: %d %s, want 400", a.status, a.body)
		}
		const limit = 1 << 16 // the flight server's usage_max_body_bytes
		pad := func(n int) string {
			b := strings.TrimSuffix(body, "}") + `,"pad":"`
			return b + strings.Repeat("x", n-len(b)-2) + `"}`
		}
		if a := f.send("/api/usage/report", pad(limit), flightSecret, ""); a.status != 200 {
			t.Errorf("body of the limit: %d %s", a.status, a.body)
		} else {
			want += billing.Whole(1)
		}
		if a := f.send("/api/usage/report", pad(limit+1), flightSecret, ""); a.status != 413 {
			t.Errorf("body past the limit: %d %s, want 413", a.status, a.body)
		}
		if used := f.state(basicAccount("env")).Used; used != want {
			t.Errorf("used %v, want %v", used, want)
		}
	})
}

// TestAttackReportKeyReusedAfterOverdraw: the check that a retry under an
// Idempotency-Key is the same report reads the first answer back; an
// answer past the hard limits (a prepaid balance overdrawn by the report,
// remainingCredits far below zero, or a report of a trillion units) is
// read too, so another report under its key is still refused (400 on
// Idempotency-Key), never answered with the first report's body and
// left uncounted.
func TestAttackReportKeyReusedAfterOverdraw(t *testing.T) {
	onBothStores(t, func(t *testing.T, f *flightServer) {
		ctx := context.Background()
		f.keyFor("overdrawn", "pre")
		if _, err := f.st.AddCredits(ctx, "overdrawn", "svc", billing.Whole(1), f.at); err != nil {
			t.Fatal(err)
		}
		for i, units := range []string{"5", "1000000000000"} {
			key := fmt.Sprintf("k-over-%d", i)
			first := f.send("/api/usage/report", f.reportBodyOf("overdrawn", units), flightSecret, "", "Idempotency-Key", key)
			if first.status != 200 || !strings.Contains(first.body, `"remainingCredits":-`) {
				t.Fatalf("report of %s: %d %s, want 200 with the balance below zero", units, first.status, first.body)
			}
			if a := f.send("/api/usage/report", f.reportBodyOf("overdrawn", "7"), flightSecret, "", "Idempotency-Key", key); a.status != 400 || !strings.Contains(a.body, `"field":"Idempotency-Key"`) {
				t.Errorf("another report under %s: %d %s, want 400 on Idempotency-Key", key, a.status, a.body)
			}
			if a := f.send("/api/usage/report", f.reportBodyOf("overdrawn", units), flightSecret, "", "Idempotency-Key", key); a.status != 200 || a.body != first.body {
				t.Errorf("the retry under %s: %d %s, want the first answer", key, a.status, a.body)
			}
		}
		if es := f.ledger("overdrawn"); len(es) != 2 {
			t.Errorf("ledger %+v, want the two reports", es)
		}
	})
}

// TestAttackReportsPastInt64: twelve reports of a trillion units each
// (the most one may state) take a period's usage past what int64 holds
// in millionths. The usage saturates rather than wrap below zero, so the
// blocked quota stays used up: no call is admitted, no estimate allowed.
func TestAttackReportsPastInt64(t *testing.T) {
	onBothStores(t, func(t *testing.T, f *flightServer) {
		k := f.keyFor("huge", "basic")
		for i := range 12 {
			if a := f.send("/api/usage/report", f.reportBodyOf("huge", "1000000000000"), flightSecret, ""); a.status != 200 {
				t.Fatalf("report %d: %d %s", i, a.status, a.body)
			}
		}
		st := f.state(basicAccount("huge"))
		if st.Used < billing.Whole(10) {
			t.Fatalf("usage wrapped: %+v", st)
		}
		res, err := f.st.Reserve(context.Background(), basicAccount("huge"), billing.Whole(1), f.at)
		if err != nil || res.Decision.Allowed {
			t.Errorf("a call after the usage saturated: %+v %v, want refused", res.Decision, err)
		}
		if a := f.send("/api/v1/service-keys/estimate-usage", `{"serviceKey":"`+k+`","serviceId":"svc","estimatedUnits":1}`, flightSecret, ""); a.status != 429 {
			t.Errorf("estimate after the usage saturated: %d %s, want 429", a.status, a.body)
		}
	})
}

// TestAttackReportAcrossPeriodEnd: a report arriving after the billing
// period ended counts in the period it arrives in, whatever its body's
// timestamp (docs/wire-contract.md, "Usage report"), and the period that
// ended keeps what it had; the retry of a report recorded in the old
// period, under its Idempotency-Key, is replayed in the new one and
// counted in neither again.
func TestAttackReportAcrossPeriodEnd(t *testing.T) {
	onBothStores(t, func(t *testing.T, f *flightServer) {
		f.keyFor("late", "basic")
		old := f.at
		oldReport := f.reportBodyOf("late", "4")
		first := f.send("/api/usage/report", oldReport, flightSecret, "", "Idempotency-Key", "k-period")
		if first.status != 200 {
			t.Fatalf("report: %d %s", first.status, first.body)
		}
		// The next monthly period; the late report has the old body
		// timestamp, signed now.
		f.at = old.AddDate(0, 1, 2)
		late := f.send("/api/usage/report", oldReport, flightSecret, "")
		if late.status != 200 {
			t.Fatalf("late report: %d %s", late.status, late.body)
		}
		again := f.send("/api/usage/report", oldReport, flightSecret, "", "Idempotency-Key", "k-period")
		if again.status != 200 || again.body != first.body {
			t.Errorf("retry in the next period: %d %s, want the first answer %s", again.status, again.body, first.body)
		}
		if used := f.state(basicAccount("late")).Used; used != billing.Whole(4) {
			t.Errorf("the new period used %v, want the late report's 4", used)
		}
		now := f.at
		f.at = old
		if used := f.state(basicAccount("late")).Used; used != billing.Whole(4) {
			t.Errorf("the old period used %v, want its 4", used)
		}
		f.at = now
		if es := f.ledger("late"); len(es) != 2 || !es[1].OccurredAt.Equal(old) {
			t.Errorf("ledger %+v, want two rows, the late one occurred at %v", es, old)
		}
	})
}
