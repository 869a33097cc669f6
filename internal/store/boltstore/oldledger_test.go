package boltstore

// The ledger rows of a store written before the ledger directory (internal/store/ledger):
// JSON in the ledger bucket of the store file. Nothing writes them any more;
// the migration tests (ledgerdir_test.go) build old stores with them, and
// Open moves such rows into the ledger directory (ledger.go).

import (
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// ledgerRecord is a ledger row as the ledger bucket held it (encodeLedger
// writes the same JSON by hand).
type ledgerRecord struct {
	Seq            uint64    `json:"seq"`
	ID             string    `json:"id"`
	Time           time.Time `json:"time"`
	UserID         string    `json:"userId"`
	ServiceID      string    `json:"serviceId"`
	EndpointID     string    `json:"endpointId,omitempty"`
	ProductID      string    `json:"productId,omitempty"`
	RequestID      string    `json:"requestId,omitempty"`
	OccurredAt     time.Time `json:"occurredAt,omitzero"`
	Units          amount    `json:"units"`
	Overage        amount    `json:"overage,omitempty"`
	Cost           amount    `json:"cost,omitempty"`
	Source         string    `json:"source"`
	IdempotencyKey string    `json:"idempotencyKey,omitempty"`
	UnitsClaimed   amount    `json:"unitsClaimed,omitempty"`
}

func toLedgerRecord(e store.LedgerEntry) ledgerRecord {
	return ledgerRecord{Seq: e.Seq, ID: e.ID, Time: e.Time, UserID: e.UserID, ServiceID: e.ServiceID,
		EndpointID: e.EndpointID, ProductID: e.ProductID, RequestID: e.RequestID, OccurredAt: e.OccurredAt,
		Units: amount(e.Units), Overage: amount(e.Overage), Cost: amount(e.Cost), Source: e.Source,
		IdempotencyKey: e.IdempotencyKey, UnitsClaimed: amount(e.UnitsClaimed)}
}

func (r ledgerRecord) entry() store.LedgerEntry {
	return store.LedgerEntry{Seq: r.Seq, ID: r.ID, Time: r.Time, UserID: r.UserID, ServiceID: r.ServiceID,
		EndpointID: r.EndpointID, ProductID: r.ProductID, RequestID: r.RequestID, OccurredAt: r.OccurredAt,
		Units: billing.Units(r.Units), Overage: billing.Units(r.Overage), Cost: billing.Units(r.Cost),
		Source: r.Source, IdempotencyKey: r.IdempotencyKey, UnitsClaimed: billing.Units(r.UnitsClaimed)}
}

// encodeLedger writes a ledger row as the store wrote every metered call
// and report into the ledger bucket: json.Marshal(toLedgerRecord(e)), the
// JSON of a store.LedgerEntry.
func encodeLedger(e store.LedgerEntry) ([]byte, error) {
	return store.AppendLedgerEntryJSON(make([]byte, 0, 256), &e)
}
