// Package scaletest builds what the console's and the portal's benchmarks
// at scale read (issue 27's "an overview over 10 million calls"): a
// catalog of four services, 21 users on two services each, and a month of
// ledger rows written through the ledger's own Append into a bbolt store's
// ledger directory. Test support only: nothing outside _test files
// imports it.
package scaletest

import (
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
	segledger "github.com/platformgw/gateway/internal/store/ledger"
)

// The month the calls fall in, and the console's clock: the last ten
// minutes of it, so the whole month is "this month" on the overview.
var (
	Month = time.Date(2026, time.October, 1, 0, 0, 0, 0, time.UTC)
	Now   = time.Date(2026, time.October, 30, 23, 50, 0, 0, time.UTC)
)

const Users = 21

// Catalog: four services of three endpoints each, one product each
// (per request, but writer per token).
func Catalog(tb testing.TB, secret string) *catalog.Catalog {
	tb.Helper()
	quota := billing.Whole(1_000_000_000)
	perRequest := func(id string) *billing.Product {
		return &billing.Product{ID: id, BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest,
			UnitLabel: "request", Price: billing.Whole(1) / 1000}
	}
	svc := func(id string, eps []string, p *billing.Product) *catalog.Service {
		s := &catalog.Service{ID: id, Backend: "http://127.0.0.1:9", Secrets: []string{secret}, Products: []*billing.Product{p}}
		for _, e := range eps {
			s.Endpoints = append(s.Endpoints, &catalog.Endpoint{ID: e, Path: "/" + e})
		}
		return s
	}
	cat, err := catalog.Compile([]*catalog.Service{
		svc("weather", []string{"hello", "forecast", "history"}, &billing.Product{ID: "basic", BillingModel: billing.Subscription,
			MeasurementType: billing.PerRequest, UnitLabel: "request", Quota: &quota, Period: "month", Overage: "block"}),
		svc("maps", []string{"tiles", "geocode", "route"}, perRequest("metered")),
		svc("search", []string{"query", "suggest", "index"}, perRequest("metered")),
		svc("writer", []string{"draft", "edit", "summarize"}, &billing.Product{ID: "tokens", BillingModel: billing.UsagePostpaid,
			MeasurementType: billing.PerToken, UnitLabel: "token", Price: billing.Whole(1) / 1000}),
	}, nil)
	if err != nil {
		tb.Fatal(err)
	}
	return cat
}

type Sub struct{ User, Service, Product string }

// Subs: each of the 21 users on two of the four services, 42
// subscriptions.
func Subs(cat *catalog.Catalog) []Sub {
	services := []string{"weather", "maps", "search", "writer"}
	var out []Sub
	for u := range Users {
		for _, s := range []string{services[u%4], services[(u+1)%4]} {
			svc, _ := cat.Service(s)
			out = append(out, Sub{fmt.Sprintf("user-%02d", u), s, svc.Products[0].ID})
		}
	}
	return out
}

// BuildLedger writes calls ledger rows, spread evenly over the 30
// days from Month to Now, at random over the subscriptions and their
// endpoints, into the ledger directory of the store file at path, through
// the ledger's own Append (internal/store/ledger), which is what the
// store's applier calls: it keeps the hourly rollups as the rows go in.
// Going around the store's settlement path (a Settle per call) is what
// makes 10 million rows take seconds instead of an hour; the store opened
// on the directory afterwards is an ordinary one (it numbers new rows on
// from the ledger's last). The store is built beside path (a store never
// starts at a path whose file is missing while its ledger directory is
// there) and moved into place, the ledger directory first, once whole.
func BuildLedger(tb testing.TB, path string, cat *catalog.Catalog, calls int) {
	tb.Helper()
	build := path + ".build"
	os.Remove(build) // a build cut short
	os.RemoveAll(boltstore.LedgerDir(build))
	st, err := boltstore.Open(build)
	if err != nil {
		tb.Fatal(err)
	}
	if err := st.Close(); err != nil {
		tb.Fatal(err)
	}
	defer func() {
		if tb.Failed() {
			return
		}
		if err := os.Rename(boltstore.LedgerDir(build), boltstore.LedgerDir(path)); err != nil {
			tb.Fatal(err)
		}
		if err := os.Rename(build, path); err != nil {
			tb.Fatal(err)
		}
	}()
	l, err := segledger.Open(boltstore.LedgerDir(build), segledger.Options{ManualSeal: true, Level: zstd.SpeedFastest})
	if err != nil {
		tb.Fatal(err)
	}
	subs := Subs(cat)
	eps := map[string][]string{}
	for _, s := range subs {
		svc, _ := cat.Service(s.Service)
		for _, e := range svc.Endpoints {
			eps[s.Service] = append(eps[s.Service], e.ID)
		}
	}
	rng := rand.New(rand.NewPCG(27, 27))
	step := Now.Sub(Month) / time.Duration(calls)
	const batch = 50_000
	es := make([]store.LedgerEntry, 0, batch)
	var uuid [16]byte
	var hexbuf [32]byte
	start := time.Now()
	for i := range calls {
		s := subs[rng.IntN(len(subs))]
		e := eps[s.Service][rng.IntN(len(eps[s.Service]))]
		units := billing.Whole(1)
		if s.Service == "writer" {
			units = billing.Whole(int64(200 + rng.IntN(1800)))
		}
		for j := 0; j < 16; j += 8 {
			v := rng.Uint64()
			for k := range 8 {
				uuid[j+k] = byte(v >> (8 * k))
			}
		}
		hex.Encode(hexbuf[:], uuid[:])
		seq := uint64(i + 1)
		es = append(es, store.LedgerEntry{Seq: seq, ID: "led_" + strconv.FormatUint(seq, 10),
			Time: Month.Add(time.Duration(i) * step), UserID: s.User, ServiceID: s.Service, EndpointID: e,
			ProductID: s.Product, RequestID: string(hexbuf[:]), Units: units, Cost: units / 1000, Source: store.SourceGateway})
		if len(es) == batch || i == calls-1 {
			if err := l.Append(es, seq); err != nil {
				tb.Fatal(err)
			}
			es = es[:0]
		}
	}
	appended := time.Since(start)
	if err := l.Seal(); err != nil { // else the store would seal them in the background, during the measuring
		tb.Fatal(err)
	}
	if err := l.Close(); err != nil {
		tb.Fatal(err)
	}
	tb.Logf("%d calls appended in %s, sealed %s later", calls, appended.Round(time.Second), (time.Since(start) - appended).Round(time.Second))
}
