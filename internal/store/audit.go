package store

import (
	"fmt"

	"github.com/platformgw/gateway/internal/billing"
)

// WithBalance is es with ", balance <balance>" after each one's Detail:
// the entries of an AddCredits, completed by the store with the balance
// the change left.
func WithBalance(es []AuditEntry, balance billing.Units) []AuditEntry {
	if len(es) == 0 {
		return nil
	}
	out := make([]AuditEntry, len(es))
	for i, e := range es {
		e.Detail += ", balance " + balance.String()
		out[i] = e
	}
	return out
}

// WithPruned is es with ": <segments> segments, <rows> rows, <bytes>
// bytes removed" after each one's Detail: the entries of a PruneLedger,
// completed by the store with what it removes.
func WithPruned(es []AuditEntry, res PruneResult) []AuditEntry {
	if len(es) == 0 {
		return nil
	}
	out := make([]AuditEntry, len(es))
	for i, e := range es {
		e.Detail += fmt.Sprintf(": %d segments, %d rows, %d bytes removed", res.Segments, res.Rows, res.Bytes)
		out[i] = e
	}
	return out
}
