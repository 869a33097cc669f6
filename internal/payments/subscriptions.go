package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/stripe/stripe-go/v82"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/subscription"
)

// Subscriptions follow payment: the webhooks of a Stripe subscription
// (and of its invoices) set the gateway subscription of its user to its
// service (docs/payments.md, "Subscriptions"):
//
//	Stripe                        gateway
//	active                        ACTIVE
//	active, cancel at period end  CANCELLING, CANCELLED from the period's end
//	trialing                      TRIAL, EXPIRED from trial_end + past_due_grace (CANCELLED if cancelling)
//	past_due                      ACTIVE, SUSPENDED from past_due_grace after it became past due
//	unpaid, paused                SUSPENDED
//	canceled                      EXPIRED
//	incomplete                    nothing yet (the first payment is not made)
//	incomplete_expired            nothing (it never gave access)
//
// The ends are the subscription's EndsAt and EndStatus, which the call
// checks itself: a subscription past its grace is refused at the call,
// on every node, whether or not the sweep has tidied its status.
//
// Out of order: the SubscriptionRecord of each Stripe subscription keeps
// the creation time of the newest event applied; an older event changes
// nothing, and one as old (Stripe's events of one second) makes the
// gateway ask Stripe for the subscription and apply that.

// More record kinds.
const (
	// KindSubscriptionOf: which Stripe subscription holds a gateway
	// subscription, by "<service>/<user>": an ended Stripe subscription
	// never ends the gateway subscription a newer one holds.
	KindSubscriptionOf = "stripe_subscription_of"
)

// The audit actions of this file; the actor is "stripe".
const (
	AuditSubscriptionStripe = ops.AuditSubscriptionStripe
	AuditInvoiceStripe      = "invoice.stripe"
)

func init() {
	checkoutByMode[stripe.CheckoutSessionModeSubscription] = onSubscriptionCheckout
	for _, t := range []stripe.EventType{stripe.EventTypeCustomerSubscriptionCreated,
		stripe.EventTypeCustomerSubscriptionUpdated, stripe.EventTypeCustomerSubscriptionDeleted} {
		handle(t, onSubscriptionEvent)
	}
	handle(stripe.EventTypeInvoicePaid, onInvoiceEvent)
	handle(stripe.EventTypeInvoicePaymentFailed, onInvoiceEvent)
	// An invoice the operator voided or wrote off in Stripe: recorded
	// so, not left open with its payment failed.
	handle(stripe.EventTypeInvoiceVoided, onInvoiceEvent)
	handle(stripe.EventTypeInvoiceMarkedUncollectible, onInvoiceEvent)
}

// listedSkew is how far the clocks of the nodes, and Stripe's, may be
// apart for state.listedAt: a record changed that long before a list
// began still has the subscription read again.
const listedSkew = 5 * time.Second

// subTurns makes a node apply one subscription change of a Stripe
// customer (a user) at a time, and the store's lease (holdSubscription)
// one node of a fleet at a time: they spare the read-decide-write of a
// SubscriptionRecord its retries. What keeps the newest event's state
// when two changes interleave anyway (a node stalled past its lease) is
// that the record and its link are swapped, not put (applyState). The
// turn is the customer's, not the node's: an invoice event reads its
// subscription from Stripe in its turn, and a Stripe slow to answer for
// one customer holds up no other customer's events.
var subTurns keyedMutex

// keyedMutex is a mutex per key, kept only while held or waited for.
type keyedMutex struct {
	mu    sync.Mutex
	locks map[string]*keyedLock
}

type keyedLock struct {
	sync.Mutex
	refs int
}

// Lock takes key's mutex and returns its unlock.
func (k *keyedMutex) Lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = make(map[string]*keyedLock)
	}
	l := k.locks[key]
	if l == nil {
		l = new(keyedLock)
		k.locks[key] = l
	}
	l.refs++
	k.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		k.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}

// invoiceMu makes a node change one invoice record at a time. An invoice
// event (putInvoice) and a refund or lost dispute of it
// (invoiceMoneyBack) each read the record and write it back with their
// change; what keeps both changes, on one node or across the nodes of a
// fleet, is that the write is a swap (store.Payments.SwapPaymentRecord):
// it lands only while the record is still the one read, and otherwise the
// change is read, made and swapped again (swapAgain, up to recordSwaps
// times). The record's
// first write is an insert, so two first writes on two nodes keep one and
// change it with the other. The mutex only spares a node's own events
// those retries.
var invoiceMu sync.Mutex

// state is what the gateway applies of a Stripe subscription.
type state struct {
	ID, Customer      string
	Status            stripe.SubscriptionStatus
	CancelAtPeriodEnd bool
	CancelAt          time.Time
	TrialEnd          time.Time
	PeriodEnd         time.Time
	// StartDate is when Stripe started the subscription; PeriodStart,
	// Anchor, Interval and IntervalCount place its billing periods.
	StartDate, PeriodStart, Anchor time.Time
	// Created is when the subscription was made at Stripe (its
	// created): of two live ones of a user and service, the later made
	// holds the gateway subscription (boughtAfter).
	Created       time.Time
	Interval      string
	IntervalCount int64
	Prices        []string
	Meta          map[string]string
	// fetched: read from Stripe now, not taken from an event.
	fetched bool
	// listedAt: when a fetched state's read from Stripe began, for one
	// read before its record was (a resync lists first, then applies):
	// a record written after about that time is newer than it may be,
	// and the subscription is read from Stripe again (decideState).
	listedAt time.Time
	// fetch: only ID and Customer are known; applyState reads the rest
	// from Stripe (and it is then fetched).
	fetch bool
	// fromRecord: only ID and Customer are known; applyState applies
	// the subscription's record as it stands, if it still grants access
	// (handOver: the one that held the gateway subscription ended).
	fromRecord bool
}

func stateOf(sub *stripe.Subscription) state {
	st := state{ID: sub.ID, Status: sub.Status, CancelAtPeriodEnd: sub.CancelAtPeriodEnd,
		CancelAt: unix(sub.CancelAt), TrialEnd: unix(sub.TrialEnd), StartDate: unix(sub.StartDate),
		Created: unix(sub.Created), Anchor: unix(sub.BillingCycleAnchor), Meta: sub.Metadata}
	if sub.Customer != nil {
		st.Customer = sub.Customer.ID
	}
	if sub.Items != nil {
		for _, it := range sub.Items.Data {
			if it == nil {
				continue
			}
			if it.Price != nil && it.Price.ID != "" {
				st.Prices = append(st.Prices, it.Price.ID)
			}
			if e := unix(it.CurrentPeriodEnd); e.After(st.PeriodEnd) {
				st.PeriodEnd, st.PeriodStart = e, unix(it.CurrentPeriodStart)
			}
			if st.Interval == "" && it.Price != nil && it.Price.Recurring != nil && it.Price.Recurring.Interval != "" {
				st.Interval, st.IntervalCount = string(it.Price.Recurring.Interval), it.Price.Recurring.IntervalCount
			}
		}
	}
	return st
}

func unix(s int64) time.Time {
	if s <= 0 {
		return time.Time{}
	}
	return time.Unix(s, 0).UTC()
}

// target is the gateway subscription a state maps to.
type target struct {
	Status    subscription.Status
	EndsAt    time.Time
	EndStatus subscription.Status
	// none: the state sets nothing (incomplete).
	none bool
}

// mapStatus maps a Stripe state to the gateway's; pastDueSince is when
// it became past due.
func mapStatus(st state, pastDueSince time.Time, grace time.Duration) target {
	cancelEnd := func() time.Time {
		if !st.CancelAt.IsZero() {
			return st.CancelAt
		}
		return st.PeriodEnd
	}
	switch st.Status {
	case stripe.SubscriptionStatusActive:
		if st.CancelAtPeriodEnd || !st.CancelAt.IsZero() {
			return target{Status: subscription.Cancelling, EndsAt: cancelEnd(), EndStatus: subscription.Cancelled}
		}
		return target{Status: subscription.Active}
	case stripe.SubscriptionStatusTrialing:
		// The trial ends past_due_grace after trial_end: the event that
		// the first payment went through (active) may come late, and a
		// caller paying by then must not be refused meanwhile. A failed
		// first payment ends it through its own events (past_due,
		// canceled).
		t := target{Status: subscription.Trial, EndStatus: subscription.Expired}
		if !st.TrialEnd.IsZero() {
			t.EndsAt = st.TrialEnd.Add(grace)
		}
		if end := cancelEnd(); (st.CancelAtPeriodEnd || !st.CancelAt.IsZero()) && (t.EndsAt.IsZero() || !end.IsZero() && !end.After(t.EndsAt)) {
			t.EndsAt, t.EndStatus = end, subscription.Cancelled
		}
		return t
	case stripe.SubscriptionStatusPastDue:
		t := target{Status: subscription.Active, EndsAt: pastDueSince.Add(grace), EndStatus: subscription.Suspended}
		if st.CancelAtPeriodEnd || !st.CancelAt.IsZero() {
			t.Status = subscription.Cancelling
			if end := cancelEnd(); !end.IsZero() && end.Before(t.EndsAt) {
				t.EndsAt, t.EndStatus = end, subscription.Cancelled
			}
		}
		return t
	case stripe.SubscriptionStatusUnpaid, stripe.SubscriptionStatusPaused:
		return target{Status: subscription.Suspended}
	case stripe.SubscriptionStatusCanceled:
		return target{Status: subscription.Expired}
	}
	// incomplete (the first payment not made yet) and incomplete_expired
	// (it never was) set nothing: such a subscription never gave access,
	// so its end takes none away. Mapped to EXPIRED, a caller on another
	// plan (free, prepaid, assigned by the operator) who opened Checkout
	// for a paid one and did not pay lost the plan they had.
	return target{none: true}
}

// ident is whose a Stripe subscription is in the gateway.
type ident struct{ User, Service, Product string }

// productOfPrices is the configured product one of the prices is the
// recurring (or metered) Price of.
func (s *Service) productOfPrices(prices []string) (service, product string, ok bool) {
	for _, id := range prices {
		for _, p := range s.cfg.Prices {
			if id != "" && (p.Price == id) {
				return p.Service, p.Product, true
			}
		}
	}
	for _, id := range prices {
		for _, p := range s.cfg.Prices {
			if id != "" && p.MeteredPrice == id {
				return p.Service, p.Product, true
			}
		}
	}
	return "", "", false
}

func (s *Service) getSubRecord(ctx context.Context, pay store.Payments, id string) (SubscriptionRecord, bool, error) {
	b, err := pay.GetPaymentRecord(ctx, KindSubscription, id)
	if errors.Is(err, store.ErrNotFound) {
		return SubscriptionRecord{}, false, nil
	}
	if err != nil {
		return SubscriptionRecord{}, false, err
	}
	var rec SubscriptionRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return SubscriptionRecord{}, false, fmt.Errorf("payments: the record of subscription %s does not read: %w", id, err)
	}
	return rec, true, nil
}

// onSubscriptionEvent applies customer.subscription.created, .updated
// and .deleted.
func onSubscriptionEvent(s *Service, ctx context.Context, ev *stripe.Event) error {
	var sub stripe.Subscription
	if err := decodeObject(ev, &sub); err != nil {
		return badEvent("%s: the subscription does not parse: %v", ev.Type, err)
	}
	if sub.ID == "" {
		return badEvent("%s: the subscription has no id", ev.Type)
	}
	st := stateOf(&sub)
	fillLegacySubscription(&st, ev.Data.Raw) // legacy.go
	return s.applyState(ctx, st, unix(ev.Created), nil)
}

// onSubscriptionCheckout links the subscription a completed Checkout
// made to the user, service and product it was started for. It sets no
// status: the subscription's own events do, in whichever order they
// come, before or after this one.
func onSubscriptionCheckout(s *Service, ctx context.Context, ev *stripe.Event) error {
	var cs stripe.CheckoutSession
	if err := decodeObject(ev, &cs); err != nil {
		return badEvent("checkout.session.completed: the session does not parse: %v", err)
	}
	pay, err := s.Payments()
	if err != nil {
		return err
	}
	_, _, err = s.linkCheckout(ctx, pay, &cs)
	return err
}

// linkCheckout is onSubscriptionCheckout's work on a completed
// subscription Checkout, whether its event brought it or a click read
// it from Stripe before the event came (applyPaidCheckout): it records
// the session's subscription as the user's, of the service and product
// the Checkout was started for, and returns whose it is and its
// customer. Linked already (by its own events, another delivery, or a
// click on any node), it changes nothing; of two first links at once
// (two nodes) the store's insert keeps one, and only that one is
// audited.
func (s *Service) linkCheckout(ctx context.Context, pay store.Payments, cs *stripe.CheckoutSession) (ident, string, error) {
	if cs.Subscription == nil || cs.Subscription.ID == "" {
		return ident{}, "", badEvent("checkout.session.completed %s: a subscription Checkout without a subscription", cs.ID)
	}
	cust, user, err := s.sessionUser(ctx, pay, cs)
	if err != nil {
		return ident{}, "", err
	}
	id := ident{User: user, Service: cs.Metadata[MetaService], Product: cs.Metadata[MetaProduct]}
	if mu := cs.Metadata[MetaUser]; mu != "" && mu != user || cs.ClientReferenceID != "" && cs.ClientReferenceID != user {
		return ident{}, "", badEvent("checkout.session.completed %s: started for another user than its customer's", cs.ID)
	}
	if !s.Sells(id.Service, id.Product) {
		return ident{}, "", badEvent("checkout.session.completed %s: service %q product %q has no Stripe price here", cs.ID, id.Service, id.Product)
	}
	rec, found, err := s.getSubRecord(ctx, pay, cs.Subscription.ID)
	if err != nil {
		return ident{}, "", err
	}
	if found {
		if rec.UserID != user || rec.ServiceID != id.Service {
			return ident{}, "", badEvent("checkout.session.completed %s: subscription %s belongs to another user or service", cs.ID, cs.Subscription.ID)
		}
		return id, cust, nil // linked already: its own events came first
	}
	// Linked; its state comes with its own events
	// (customer.subscription.created and after), whatever their order.
	body, _ := json.Marshal(SubscriptionRecord{ID: cs.Subscription.ID, UserID: user, ServiceID: id.Service,
		ProductID: id.Product, CustomerID: cust, UpdatedAt: s.now().UTC()})
	if _, err := pay.InsertPaymentRecord(ctx, KindSubscription, cs.Subscription.ID, body, s.now()); errors.Is(err, store.ErrExists) {
		return id, cust, nil // linked by another node meanwhile, which audited it
	} else if err != nil {
		return ident{}, "", err
	}
	s.audit(ctx, AuditSubscriptionStripe, user, id.Service, fmt.Sprintf("Checkout %s completed: Stripe subscription %s of product %s is %s's", cs.ID, cs.Subscription.ID, id.Product, user))
	return id, cust, nil
}

// onInvoiceEvent records an invoice.paid or invoice.payment_failed and
// applies its subscription as Stripe has it now. The invoice alone does
// not say the subscription's status: an older invoice paid while a newer
// one is still due leaves it past due, and a failed retry of a
// subscription that is paid by now leaves it active. So the subscription
// is read from Stripe and applied as read (a fetched state: the newest
// there is), stamped with the event's time.
func onInvoiceEvent(s *Service, ctx context.Context, ev *stripe.Event) error {
	var inv stripe.Invoice
	if err := decodeObject(ev, &inv); err != nil {
		return badEvent("%s: the invoice does not parse: %v", ev.Type, err)
	}
	if inv.ID == "" {
		return badEvent("%s: the invoice has no id", ev.Type)
	}
	fillLegacyInvoice(&inv, ev.Data.Raw) // legacy.go
	pay, err := s.Payments()
	if err != nil {
		return err
	}
	cust := ""
	if inv.Customer != nil {
		cust = inv.Customer.ID
	}
	user, err := s.userOfCustomer(ctx, pay, cust)
	if err != nil {
		return err
	}
	id, subID, err := s.invoiceIdent(ctx, pay, &inv, user)
	if err != nil {
		return err
	}
	found := false
	if subID != "" {
		if _, found, err = s.getSubRecord(ctx, pay, subID); err != nil {
			return err
		}
	}
	if err := s.putInvoice(ctx, pay, &inv, id, subID, cust); err != nil {
		return err
	}
	if !found {
		return nil // the subscription's own events will set it
	}
	// Read from Stripe by applyState, after it read the record it swaps:
	// read here, before, a newer event applied meanwhile (another node's,
	// or this one's while this waited for the subscription) would be
	// written over with the older state Stripe gave (applyState).
	st := state{ID: subID, Customer: cust, fetch: true}
	return s.applyState(ctx, st, unix(ev.Created), &id)
}

// invoiceIdent is whose an invoice is: the user, and the service and
// product of its subscription as recorded, or of its prices, or of its
// subscription's metadata; an invoice of none is a badEvent.
func (s *Service) invoiceIdent(ctx context.Context, pay store.Payments, inv *stripe.Invoice, user string) (ident, string, error) {
	subID := ""
	var meta map[string]string
	if inv.Parent != nil && inv.Parent.SubscriptionDetails != nil {
		meta = inv.Parent.SubscriptionDetails.Metadata
		if inv.Parent.SubscriptionDetails.Subscription != nil {
			subID = inv.Parent.SubscriptionDetails.Subscription.ID
		}
	}
	id := ident{User: user}
	if subID != "" {
		rec, found, err := s.getSubRecord(ctx, pay, subID)
		if err != nil {
			return id, subID, err
		}
		if found {
			id.Service, id.Product = rec.ServiceID, rec.ProductID
			return id, subID, nil
		}
	}
	var prices []string
	if inv.Lines != nil {
		for _, l := range inv.Lines.Data {
			if l != nil && l.Pricing != nil && l.Pricing.PriceDetails != nil {
				prices = append(prices, l.Pricing.PriceDetails.Price)
			}
		}
	}
	var ok bool
	if id.Service, id.Product, ok = s.productOfPrices(prices); ok {
		return id, subID, nil
	}
	if s.Sells(meta[MetaService], meta[MetaProduct]) {
		id.Service, id.Product = meta[MetaService], meta[MetaProduct]
		return id, subID, nil
	}
	return id, subID, badEvent("invoice %s: no configured product has its price", inv.ID)
}

// putInvoice keeps the invoice for the console and the portal. A paid
// or voided invoice stays so, and a written-off one is not open again:
// an older payment_failed delivered late does not make it open again
// (invoiceMayBecome).
func (s *Service) putInvoice(ctx context.Context, pay store.Payments, inv *stripe.Invoice, id ident, subID, cust string) error {
	invoiceMu.Lock()
	defer invoiceMu.Unlock()
	r := InvoiceRecord{ID: inv.ID, UserID: id.User, ServiceID: id.Service, ProductID: id.Product, CustomerID: cust,
		SubscriptionID: subID, Status: string(inv.Status), AmountDue: inv.AmountDue, AmountPaid: inv.AmountPaid,
		Currency: strings.ToUpper(string(inv.Currency)), PeriodStart: unix(inv.PeriodStart), PeriodEnd: unix(inv.PeriodEnd),
		HostedURL: inv.HostedInvoiceURL, PDFURL: inv.InvoicePDF, UpdatedAt: s.now().UTC()}
	if inv.StatusTransitions != nil {
		r.PaidAt = unix(inv.StatusTransitions.PaidAt)
	}
	if r.Status == "" {
		r.Status = "open"
	}
	for try := 1; ; try++ {
		b, err := pay.GetPaymentRecord(ctx, KindInvoice, inv.ID)
		if errors.Is(err, store.ErrNotFound) {
			// The first record of the invoice: inserted, not put, so that
			// another node recording it at the same moment (its invoice
			// event here, its refund's there, invoiceKept) cannot be
			// written over. The loser changes the winner's record.
			body, _ := json.Marshal(r)
			if b, err = pay.InsertPaymentRecord(ctx, KindInvoice, inv.ID, body, s.now()); err == nil {
				s.auditInvoice(ctx, id, inv.ID, r)
				return nil
			}
			if !errors.Is(err, store.ErrExists) {
				return err
			}
		} else if err != nil {
			return err
		}
		w := r
		var old InvoiceRecord
		back := false // what went back grew, summed against what was paid now
		if json.Unmarshal(b, &old) == nil {
			if !invoiceMayBecome(old.Status, w.Status) {
				return nil
			}
			// What went back since stays recorded (invoiceMoneyBack),
			// and is summed again: a refund or lost dispute recorded
			// while the record said less was paid (an open invoice whose
			// first charge failed, its retry's charge refunded before
			// invoice.paid came) was held to that.
			w.Refunded, w.Disputed = old.Refunded, old.Disputed
			w.RefundedBy, w.DisputedBy = old.RefundedBy, old.DisputedBy
			w.RefundedBefore, w.DisputedBefore = old.RefundedBefore, old.DisputedBefore
			back = sumMoneyBack(&w)
			if !back && old.Status == w.Status && old.AmountPaid == w.AmountPaid && old.AmountDue == w.AmountDue {
				return nil
			}
		}
		body, _ := json.Marshal(w)
		err = pay.SwapPaymentRecord(ctx, KindInvoice, inv.ID, b, body, s.now())
		if err == nil {
			if old.Status != w.Status || old.AmountPaid != w.AmountPaid || old.AmountDue != w.AmountDue {
				s.auditInvoice(ctx, id, inv.ID, w)
			}
			if back {
				s.auditMoneyBack(ctx, inv.ID, "refunds and disputes recorded before its payment was", w)
			}
			return nil
		}
		if !swapAgain(err, try) {
			return fmt.Errorf("recording invoice %s: %w", inv.ID, err)
		}
	}
}

// invoiceMayBecome reports whether an invoice recorded as old may be
// recorded as now: Stripe's invoices go from draft to open, and from
// open to paid, void or uncollectible; paid and void are final, and an
// uncollectible one can still be paid or voided. So an event older than
// the record (a late invoice.payment_failed, open) never takes a paid,
// voided or written-off invoice back.
func invoiceMayBecome(old, now string) bool {
	switch old {
	case "paid", "void":
		return now == old
	case "uncollectible":
		return now == old || now == "paid" || now == "void"
	}
	return true
}

// recordSwaps is how many times a change of a payment record (an
// invoice's, a top-up's) is made and swapped while other changes of the
// record (other nodes') land first; past it the event is answered 500 and
// Stripe sends it again.
const recordSwaps = 10

// swapAgain reports whether the try-th swap of a payment record failed
// with err only because the record changed since it was read (or is
// gone), so the change is to be read, made and swapped again.
func swapAgain(err error, try int) bool {
	return try < recordSwaps && (errors.Is(err, store.ErrStale) || errors.Is(err, store.ErrNotFound))
}

// changeRecord makes change on the record of kind and id (JSON of a T)
// and writes it back, unless change says there is nothing to write; it
// returns the record as written (or as read, when nothing was) and
// whether it wrote. The write is a swap over the bytes read, so a change
// another node made meanwhile is read again, changed again and kept. A
// record that is not stored is the store's ErrNotFound.
func changeRecord[T any](ctx context.Context, pay store.Payments, kind, id string, now time.Time, change func(*T) bool) (T, bool, error) {
	for try := 1; ; try++ {
		var rec T
		b, err := pay.GetPaymentRecord(ctx, kind, id)
		if err != nil {
			return rec, false, err
		}
		if err := json.Unmarshal(b, &rec); err != nil {
			return rec, false, fmt.Errorf("%s record %s does not parse: %w", kind, id, err)
		}
		if !change(&rec) {
			return rec, false, nil
		}
		body, _ := json.Marshal(rec)
		err = pay.SwapPaymentRecord(ctx, kind, id, b, body, now)
		if err == nil || !swapAgain(err, try) {
			return rec, err == nil, err
		}
	}
}

// auditInvoice audits an invoice record written.
func (s *Service) auditInvoice(ctx context.Context, id ident, invID string, r InvoiceRecord) {
	amount := MinorMoney(r.AmountDue, r.Currency).String()
	if r.Status == "paid" {
		amount = MinorMoney(r.AmountPaid, r.Currency).String()
	}
	s.audit(ctx, AuditInvoiceStripe, id.User, id.Service, fmt.Sprintf("invoice %s of product %s %s: %s", invID, id.Product, r.Status, amount))
}

// applyState sets the gateway subscription from a Stripe subscription's
// state as of eventAt. fallback names the user, service and product
// when the state's own prices do not (a state read from Stripe, an
// invoice's).
//
// Two nodes applying two events of one Stripe subscription at once.
// subTurns keeps a node's own events of a customer one at a time, and
// the store's lease (holdSubscription) the fleet's, but a lease is not a
// fence: a node
// stalled past it (a slow Stripe or PostgreSQL, a paused process) goes on
// writing after another took it. What makes the newest event win
// whatever the interleaving is the record: each write of it is a swap
// over the record read before the gateway subscription was written
// (store.Payments.SwapPaymentRecord; the first write an insert), and
// Seq changes with every write, so a swap lands only if no other write
// of the record came in between. A node whose swap fails reads the
// record again and decides again:
//
//   - the other node's event was older (or the record holds no state):
//     this event still applies; it is written again and swapped again;
//   - the other node's event was newer (or as new, the same state): this
//     event changes nothing, but this node's write of the gateway
//     subscription may have gone over the other's. If it wrote anything,
//     it writes the record's state again (rebuilt from the record, no
//     Stripe call; its own write counts as this subscription's, so an
//     ended state goes over it) and swaps the record (Seq) to confirm it.
//
// So every node that wrote the gateway subscription ends with a swap of
// the record it decided on; the last write of the gateway subscription
// is then the one of the last record: a write after it would need a swap
// after it, and a swap after a read fails once any other swap came
// between. For instance, a (older, active) reads R0; b (newer, deleted)
// reads R0, writes EXPIRED and swaps R0→Rb; a writes ACTIVE; a's swap of
// R0 fails, a reads Rb (newer), writes EXPIRED over its own ACTIVE and
// swaps Rb→Rb'. Or a swaps first and b's swap fails: b's event is newer,
// so b writes EXPIRED again and swaps over a's record. Past recordSwaps
// tries the event fails (500) and Stripe sends it again.
// A state that cannot be put back (a trialing record from before records
// kept trial_end, and Stripe, asked for it, does not answer) is not
// written without its end: the record is swapped marked PutBack and the
// event fails (500). Stripe's retry of it is older than the record and
// would change nothing by itself; the mark makes it, or whichever
// applyState of the subscription comes next, put the state back first.
// The link (stripe_subscription_of) is swapped the same way
// (setGatewaySubscription).
//
// A Stripe subscription that held the gateway subscription and grants
// no access now (canceled, unpaid, paused, past due beyond the grace),
// its state still the gateway subscription's, hands it over to another
// of the user's live ones, if the link lists one (handOver), whether
// this call wrote its end or an earlier one did and its hand-over is
// still owed; a hand-over that fails fails the call.
func (s *Service) applyState(ctx context.Context, st state, eventAt time.Time, fallback *ident) error {
	defer subTurns.Lock(st.Customer)()
	pay, err := s.Payments()
	if err != nil {
		return err
	}
	return s.applyStateHeld(ctx, pay, st, eventAt, fallback)
}

// applyStateHeld is applyState in the turn of st's customer, held.
func (s *Service) applyStateHeld(ctx context.Context, pay store.Payments, st state, eventAt time.Time, fallback *ident) error {
	release, err := s.holdSubscription(ctx, pay, st.ID)
	if err != nil {
		return err
	}
	defer release()
	// mine is what this call last wrote of the gateway subscription (and
	// its link); nil while it wrote nothing. whose is whose it was.
	var mine *appliedSub
	var whose ident
	for try := 1; ; try++ {
		b, err := pay.GetPaymentRecord(ctx, KindSubscription, st.ID)
		found := err == nil
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		var rec SubscriptionRecord
		if found {
			if err := json.Unmarshal(b, &rec); err != nil {
				return fmt.Errorf("payments: the record of subscription %s does not read: %w", st.ID, err)
			}
		}
		ch, err := s.decideState(ctx, pay, st, eventAt, fallback, rec, found)
		if err != nil {
			return err
		}
		var newRec SubscriptionRecord
		// failed: the record's state could not be put back; the record
		// is swapped marked (PutBack) and the event fails, so Stripe's
		// retry of it puts the state back.
		var failed error
		switch {
		case ch != nil:
			if !ch.t.none {
				w, err := s.setGatewaySubscription(ctx, pay, ch.st, ch.id, ch.t, mine, false)
				if err != nil {
					return err
				}
				if w != nil {
					mine, whose = w, ch.id
				}
			}
			newRec = ch.rec
			newRec.PutBack = rec.PutBack && ch.t.none // nothing written: still owed
		case mine == nil && (!rec.PutBack || st.fromRecord):
			// Nothing of this event was written (a hand-over to a record
			// that grants no access now owes nothing: PutBack is for the
			// subscription's own next event). An ended holder whose
			// hand-over is still owed (it failed, and this is Stripe's
			// retry of the event; or its past-due grace ran out since its
			// last write) hands over now.
			if st.fromRecord || !found {
				return nil
			}
			return s.handOver(ctx, pay, st.ID, st.Customer, ident{User: rec.UserID, Service: rec.ServiceID})
		default:
			// A newer event landed since this call wrote the gateway
			// subscription (or since an earlier call wrote it and could
			// not put the newer state back: PutBack): its state goes
			// back over that write.
			newRec = rec
			w, err := s.reapplyRecord(ctx, pay, &newRec, mine)
			if err != nil {
				newRec.PutBack, failed = true, err
			} else {
				newRec.PutBack = false
				if w != nil {
					mine, whose = w, ident{User: newRec.UserID, Service: newRec.ServiceID, Product: newRec.ProductID}
				}
			}
			newRec.UpdatedAt = s.now().UTC()
		}
		newRec.Seq = rec.Seq + 1
		body, _ := json.Marshal(newRec)
		if found {
			err = pay.SwapPaymentRecord(ctx, KindSubscription, st.ID, b, body, s.now())
		} else if _, err = pay.InsertPaymentRecord(ctx, KindSubscription, st.ID, body, s.now()); errors.Is(err, store.ErrExists) {
			err = store.ErrStale // another node's first write: read it and decide again
		}
		if err == nil {
			if failed != nil || st.fromRecord {
				return failed
			}
			if whose.User == "" {
				whose = ident{User: newRec.UserID, Service: newRec.ServiceID}
			}
			return s.handOver(ctx, pay, st.ID, st.Customer, whose)
		}
		if !swapAgain(err, try) {
			return fmt.Errorf("recording subscription %s: %w", st.ID, err)
		}
		s.log.Info("the record of a Stripe subscription changed on another node meanwhile; deciding again",
			zap.String("subscription", st.ID), zap.Int("try", try))
	}
}

// handOver gives the gateway subscription of id, which the Stripe
// subscription ended (of customer) held, to the newest other live
// Stripe subscription of the user and service that the link lists
// (linkRecord.Others: those seen while ended held it), at once: the
// caller pays for it, and its next event (its next invoice) may be a
// period away. It does so only while ended's own record grants no
// access now (canceled, unpaid, paused, past due beyond the grace), the
// link still names ended with a state that grants none, and the gateway
// subscription is still as ended set it (a plan put since stays, as over
// an ended subscription's write). It is applied from its record as it
// stands (a trial's end the record does not keep read from Stripe:
// recordChange; applyState, fromRecord: under its lease, its record swapped,
// so an event of it applied meanwhile on another node is not written
// over), and only one of the same customer, whose turn this node holds.
// Nothing is cancelled or changed at Stripe. It is called after every
// applyState of a subscription (not a hand-over's), so a hand-over owed
// is made by the first of ended's events or resyncs that finds it owed:
// one whose write ended it, Stripe's retry of one whose hand-over
// failed (a hand-over that fails fails the event: 500), or one past the
// grace of a past-due holder that nothing else ended. Nil when nothing
// is owed or it was handed over.
func (s *Service) handOver(ctx context.Context, pay store.Payments, ended, customer string, id ident) error {
	_, err := s.handOverTo(ctx, pay, ended, customer, id)
	return err
}

// handOverTo is handOver, saying whether this call handed the gateway
// subscription over.
func (s *Service) handOverTo(ctx context.Context, pay store.Payments, ended, customer string, id ident) (bool, error) {
	if customer == "" || id.User == "" || id.Service == "" {
		return false, nil
	}
	b, err := pay.GetPaymentRecord(ctx, KindSubscriptionOf, id.Service+"/"+id.User)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	var link linkRecord
	if json.Unmarshal(b, &link) != nil || link.SubscriptionID != ended || len(link.Others) == 0 || link.Applied == nil ||
		s.appliedLive(link.Applied) {
		return false, nil
	}
	if rec, found, err := s.getSubRecord(ctx, pay, ended); err != nil {
		return false, err
	} else if found && s.recordLive(rec) {
		return false, nil // live as its record says: an older event's write, put back by its node
	}
	cur, err := s.Store().GetSubscription(ctx, id.User, id.Service)
	if errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrNoAccount) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	if !stillSet(link, ended, link.Applied.ProductID, cur) {
		return false, nil // a plan put since ended's write stays
	}
	var next *SubscriptionRecord
	for _, o := range link.Others {
		rec, found, err := s.getSubRecord(ctx, pay, o)
		if err != nil {
			s.log.Warn("the record of a Stripe subscription to hand the gateway subscription over to does not read",
				zap.String("subscription", o), zap.Error(err))
			continue
		}
		if o == ended || !found || rec.UserID != id.User || rec.ServiceID != id.Service || rec.CustomerID != customer || !s.recordLive(rec) {
			continue
		}
		if next == nil || boughtAfter(rec.Created, rec.StartDate, next.Created, next.StartDate) {
			next = &rec
		}
	}
	if next == nil {
		return false, nil
	}
	s.log.Info("the Stripe subscription that held the gateway subscription ended; another live one of the user takes it over",
		zap.String("subscription", next.ID), zap.String("ended", ended), zap.String("user_id", id.User), zap.String("service_id", id.Service))
	if err := s.applyStateHeld(ctx, pay, state{ID: next.ID, Customer: customer, fromRecord: true}, time.Time{}, nil); err != nil {
		s.log.Warn("the gateway subscription could not be handed over to the user's other live Stripe subscription; the event fails and Stripe's retry of it hands over",
			zap.String("subscription", next.ID), zap.String("ended", ended), zap.String("user_id", id.User),
			zap.String("service_id", id.Service), zap.Error(err))
		return false, fmt.Errorf("hand the gateway subscription over from %s to %s: %w", ended, next.ID, err)
	}
	return true, nil
}

// change is what applyState writes for an event: the state (read from
// Stripe when the event's time does not order it), whose it is, the
// gateway subscription it maps to and the record.
type change struct {
	st  state
	id  ident
	t   target
	rec SubscriptionRecord
}

// decideState is what the state st as of eventAt changes over rec (the
// record as read; found says whether there is one): nil when nothing
// (an event older than the state applied, or as old and the same).
func (s *Service) decideState(ctx context.Context, pay store.Payments, st state, eventAt time.Time, fallback *ident, rec SubscriptionRecord, found bool) (*change, error) {
	var err error
	if st.fromRecord {
		return s.recordChange(ctx, rec, found)
	}
	if st.fetched && !st.listedAt.IsZero() && found &&
		(rec.UpdatedAt.After(st.listedAt.Add(-listedSkew)) || rec.EventCreated.After(st.listedAt.Add(-listedSkew))) {
		// Read from Stripe before the record was (a resync's list), and
		// the record changed about then or since: a webhook applied
		// meanwhile may be newer than the list. Stripe is read again,
		// after the record, as below.
		st.fetch = true
	}
	if st.fetch {
		// After the record was read: the swap over it then fails if a
		// newer state was written since, and Stripe is read again.
		sub, err := s.sc.V1Subscriptions.Retrieve(ctx, st.ID, nil)
		if err != nil {
			return nil, fmt.Errorf("read subscription %s from Stripe: %w", st.ID, stripeErr(err))
		}
		f := stateOf(sub)
		f.ID, f.Customer, f.fetched = st.ID, st.Customer, true
		st = f
	}
	if found && !rec.EventCreated.IsZero() && !st.fetched {
		switch {
		case eventAt.Before(rec.EventCreated):
			s.log.Info("stripe event older than the state applied; nothing changes", zap.String("subscription", st.ID))
			return nil, nil
		case eventAt.Equal(rec.EventCreated) && sameState(rec, st, s):
			return nil, nil // the state applied already (the same event on two nodes)
		case eventAt.Equal(rec.EventCreated):
			// Two events of one second: their order is unknown, so
			// apply the subscription as Stripe has it now.
			fresh, err := s.sc.V1Subscriptions.Retrieve(ctx, st.ID, nil)
			if err != nil {
				return nil, fmt.Errorf("read subscription %s from Stripe: %w", st.ID, stripeErr(err))
			}
			f := stateOf(fresh)
			f.ID, f.Customer, f.fetched = st.ID, st.Customer, true
			if fallback == nil {
				// The event's product stands when Stripe's answer names
				// no configured price.
				if svc, prod, ok := s.productOfPrices(st.Prices); ok {
					fallback = &ident{User: rec.UserID, Service: svc, Product: prod}
				}
			}
			st = f
		}
	}
	// Whose it is.
	var id ident
	switch {
	case found && rec.UserID != "":
		id = ident{User: rec.UserID, Service: rec.ServiceID, Product: rec.ProductID}
	case fallback != nil && fallback.User != "":
		id.User = fallback.User
	default:
		if id.User, err = s.userOfCustomer(ctx, pay, st.Customer); err != nil {
			return nil, err
		}
	}
	if found && !st.fetched && st.Customer != "" && rec.CustomerID != "" && st.Customer != rec.CustomerID {
		return nil, badEvent("subscription %s: the event names another customer than the one it was made for", st.ID)
	}
	if svc, prod, ok := s.productOfPrices(st.Prices); ok {
		if id.Service != "" && svc != id.Service {
			return nil, badEvent("subscription %s: its price belongs to service %s, not %s", st.ID, svc, id.Service)
		}
		id.Service, id.Product = svc, prod
	} else if len(st.Prices) > 0 && !st.fetched {
		return nil, badEvent("subscription %s: no configured product has its price %s", st.ID, strings.Join(st.Prices, ", "))
	} else if fallback != nil && fallback.Service != "" && id.Service == "" {
		id.Service, id.Product = fallback.Service, fallback.Product
	} else if fallback != nil && fallback.Product != "" && fallback.Service == id.Service {
		id.Product = fallback.Product
	}
	if id.Service == "" || id.Product == "" {
		return nil, badEvent("subscription %s: no configured product has its price", st.ID)
	}
	if svc, ok := s.cat.Service(id.Service); !ok {
		return nil, badEvent("subscription %s: service %s is not in the catalog", st.ID, id.Service)
	} else if _, ok := svc.Product(id.Product); !ok {
		return nil, badEvent("subscription %s: service %s has no product %s", st.ID, id.Service, id.Product)
	}

	pastDueSince := time.Time{}
	if st.Status == stripe.SubscriptionStatusPastDue {
		pastDueSince = eventAt
		if found && rec.StripeStatus == string(stripe.SubscriptionStatusPastDue) && !rec.PastDueSince.IsZero() {
			pastDueSince = rec.PastDueSince
		}
		if pastDueSince.IsZero() {
			pastDueSince = s.now().UTC()
		}
	}
	t := mapStatus(st, pastDueSince, time.Duration(s.cfg.PastDueGrace))

	newRec := SubscriptionRecord{ID: st.ID, UserID: id.User, ServiceID: id.Service, ProductID: id.Product,
		CustomerID: st.Customer, StripeStatus: string(st.Status), Status: string(t.Status),
		CancelAtPeriodEnd: st.CancelAtPeriodEnd, CancelAt: st.CancelAt, CurrentPeriodEnd: st.PeriodEnd, TrialEnd: st.TrialEnd, PastDueSince: pastDueSince,
		StartDate: st.StartDate, Created: st.Created, CurrentPeriodStart: st.PeriodStart, BillingCycleAnchor: st.Anchor,
		Interval: st.Interval, IntervalCount: st.IntervalCount, EventCreated: eventAt, UpdatedAt: s.now().UTC()}
	if found {
		if newRec.CustomerID == "" || st.fetched {
			newRec.CustomerID = rec.CustomerID
		}
		if rec.EventCreated.After(newRec.EventCreated) {
			newRec.EventCreated = rec.EventCreated
		}
		if newRec.StartDate.IsZero() {
			newRec.StartDate = rec.StartDate
		}
		if newRec.Created.IsZero() {
			newRec.Created = rec.Created
		}
		if newRec.BillingCycleAnchor.IsZero() {
			newRec.BillingCycleAnchor = rec.BillingCycleAnchor
		}
		if newRec.Interval == "" {
			newRec.Interval, newRec.IntervalCount = rec.Interval, rec.IntervalCount
		}
		if newRec.CurrentPeriodStart.IsZero() && newRec.CurrentPeriodEnd.Equal(rec.CurrentPeriodEnd) {
			newRec.CurrentPeriodStart = rec.CurrentPeriodStart
		}
	}
	if newRec.CustomerID == "" {
		newRec.CustomerID = st.Customer
	}
	// When it was bought, as far as known, decides which of two live
	// Stripe subscriptions holds the gateway subscription.
	st.Created, st.StartDate = newRec.Created, newRec.StartDate
	return &change{st: st, id: id, t: t, rec: newRec}, nil
}

// recordChange is the change of a fromRecord state: the record's state
// applied as it stands (rebuilt from it, no Stripe call, but for the
// trial's end of a trialing record written before records kept it,
// which is read from Stripe and kept in the record, as reapplyRecord
// does: a Stripe that cannot be read is an error, so the hand-over
// fails its event and Stripe's retry hands over), nil when it grants no
// access now or cannot be rebuilt (no record, whose it is not known).
func (s *Service) recordChange(ctx context.Context, rec SubscriptionRecord, found bool) (*change, error) {
	if !found || rec.UserID == "" || rec.ServiceID == "" || rec.ProductID == "" {
		return nil, nil
	}
	st := recordState(rec)
	newRec := rec
	if st.Status == stripe.SubscriptionStatusTrialing && st.TrialEnd.IsZero() {
		end, err := s.trialEndFromStripe(ctx, rec.ID)
		if err != nil {
			return nil, err
		}
		st.TrialEnd, newRec.TrialEnd = end, end
	}
	t := mapStatus(st, rec.PastDueSince, time.Duration(s.cfg.PastDueGrace))
	if !s.liveNow(t) {
		return nil, nil
	}
	st.fromRecord = true
	newRec.UpdatedAt = s.now().UTC()
	return &change{st: st, id: ident{User: rec.UserID, Service: rec.ServiceID, Product: rec.ProductID}, t: t, rec: newRec}, nil
}

// trialEndFromStripe reads the trial's end of Stripe subscription id,
// trialing in a record written before records kept trial_end: an error
// when Stripe cannot be read or gives none (a trial without its end
// would never end).
func (s *Service) trialEndFromStripe(ctx context.Context, id string) (time.Time, error) {
	sub, err := s.sc.V1Subscriptions.Retrieve(ctx, id, nil)
	if err != nil {
		return time.Time{}, fmt.Errorf("read subscription %s from Stripe for its trial's end, which its record does not keep: %w", id, stripeErr(err))
	}
	end := unix(sub.TrialEnd)
	if end.IsZero() {
		return time.Time{}, fmt.Errorf("Stripe gives subscription %s, trialing in its record, no trial_end", id)
	}
	return end, nil
}

// recordState is the state a record applied (ID, Customer and what
// mapStatus reads), for putting it back or handing the gateway
// subscription over to it.
func recordState(rec SubscriptionRecord) state {
	return state{ID: rec.ID, Customer: rec.CustomerID, Status: stripe.SubscriptionStatus(rec.StripeStatus),
		CancelAtPeriodEnd: rec.CancelAtPeriodEnd, CancelAt: rec.CancelAt, PeriodEnd: rec.CurrentPeriodEnd, TrialEnd: rec.TrialEnd,
		StartDate: rec.StartDate, Created: rec.Created, PeriodStart: rec.CurrentPeriodStart, Anchor: rec.BillingCycleAnchor,
		Interval: rec.Interval, IntervalCount: rec.IntervalCount}
}

// liveNow reports whether t grants access now: a status that does, and
// an end (a cancellation's, a grace's, a trial's) not yet reached.
func (s *Service) liveNow(t target) bool {
	return !t.none && t.Status.GrantsAccess() && (t.EndsAt.IsZero() || s.now().Before(t.EndsAt))
}

// appliedLive reports whether the gateway subscription as a Stripe
// subscription last set it (a link's Applied) grants access now.
func (s *Service) appliedLive(a *appliedSub) bool {
	return s.liveNow(target{Status: subscription.Status(strings.ToUpper(a.Status)), EndsAt: a.EndsAt})
}

// recordLive reports whether the Stripe subscription of rec, as its
// record has it, grants access now.
func (s *Service) recordLive(rec SubscriptionRecord) bool {
	return s.liveNow(mapStatus(recordState(rec), rec.PastDueSince, time.Duration(s.cfg.PastDueGrace)))
}

// renews reports whether a Stripe subscription goes on past its period
// (nobody set it to cancel).
func renews(cancelAtPeriodEnd bool, cancelAt time.Time) bool {
	return !cancelAtPeriodEnd && cancelAt.IsZero()
}

// boughtAfter reports whether a Stripe subscription made at (aCreated,
// aStart) was bought after one made at (bCreated, bStart): by Stripe's
// created, or by start_date where either record lacks created (one
// written before it was kept). Where neither says (records from before
// both were kept), the order is unknown and a counts as the later: it
// takes the gateway subscription over, as every live one did before;
// each one's next event records its dates and the order holds from then.
// As old is not later: the holder stays.
func boughtAfter(aCreated, aStart, bCreated, bStart time.Time) bool {
	switch {
	case !aCreated.IsZero() && !bCreated.IsZero():
		return aCreated.After(bCreated)
	case !aStart.IsZero() && !bStart.IsZero():
		return aStart.After(bStart)
	}
	return true
}

// sameState reports whether st says what rec applied.
func sameState(rec SubscriptionRecord, st state, s *Service) bool {
	if rec.StripeStatus != string(st.Status) || rec.CancelAtPeriodEnd != st.CancelAtPeriodEnd ||
		!rec.CancelAt.Equal(st.CancelAt) || !rec.CurrentPeriodEnd.Equal(st.PeriodEnd) {
		return false
	}
	if len(st.Prices) == 0 {
		return true
	}
	svc, prod, ok := s.productOfPrices(st.Prices)
	return ok && svc == rec.ServiceID && prod == rec.ProductID
}

// Holding a subscription across a fleet: the nodes apply the events of
// one Stripe subscription one at a time, through the store's lease.
const (
	subLeaseTTL  = 30 * time.Second
	subLeaseWait = 3 * time.Second
)

// holdSubscription takes the lease of a Stripe subscription for this
// node, waiting up to subLeaseWait for another node to finish; past that
// the event fails with a retryable error and Stripe sends it again.
func (s *Service) holdSubscription(ctx context.Context, pay store.Payments, id string) (func(), error) {
	name := "stripe_subscription/" + id
	holder := s.nodeID
	if holder == "" {
		holder = "node"
	}
	deadline := time.Now().Add(subLeaseWait)
	for {
		l, err := pay.TakeLease(ctx, name, holder, subLeaseTTL, s.now())
		if err != nil {
			return nil, err
		}
		if l.Held {
			return func() { _ = pay.ReleaseLease(context.WithoutCancel(ctx), name, holder) }, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("subscription %s is being applied by %s; Stripe sends the event again", id, l.Holder)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stripeSubscription is the record of the Stripe subscription that
// holds the user's subscription to the service (when it started, its
// billing periods); the zero record when none is known.
func (s *Service) stripeSubscription(ctx context.Context, pay store.Payments, userID, serviceID string) (SubscriptionRecord, error) {
	b, err := pay.GetPaymentRecord(ctx, KindSubscriptionOf, serviceID+"/"+userID)
	if errors.Is(err, store.ErrNotFound) {
		return SubscriptionRecord{}, nil
	} else if err != nil {
		return SubscriptionRecord{}, err
	}
	var link linkRecord
	if json.Unmarshal(b, &link) != nil || link.SubscriptionID == "" {
		return SubscriptionRecord{}, nil
	}
	b, err = pay.GetPaymentRecord(ctx, KindSubscription, link.SubscriptionID)
	if errors.Is(err, store.ErrNotFound) {
		return SubscriptionRecord{}, nil
	} else if err != nil {
		return SubscriptionRecord{}, err
	}
	var rec SubscriptionRecord
	_ = json.Unmarshal(b, &rec)
	return rec, nil
}

// linkRecord is KindSubscriptionOf.
type linkRecord struct {
	SubscriptionID string `json:"subscriptionId"`
	// Applied is the gateway subscription as SubscriptionID last set it
	// (or found it already set); nil in a link written before it was
	// kept.
	Applied *appliedSub `json:"applied,omitempty"`
	// Others are the other live Stripe subscriptions of the user and
	// service seen while SubscriptionID held the gateway subscription
	// (each reported to the operator once, as it was added): when
	// SubscriptionID ends, the newest of them still live takes the
	// gateway subscription over at once (handOver). One that ends for
	// good (canceled) leaves the list with that event (unlist); others
	// that grant no access now (unpaid, paused, or ended on an event not
	// applied yet) may stay listed: each is read before anything is
	// handed to it.
	Others    []string  `json:"others,omitempty"`
	UpdatedAt time.Time `json:"updatedAt"`
}

// maxOthers bounds linkRecord.Others: a user with more live Stripe
// subscriptions of one service than that has the oldest forgotten,
// which then take the gateway subscription over with their next event
// rather than at once.
const maxOthers = 8

// withOther is ids with id added at the end (moved there if listed),
// the oldest dropped past maxOthers.
func withOther(ids []string, id string) []string {
	out := append(withoutOther(ids, id), id)
	if len(out) > maxOthers {
		out = out[len(out)-maxOthers:]
	}
	return out
}

// withoutOther is ids without id.
func withoutOther(ids []string, id string) []string {
	var out []string
	for _, x := range ids {
		if x != id {
			out = append(out, x)
		}
	}
	return out
}

// appliedSub is what a Stripe subscription wrote of the gateway
// subscription: its product, status and end.
type appliedSub struct {
	ProductID string    `json:"productId"`
	Status    string    `json:"status"`
	EndsAt    time.Time `json:"endsAt,omitzero"`
	EndStatus string    `json:"endStatus,omitempty"`
}

// same reports whether a and b are the same plan, status and end.
func (a *appliedSub) same(b *appliedSub) bool {
	return a != nil && b != nil && a.ProductID == b.ProductID && strings.EqualFold(a.Status, b.Status) &&
		a.EndsAt.Equal(b.EndsAt) && strings.EqualFold(a.EndStatus, b.EndStatus)
}

// stillSet reports whether cur is still the gateway subscription the
// Stripe subscription subID set, as link remembers it: nothing was put
// since (an operator's plan, the portal's free or prepaid one, another
// Stripe subscription's). The sweep tidying the status to its end's
// (the same end kept) is not a put. A link from before Applied was kept
// knows only the subscription: the product must be the one product
// names.
func stillSet(link linkRecord, subID, product string, cur store.Subscription) bool {
	if link.SubscriptionID != subID {
		return false
	}
	a := link.Applied
	if a == nil {
		return cur.ProductID == product
	}
	if cur.ProductID != a.ProductID || !cur.EndsAt.Equal(a.EndsAt) || !strings.EqualFold(cur.EndStatus, a.EndStatus) {
		return false
	}
	return strings.EqualFold(cur.Status, a.Status) || !a.EndsAt.IsZero() && strings.EqualFold(cur.Status, a.EndStatus)
}

// reapplyRecord writes the gateway subscription as rec, the record of
// a newer event that landed meanwhile on another node, says: the state
// is rebuilt from the record (no Stripe call, but for the trial's end of
// a trialing record written before records kept it, which is read from
// Stripe and kept in rec; a Stripe that cannot be read is an error, and
// nothing is written: a trial without its end would never end). mine is
// what this node wrote over it, which counts as this Stripe
// subscription's write.
func (s *Service) reapplyRecord(ctx context.Context, pay store.Payments, rec *SubscriptionRecord, mine *appliedSub) (*appliedSub, error) {
	st := recordState(*rec)
	if rec.UserID == "" || rec.ServiceID == "" || rec.ProductID == "" {
		return nil, nil
	}
	if st.Status == stripe.SubscriptionStatusTrialing && st.TrialEnd.IsZero() {
		end, err := s.trialEndFromStripe(ctx, rec.ID)
		if err != nil {
			return nil, err
		}
		st.TrialEnd, rec.TrialEnd = end, end
	}
	t := mapStatus(st, rec.PastDueSince, time.Duration(s.cfg.PastDueGrace))
	if t.none {
		return nil, nil
	}
	s.log.Info("a newer event of the Stripe subscription was applied on another node meanwhile; its state goes back",
		zap.String("subscription", rec.ID), zap.String("stripe_status", rec.StripeStatus))
	return s.setGatewaySubscription(ctx, pay, st, ident{User: rec.UserID, Service: rec.ServiceID, Product: rec.ProductID}, t, mine, true)
}

// errLinkMoved: the link record changed since it was read (another
// node's write); setGatewaySubscription reads and decides again.
var errLinkMoved = errors.New("the subscription's link changed meanwhile")

// errSubMoved: the gateway subscription was put since a put-back read
// it (store.ErrStale of its conditional put); setGatewaySubscription
// reads and decides again.
var errSubMoved = errors.New("the gateway subscription was put meanwhile")

// setGatewaySubscription writes the gateway subscription, unless it is
// as the target says already. A target that grants no access (the
// Stripe subscription ended, unpaid, suspended) is written only over
// the gateway subscription this Stripe subscription set itself, or
// where there is none: never over one a newer Stripe subscription holds
// nor over a plan put since (the caller moved to a free or prepaid plan,
// an operator assigned one), whichever way the state came (an event, an
// invoice's read-back, a resync). mine, when not nil, is what this call
// of applyState wrote already (also this Stripe subscription's). It
// returns what it wrote (of the link or the gateway subscription), nil
// when nothing.
//
// putBack: the state is a newer record's put back over an older event's
// write of this Stripe subscription (reapplyRecord). That undoes the
// stale write and nothing else, so whatever the state, it is written
// only while the gateway subscription is still as this Stripe
// subscription last set it (mine, or the link's): a plan put since (an
// operator's, at the admin API or the console, in the instant between
// the stale write and its undoing) is the latest explicit write and
// stays; Stripe's state is written with the subscription's next event,
// as over any plan. The check is the read, and the put is a
// compare-and-swap on it (store PutSubscriptionIf, over the revision
// read): a put that lands between the two refuses the put-back, which
// reads again and finds it (TestRacePutBackFencedAgainstAnOperatorsPlan).
func (s *Service) setGatewaySubscription(ctx context.Context, pay store.Payments, st state, id ident, t target, mine *appliedSub, putBack bool) (*appliedSub, error) {
	for try := 1; ; try++ {
		w, err := s.setGatewaySubscriptionOnce(ctx, pay, st, id, t, mine, putBack)
		if !errors.Is(err, errLinkMoved) && !errors.Is(err, errSubMoved) || try >= recordSwaps {
			return w, err
		}
	}
}

func (s *Service) setGatewaySubscriptionOnce(ctx context.Context, pay store.Payments, st state, id ident, t target, mine *appliedSub, putBack bool) (*appliedSub, error) {
	linkID := id.Service + "/" + id.User
	var link linkRecord
	linkBody, err := pay.GetPaymentRecord(ctx, KindSubscriptionOf, linkID)
	if err == nil {
		_ = json.Unmarshal(linkBody, &link)
	} else if errors.Is(err, store.ErrNotFound) {
		linkBody = nil
	} else {
		return nil, err
	}
	live := t.Status.GrantsAccess()
	if link.SubscriptionID != "" && link.SubscriptionID != st.ID && !live {
		s.log.Info("an ended Stripe subscription leaves the gateway subscription another one holds",
			zap.String("subscription", st.ID), zap.String("holder", link.SubscriptionID))
		return nil, s.unlist(ctx, pay, st, linkID, link, linkBody)
	}
	// Another Stripe subscription holds the gateway subscription and this
	// one grants access too: it takes it over only from one that no
	// longer does, or when it was bought after it (the caller's latest
	// purchase). An older one changes nothing while the holder is live
	// (keepOut); with either taking it back on its own events, the plan,
	// period and status flipped with every event of the two.
	takesOverFrom, fromLive := "", false
	var holder SubscriptionRecord
	if link.SubscriptionID != "" && link.SubscriptionID != st.ID && live {
		var found bool
		if holder, found, err = s.getSubRecord(ctx, pay, link.SubscriptionID); err != nil {
			return nil, err
		}
		// Live as its record says and as it last set the gateway
		// subscription (the link, swapped with its ended write before
		// its record is: an end applied meanwhile on another node).
		fromLive = found && s.recordLive(holder) && (link.Applied == nil ||
			s.appliedLive(link.Applied))
		if fromLive && !boughtAfter(st.Created, st.StartDate, holder.Created, holder.StartDate) {
			return nil, s.keepOut(ctx, pay, st, id, link, linkBody, holder)
		}
		// A live one taking the gateway subscription over from another:
		// told once the link is swapped to it (a try whose swap fails
		// takes nothing over, and is made again).
		takesOverFrom = link.SubscriptionID
	}
	cur, err := s.Store().GetSubscription(ctx, id.User, id.Service)
	had := err == nil
	if err != nil && !errors.Is(err, store.ErrNotFound) && !errors.Is(err, store.ErrNoAccount) {
		return nil, err
	}
	setSince := had && !stillSet(link, st.ID, id.Product, cur) &&
		(mine == nil || !stillSet(linkRecord{SubscriptionID: st.ID, Applied: mine}, st.ID, id.Product, cur))
	if setSince && !live {
		s.log.Info("a Stripe subscription that grants no access leaves the plan put since it last set it",
			zap.String("subscription", st.ID), zap.String("user_id", id.User), zap.String("service_id", id.Service),
			zap.String("plan", describeSub(cur)))
		return nil, nil
	}
	if putBack && (setSince || !had) {
		s.log.Warn("a plan put while a race of Stripe events was being undone stays; Stripe's state is applied with the subscription's next event",
			zap.String("subscription", st.ID), zap.String("user_id", id.User), zap.String("service_id", id.Service),
			zap.String("plan", describeSubOrNone(cur, had)), zap.String("stripe_status", string(st.Status)))
		return nil, nil
	}
	endStatus := ""
	if !t.EndsAt.IsZero() {
		endStatus = string(t.EndStatus)
	}
	applied := &appliedSub{ProductID: id.Product, Status: string(t.Status), EndsAt: t.EndsAt, EndStatus: endStatus}
	var wrote *appliedSub
	if link.SubscriptionID != st.ID || !link.Applied.same(applied) {
		// A swap over the link as read (an insert where there was none):
		// a link another node wrote since is read and decided on again.
		// A live holder taken over from stays listed, to take the
		// gateway subscription back when this one ends.
		others := withoutOther(link.Others, st.ID)
		if fromLive {
			others = withOther(others, takesOverFrom)
		}
		b, _ := json.Marshal(linkRecord{SubscriptionID: st.ID, Applied: applied, Others: others, UpdatedAt: s.now().UTC()})
		if linkBody == nil {
			_, err = pay.InsertPaymentRecord(ctx, KindSubscriptionOf, linkID, b, s.now())
		} else {
			err = pay.SwapPaymentRecord(ctx, KindSubscriptionOf, linkID, linkBody, b, s.now())
		}
		if errors.Is(err, store.ErrExists) || errors.Is(err, store.ErrStale) || errors.Is(err, store.ErrNotFound) {
			return nil, errLinkMoved
		} else if err != nil {
			return nil, err
		}
		wrote = applied
		if fromLive && renews(holder.CancelAtPeriodEnd, holder.CancelAt) {
			// Not when the other is ending: a plan bought after it, not a
			// double charge.
			s.warnSecondLive(ctx, id, st.ID, id.Product, holder)
		}
	}
	restart := s.periodRestart(st, id, t, cur, had)
	if had && restart.IsZero() && cur.ProductID == id.Product && strings.EqualFold(cur.Status, string(t.Status)) &&
		cur.EndsAt.Equal(t.EndsAt) && strings.EqualFold(cur.EndStatus, endStatus) {
		return wrote, nil
	}
	put := store.Subscription{UserID: id.User, ServiceID: id.Service, ProductID: id.Product,
		Status: string(t.Status), UpdatedAt: s.now().UTC(), EndsAt: t.EndsAt, EndStatus: endStatus}
	if had {
		put.RestartPeriodsAt = restart
	} else if live && !st.PeriodStart.IsZero() {
		put.StartedAt = st.PeriodStart // a new subscription's periods are Stripe's
	}
	before := "none"
	if had {
		before = describeSub(cur)
	}
	// The subscription and its audit entry are stored in one transaction:
	// a change whose entry cannot be written is not made (the event is
	// answered with an error and Stripe delivers it again).
	entry := s.auditEntry(AuditSubscriptionStripe, id.User, id.Service,
		fmt.Sprintf("Stripe subscription %s is %s: %s → %s", st.ID, stripeWords(st), before, describeSub(put)))
	var next store.Subscription
	if putBack {
		// Only over the gateway subscription as read above: a put since
		// (an operator's plan) refuses it, and the next try finds it.
		next, err = s.Store().PutSubscriptionIf(ctx, put, cur.Revision, entry...)
		if errors.Is(err, store.ErrStale) {
			s.log.Info("the gateway subscription was put while a race of Stripe events was being undone; deciding again",
				zap.String("subscription", st.ID), zap.String("user_id", id.User), zap.String("service_id", id.Service))
			return wrote, errSubMoved
		}
	} else {
		next, err = s.Store().PutSubscription(ctx, put, entry...)
	}
	if err != nil {
		return wrote, fmt.Errorf("set the subscription of %s to %s: %w", id.User, id.Service, err)
	}
	s.log.Info("subscription set from Stripe", zap.String("user_id", id.User), zap.String("service_id", id.Service),
		zap.String("product_id", id.Product), zap.String("status", next.Status), zap.String("subscription", st.ID))
	return applied, nil
}

// unlist drops st, a Stripe subscription that ended for good (canceled,
// incomplete_expired) and does not hold the gateway subscription, from
// the link's list of the ones to hand it over to (linkRecord.Others). One
// unpaid or paused stays listed: paid, it is live again.
func (s *Service) unlist(ctx context.Context, pay store.Payments, st state, linkID string, link linkRecord, linkBody []byte) error {
	if st.Status != stripe.SubscriptionStatusCanceled && st.Status != stripe.SubscriptionStatusIncompleteExpired {
		return nil
	}
	others := withoutOther(link.Others, st.ID)
	if len(others) == len(link.Others) {
		return nil
	}
	link.Others, link.UpdatedAt = others, s.now().UTC()
	b, _ := json.Marshal(link)
	err := pay.SwapPaymentRecord(ctx, KindSubscriptionOf, linkID, linkBody, b, s.now())
	if errors.Is(err, store.ErrStale) || errors.Is(err, store.ErrNotFound) {
		return errLinkMoved
	}
	return err
}

// keepOut is what an event of a live Stripe subscription st, bought
// before the live one, holder, that holds the gateway subscription,
// does: nothing to the gateway subscription (its record is still
// written, by applyState). The first time st is seen so, it is listed in
// the link (linkRecord.Others: it takes the gateway subscription over
// when holder ends) and, when both renew, reported to the operator
// (warnSecondLive), once: its later events find it listed.
func (s *Service) keepOut(ctx context.Context, pay store.Payments, st state, id ident, link linkRecord, linkBody []byte, holder SubscriptionRecord) error {
	s.log.Info("a live Stripe subscription bought before the live one holding the gateway subscription changes nothing while that one is live",
		zap.String("subscription", st.ID), zap.String("holder", holder.ID), zap.String("user_id", id.User), zap.String("service_id", id.Service))
	for _, o := range link.Others {
		if o == st.ID {
			return nil
		}
	}
	link.Others = withOther(link.Others, st.ID)
	link.UpdatedAt = s.now().UTC()
	b, _ := json.Marshal(link)
	err := pay.SwapPaymentRecord(ctx, KindSubscriptionOf, id.Service+"/"+id.User, linkBody, b, s.now())
	if errors.Is(err, store.ErrStale) || errors.Is(err, store.ErrNotFound) {
		return errLinkMoved
	} else if err != nil {
		return err
	}
	if renews(st.CancelAtPeriodEnd, st.CancelAt) && renews(holder.CancelAtPeriodEnd, holder.CancelAt) {
		s.warnSecondLive(ctx, ident{User: id.User, Service: id.Service, Product: holder.ProductID}, holder.ID, holder.ProductID,
			SubscriptionRecord{ID: st.ID, ProductID: id.Product, StripeStatus: string(st.Status)})
	}
	return nil
}

// warnSecondLive tells the operator that two Stripe subscriptions of a
// user and service grant access and renew: the user pays both (two
// Checkout Sessions paid, one opened before the gateway kept them to one
// per service, docs/payments.md "Checkout", or one made in the
// Dashboard). holder (of product) holds the gateway subscription, the
// one bought later; other is the other's record. The gateway cancels
// nothing at Stripe by itself, since which one the user meant to keep is
// theirs and the operator's to say. The warning and an audit entry name
// both, so one is cancelled (and its invoice refunded) in the Stripe
// Dashboard.
func (s *Service) warnSecondLive(ctx context.Context, id ident, holder, product string, other SubscriptionRecord) {
	s.log.Warn("two live Stripe subscriptions hold one gateway subscription: the user is charged for both; cancel one in Stripe",
		zap.String("user_id", id.User), zap.String("service_id", id.Service), zap.String("subscription", holder),
		zap.String("product_id", product), zap.String("other_subscription", other.ID), zap.String("other_product_id", other.ProductID),
		zap.String("other_status", other.StripeStatus))
	s.audit(ctx, AuditSubscriptionStripe, id.User, id.Service, fmt.Sprintf(
		"Stripe subscription %s (product %s) and %s (product %s) are both live for one subscription: the user is charged for both; the gateway subscription follows %s, the later bought; cancel one in Stripe",
		holder, product, other.ID, other.ProductID, holder))
}

// periodRestart is where the gateway subscription's billing periods
// start again for Stripe's state st, zero when they stay: a Stripe
// subscription that grants access and whose current period (the one the
// caller pays for) does not begin on the gateway's grid of periods. That
// is a trial converted (Stripe's first paid period begins at trial_end,
// the gateway's periods ran from the trial's start, and the quota the
// free trial used would count against the paid period), or a paid plan
// bought where another ran (its periods anchored at the older plan's
// start). Stripe's periods keep their anchor after that (renewals, a
// plan switched with proration), so a later event of the same or the
// next period moves nothing. Calendar periods do not follow a start.
func (s *Service) periodRestart(st state, id ident, t target, cur store.Subscription, had bool) time.Time {
	if !had || !t.Status.GrantsAccess() || st.PeriodStart.IsZero() || cur.StartedAt.Equal(st.PeriodStart) {
		return time.Time{}
	}
	svc, ok := s.cat.Service(id.Service)
	if !ok {
		return time.Time{}
	}
	p, ok := svc.Product(id.Product)
	if !ok || p.CalendarPeriods {
		return time.Time{}
	}
	if start, _ := billing.PeriodBounds(p.Period, false, cur.StartedAt, st.PeriodStart); start.Equal(st.PeriodStart) {
		return time.Time{}
	}
	return st.PeriodStart
}

// describeSubOrNone is describeSub, or "none" when there is none.
func describeSubOrNone(sub store.Subscription, had bool) string {
	if !had {
		return "none"
	}
	return describeSub(sub)
}

// describeSub says a gateway subscription in words for the audit log.
func describeSub(sub store.Subscription) string {
	s := "product " + sub.ProductID + " " + strings.ToUpper(sub.Status)
	if !sub.EndsAt.IsZero() {
		s += ", " + strings.ToUpper(sub.EndStatus) + " from " + sub.EndsAt.UTC().Format(time.RFC3339)
	}
	return s
}

func stripeWords(st state) string {
	w := strings.ReplaceAll(string(st.Status), "_", " ")
	if st.CancelAtPeriodEnd {
		w += ", cancelling at the period's end"
	}
	if st.fetched {
		w += " (as read from Stripe)"
	}
	if st.fromRecord {
		w += " (as last recorded: the Stripe subscription that held the plan ended)"
	}
	return w
}
