package usagehandler

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
	"github.com/platformgw/gateway/internal/store/pgstore"
)

// completionOf is a completion body: the fields given (raw JSON pairs
// "name":value) and the server's timestamp.
func (f *flightServer) completionOf(fields string) string {
	if fields != "" {
		fields += ","
	}
	return fmt.Sprintf(`{%s"timestamp":%d}`, fields, f.at.Unix())
}

// job is the stored job id.
func (f *flightServer) job(id string) store.Job {
	f.t.Helper()
	j, err := f.st.GetJob(context.Background(), id)
	if err != nil {
		f.t.Fatal(err)
	}
	return j
}

// TestAttackJobCompletedOnce: a job completes once. The same completion
// spelled otherwise (units "2", 2.0, 2e0; status absent, "completed",
// "done") is 200 and charges nothing more; a completion with other units,
// or FAILED, is 409 and changes nothing; progress after it is 409 and
// leaves the job as it was.
func TestAttackJobCompletedOnce(t *testing.T) {
	onBothStores(t, func(t *testing.T, f *flightServer) {
		f.keyFor("once", "basic")
		f.openJob("job-once", "once", billing.Whole(1))
		path := "/api/usage/complete/job-once"
		if a := f.send(path, f.completionOf(`"status":"COMPLETED","units":2,"result":"r"`), flightSecret, ""); a.status != 200 {
			t.Fatalf("completion: %d %s", a.status, a.body)
		}
		for _, same := range []string{`"units":"2","result":"r"`, `"status":"completed","units":2.0,"result":"r"`, `"status":"done","units":2e0,"result":"r","extra":1`} {
			if a := f.send(path, f.completionOf(same), flightSecret, ""); a.status != 200 {
				t.Errorf("the same completion (%s): %d %s, want 200", same, a.status, a.body)
			}
		}
		for _, other := range []string{`"units":3,"result":"r"`, `"units":2`, `"status":"FAILED","units":2,"result":"r"`, `"units":0,"result":"r"`} {
			if a := f.send(path, f.completionOf(other), flightSecret, ""); a.status != 409 || !strings.Contains(a.body, "request_already_completed") {
				t.Errorf("another completion (%s): %d %s, want 409", other, a.status, a.body)
			}
		}
		if a := f.send("/api/usage/progress/job-once", f.completionOf(`"stage":"late","percentageComplete":10`), flightSecret, ""); a.status != 409 {
			t.Errorf("progress after completion: %d %s, want 409", a.status, a.body)
		}
		j := f.job("job-once")
		st := f.state(basicAccount("once"))
		es := f.ledger("once")
		if j.Status != store.JobCompleted || j.Units != billing.Whole(2) || j.Stage != "" || j.PercentageComplete != 100 ||
			st.Used != billing.Whole(2) || st.Reserved != 0 || len(es) != 1 || es[0].Units != billing.Whole(2) {
			t.Errorf("after the completion and its repeats: job %s %v stage %q %v%%, state %+v, ledger %+v; want COMPLETED, 2 used once, nothing held",
				j.Status, j.Units, j.Stage, j.PercentageComplete, st, es)
		}
	})
}

// TestAttackJobConcurrentCompletions: eight different completions of one
// job posted at once (one FAILED, the others COMPLETED with units 2 to
// 8): exactly one is taken (200), the others are 409, and exactly its
// units are charged, once (nothing when the FAILED one wins), its hold
// settled.
func TestAttackJobConcurrentCompletions(t *testing.T) {
	onBothStores(t, func(t *testing.T, f *flightServer) {
		f.keyFor("race", "basic")
		f.openJob("job-race", "race", billing.Whole(1))
		answers := make([]rawAnswer, 8)
		var wg sync.WaitGroup
		for i := range answers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				fields := fmt.Sprintf(`"units":%d`, i+1)
				if i == 0 {
					fields = `"status":"FAILED","units":1`
				}
				answers[i] = f.send("/api/usage/complete/job-race", f.completionOf(fields), flightSecret, "")
			}()
		}
		wg.Wait()
		won := -1
		for i, a := range answers {
			switch {
			case a.status == 200 && won < 0:
				won = i
			case a.status == 200:
				t.Errorf("completions %d and %d both taken", won+1, i+1)
			case a.status != 409:
				t.Errorf("completion %d: %d %s, want 200 or 409", i+1, a.status, a.body)
			}
		}
		if won < 0 {
			t.Fatal("no completion taken")
		}
		want := billing.Whole(int64(won + 1))
		if won == 0 { // the FAILED one: nothing charged
			want = 0
		}
		j := f.job("job-race")
		st := f.state(basicAccount("race"))
		es := f.ledger("race")
		if j.Units != want || st.Used != want || st.Reserved != 0 || want > 0 && (len(es) != 1 || es[0].Units != want) || want == 0 && len(es) != 0 {
			t.Errorf("taken %v: job %v, state %+v, ledger %+v", want, j.Units, st, es)
		}
	})
}

// TestAttackJobCompletionRacesExpiry: a completion posted while the
// maintenance sweep expires its job: either the completion is taken (200,
// COMPLETED, its units charged) or the sweep is (409, FAILED expired,
// nothing charged); never both, never neither, and the hold is gone
// either way. Twelve jobs, each raced once.
func TestAttackJobCompletionRacesExpiry(t *testing.T) {
	onBothStores(t, func(t *testing.T, f *flightServer) {
		f.keyFor("late", "basic")
		const n = 12
		// One job at a time, the sweep a little later each round, so
		// that both orders happen on either store.
		answers := make([]rawAnswer, n)
		for i := range n {
			f.openJob(fmt.Sprintf("job-late-%d", i), "late", billing.Scale/2)
			var wg sync.WaitGroup
			wg.Add(2)
			go func() {
				defer wg.Done()
				answers[i] = f.send(fmt.Sprintf("/api/usage/complete/job-late-%d", i), f.completionOf(`"units":"0.5"`), flightSecret, "")
			}()
			go func() {
				defer wg.Done()
				time.Sleep(time.Duration(i) * 400 * time.Microsecond)
				if _, err := f.st.ExpireJobs(context.Background(), f.at.Add(2*time.Hour), engine.JobExpiredMessage); err != nil {
					t.Error(err)
				}
			}()
			wg.Wait()
		}
		var completed billing.Units
		for i, a := range answers {
			j := f.job(fmt.Sprintf("job-late-%d", i))
			switch {
			case a.status == 200 && j.Status == store.JobCompleted && j.Units == billing.Scale/2:
				completed += j.Units
			case a.status == 409 && j.Status == store.JobFailed && j.ErrorMessage == engine.JobExpiredMessage && j.Units == 0:
			default:
				t.Errorf("job %d: completion %d %s, job %s %v %q", i, a.status, a.body, j.Status, j.Units, j.ErrorMessage)
			}
		}
		t.Logf("%v units completed before the sweep (0.5 a job, %d jobs)", completed, n)
		st := f.state(basicAccount("late"))
		var ledger billing.Units
		for _, e := range f.ledger("late") {
			ledger += e.Units
		}
		if st.Used != completed || ledger != completed || st.Reserved != 0 {
			t.Errorf("completions took %v: state %+v, ledger %v; want them used, nothing held", completed, st, ledger)
		}
	})
}

// TestAttackJobCompletionPastItsHold: a completion stating far more than
// its job held, on a quota of 10 with overage blocked and 8 used, charges
// what the quota has left (2), keeps what was stated as unitsClaimed (50),
// and the job's currentCost and units say what was charged; a FAILED
// completion stating units charges nothing and gives its hold back.
func TestAttackJobCompletionPastItsHold(t *testing.T) {
	onBothStores(t, func(t *testing.T, f *flightServer) {
		f.keyFor("greedy", "basic")
		if a := f.send("/api/usage/report", f.reportBodyOf("greedy", "8"), flightSecret, ""); a.status != 200 {
			t.Fatalf("report: %d %s", a.status, a.body)
		}
		f.openJob("job-greedy", "greedy", billing.Whole(1))
		f.openJob("job-failed", "greedy", billing.Whole(1))
		if a := f.send("/api/usage/complete/job-failed", f.completionOf(`"status":"failed","units":5`), flightSecret, ""); a.status != 200 {
			t.Fatalf("failed completion: %d %s", a.status, a.body)
		}
		if a := f.send("/api/usage/complete/job-greedy", f.completionOf(`"units":50`), flightSecret, ""); a.status != 200 {
			t.Fatalf("completion: %d %s", a.status, a.body)
		}
		st := f.state(basicAccount("greedy"))
		j, failed := f.job("job-greedy"), f.job("job-failed")
		var row store.LedgerEntry
		for _, e := range f.ledger("greedy") {
			if e.RequestID == "job-greedy" {
				row = e
			}
			if e.RequestID == "job-failed" {
				t.Errorf("a failed job was charged: %+v", e)
			}
		}
		if st.Used != billing.Whole(10) || st.Reserved != 0 || j.Units != billing.Whole(2) || row.Units != billing.Whole(2) ||
			row.UnitsClaimed != billing.Whole(50) || failed.Status != store.JobFailed || failed.Units != 0 {
			t.Errorf("state %+v, job units %v, row %+v, failed job %s %v; want 10 used, 2 charged of 50 claimed, nothing held",
				st, j.Units, row, failed.Status, failed.Units)
		}
	})
}

// TestAttackJobCompletionBodies: a completion whose body is not JSON, or
// past usage_max_body_bytes, is refused (400, 413) and the job stays open
// with its hold; the backend's retry then completes it. A result far past
// result_max_bytes is cut there with its size kept; a result that is a
// JSON value is kept as its compact text.
func TestAttackJobCompletionBodies(t *testing.T) {
	onBothStores(t, func(t *testing.T, f *flightServer) {
		f.keyFor("big", "basic")
		f.openJob("job-big", "big", billing.Whole(1))
		f.openJob("job-json", "big", billing.Whole(1))
		path := "/api/usage/complete/job-big"
		const limit = 1 << 16
		huge := f.completionOf(`"units":1,"result":"` + strings.Repeat("é", limit/2) + `"`)
		for name, a := range map[string]rawAnswer{
			"not JSON":      f.send(path, `status=COMPLETED&units=1`, flightSecret, ""),
			"cut off JSON":  f.send(path, f.completionOf(`"units":1`)[:20], flightSecret, ""),
			"a JSON array":  f.send(path, `[{"units":1}]`, flightSecret, ""),
			"past the body": f.send(path, huge, flightSecret, ""),
		} {
			if a.status != 400 && a.status != 413 {
				t.Errorf("%s: %d %s, want 400 or 413", name, a.status, a.body)
			}
		}
		if j, st := f.job("job-big"), f.state(basicAccount("big")); j.Status != store.JobPending || st.Reserved != billing.Whole(2) || st.Used != 0 {
			t.Fatalf("after refused completions: job %s, state %+v; want PENDING with both holds", j.Status, st)
		}
		result := strings.Repeat("é", 3000) // 6000 bytes, the cap 1 KiB
		if a := f.send(path, f.completionOf(`"units":1,"result":"`+result+`"`), flightSecret, ""); a.status != 200 {
			t.Fatalf("completion: %d %s", a.status, a.body)
		}
		if a := f.send("/api/usage/complete/job-json", f.completionOf(`"units":1,"result":{ "a" : [1, 2,{"b":null}] }`), flightSecret, ""); a.status != 200 {
			t.Fatalf("JSON result: %d %s", a.status, a.body)
		}
		j, jj := f.job("job-big"), f.job("job-json")
		if j.ResultSize != 6000 || !j.ResultTruncated || len(j.Result) > 1<<10 || !strings.HasPrefix(result, j.Result) || len(j.Result)%2 != 0 {
			t.Errorf("cut result: size %d truncated %v len %d", j.ResultSize, j.ResultTruncated, len(j.Result))
		}
		if jj.Result != `{"a":[1,2,{"b":null}]}` || jj.ContentType != "application/json" {
			t.Errorf("JSON result kept as %q %q", jj.Result, jj.ContentType)
		}
		if st := f.state(basicAccount("big")); st.Used != billing.Whole(2) || st.Reserved != 0 {
			t.Errorf("state %+v, want 2 used, nothing held", st)
		}
	})
}

// TestAttackEstimatesNeverHold: estimates, allowed and denied, of both
// routes, many and at once, reserve nothing and charge nothing: the
// subscription's state and ledger are as before, and a call may still
// take all that is left.
func TestAttackEstimatesNeverHold(t *testing.T) {
	onBothStores(t, func(t *testing.T, f *flightServer) {
		k := f.keyFor("est", "basic")
		if a := f.send("/api/usage/report", f.reportBodyOf("est", "3"), flightSecret, ""); a.status != 200 {
			t.Fatalf("report: %d %s", a.status, a.body)
		}
		before := f.state(basicAccount("est"))
		var wg sync.WaitGroup
		for i := range 40 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				units := []string{"0", "1", "7", "7.000001", "100"}[i%5]
				var a rawAnswer
				if i%2 == 0 {
					a = f.send("/api/v1/service-keys/estimate-usage", `{"serviceKey":"`+k+`","serviceId":"svc","estimatedUnits":`+units+`}`, flightSecret, "")
				} else {
					a = f.send("/api/v1/billing/usage/estimate", `{"userId":"est","serviceId":"svc","estimatedUnits":"`+units+`"}`, "", "", "Authorization", "Bearer "+k)
				}
				if a.status != 200 && a.status != 429 {
					t.Errorf("estimate %s: %d %s", units, a.status, a.body)
				}
			}()
		}
		wg.Wait()
		if after := f.state(basicAccount("est")); after != before {
			t.Errorf("state after estimates %+v, was %+v", after, before)
		}
		if es := f.ledger("est"); len(es) != 1 {
			t.Errorf("ledger %+v, want the report only", es)
		}
		res, err := f.st.Reserve(context.Background(), basicAccount("est"), billing.Whole(7), f.at)
		if err != nil || !res.Decision.Allowed {
			t.Errorf("a hold of the 7 left after estimates: %+v %v", res.Decision, err)
		}
	})
}

// TestAttackJobCompletedAfterRestart: a job open when the store is closed
// (a restart) still holds its units when it is opened again, and its
// completion then settles them, charging the units stated once; its
// repeat after a second restart is 200 and charges nothing more. A report
// recorded under an Idempotency-Key before the restarts is replayed after
// each, counted once.
func TestAttackJobCompletedAfterRestart(t *testing.T) {
	at := time.Now().UTC().Truncate(time.Second)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		open func(t *testing.T) store.Store
	}{
		{"bbolt", func() func(t *testing.T) store.Store {
			var path string
			return func(t *testing.T) store.Store {
				if path == "" {
					path = filepath.Join(t.TempDir(), "platform.db")
				}
				st, err := boltstore.Open(path)
				if err != nil {
					t.Fatal(err)
				}
				return st
			}
		}()},
		{"postgres", func() func(t *testing.T) store.Store {
			var dsn string
			return func(t *testing.T) store.Store {
				if dsn == "" {
					dsn = pgtest.DB(t)
				}
				st, err := pgstore.Open(ctx, pgstore.Options{DSN: dsn, NodeID: "n1"})
				if err != nil {
					t.Fatal(err)
				}
				return st
			}
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := tc.open(t)
			f := newFlightServerOn(t, st, at)
			f.keyFor("restart", "basic")
			f.openJob("job-restart", "restart", billing.Whole(1))
			completion := f.completionOf(`"units":"4.5","result":"done"`)
			report := f.reportBodyOf("restart", "0.25")
			first := f.send("/api/usage/report", report, flightSecret, "", "Idempotency-Key", "k-restart")
			if first.status != 200 {
				t.Fatalf("report: %d %s", first.status, first.body)
			}
			st.Close()
			for round := range 2 {
				func() {
					st := tc.open(t)
					defer st.Close()
					f := newFlightServerOn(t, st, at)
					if round == 0 {
						if s := f.state(basicAccount("restart")); s.Reserved != billing.Whole(1) || s.Used != billing.Scale/4 {
							t.Fatalf("after the restart: %+v, want the job's hold of 1 and the report's 0.25", s)
						}
					}
					if a := f.send("/api/usage/report", report, flightSecret, "", "Idempotency-Key", "k-restart"); a.status != 200 || a.body != first.body || a.header.Get("Idempotent-Replayed") != "true" {
						t.Errorf("report retried after restart %d: %d %s, want the first answer replayed", round, a.status, a.body)
					}
					if a := f.send("/api/usage/complete/job-restart", completion, flightSecret, ""); a.status != 200 {
						t.Fatalf("completion, round %d: %d %s", round, a.status, a.body)
					}
					if s := f.state(basicAccount("restart")); s.Reserved != 0 || s.Used != billing.Whole(4)+billing.Scale*3/4 {
						t.Errorf("round %d: %+v, want 4.75 used, nothing held", round, s)
					}
					if es := f.ledger("restart"); len(es) != 2 {
						t.Errorf("round %d: ledger %+v, want the report's row and the job's", round, es)
					}
				}()
			}
		})
	}
}
