package payments_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/payments"
	"github.com/platformgw/gateway/internal/store"
)

// TestMeterAddedByReloadSendsOnlyWhatFollows: an operator moves the
// product payg from prepaid credits to postpaid billing through Stripe (a
// config reload: billing USAGE_POSTPAID, a `meter` line), with the shipper
// running for another product for a while already. The shipper looked back
// up to 35 days for every metered product, so the credits payg's callers
// had spent before the reload went to Stripe as money (their cost, in
// credits, sent as millionths of USD): paid twice, once in credits and
// once on the invoice. The same for a meter added to a postpaid product
// billed some other way until then. Only the usage from the moment the
// product is metered may go, the rows of the hour it happens in included.
func TestMeterAddedByReloadSendsOnlyWhatFollows(t *testing.T) {
	e := newMeterEnv(t, openBolt(t, filepath.Join(t.TempDir(), "gw.db")))
	prepaid := postpaid
	prepaid.BillingModel = billing.Prepaid
	service := func(payg billing.Product, meterPayg bool, node string) *payments.Service {
		return meterReloadService(t, e, payg, meterPayg, node)
	}
	e.subscribe("ann", prepaid)
	e.customer("ann", "cus_ann")

	before := service(prepaid, false, "node-a")
	if run := ship(t, before); !run.Leader { // the shipper runs from now on, for pro
		t.Fatalf("the first run: %+v", run)
	}
	e.clock.Add(24 * time.Hour)                                    // the next day, 09:10
	e.report("ann", prepaid, 40, e.clock.Now().Add(-20*time.Hour)) // credits, yesterday
	e.report("ann", prepaid, 5, e.clock.Now().Add(10*time.Minute)) // credits, at 09:20
	e.clock.Add(20 * time.Minute)
	if run := ship(t, before); run.Sent != 0 {
		t.Fatalf("credits sent to a meter: %+v", run)
	}

	// The reload, at 09:34: payg is postpaid and metered from now on.
	e.clock.Add(4 * time.Minute) // the old config's lease (3 meter intervals) has run out
	after := service(postpaid, true, "node-b")
	if run := ship(t, after); !run.Leader {
		t.Fatalf("the run after the reload did not take the lease: %+v", run)
	}
	e.clock.Add(10 * time.Minute)
	e.report("ann", postpaid, 3, e.clock.Now())                // 09:44: 0.006 USD
	e.report("ann", postpaid, 2, e.clock.Now().Add(time.Hour)) // 10:44: 0.004 USD
	e.clock.Add(3 * time.Hour)
	ship(t, after)
	if got := sums(t, stripeSaw(t, e.mock))["cus_ann"]; got != 10000 {
		t.Errorf("Stripe was sent %d millionths of USD for ann, want 10000: the 0.01 of postpaid usage since the meter was added, "+
			"not the credits spent before it (0.08 and 0.01)", got)
	}
}

// TestMeterRemovedAndAddedBackSkipsTheCreditsBetween: payg is postpaid
// and metered; the operator moves it to prepaid credits (its meter line
// goes) for a day, then back to postpaid with its meter. The shipper kept
// the product's first metered-since for good (so that a fleet's rolling
// change never restarts it), so the run after the meter came back looked
// back over the prepaid day too and sent the credits spent then to Stripe
// as money: paid twice, in credits and on the invoice. Only the usage of
// the hours the product was metered may go.
func TestMeterRemovedAndAddedBackSkipsTheCreditsBetween(t *testing.T) {
	e := newMeterEnv(t, openBolt(t, filepath.Join(t.TempDir(), "gw.db")))
	prepaid := postpaid
	prepaid.BillingModel = billing.Prepaid
	service := func(payg billing.Product, meterPayg bool, node string) *payments.Service {
		return meterReloadService(t, e, payg, meterPayg, node)
	}
	e.subscribe("ann", postpaid)
	e.customer("ann", "cus_ann")

	metered := service(postpaid, true, "node-a")
	if run := ship(t, metered); !run.Leader {
		t.Fatalf("the first run: %+v", run)
	}
	e.clock.Add(10 * time.Minute)
	e.report("ann", postpaid, 3, e.clock.Now()) // 0.006 USD, metered
	e.clock.Add(2 * time.Hour)
	ship(t, metered)

	// The reload: payg is prepaid, its meter gone, for a day.
	e.clock.Add(4 * time.Minute) // the old config's lease has run out
	credits := service(prepaid, false, "node-b")
	if run := ship(t, credits); !run.Leader {
		t.Fatalf("the run of the prepaid config did not take the lease: %+v", run)
	}
	e.subscribe("ann", prepaid)
	e.clock.Add(time.Hour)
	e.report("ann", prepaid, 40, e.clock.Now()) // credits
	e.clock.Add(3 * time.Hour)
	e.report("ann", prepaid, 5, e.clock.Now()) // credits
	e.clock.Add(20 * time.Hour)
	ship(t, credits)

	// Back to postpaid, with its meter.
	e.clock.Add(4 * time.Minute)
	again := service(postpaid, true, "node-c")
	if run := ship(t, again); !run.Leader {
		t.Fatalf("the run after the meter came back did not take the lease: %+v", run)
	}
	e.subscribe("ann", postpaid)
	e.clock.Add(10 * time.Minute)
	e.report("ann", postpaid, 2, e.clock.Now()) // 0.004 USD, metered
	e.clock.Add(3 * time.Hour)
	ship(t, again)
	if run := ship(t, again); run.Sent != 0 {
		t.Errorf("a second run sent %d more events", run.Sent)
	}
	if got := sums(t, stripeSaw(t, e.mock))["cus_ann"]; got != 10000 {
		t.Errorf("Stripe was sent %d millionths of USD for ann, want 10000: the 0.006 and 0.004 of metered usage, "+
			"not the credits spent while payg was prepaid (0.08 and 0.01)", got)
	}
}

// meterReloadService is node's payments service over e's store for the
// catalog of service geo with payg (as given: prepaid or postpaid) and
// pro, payg's meter line configured only when meterPayg: the config a
// reload that adds or removes payg's meter leaves.
func meterReloadService(t *testing.T, e *meterEnv, payg billing.Product, meterPayg bool, node string) *payments.Service {
	t.Helper()
	p1, p2 := payg, plan
	cat, err := catalog.Compile([]*catalog.Service{{ID: "geo", Backend: "http://127.0.0.1:9", Secrets: []string{"s3cret-s3cret-s3cret-s3cret-0001"},
		Endpoints: []*catalog.Endpoint{{ID: "lookup", Path: "/lookup"}},
		Products:  []*billing.Product{&p1, &p2},
		ProductListings: []*catalog.ProductListing{{Product: "payg", Currency: "USD"},
			{Product: "pro", Currency: "USD"}},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := e.config()
	if !meterPayg {
		cfg.Prices = cfg.Prices[1:] // the pro meter only
	}
	if err := cfg.Validate(cat); err != nil {
		t.Fatal(err)
	}
	s, err := payments.New(cfg, payments.Deps{Store: func() store.Store { return e.st }, Catalog: cat, Now: e.clock.Now, NodeID: node})
	if err != nil {
		t.Fatal(err)
	}
	return s
}
