package ops

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/storetest"
)

// TestUsageExportsCarryEveryLedgerField reads an entry with every field of
// store.LedgerFields set back from the usage exports' JSON record
// (ledgerRecord) and CSV row, each field under its JSON name, and checks
// the unitsUncharged they add.
func TestUsageExportsCarryEveryLedgerField(t *testing.T) {
	e := storetest.FullLedgerEntry(t)
	uncharged := e.Uncharged().String()

	b, err := UsageJSON(e, "EUR")
	if err != nil {
		t.Fatal(err)
	}
	var got store.LedgerEntry
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	storetest.CheckLedgerEntry(t, "the usage JSON (ledgerRecord)", got, e)
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(b, &keys); err != nil {
		t.Fatal(err)
	}
	if string(keys["unitsUncharged"]) != uncharged {
		t.Errorf("usage JSON unitsUncharged = %s, want %s", keys["unitsUncharged"], uncharged)
	}
	if string(keys["costUnit"]) != `"EUR"` {
		t.Errorf("usage JSON costUnit = %s, want the cost's currency", keys["costUnit"])
	}

	cols, row := UsageCSVColumns(), UsageCSVRow(e, "EUR")
	if len(cols) != len(row) {
		t.Fatalf("%d CSV columns, %d values", len(cols), len(row))
	}
	cell := make(map[string]string, len(cols))
	for i, c := range cols {
		cell[c] = row[i]
	}
	var fromCSV store.LedgerEntry
	v := reflect.ValueOf(&fromCSV).Elem()
	for _, f := range store.LedgerFields() {
		text, ok := cell[f.JSON]
		if !ok {
			continue // CheckLedgerEntry reports it, unless skipped
		}
		switch x := v.FieldByName(f.Name).Addr().Interface().(type) {
		case *string:
			*x = text
		case *billing.Units:
			if *x, err = billing.ParseStoredUnits(text); err != nil {
				t.Errorf("CSV %s: %v", f.JSON, err)
			}
		case *time.Time:
			if *x, err = time.Parse(time.RFC3339Nano, text); err != nil {
				t.Errorf("CSV %s: %v", f.JSON, err)
			}
		default:
			t.Errorf("CSV column %s: no reader for %T", f.JSON, x)
		}
	}
	// The CSV has never had a seq column: its rows come in ledger order
	// and the id names each; adding one would change the export.
	storetest.CheckLedgerEntry(t, "the usage CSV row (UsageCSVRow)", fromCSV, e, "Seq")
	if cell["unitsUncharged"] != uncharged {
		t.Errorf("usage CSV unitsUncharged = %q, want %s", cell["unitsUncharged"], uncharged)
	}
	if cell["costUnit"] != "EUR" {
		t.Errorf("usage CSV costUnit = %q, want the cost's currency", cell["costUnit"])
	}
}

// TestCostUnit: a prepaid product's cost is in credits, another's in its
// listing's currency; a product the catalog no longer has says nothing
// rather than guess.
func TestCostUnit(t *testing.T) {
	cat, err := catalog.Compile([]*catalog.Service{{ID: "weather", Backend: "http://127.0.0.1:9", Secrets: []string{"s3cret-s3cret-s3cret-s3cret-0001"},
		Endpoints: []*catalog.Endpoint{{ID: "forecast", Path: "/forecast"}},
		Products: []*billing.Product{
			{ID: "credits", BillingModel: billing.Prepaid, MeasurementType: billing.PerRequest, Price: billing.Whole(1)},
			{ID: "metered", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest, Price: billing.Whole(1) / 100},
		},
		ProductListings: []*catalog.ProductListing{{Product: "metered", Currency: "EUR"}},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ service, product, want string }{
		{"weather", "credits", "credits"}, {"weather", "metered", "EUR"}, {"weather", "gone", ""}, {"gone", "metered", ""},
	} {
		if got := CostUnit(cat, tc.service, tc.product); got != tc.want {
			t.Errorf("CostUnit(%s, %s) = %q, want %q", tc.service, tc.product, got, tc.want)
		}
	}
}
