package boltstore

import (
	"testing"

	"github.com/platformgw/gateway/internal/store/storetest"
)

// TestSettlementCarriesEveryLedgerField round-trips an entry with every
// field of store.LedgerFields set through a settlement record. The id is
// not written: it is derived from the sequence number (ledgerID), as the
// store assigns it.
func TestSettlementCarriesEveryLedgerField(t *testing.T) {
	want := storetest.FullLedgerEntry(t)
	want.ID = ledgerID(want.Seq)
	r := settlement{ledger: &want}
	got, err := decodeSettlement(r.encode(nil))
	if err != nil {
		t.Fatal(err)
	}
	if got.ledger == nil {
		t.Fatal("the ledger part did not come back")
	}
	storetest.CheckLedgerEntry(t, "the settlement record", *got.ledger, want)
}
