package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/e2etest"
	"github.com/platformgw/gateway/internal/payments/stripetest"
	"github.com/platformgw/gateway/internal/store/pgstore"
)

// TestFleetTopUpsWhileSpending is an attack run on the money of a
// prepaid balance in a fleet: two gateway processes on one PostgreSQL
// database, a caller spending credits through both as fast as they
// answer while two packs are bought (each paid event delivered to both
// nodes at once), one is refunded in two parts (each refund's event to
// both nodes at once, the second event naming both refunds), the other
// lost in a dispute (to both nodes at once, after a refund's event of
// it that takes its share first), and an operator corrects the balance
// twice through the admin API of each node, all at the same time. Then
// the books agree: each pack granted once, each refund and the dispute
// taken back once (the dispute only what the pack had left), one audit
// entry each, and the balance is what was granted, less what was taken
// back, plus the operator's corrections, less exactly the calls the
// ledger charged, which are the calls the backend served.
func TestFleetTopUpsWhileSpending(t *testing.T) {
	mock := stripetest.Start(t)
	mock.Answer("/v1/prices/price_pack", map[string]any{"unit_amount": 1000, "unit_amount_decimal": "1000", "currency": "usd"})
	dsn := fleetDB(t)
	f := newFleet(t, dsn, 2, func(f *fleet) {
		f.products = "\t\t\tproduct packs {\n\t\t\t\tbilling PREPAID\n\t\t\t\tmeasurement PER_REQUEST\n\t\t\t\tunit request\n\t\t\t\tprice 1\n\t\t\t\tcurrency USD\n\t\t\t}\n"
		f.payments = fmt.Sprintf("\t\tpayments stripe {\n\t\t\tsecret_key sk_test_fleet\n\t\t\twebhook_secret %s\n\t\t\tapi_base %s\n\t\t\tprice %s paid price_paid\n\t\t\ttopup %s packs pack price_pack 100\n\t\t}",
			fleetWhsec, mock.URL, fleetService, fleetService)
	})
	st, err := pgstore.Open(context.Background(), pgstore.Options{DSN: dsn, NodeID: "test-seed", MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	const user = "u-top"
	seedCustomer(t, st, user, "cus_u_top")
	key, _ := subscribe(t, f.nodes[0], user, "packs", 0)
	at := time.Now().Add(-time.Minute).Truncate(time.Second)

	// both delivers ev to every node at once; a 500 (the other node
	// held what it needed past its wait) is sent again, as Stripe does.
	both := func(ev []byte) {
		t.Helper()
		var wg sync.WaitGroup
		for _, nd := range f.nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for try := 0; ; try++ {
					status, body := stripetest.Deliver(t, nd.base+"/stripe/webhook", ev, fleetWhsec, time.Now())
					if status == 200 {
						return
					}
					if status != 500 || try == 5 {
						t.Errorf("%s: %d %s", nd.name, status, body)
						return
					}
					time.Sleep(100 * time.Millisecond)
				}
			}()
		}
		wg.Wait()
	}
	paid := func(pi string) []byte {
		return stripetest.Event("evt_paid_"+pi, "checkout.session.completed", at, map[string]any{
			"id": "cs_" + pi, "object": "checkout.session", "mode": "payment", "status": "complete", "payment_status": "paid",
			"payment_intent": pi, "amount_total": 1000, "amount_subtotal": 1000, "currency": "usd", "customer": "cus_u_top",
			"client_reference_id": user,
			"metadata": map[string]string{"platform_user_id": user, "platform_service_id": fleetService,
				"platform_product_id": "packs", "platform_pack": "pack"}})
	}
	refund := func(id string, amount int64, minute int) map[string]any {
		return map[string]any{"id": id, "object": "refund", "amount": amount, "status": "succeeded",
			"created": at.Add(time.Duration(minute) * time.Minute).Unix()}
	}
	refunded := func(evt, ch, pi string, refunds ...map[string]any) []byte {
		var sum int64
		data := []any{}
		for _, r := range refunds {
			sum += r["amount"].(int64)
			data = append(data, r)
		}
		return stripetest.Event(evt, "charge.refunded", at.Add(time.Minute), map[string]any{"id": ch, "object": "charge",
			"amount": 1000, "amount_refunded": sum, "currency": "usd", "payment_intent": pi, "customer": "cus_u_top",
			"refunds": map[string]any{"object": "list", "has_more": false, "data": data}})
	}

	// The first pack, then the caller spends through both nodes while
	// everything else happens.
	both(paid("pi_top_a"))
	var served, refused atomic.Int64
	stop := make(chan struct{})
	var load sync.WaitGroup
	for i := range 8 {
		load.Add(1)
		go func() {
			defer load.Done()
			nd := f.nodes[i%len(f.nodes)]
			for {
				select {
				case <-stop:
					return
				default:
				}
				switch r := invoke(nd.base, key); {
				case r.status == 200:
					served.Add(1)
				case r.status == 402 || strings.Contains(r.code, "insufficient_credits"):
					refused.Add(1)
					time.Sleep(5 * time.Millisecond)
				default:
					t.Errorf("%s: call %d %s %v", nd.name, r.status, r.code, r.err)
					return
				}
			}
		}()
	}
	var work sync.WaitGroup
	work.Add(3)
	go func() {
		defer work.Done()
		both(paid("pi_top_b"))
		both(refunded("evt_top_r1", "ch_top_a", "pi_top_a", refund("re_top_a1", 300, 1)))
		both(refunded("evt_top_r2", "ch_top_a", "pi_top_a", refund("re_top_a1", 300, 1), refund("re_top_a2", 700, 2)))
	}()
	go func() {
		defer work.Done()
		both(paid("pi_top_b"))
		// A partial refund of the second pack, then its charge's dispute
		// lost: the dispute takes what the pack has left, 90.
		both(refunded("evt_top_rb", "ch_top_b", "pi_top_b", refund("re_top_b1", 100, 1)))
		both(stripetest.Event("evt_top_dp", "charge.dispute.closed", at.Add(2*time.Minute), map[string]any{"id": "dp_top_b",
			"object": "dispute", "amount": 900, "currency": "usd", "status": "lost", "charge": "ch_top_b", "payment_intent": "pi_top_b"}))
	}()
	go func() {
		defer work.Done()
		e2etest.AdminJSON(t, "POST", f.nodes[0].admin+"/platform/subscriptions/"+user+"/"+fleetService+"/credits", map[string]any{"amount": 50}, 200, nil)
		e2etest.AdminJSON(t, "POST", f.nodes[1].admin+"/platform/subscriptions/"+user+"/"+fleetService+"/credits", map[string]any{"amount": -20.5}, 200, nil)
	}()
	work.Wait()
	time.Sleep(300 * time.Millisecond)
	close(stop)
	load.Wait()
	t.Logf("calls served %d, refused for credits %d", served.Load(), refused.Load())
	if served.Load() == 0 {
		t.Error("no call was served while the money moved")
	}

	// The grants: each pack once, each taken back whole, by its refunds
	// and the dispute, each once.
	grants, err := st.ListCreditGrants(ctx, user, fleetService)
	if err != nil {
		t.Fatal(err)
	}
	if len(grants) != 2 {
		t.Fatalf("grants %+v, want the two packs", grants)
	}
	for _, g := range grants {
		if g.Credits != billing.Whole(100) || g.Reversed != billing.Whole(100) {
			t.Errorf("grant %s: %s granted, %s taken back, want 100 and 100", g.ID, g.Credits, g.Reversed)
		}
	}
	entries, _, err := st.ListAudit(ctx, "", 10000)
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, e := range entries {
		if e.UserID == user {
			count[e.Action]++
		}
	}
	if count["credits.grant"] != 2 || count["credits.reverse"] != 4 || count["credits.add"] != 2 {
		t.Errorf("audit entries %v, want 2 credits.grant, 4 credits.reverse (three refunds, one dispute), 2 credits.add", count)
	}

	// The balance every node reads, once the nodes gave back their
	// leases: granted less taken back, plus the corrections, less the
	// calls the ledger charged, which are the calls the backend served.
	want := func() (billing.Units, int) {
		charged := 0
		var cost billing.Units
		for _, e := range exportLedger(t, f.nodes[0], user) {
			charged++
			c, err := billing.ParseUnits(strings.Trim(string(e.Cost), `"`))
			if err != nil {
				t.Fatalf("ledger cost %s: %v", e.Cost, err)
			}
			cost += c
		}
		// Granted 200, taken back 200 (both packs whole), +50 and
		// -20.5 by the operator.
		return billing.Whole(50) - billing.Units(20_500_000) - cost, charged
	}
	var last string
	agree := func() bool {
		w, charged := want()
		ok := charged == len(f.served())
		last = fmt.Sprintf("ledger %d rows, backend served %d, want balance %s:", charged, len(f.served()), w)
		for _, nd := range f.nodes {
			// (As the CLI reads it: billing.Units reads no negative
			// quantity.)
			var sub struct{ Credits, CreditsHeld json.Number }
			e2etest.AdminJSON(t, "GET", nd.admin+"/platform/subscriptions/"+user+"/"+fleetService, nil, 200, &sub)
			last += fmt.Sprintf(" %s says %s (held %s)", nd.name, sub.Credits, sub.CreditsHeld)
			credits, err := billing.ParseStoredUnits(sub.Credits.String())
			ok = ok && err == nil && credits == w && sub.CreditsHeld.String() == "0"
		}
		return ok
	}
	for deadline := time.Now().Add(30 * time.Second); !agree(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("the books do not agree within 30s: %s", last)
			break
		}
	}
	if t.Failed() {
		f.dump()
	}
}
