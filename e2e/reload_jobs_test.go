package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// reloadJobsCatalog: svc (async backend be) with endpoints job (present
// when withJob), job2 (cost job2Cost) and other; products req
// (PER_REQUEST, quota 100), tok (PER_TOKEN at tokPrice) and pre (PREPAID
// at 1 a call, present when withPre). sy: a sync service with product
// tok at the same price. gone (async, backend goneBE, present when
// withGone).
func reloadJobsCatalog(be, sy, goneBE string, withJob bool, job2Cost, tokPrice string, withPre, withGone bool) string {
	job, pre, gone := "", "", ""
	if withJob {
		job = "endpoint job {\n\t\t\t\tasync\n\t\t\t\tpath /job\n\t\t\t}"
	}
	if withPre {
		pre = "product pre {\n\t\t\t\tbilling PREPAID\n\t\t\t\tmeasurement PER_REQUEST\n\t\t\t\tprice 1\n\t\t\t}"
	}
	if withGone {
		gone = fmt.Sprintf(`service gone {
			backend %s
			secret %s
			endpoint run {
				async
				path /job
			}
			product req {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				quota 100
			}
		}`, goneBE, usageSecret2)
	}
	return fmt.Sprintf(`
		job_ttl 1h
		service svc {
			backend %s
			secret %s
			%s
			endpoint job2 {
				async
				path /job
				cost %s
			}
			endpoint other {
				async
				path /job
			}
			product req {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				quota 100
			}
			product tok {
				billing USAGE_POSTPAID
				measurement PER_TOKEN
				price %s
			}
			%s
		}
		service sy {
			backend %s
			secret %s
			endpoint slow
			product tok {
				billing USAGE_POSTPAID
				measurement PER_TOKEN
				price %s
			}
		}
		%s`, be, usageSecret, job, job2Cost, tokPrice, pre, sy, usageSecret2, tokPrice, gone)
}

// reloadComplete posts a signed completion of a job and returns the answer.
func reloadComplete(t *testing.T, env usageEnvelope, secret, body string) (int, []byte) {
	t.Helper()
	ts := usageURLTimestamp(t, env.CallbackURL)
	body = body[:len(body)-1] + fmt.Sprintf(`,"timestamp":%d}`, time.Now().Unix())
	resp, b := usagePost(t, usageSigned{URL: env.CallbackURL, Body: body, Secret: secret, Timestamp: ts})
	return resp.StatusCode, b
}

// ledgerOf is the one ledger entry of request id among es.
func ledgerOf(t *testing.T, es []store.LedgerEntry, id string) store.LedgerEntry {
	t.Helper()
	var found []store.LedgerEntry
	for _, e := range es {
		if e.RequestID == id {
			found = append(found, e)
		}
	}
	if len(found) != 1 {
		t.Fatalf("request %s: %d ledger entries %+v, want 1", id, len(found), found)
	}
	return found[0]
}

// TestReloadJobsKeepAdmissionTerms: a job open across a reload (POST
// /load) is charged under the terms it was accepted with, as a sync call
// admitted at the same instant is: the product (here its price, and its
// very existence) and the endpoint's per-call cost then, whatever the
// reload did to them. Found by a review of reloads: the endpoint removed
// made its job free, a cost raised 1→5 charged 5, a price raised
// thousandfold charged the new price, a product removed made its job
// free. A job of a service the reload removed can no longer be completed
// (nobody can sign for it): it expires and its hold is given back.
func TestReloadJobsKeepAdmissionTerms(t *testing.T) {
	dir := t.TempDir()
	be := newUsageBackend(t, usageSecret)
	goneBE := newUsageBackend(t, usageSecret2)
	arrived := make(chan struct{}, 10)
	release := make(chan struct{})
	sy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		w.Header().Set("X-Platform-Units", "10")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "ok")
	}))
	defer sy.Close()
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	defer unblock()

	g := startGateway(t, dir, reloadJobsCatalog(be.URL, sy.URL, goneBE.URL, true, "1", "0.001", true, true))
	key, _ := g.newKey("u")
	g.subscribe("u", "svc", "req", "ACTIVE")
	keyTok, _ := g.newKey("u-tok")
	g.subscribe("u-tok", "svc", "tok", "ACTIVE")
	g.subscribe("u-tok", "sy", "tok", "ACTIVE")
	keyPre, _ := g.newKey("u-pre")
	g.subscribe("u-pre", "svc", "pre", "ACTIVE")
	g.credits("u-pre", "svc", "10")
	keyGone, _ := g.newKey("u-gone")
	g.subscribe("u-gone", "gone", "req", "ACTIVE")

	// Jobs accepted under the first catalog.
	accJob, envJob := usageStart(t, be, asyncURL("/api", "svc", "job"), key, "x")    // endpoint removed by the reload
	accJob2, envJob2 := usageStart(t, be, asyncURL("/api", "svc", "job2"), key, "x") // cost 1 -> 5
	accTok, envTok := usageStart(t, be, asyncURL("/api", "svc", "other"), keyTok, "x")
	accPre, envPre := usageStart(t, be, asyncURL("/api", "svc", "other"), keyPre, "x")
	_, envGone := usageStart(t, goneBE, asyncURL("/api", "gone", "run"), keyGone, "x")
	if sub, err := g.store().GetSubscription(context.Background(), "u-pre", "svc"); err != nil || sub.CreditsHeld != billing.Whole(1) {
		t.Fatalf("u-pre before the reload: %+v, %v; want 1 credit held", sub, err)
	}
	// A sync call admitted at the same time, in flight across the reload.
	var wg sync.WaitGroup
	var syncStatus int
	wg.Add(1)
	go func() {
		defer wg.Done()
		resp, _ := call(t, "GET", invokeURL("sy", "slow"), keyTok, "")
		syncStatus = resp.StatusCode
	}()
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the sync call never reached its backend")
	}

	// The reload: endpoint job removed, job2's cost 1 -> 5, tok's price
	// 0.001 -> 1, product pre removed, service gone removed.
	g.reload(reloadJobsCatalog(be.URL, sy.URL, goneBE.URL, false, "5", "1", false, false))

	unblock()
	wg.Wait()
	if syncStatus != http.StatusOK {
		t.Fatalf("sync call: %d", syncStatus)
	}
	for _, c := range []struct {
		env  usageEnvelope
		body string
	}{
		{envJob, `{"status":"COMPLETED"}`},
		{envJob2, `{"status":"COMPLETED"}`},
		{envTok, `{"status":"COMPLETED","units":10}`},
		{envPre, `{"status":"COMPLETED","units":3}`},
	} {
		if code, b := reloadComplete(t, c.env, usageSecret, c.body); code != http.StatusOK {
			t.Fatalf("completion of %s: %d %s", c.env.RequestID, code, b)
		}
	}

	// PER_REQUEST jobs completed without units: one call each at the
	// endpoint's cost when accepted (1), the removed endpoint's included.
	es := g.ledger("u")
	for _, id := range []string{accJob.RequestID, accJob2.RequestID} {
		if e := ledgerOf(t, es, id); e.ProductID != "req" || e.Units != billing.Whole(1) || e.Cost != 0 {
			t.Errorf("u's job %s: %+v, want 1 unit under req", id, e)
		}
	}
	req := billing.Product{ID: "req", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, Quota: new(billing.Whole(100))}
	if st, err := g.store().State(context.Background(), store.Account{UserID: "u", ServiceID: "svc", Product: req}, time.Now()); err != nil ||
		st.Used != billing.Whole(2) || st.Reserved != 0 {
		t.Errorf("u: %+v, %v; want 2 used, nothing held", st, err)
	}

	// PER_TOKEN at 0.001 when accepted: the sync call and the job each
	// cost 0.01 for 10 units.
	es = g.ledger("u-tok")
	if e := ledgerOf(t, es, accTok.RequestID); e.ProductID != "tok" || e.Units != billing.Whole(10) || e.Cost != 10_000 {
		t.Errorf("u-tok's job: %+v, want 10 units costing 0.01", e)
	}
	var syncCost billing.Units
	for _, e := range es {
		if e.ServiceID == "sy" {
			syncCost += e.Cost
		}
	}
	if syncCost != 10_000 {
		t.Errorf("u-tok's sync call cost %s, want 0.01", syncCost)
	}

	// PREPAID at 1 a call, removed by the reload: 3 units cost 3 credits.
	if e := ledgerOf(t, g.ledger("u-pre"), accPre.RequestID); e.ProductID != "pre" || e.Units != billing.Whole(3) || e.Cost != billing.Whole(3) {
		t.Errorf("u-pre's job: %+v, want 3 units costing 3 under pre", e)
	}
	if sub, err := g.store().GetSubscription(context.Background(), "u-pre", "svc"); err != nil ||
		sub.Credits != billing.Whole(7) || sub.CreditsHeld != 0 {
		t.Errorf("u-pre after: %+v, %v; want 7 credits, none held", sub, err)
	}

	// A job accepted after the reload is charged the new terms.
	acc, env := usageStart(t, be, asyncURL("/api", "svc", "other"), keyTok, "x")
	if code, b := reloadComplete(t, env, usageSecret, `{"status":"COMPLETED","units":10}`); code != http.StatusOK {
		t.Fatalf("completion: %d %s", code, b)
	}
	if e := ledgerOf(t, g.ledger("u-tok"), acc.RequestID); e.Units != billing.Whole(10) || e.Cost != billing.Whole(10) {
		t.Errorf("u-tok's job after the reload: %+v, want 10 units costing 10", e)
	}
	acc, env = usageStart(t, be, asyncURL("/api", "svc", "job2"), key, "x")
	if code, b := reloadComplete(t, env, usageSecret, `{"status":"COMPLETED"}`); code != http.StatusOK {
		t.Fatalf("completion: %d %s", code, b)
	}
	if e := ledgerOf(t, g.ledger("u"), acc.RequestID); e.Units != billing.Whole(5) {
		t.Errorf("u's job2 after the reload: %+v, want 5 units (the new cost)", e)
	}

	// The service is gone: nobody can sign for its job, whose completion
	// is refused as unknown; the job expires and gives its hold back,
	// charging nothing.
	if code, b := reloadComplete(t, envGone, usageSecret2, `{"status":"COMPLETED","units":3}`); code != http.StatusNotFound {
		t.Errorf("completion of a removed service's job: %d %s, want 404", code, b)
	}
	if n, err := g.store().ExpireJobs(context.Background(), time.Now().Add(2*time.Hour), "expired"); err != nil || n != 1 {
		t.Fatalf("ExpireJobs = %d, %v; want the removed service's job", n, err)
	}
	if st, err := g.store().State(context.Background(), store.Account{UserID: "u-gone", ServiceID: "gone", Product: req}, time.Now()); err != nil ||
		st.Used != 0 || st.Reserved != 0 {
		t.Errorf("u-gone: %+v, %v; want nothing used or held", st, err)
	}
	if es := g.ledger("u-gone"); len(es) != 0 {
		t.Errorf("u-gone's ledger %+v, want none", es)
	}
}
