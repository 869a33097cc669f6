package store

import (
	"context"
	"errors"
	"iter"
	"time"

	"github.com/platformgw/gateway/internal/billing"
)

// Payments is what the payments integration (internal/payments, Stripe)
// keeps in the store. It is an optional interface, like RollupReader: both
// stores implement it, and storetest holds them to one contract. Nothing in
// it is on the call path.
//
// It has three parts:
//   - records: small JSON documents by kind and id (a caller's Stripe
//     customer, a processed webhook event, a payment, an invoice, a
//     subscription's Stripe id), written once, replaced whole, or
//     swapped (replaced only while unchanged since read);
//   - credit grants: prepaid credits bought with money, granted exactly
//     once by an id of the payment, taken back exactly once by the id of a
//     refund or dispute, and expired oldest first;
//   - named leases with a cursor: one holder at a time in a fleet (the
//     meter shipper), whose position survives restarts and is fenced, so a
//     holder that lost its lease cannot move the cursor.
//
// Bad input (an empty kind, id, name or holder, a limit below 1, a grant
// or reversal of no credits) is ErrBadInput and writes nothing. Every
// grant, reversal and expiry appends its audit entry (credits.grant,
// credits.reverse, credits.expire; the actor is the grant's Source, or
// "payments") with the change itself, so the caller does not audit them.
type Payments interface {
	// InsertPaymentRecord stores body under (kind, id) unless a record is
	// stored there already: then it writes nothing and returns the stored
	// body with ErrExists. This is the exactly-once claim (a webhook
	// event's id, a customer made once per user).
	InsertPaymentRecord(ctx context.Context, kind, id string, body []byte, at time.Time) ([]byte, error)
	// PutPaymentRecord stores body under (kind, id), replacing any.
	PutPaymentRecord(ctx context.Context, kind, id string, body []byte, at time.Time) error
	// SwapPaymentRecord replaces the record under (kind, id) with body
	// only while its stored body is old, byte for byte: the
	// compare-and-swap of a read-change-write that must not lose another
	// node's change made in between. A record whose body is no longer old
	// is ErrStale, and no record is ErrNotFound; both write nothing, and
	// the caller reads the record again, changes it again, and swaps
	// again.
	SwapPaymentRecord(ctx context.Context, kind, id string, old, body []byte, at time.Time) error
	// GetPaymentRecord returns the body stored under (kind, id), or
	// ErrNotFound.
	GetPaymentRecord(ctx context.Context, kind, id string) ([]byte, error)
	// ListPaymentRecords returns up to limit records of kind in id order
	// (bytewise), starting after the id `after` ("" for the first; it need
	// not be stored), and whether more follow.
	ListPaymentRecords(ctx context.Context, kind, after string, limit int) ([]PaymentRecord, bool, error)

	// GrantCredits adds g.Credits to the subscription's prepaid balance
	// and keeps the grant, in one transaction (in boltstore, one record
	// of the settlement log: a crash keeps both or neither). A grant whose
	// ID was granted before writes nothing and returns ErrReplayed with the
	// subscription as it is, whatever else it says. No subscription is
	// ErrNoAccount. g needs an ID, the subscription, Credits > 0 and
	// GrantedAt; ExpiresAt, when set, after GrantedAt; Reversed, Expired
	// and ExpiredAt zero. The subscription's UpdatedAt is not changed. A
	// grant that would take the balance past what a balance holds is
	// ErrBalanceRange and writes nothing.
	GrantCredits(ctx context.Context, g CreditGrant) (Subscription, error)
	// ReverseCredits takes back r.Credits of the grant r.GrantID (a refund
	// or a lost dispute), at most what the grant has left
	// (CreditGrant.Left: Credits - Reversed - Expired, spent or not); the
	// balance may go negative, but not past what a balance holds
	// (ErrBalanceRange, nothing written). It returns the subscription and
	// the grant after it; what it took is the change of the grant's
	// Reversed. A reversal whose ID was applied before writes nothing and
	// returns ErrReplayed with the subscription and the grant it took
	// from. An unknown grant is ErrNotFound.
	ReverseCredits(ctx context.Context, r CreditReversal) (Subscription, CreditGrant, error)
	// ExpireCredits ends every grant whose ExpiresAt <= now: it removes
	// what is left of it from the balance and records that (Expired,
	// ExpiredAt = now) on the grant, once, even when nothing is left. What
	// is left follows ExpireGrants: credits are spent oldest grant first,
	// so the balance is made of the newest grants, and credits not from a
	// grant count as spent before any. The balance is the one the store
	// holds (in pgstore, with the charges the nodes have shipped). It
	// returns the grants it expired; nodes calling it together expire each
	// grant once.
	ExpireCredits(ctx context.Context, now time.Time) ([]CreditGrant, error)
	// ListCreditGrants returns a subscription's grants oldest first
	// (OlderGrant), a user's when serviceID is empty, or every grant when
	// both are; a serviceID without a userID is ErrBadInput.
	ListCreditGrants(ctx context.Context, userID, serviceID string) ([]CreditGrant, error)

	// TakeLease gives the lease name to holder until now+ttl when it is
	// free, expired, or already the holder's (a renewal, which keeps the
	// epoch). It returns the lease as it is after the call, with its
	// cursor; Held reports whether holder has it. Each change of holder
	// (a release counts: the next take is a change) increments Epoch, so
	// an epoch names one tenure. ttl must be positive.
	TakeLease(ctx context.Context, name, holder string, ttl time.Duration, now time.Time) (Lease, error)
	// ReleaseLease gives the lease up if holder has it (the cursor stays);
	// otherwise it does nothing.
	ReleaseLease(ctx context.Context, name, holder string) error
	// PutLeaseCursor stores the cursor of the lease name, only while
	// holder holds it with epoch and it has not expired at now: otherwise
	// it writes nothing and returns ErrLeaseLost.
	PutLeaseCursor(ctx context.Context, name, holder string, epoch uint64, cursor []byte, now time.Time) error
}

// ErrLeaseLost says the lease is held by another holder (or expired and
// was taken): the caller must stop and not write what it was doing.
var ErrLeaseLost = errors.New("lease lost")

// PaymentRecord is one record of ListPaymentRecords.
type PaymentRecord struct {
	Kind      string    `json:"kind"`
	ID        string    `json:"id"`
	Body      []byte    `json:"body"`
	UpdatedAt time.Time `json:"updatedAt"`
}

// CreditGrant is prepaid credits bought with money (a Stripe payment), or
// granted by an operator with an expiry.
type CreditGrant struct {
	// ID is the grant's idempotency key: the payment's id.
	ID        string        `json:"id"`
	UserID    string        `json:"userId"`
	ServiceID string        `json:"serviceId"`
	Credits   billing.Units `json:"credits"`
	GrantedAt time.Time     `json:"grantedAt"`
	// ExpiresAt, when set, is when what is left of the grant is removed.
	ExpiresAt time.Time `json:"expiresAt,omitzero"`
	// Source says where it came from ("stripe", "console:<operator>").
	Source string `json:"source,omitempty"`
	// Reference is what the money was (a Checkout Session id, a pack name).
	Reference string `json:"reference,omitempty"`
	// Reversed is what refunds and disputes took back; Expired what the
	// expiry removed; ExpiredAt when.
	Reversed  billing.Units `json:"reversed,omitempty"`
	Expired   billing.Units `json:"expired,omitempty"`
	ExpiredAt time.Time     `json:"expiredAt,omitzero"`
	// ExpiredLater is the part of Expired removed after ExpiredAt: credits
	// held at the expiry (calls in flight, open jobs, leased blocks) that
	// those holds gave back unspent. Deferred is what the expiry left to
	// them and they have not settled yet: it expires as far as they give
	// it back, and counts as spent as far as they charge it
	// (ExpireGrantsHeld, docs/operations.md).
	ExpiredLater billing.Units `json:"expiredLater,omitempty"`
	Deferred     billing.Units `json:"deferred,omitempty"`
}

// CreditReversal takes back credits of a grant.
type CreditReversal struct {
	// ID is the reversal's idempotency key: the refund's or dispute's id.
	ID      string        `json:"id"`
	GrantID string        `json:"grantId"`
	Credits billing.Units `json:"credits"`
	At      time.Time     `json:"at"`
	Reason  string        `json:"reason,omitempty"`
}

// Lease is a named lease as TakeLease leaves it.
type Lease struct {
	Name    string    `json:"name"`
	Holder  string    `json:"holder"`
	Epoch   uint64    `json:"epoch"`
	Expires time.Time `json:"expires"`
	Cursor  []byte    `json:"cursor,omitempty"`
	// Held reports whether the caller of TakeLease holds it.
	Held bool `json:"-"`
}

// paymentPage is how many records PaymentRecords reads at a time.
const paymentPage = 500

// PaymentRecords yields p's records of kind in id order, starting after the
// id `after` ("" for the first), reading them a page at a time. A read
// that fails yields its error once and ends the sequence; breaking out of
// the loop stops the reading.
func PaymentRecords(ctx context.Context, p Payments, kind, after string) iter.Seq2[PaymentRecord, error] {
	return func(yield func(PaymentRecord, error) bool) {
		for {
			page, more, err := p.ListPaymentRecords(ctx, kind, after, paymentPage)
			if err != nil {
				yield(PaymentRecord{}, err)
				return
			}
			for _, r := range page {
				if !yield(r, nil) {
					return
				}
				after = r.ID
			}
			if !more || len(page) == 0 {
				return
			}
		}
	}
}
