package store

// LedgerField is one field of a LedgerEntry.
type LedgerField struct {
	Name string // the Go field of LedgerEntry
	JSON string // its name in the stored JSON and in the usage exports
}

// LedgerFields lists every field of a LedgerEntry, in its order: the one
// list the entry's encoders are held to. An entry is written by hand in
// five places (AppendLedgerEntryJSON and its detail variant here,
// boltstore's settlement record, the ledger's column codec, and the usage
// exports' JSON record and CSV row in internal/platform), each for speed
// or for a format of its own. Each of them has a test that fills every
// field listed here and fails when the encoder loses one
// (storetest.FullLedgerEntry, storetest.CheckLedgerEntry), and a test here
// fails when this list and LedgerEntry differ, so a field added to
// LedgerEntry fails the tests until every encoder carries it.
func LedgerFields() []LedgerField {
	return []LedgerField{
		{"Seq", "seq"},
		{"ID", "id"},
		{"Time", "time"},
		{"UserID", "userId"},
		{"ServiceID", "serviceId"},
		{"EndpointID", "endpointId"},
		{"ProductID", "productId"},
		{"RequestID", "requestId"},
		{"OccurredAt", "occurredAt"},
		{"Units", "units"},
		{"Overage", "overage"},
		{"Cost", "cost"},
		{"Source", "source"},
		{"IdempotencyKey", "idempotencyKey"},
		{"UnitsClaimed", "unitsClaimed"},
	}
}
