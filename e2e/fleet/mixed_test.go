package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/e2etest"
	"github.com/platformgw/gateway/internal/store/pgstore"
)

// TestFleetMixedTrafficKeepsTheBooks: everything billable a fleet takes,
// at once, on three nodes sharing one database, one of them killed with
// kill -9 and restarted meanwhile: sync calls racing for a blocked quota,
// a prepaid balance and a spending cap over every node; async jobs created
// on one node whose backend posts each completion to two nodes at the
// same instant; usage reports each sent to two nodes at the same instant
// under one Idempotency-Key. Afterwards the books must hold: no limit
// charged past (the ledger, which also holds the calls the dead node
// settled without its caller seeing the answer), every acknowledged call
// and completion exactly once, every report once, the counters every node
// reads equal to the ledger, and `store check` finding nothing, in both
// settle modes.
func TestFleetMixedTrafficKeepsTheBooks(t *testing.T) {
	for _, mode := range []string{"log", "commit"} {
		t.Run("settle "+mode, func(t *testing.T) {
			f := newFleet(t, fleetDB(t), 3, func(f *fleet) { f.settle = mode })
			a, b, c := f.nodes[0], f.nodes[1], f.nodes[2]
			limited := []struct{ user, product string }{{"m-quota", "quota"}, {"m-prepaid", "prepaid"}, {"m-capped", "capped"}}
			keys := map[string]string{}
			for _, l := range limited {
				credits := 0
				if l.product == "prepaid" {
					credits = 100
				}
				keys[l.user], _ = subscribe(t, a, l.user, l.product, credits)
			}
			keys["m-reports"], _ = subscribe(t, b, "m-reports", "unlimited", 0)
			// Jobs of a prepaid user whose sync calls lease blocks on the
			// same nodes meanwhile.
			keys["m-jobs"], _ = subscribe(t, b, "m-jobs", "prepaid", 1000)
			limited = append(limited, struct{ user, product string }{"m-jobs", "prepaid"})

			var loads []*load
			for _, l := range limited {
				callers := 12
				if l.user == "m-jobs" {
					callers = 4
				}
				loads = append(loads, startLoad(f.nodes, keys[l.user], callers))
			}

			// Jobs created on a and b; each completion posted to a and b
			// at once.
			const jobs = 10
			var jobWG sync.WaitGroup
			var jobMu sync.Mutex
			jobAnswers := map[string][]int{} // request id -> the two completions' statuses
			for i := range jobs {
				nd := f.nodes[i%2]
				id, ok := startJob(t, nd, keys["m-jobs"])
				if !ok {
					continue
				}
				env := waitEnvelope(t, f, id)
				jobWG.Go(func() {
					codes := completeTwice(t, env, a, b)
					jobMu.Lock()
					jobAnswers[id] = codes
					jobMu.Unlock()
				})
			}

			// Reports, each to a and b at once under one key.
			const reports = 20
			var repWG sync.WaitGroup
			for i := range reports {
				repWG.Go(func() { reportTwice(t, "m-reports", fmt.Sprintf("rep-%d", i), a, b) })
			}

			// c dies under load and comes back.
			waitFor(t, 30*time.Second, func() bool { return loads[0].served() > 20 })
			c.kill()
			time.Sleep(500 * time.Millisecond)
			f.start(c)
			jobWG.Wait()
			repWG.Wait()
			// The limits are used up (or the callers gave up): stop.
			time.Sleep(2 * time.Second)
			acked := map[string]int{}
			for i, l := range loads {
				for id := range l.finish() {
					acked[id] = i
				}
				t.Logf("%s: %d served, answers %v", limited[i].user, len(l.acked), l.statuses)
			}

			// Every completion answered, at least one of each pair 200;
			// the other 200 too (the same completion again) or a
			// conflict, never a server error.
			for id, codes := range jobAnswers {
				ok := 0
				for _, c := range codes {
					switch {
					case c == 200:
						ok++
					case c >= 500 || c == 0:
						t.Errorf("job %s: a completion answered %d", id, c)
					}
				}
				if ok == 0 {
					t.Errorf("job %s: neither completion taken (%v)", id, codes)
				}
			}

			waitLedger(t, a, acked, 15*time.Second)
			checkLedger(t, a, acked, nil)
			entries := exportLedger(t, b, "")
			perUser, completions, reported := map[string]int{}, map[string]int{}, map[string]int{}
			for _, e := range entries {
				perUser[e.UserID]++
				switch e.Source {
				case "completion":
					completions[e.RequestID]++
				case "report":
					reported[e.UserID]++
				}
			}
			for id := range jobAnswers {
				if completions[id] != 1 {
					t.Errorf("job %s: %d completion entries in the ledger, want 1", id, completions[id])
				}
			}
			if reported["m-reports"] != reports {
				t.Errorf("%d report entries, want %d (each sent twice under one key)", reported["m-reports"], reports)
			}
			for _, l := range limited {
				limit := 100
				if l.user == "m-jobs" {
					limit = 1000
				}
				if perUser[l.user] > limit {
					t.Errorf("%s: %d entries of one unit charged against a limit of %d", l.user, perUser[l.user], limit)
				}
			}
			if len(jobAnswers) == 0 {
				t.Error("no job was taken: nothing completed twice")
			}
			// The counters every node reads equal the ledger (each entry
			// is one unit).
			for _, user := range []string{"m-quota", "m-prepaid", "m-capped", "m-jobs", "m-reports"} {
				for _, nd := range f.nodes {
					if used := unitsUsed(t, nd, user); used != strconv.Itoa(perUser[user]) {
						t.Errorf("%s on %s: the counter says %s units used, the ledger holds %d entries of one", user, nd.name, used, perUser[user])
					}
				}
			}
			if rep, err := pgstore.Check(context.Background(), f.dsn); err != nil {
				t.Errorf("store check: %v %+v", err, rep.Mismatches)
			}
			if t.Failed() {
				f.dump()
			}
		})
	}
}

// startJob starts an async call through nd; ok is false when the node
// did not take it.
func startJob(t *testing.T, nd *node, key string) (string, bool) {
	t.Helper()
	req, _ := http.NewRequest("POST", nd.base+"/api/service/"+fleetService+"/endpoint/job/invoke/async", strings.NewReader("job"))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("async invoke on %s: %v", nd.name, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Logf("async invoke on %s: %d %s", nd.name, resp.StatusCode, body)
		return "", false
	}
	var acc struct {
		RequestID string `json:"requestId"`
	}
	json.Unmarshal(body, &acc)
	return acc.RequestID, true
}

// waitEnvelope is the envelope the backend got for job id.
func waitEnvelope(t *testing.T, f *fleet, id string) envelope {
	t.Helper()
	for {
		select {
		case env := <-f.jobs:
			if env.RequestID == id {
				return env
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the backend never got job %s", id)
		}
	}
}

// completeTwice posts the job's completion (one unit) to both nodes at
// the same instant and returns their statuses (0: no answer).
func completeTwice(t *testing.T, env envelope, x, y *node) []int {
	cb, err := url.Parse(env.CallbackURL)
	if err != nil {
		t.Error(err)
		return nil
	}
	body := fmt.Sprintf(`{"status":"COMPLETED","result":"done","units":1,"timestamp":%d}`, time.Now().Unix())
	return postTwice(body, "", cb.Path, x, y)
}

// reportTwice posts one report of one unit under key to both nodes at the
// same instant.
func reportTwice(t *testing.T, user, key string, x, y *node) {
	body := fmt.Sprintf(`{"userId":%q,"serviceId":%q,"unitsUsed":1,"timestamp":%d}`, user, fleetService, time.Now().Unix())
	codes := postTwice(body, key, "/api/usage/report", x, y)
	for _, c := range codes {
		if c != 200 {
			t.Errorf("report %s: answers %v, want 200 from both (the second the first's answer)", key, codes)
			return
		}
	}
}

// postTwice signs body and posts it to path on both nodes, released
// together.
func postTwice(body, idemKey, path string, x, y *node) []int {
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	sig := e2etest.UsageSign(fleetSecret, []byte(body), ts)
	start := make(chan struct{})
	codes := make([]int, 2)
	var wg sync.WaitGroup
	for i, nd := range []*node{x, y} {
		wg.Go(func() {
			req, _ := http.NewRequest("POST", nd.base+path, strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Platform-Signature", sig)
			req.Header.Set("X-Platform-Timestamp", ts)
			if idemKey != "" {
				req.Header.Set("Idempotency-Key", idemKey)
			}
			<-start
			resp, err := client.Do(req)
			if err != nil {
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes[i] = resp.StatusCode
		})
	}
	close(start)
	wg.Wait()
	return codes
}
