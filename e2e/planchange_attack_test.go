package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/e2etest"
	"github.com/platformgw/gateway/internal/pgtest"
)

// planBackend answers /slow only once the test releases it, takes jobs
// on /job (202, the envelope to the test) and answers everything else.
type planBackend struct {
	*httptest.Server
	arrived chan struct{}
	release chan struct{}
	jobs    chan usageEnvelope
}

func newPlanBackend(t *testing.T) *planBackend {
	b := &planBackend{arrived: make(chan struct{}, 4), release: make(chan struct{}), jobs: make(chan usageEnvelope, 4)}
	stop := make(chan struct{})
	b.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		switch {
		case strings.HasSuffix(r.URL.Path, "/job"):
			var env usageEnvelope
			json.Unmarshal(raw, &env)
			b.jobs <- env
			w.WriteHeader(http.StatusAccepted)
			return
		case strings.HasSuffix(r.URL.Path, "/slow"):
			b.arrived <- struct{}{}
			select {
			case <-b.release:
			case <-stop:
			}
		}
		io.WriteString(w, "ok")
	}))
	t.Cleanup(b.Close)
	t.Cleanup(func() { close(stop) })
	return b
}

func planCatalog(backend string) string {
	return fmt.Sprintf(`
		job_ttl 1h
		service pc {
			backend %s
			secret %s
			endpoint echo {
				path /echo
			}
			endpoint slow {
				path /slow
			}
			endpoint job {
				async
				path /job
			}
			product free {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 5
			}
			product lite {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 2
			}
			product pre {
				billing PREPAID
				measurement PER_REQUEST
				unit request
				price 2
			}
			product payg {
				billing USAGE_POSTPAID
				measurement PER_REQUEST
				unit request
				price 0.5
				currency USD
			}
			product usd {
				billing USAGE_POSTPAID
				measurement PER_REQUEST
				unit request
				price 0.5
				spending_cap 10
				currency USD
			}
		}`, backend, usageSecret)
}

type planSub struct {
	ProductID   string  `json:"productId"`
	Status      string  `json:"status"`
	Credits     float64 `json:"credits"`
	CreditsHeld float64 `json:"creditsHeld"`
}

type planPeriod struct {
	ProductID      string   `json:"productId"`
	UnitsUsed      float64  `json:"unitsUsed"`
	UnitsHeld      float64  `json:"unitsHeld"`
	Quota          *float64 `json:"quota"`
	UnitsRemaining *float64 `json:"unitsRemaining"`
	Credits        float64  `json:"credits"`
	CreditsHeld    float64  `json:"creditsHeld"`
	Spend          float64  `json:"spend"`
	SpendHeld      float64  `json:"spendHeld"`
	CostUnit       string   `json:"costUnit"`
}

type planRow struct {
	Seq       int     `json:"seq"`
	Time      string  `json:"time"`
	RequestID string  `json:"requestId"`
	ProductID string  `json:"productId"`
	Units     float64 `json:"units"`
	Cost      float64 `json:"cost"`
	CostUnit  string  `json:"costUnit"`
	Source    string  `json:"source"`
}

func planAdmin() string { return fmt.Sprintf("http://localhost:%d", adminPort) }

func planPut(t *testing.T, user, product, status string) {
	t.Helper()
	body := map[string]string{"productId": product}
	if status != "" {
		body["status"] = status
	}
	e2etest.AdminJSON(t, "PUT", planAdmin()+"/platform/subscriptions/"+user+"/pc", body, 200, nil)
}

func planSummary(t *testing.T, user string) planPeriod {
	t.Helper()
	var out struct {
		Subscriptions []planPeriod `json:"subscriptions"`
	}
	adminGet(t, planAdmin()+"/platform/users/"+user+"/summary?serviceId=pc", 200, &out)
	if len(out.Subscriptions) != 1 {
		t.Fatalf("summary: %+v", out)
	}
	return out.Subscriptions[0]
}

func planSubscription(t *testing.T, user string) planSub {
	t.Helper()
	var s planSub
	adminGet(t, planAdmin()+"/platform/subscriptions/"+user+"/pc", 200, &s)
	return s
}

func planRows(t *testing.T, user string) []planRow {
	t.Helper()
	var rows []planRow
	adminGet(t, planAdmin()+"/platform/usage?userId="+user, 200, &rows)
	return rows
}

// slowCall starts a call to /slow and waits for it to reach the backend.
func (b *planBackend) slowCall(t *testing.T, key string) chan int {
	t.Helper()
	done := make(chan int, 1)
	go func() {
		resp, _, err := raceInvokeResp(invokeURL("pc", "slow"), key)
		if err != nil {
			done <- -1
			return
		}
		done <- resp.StatusCode
	}()
	select {
	case <-b.arrived:
	case code := <-done:
		t.Fatalf("the slow call ended before reaching the backend: %d", code)
	case <-time.After(5 * time.Second):
		t.Fatal("the slow call never reached the backend")
	}
	return done
}

// planBooks waits (a PostgreSQL node ships its settlements within
// ship_interval, 200 ms) until the subscription, its period summary and
// the usage export read as ok says, and fails with what they read last.
func planBooks(t *testing.T, u string, ok func(planSub, planPeriod, []planRow) bool) (planSub, planPeriod, []planRow) {
	t.Helper()
	var (
		s    planSub
		p    planPeriod
		rows []planRow
	)
	for deadline := time.Now().Add(5 * time.Second); ; {
		s, p, rows = planSubscription(t, u), planSummary(t, u), planRows(t, u)
		if ok(s, p, rows) {
			return s, p, rows
		}
		if time.Now().After(deadline) {
			t.Fatalf("books of %s: subscription %+v, period %+v, ledger %+v", u, s, p, rows)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// planOnBothStores runs f against a gateway serving planCatalog on an
// embedded store file and one on PostgreSQL; reload loads the catalog
// given into the running gateway, on its store.
func planOnBothStores(t *testing.T, f func(t *testing.T, be *planBackend, g *gateway, reload func(string))) {
	for _, pg := range []bool{false, true} {
		name := "file"
		if pg {
			name = "postgres"
		}
		t.Run(name, func(t *testing.T) {
			be := newPlanBackend(t)
			dir := t.TempDir()
			var g *gateway
			reload := func(block string) { g.reload(block) }
			if pg {
				dsn := pgtest.DB(t)
				g = startGatewayPostgres(t, dir, dsn, planCatalog(be.URL))
				reload = func(block string) {
					t.Helper()
					resp, err := loadClient.Post(fmt.Sprintf("http://localhost:%d/load", adminPort), "text/caddyfile",
						strings.NewReader(onPostgres(t, gatewayConfig(dir, block, "", "", ""), dir, dsn)))
					if err != nil {
						t.Fatal(err)
					}
					defer resp.Body.Close()
					if b, _ := io.ReadAll(resp.Body); resp.StatusCode != http.StatusOK {
						t.Fatalf("reload: %d %s", resp.StatusCode, b)
					}
				}
			} else {
				g = startGateway(t, dir, planCatalog(be.URL))
			}
			f(t, be, g, reload)
		})
	}
}

func planEcho(t *testing.T, key string) (*http.Response, []byte) {
	t.Helper()
	return call(t, "GET", invokeURL("pc", "echo"), key, "")
}

func planEchoWant(t *testing.T, key string, want int) {
	t.Helper()
	if resp, body := planEcho(t, key); resp.StatusCode != want {
		t.Fatalf("call: %d %s, want %d", resp.StatusCode, body, want)
	}
}

// TestPlanChangeMidPeriod: an outside attack on plan changes within a
// billing period (the admin API's PUT, as the console and the portal
// make it), on both stores, through the real server. A call or a job in
// flight across the change is charged once, on the terms it was admitted
// under (a prepaid call moved to a free plan still takes its credits; a
// free call moved to a prepaid plan takes none); the units used carry
// over, so moving away and back, or cancelling, suspending and
// subscribing again within the period gives no fresh quota, including
// for the calls served just before the move; a usage report arriving
// after the change is priced by the new plan; a reload that reprices a
// product charges a call in flight its admission's price. The ledger
// export, the period summary and the balance agree each time. (A run of
// the fifth outside attack: all of this held on the embedded store. On
// PostgreSQL the last three subtests failed: the lease a node took under
// the old terms stayed whole until it expired, and its unused part showed
// as credits held with nothing in flight and refused the new plan's last
// unit (429) and a balance's last credits (403). Spend in different cost
// units, kept apart per period, is the contract case SpendPerCostUnit's.)
func TestPlanChangeMidPeriod(t *testing.T) {
	planOnBothStores(t, func(t *testing.T, be *planBackend, g *gateway, reload func(string)) {
		t.Run("prepaid call in flight, moved to free", func(t *testing.T) {
			const u = "pc-1"
			key, _ := g.newKey(u)
			planPut(t, u, "pre", "")
			g.credits(u, "pc", "10")
			done := be.slowCall(t, key)
			planPut(t, u, "free", "")
			be.release <- struct{}{}
			if code := <-done; code != 200 {
				t.Fatalf("slow: %d", code)
			}
			planBooks(t, u, func(s planSub, p planPeriod, rows []planRow) bool {
				return s.Credits == 8 && s.CreditsHeld == 0 && p.UnitsUsed == 1 && p.UnitsHeld == 0 &&
					len(rows) == 1 && rows[0].ProductID == "pre" && rows[0].Cost == 2 && rows[0].CostUnit == "credits"
			})
			planPut(t, u, "pre", "")
			planEchoWant(t, key, 200)
			planBooks(t, u, func(s planSub, p planPeriod, rows []planRow) bool {
				return s.Credits == 6 && s.CreditsHeld == 0 && p.UnitsUsed == 2 && p.Spend == 4 && len(rows) == 2
			})
		})

		t.Run("free call in flight, moved to prepaid", func(t *testing.T) {
			const u = "pc-2"
			key, _ := g.newKey(u)
			planPut(t, u, "free", "")
			done := be.slowCall(t, key)
			planPut(t, u, "pre", "")
			g.credits(u, "pc", "10")
			be.release <- struct{}{}
			if code := <-done; code != 200 {
				t.Fatalf("slow: %d", code)
			}
			planBooks(t, u, func(s planSub, p planPeriod, rows []planRow) bool {
				return s.Credits == 10 && s.CreditsHeld == 0 && p.UnitsUsed == 1 && p.UnitsHeld == 0 && p.Spend == 0 &&
					len(rows) == 1 && rows[0].ProductID == "free" && rows[0].Cost == 0
			})
		})

		t.Run("prepaid job open, moved to another plan, then completed", func(t *testing.T) {
			const u = "pc-3"
			key, _ := g.newKey(u)
			planPut(t, u, "pre", "")
			g.credits(u, "pc", "10")
			if resp, body := call(t, "POST", asyncURL("/api", "pc", "job"), key, "{}", "Content-Type", "application/json"); resp.StatusCode != 202 {
				t.Fatalf("async: %d %s", resp.StatusCode, body)
			}
			env := <-be.jobs
			planPut(t, u, "usd", "")
			ts := usageURLTimestamp(t, env.CallbackURL)
			body := `{"status":"COMPLETED","timestamp":` + ts + `}`
			for range 2 { // the backend's retry changes nothing
				if status, answer, err := asyncPost(env.CallbackURL, body, "Content-Type", "application/json",
					"X-Platform-Signature", e2etest.UsageSign(usageSecret, []byte(body), ts), "X-Platform-Timestamp", ts); err != nil || status != 200 {
					t.Fatalf("completion: %d %s %v", status, answer, err)
				}
			}
			planBooks(t, u, func(s planSub, p planPeriod, rows []planRow) bool {
				return s.Credits == 8 && s.CreditsHeld == 0 && p.UnitsUsed == 1 && p.UnitsHeld == 0 &&
					len(rows) == 1 && rows[0].ProductID == "pre" && rows[0].Cost == 2 && rows[0].CostUnit == "credits" &&
					rows[0].Source == "completion"
			})
		})

		t.Run("suspended, cancelled and subscribed again", func(t *testing.T) {
			const u = "pc-4"
			key, _ := g.newKey(u)
			planPut(t, u, "free", "")
			for range 5 {
				planEchoWant(t, key, 200)
			}
			planPut(t, u, "free", "SUSPENDED")
			planEchoWant(t, key, 403)
			planPut(t, u, "free", "CANCELLED")
			planPut(t, u, "free", "")
			planEchoWant(t, key, 429)
			planBooks(t, u, func(s planSub, p planPeriod, rows []planRow) bool {
				return p.UnitsUsed == 5 && *p.UnitsRemaining == 0 && len(rows) == 5
			})
		})

		t.Run("report after a change is priced by the new plan", func(t *testing.T) {
			const u = "pc-5"
			g.newKey(u)
			planPut(t, u, "pre", "")
			g.credits(u, "pc", "10")
			planPut(t, u, "free", "")
			body := fmt.Sprintf(`{"userId":%q,"serviceId":"pc","unitsUsed":3,"timestamp":%q}`, u, time.Now().UTC().Add(-time.Minute).Format(time.RFC3339))
			if resp, out := usagePost(t, usageSigned{URL: gwBase + "/usage/api/v1/report", Secret: usageSecret, Body: body}); resp.StatusCode != 200 {
				t.Fatalf("report: %d %s", resp.StatusCode, out)
			}
			planBooks(t, u, func(s planSub, p planPeriod, rows []planRow) bool {
				return s.Credits == 10 && p.UnitsUsed == 3 && *p.UnitsRemaining == 2 &&
					len(rows) == 1 && rows[0].ProductID == "free" && rows[0].Cost == 0 && rows[0].Source == "report"
			})
		})

		t.Run("away and back gives no fresh quota", func(t *testing.T) {
			for _, away := range []string{"pre", "payg"} {
				u := "pc-6-" + away
				key, _ := g.newKey(u)
				planPut(t, u, "free", "")
				g.credits(u, "pc", "100")
				for range 3 {
					planEchoWant(t, key, 200)
				}
				planPut(t, u, away, "")
				for range 2 { // served just before the move back
					planEchoWant(t, key, 200)
				}
				planPut(t, u, "free", "")
				planEchoWant(t, key, 429)
				planBooks(t, u, func(s planSub, p planPeriod, rows []planRow) bool {
					return p.UnitsUsed == 5 && *p.UnitsRemaining == 0 && len(rows) == 5
				})
			}
		})

		t.Run("a reload reprices a product with a prepaid call in flight", func(t *testing.T) {
			const u = "pc-7"
			key, _ := g.newKey(u)
			planPut(t, u, "pre", "")
			g.credits(u, "pc", "10")
			done := be.slowCall(t, key)
			cfg := planCatalog(be.URL)
			reload(strings.Replace(cfg, "price 2", "price 3", 1))
			defer reload(cfg)
			be.release <- struct{}{}
			if code := <-done; code != 200 {
				t.Fatalf("slow: %d", code)
			}
			planEchoWant(t, key, 200)
			planBooks(t, u, func(s planSub, p planPeriod, rows []planRow) bool {
				return s.Credits == 5 && s.CreditsHeld == 0 && p.Spend == 5 && len(rows) == 2 && rows[0].Cost == 2 && rows[1].Cost == 3
			})
		})

		// What a fleet node had leased under the old terms and no call
		// holds is not kept from the new ones: the last units of a quota
		// and the last credits of a balance serve calls at once.
		t.Run("moved to a smaller quota with a call in flight", func(t *testing.T) {
			const u = "pc-8"
			key, _ := g.newKey(u)
			planPut(t, u, "free", "")
			done := be.slowCall(t, key)
			planPut(t, u, "lite", "")
			be.release <- struct{}{}
			if code := <-done; code != 200 {
				t.Fatalf("slow: %d", code)
			}
			planEchoWant(t, key, 200) // 2 of lite's 2
			planEchoWant(t, key, 429)
			planBooks(t, u, func(s planSub, p planPeriod, rows []planRow) bool {
				return p.UnitsUsed == 2 && p.UnitsHeld == 0 && *p.UnitsRemaining == 0 && len(rows) == 2
			})
		})

		t.Run("repriced with a prepaid call in flight, the last credits", func(t *testing.T) {
			const u = "pc-9"
			key, _ := g.newKey(u)
			planPut(t, u, "pre", "")
			g.credits(u, "pc", "4")
			done := be.slowCall(t, key)
			cfg := planCatalog(be.URL)
			reload(strings.Replace(cfg, "price 2", "price 1", 1))
			defer reload(cfg)
			be.release <- struct{}{}
			if code := <-done; code != 200 {
				t.Fatalf("slow: %d", code)
			}
			planEchoWant(t, key, 200) // 2 credits left, 1 a call now
			planEchoWant(t, key, 200)
			planEchoWant(t, key, 403)
			planBooks(t, u, func(s planSub, p planPeriod, rows []planRow) bool {
				return s.Credits == 0 && s.CreditsHeld == 0 && len(rows) == 3
			})
		})
	})
}
