package payments

import "time"

// The records the Service keeps (store.Payments, by kind and id), shared
// by its parts: webhooks write them, the console and the portal read
// them. Amounts of money are integers in the currency's minor units, as
// Stripe gives them, with the ISO 4217 code in upper case.

// More record kinds.
const (
	// KindInvoice: a Stripe invoice of a subscription, by invoice id.
	KindInvoice = "stripe_invoice"
	// KindTopUp: a paid top-up, by the PaymentIntent id (the credit
	// grant's id).
	KindTopUp = "stripe_topup"
	// KindSubscription: the Stripe subscription behind a gateway
	// subscription, by Stripe subscription id.
	KindSubscription = "stripe_subscription"
	// KindTopUpIgnored: a paid top-up the gateway could not grant when it
	// was paid (IgnoredTopUp), by the PaymentIntent id: its refund or
	// dispute takes nothing back.
	KindTopUpIgnored = "stripe_topup_ignored"
)

// IgnoredTopUp is KindTopUpIgnored: a top-up paid that the gateway did
// not grant, as its paid event or, when a refund or lost dispute of it
// came before that event and the config could not grant it either, as
// that event says it. The Revenue page lists it (paid, not granted) for
// the operator to refund or grant by hand, unless it was granted since
// (a KindTopUp record of the same PaymentIntent). Fields after At are
// empty in a record written before they were kept.
type IgnoredTopUp struct {
	ID        string    `json:"id"` // the PaymentIntent
	SessionID string    `json:"sessionId"`
	Reason    string    `json:"reason"`
	At        time.Time `json:"at"`
	UserID    string    `json:"userId,omitempty"`
	ServiceID string    `json:"serviceId,omitempty"`
	ProductID string    `json:"productId,omitempty"`
	Pack      string    `json:"pack,omitempty"`
	// Amount is what was paid, in Currency's minor units (0: not known,
	// as when only a charge.refund.updated of it came); PaidAt when.
	Amount   int64     `json:"amount,omitempty"`
	Currency string    `json:"currency,omitempty"`
	PaidAt   time.Time `json:"paidAt,omitzero"`
	// Refunds are the succeeded refunds of its charge seen while it was
	// not granted, Refunded their sum; DisputeID and Disputed a lost
	// dispute seen so. A grant made later (its paid event applied once
	// the config can) takes them back at once (catchUpMoneyBack).
	Refunds   []SeenRefund `json:"refunds,omitempty"`
	Refunded  int64        `json:"refunded,omitempty"`
	DisputeID string       `json:"disputeId,omitempty"`
	Disputed  int64        `json:"disputed,omitempty"`
	// Foreign: its session's customer is not one this gateway made
	// (another gateway's on the same Stripe account): its money is not
	// this gateway's, so Revenue neither counts nor lists it.
	Foreign bool `json:"foreign,omitempty"`
	// Unlisted are the events (by id) of money back of it seen while it
	// was not granted whose refunds Stripe could not list then: what went
	// back is known to be more than Refunds say, by how much not. Its
	// grant lists them first, and is not made while it cannot
	// (listUnlisted).
	Unlisted []string `json:"unlisted,omitempty"`
	// Resolved: an operator dealt with it (refunded it in Stripe, granted
	// its credits by hand) and marked it so (ResolveNotGranted): the
	// Revenue page lists it among the resolved, not the open ones; its
	// money stays counted; its paid event coming later grants nothing
	// (skipResolved). nil while open.
	Resolved *TopUpResolution `json:"resolved,omitempty"`
	// GrantSkipped: its paid event was applied after it was marked
	// Resolved, when the config could grant it, and granted nothing (the
	// operator refunded it or granted its credits by hand): the first
	// such event, by id, and when it came. nil while none came.
	GrantSkipped *SkippedGrant `json:"grantSkipped,omitempty"`
}

// SkippedGrant is the paid event of a top-up marked resolved that came
// later and was not granted (IgnoredTopUp.GrantSkipped).
type SkippedGrant struct {
	Event string    `json:"event"`
	At    time.Time `json:"at"`
}

// TopUpResolution is who marked a top-up paid and not granted resolved,
// when, and their note ("refunded in Stripe").
type TopUpResolution struct {
	By   string    `json:"by"`
	At   time.Time `json:"at"`
	Note string    `json:"note,omitempty"`
}

// SeenRefund is a succeeded refund of a top-up not granted when it came.
type SeenRefund struct {
	ID      string `json:"id"`
	Amount  int64  `json:"amount"`
	Created int64  `json:"created,omitempty"`
}

// CustomerRecord is KindCustomer: the Stripe customer of a user, made
// once and remembered.
type CustomerRecord struct {
	UserID     string    `json:"userId"`
	CustomerID string    `json:"customerId"`
	CreatedAt  time.Time `json:"createdAt"`
}

// InvoiceRecord is KindInvoice.
type InvoiceRecord struct {
	ID             string    `json:"id"`
	UserID         string    `json:"userId"`
	ServiceID      string    `json:"serviceId"`
	ProductID      string    `json:"productId,omitempty"`
	CustomerID     string    `json:"customerId"`
	SubscriptionID string    `json:"subscriptionId,omitempty"`
	Status         string    `json:"status"` // paid, open, uncollectible, void
	AmountDue      int64     `json:"amountDue"`
	AmountPaid     int64     `json:"amountPaid"`
	Currency       string    `json:"currency"`
	PeriodStart    time.Time `json:"periodStart,omitzero"`
	PeriodEnd      time.Time `json:"periodEnd,omitzero"`
	PaidAt         time.Time `json:"paidAt,omitzero"`
	// Refunded and Disputed are what went back of AmountPaid: the
	// succeeded refunds of its charges, summed, and its lost disputes'
	// amounts, summed (invoicerefunds.go), each at most AmountPaid.
	Refunded int64 `json:"refunded,omitempty"`
	Disputed int64 `json:"disputed,omitempty"`
	// RefundedBy is, per charge of the invoice (an invoice may be paid
	// by more than one), the succeeded refunds of that charge, summed;
	// DisputedBy, per lost dispute, its amount. Refunded and Disputed
	// are their sums, so a charge's refunds told again count once and
	// two charges' refunds both count.
	RefundedBy map[string]int64 `json:"refundedBy,omitempty"`
	DisputedBy map[string]int64 `json:"disputedBy,omitempty"`
	// RefundedBefore and DisputedBefore are what a record written before
	// the per-charge amounts were kept said went back, of charges (or
	// disputes) not named: Refunded and Disputed are never less.
	RefundedBefore int64     `json:"refundedBefore,omitempty"`
	DisputedBefore int64     `json:"disputedBefore,omitempty"`
	HostedURL      string    `json:"hostedUrl,omitempty"`
	PDFURL         string    `json:"pdfUrl,omitempty"`
	UpdatedAt      time.Time `json:"updatedAt"`
}

// TopUpRecord is KindTopUp.
type TopUpRecord struct {
	ID        string `json:"id"` // PaymentIntent id
	SessionID string `json:"sessionId"`
	UserID    string `json:"userId"`
	ServiceID string `json:"serviceId"`
	ProductID string `json:"productId"`
	Pack      string `json:"pack"`
	// Credits is the grant, as a decimal string of billing.Units.
	Credits    string    `json:"credits"`
	Amount     int64     `json:"amount"`
	Currency   string    `json:"currency"`
	PaidAt     time.Time `json:"paidAt"`
	Refunded   int64     `json:"refunded,omitempty"`
	Disputed   int64     `json:"disputed,omitempty"`
	ReceiptURL string    `json:"receiptUrl,omitempty"`
	UpdatedAt  time.Time `json:"updatedAt"`
}

// SubscriptionRecord is KindSubscription: what the gateway last applied
// of a Stripe subscription, so an older event never overwrites a newer
// state.
type SubscriptionRecord struct {
	ID         string `json:"id"`
	UserID     string `json:"userId"`
	ServiceID  string `json:"serviceId"`
	ProductID  string `json:"productId"`
	CustomerID string `json:"customerId"`
	// StripeStatus is Stripe's status (active, trialing, past_due, …);
	// Status the gateway's (ACTIVE, TRIAL, CANCELLING, SUSPENDED, …).
	StripeStatus      string `json:"stripeStatus"`
	Status            string `json:"status"`
	CancelAtPeriodEnd bool   `json:"cancelAtPeriodEnd,omitempty"`
	// CancelAt is Stripe's cancel_at: a set end other than the period's.
	CancelAt         time.Time `json:"cancelAt,omitzero"`
	CurrentPeriodEnd time.Time `json:"currentPeriodEnd,omitzero"`
	// TrialEnd is Stripe's trial_end: a TRIAL ends past_due_grace after
	// it (mapStatus), also when the state is put back from the record
	// (reapplyRecord). Empty in a record written before it was kept: a
	// trialing one put back asks Stripe for it (and keeps it then).
	TrialEnd time.Time `json:"trialEnd,omitzero"`
	// StartDate is when Stripe started the subscription: metered usage is
	// never stamped before it (meters.go meterTimestamp).
	StartDate time.Time `json:"startDate,omitzero"`
	// Created is Stripe's created of the subscription: of two live
	// Stripe subscriptions of one user and service, the later made holds
	// the gateway subscription (docs/payments.md, "Two live Stripe
	// subscriptions"). Empty in a record written before it was kept:
	// StartDate stands in.
	Created time.Time `json:"created,omitzero"`
	// CurrentPeriodStart, BillingCycleAnchor, Interval and IntervalCount
	// place the subscription's billing periods (its renewals): the meter
	// shipper splits an hour that holds one (meters.go periodBoundaryIn).
	// Empty in a record written before they were kept: the periods are
	// then taken as months from StartDate.
	CurrentPeriodStart time.Time `json:"currentPeriodStart,omitzero"`
	BillingCycleAnchor time.Time `json:"billingCycleAnchor,omitzero"`
	Interval           string    `json:"interval,omitempty"`
	IntervalCount      int64     `json:"intervalCount,omitempty"`
	PastDueSince       time.Time `json:"pastDueSince,omitzero"`
	// EventCreated is the creation time of the newest event applied.
	EventCreated time.Time `json:"eventCreated,omitzero"`
	// PutBack says the record's state may not be on the gateway
	// subscription: a node wrote an older event's state over it and
	// could not put this one back (reapplyRecord failed: a trial's end
	// that Stripe could not be asked for). The next applyState of the
	// subscription, Stripe's retry of that event or any other, puts it
	// back first.
	PutBack bool `json:"putBack,omitempty"`
	// Seq counts the record's writes by applyState: every write changes
	// the record, so a swap over a read of it fails once another node
	// wrote it in between (applyState).
	Seq       int64     `json:"seq,omitempty"`
	UpdatedAt time.Time `json:"updatedAt"`
}
