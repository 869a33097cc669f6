package boltstore

// The ledger rows of a store written before the ledger directory (internal/store/ledger):
// JSON in the ledger bucket of the store file. Nothing writes them any more;
// the migration tests (ledgerdir_test.go) build old stores with them, and
// Open moves such rows into the ledger directory (ledger.go).

import (
	"encoding/json"
	"strconv"
	"time"
	"unicode/utf8"

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

// encodeLedger writes a ledger row as json.Marshal writes toLedgerRecord(e),
// without reflection, as the store wrote every metered call and report
// into the ledger bucket.
func encodeLedger(e store.LedgerEntry) ([]byte, error) {
	for _, s := range []string{e.ID, e.UserID, e.ServiceID, e.EndpointID, e.ProductID, e.RequestID, e.Source, e.IdempotencyKey} {
		if !utf8.ValidString(s) {
			return json.Marshal(toLedgerRecord(e))
		}
	}
	b := make([]byte, 0, 256+len(e.UserID)+len(e.ServiceID)+len(e.EndpointID)+len(e.ProductID)+len(e.RequestID)+
		len(e.IdempotencyKey))
	b = append(b, `{"seq":`...)
	b = strconv.AppendUint(b, e.Seq, 10)
	b = append(b, `,"id":`...)
	b = appendJSONString(b, e.ID)
	b = append(b, `,"time":`...)
	var err error
	if b, err = appendJSONTime(b, e.Time); err != nil {
		return nil, err
	}
	b = append(b, `,"userId":`...)
	b = appendJSONString(b, e.UserID)
	b = append(b, `,"serviceId":`...)
	b = appendJSONString(b, e.ServiceID)
	if e.EndpointID != "" {
		b = append(b, `,"endpointId":`...)
		b = appendJSONString(b, e.EndpointID)
	}
	if e.ProductID != "" {
		b = append(b, `,"productId":`...)
		b = appendJSONString(b, e.ProductID)
	}
	if e.RequestID != "" {
		b = append(b, `,"requestId":`...)
		b = appendJSONString(b, e.RequestID)
	}
	if !e.OccurredAt.IsZero() {
		b = append(b, `,"occurredAt":`...)
		if b, err = appendJSONTime(b, e.OccurredAt); err != nil {
			return nil, err
		}
	}
	b = append(b, `,"units":`...)
	b = append(b, e.Units.String()...)
	if e.Overage != 0 {
		b = append(b, `,"overage":`...)
		b = append(b, e.Overage.String()...)
	}
	if e.Cost != 0 {
		b = append(b, `,"cost":`...)
		b = append(b, e.Cost.String()...)
	}
	b = append(b, `,"source":`...)
	b = appendJSONString(b, e.Source)
	if e.IdempotencyKey != "" {
		b = append(b, `,"idempotencyKey":`...)
		b = appendJSONString(b, e.IdempotencyKey)
	}
	if e.UnitsClaimed != 0 {
		b = append(b, `,"unitsClaimed":`...)
		b = append(b, e.UnitsClaimed.String()...)
	}
	return append(b, '}'), nil
}
