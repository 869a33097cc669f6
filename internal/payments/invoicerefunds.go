package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/stripe/stripe-go/v82"

	"github.com/platformgw/gateway/internal/store"
)

// Money given back of a paid invoice: a refund made in the Dashboard (or
// by a credit note), or a dispute lost. It changes no credits and no
// subscription; the invoice's record keeps what went back, so the Revenue
// page counts what was received, not what was once paid
// (docs/payments.md, "Money in the console").

// legacyCharge is what a charge or dispute of an API version before
// 2025-03-31 says of the invoice it paid; basil's types dropped it.
type legacyCharge struct {
	Invoice json.RawMessage `json:"invoice"`
	Charge  *struct {
		Invoice json.RawMessage `json:"invoice"`
	} `json:"charge"`
}

// invoiceOf is the invoice the charge of raw (a charge or a dispute
// object), of PaymentIntent pi, paid: as the object names it, else as
// Stripe's invoice payments say; "" when it paid none.
func (s *Service) invoiceOf(ctx context.Context, raw []byte, pi string) (string, error) {
	var old legacyCharge
	if json.Unmarshal(raw, &old) == nil {
		if id := idOf(old.Invoice); id != "" {
			return id, nil
		}
		if old.Charge != nil {
			if id := idOf(old.Charge.Invoice); id != "" {
				return id, nil
			}
		}
	}
	if pi == "" {
		return "", nil
	}
	params := &stripe.InvoicePaymentListParams{Payment: &stripe.InvoicePaymentListPaymentParams{
		Type: stripe.String("payment_intent"), PaymentIntent: stripe.String(pi)}}
	for p, err := range s.sc.V1InvoicePayments.List(ctx, params) {
		if err != nil {
			return "", fmt.Errorf("asking Stripe which invoice PaymentIntent %s paid: %w", pi, stripeErr(err))
		}
		if p != nil && p.Invoice != nil && p.Invoice.ID != "" {
			return p.Invoice.ID, nil
		}
	}
	return "", nil
}

// invoiceKept makes sure the gateway keeps a record of invoice invID,
// whose charge's refund or lost dispute is being applied: Stripe sends
// events in no set order, so that event may come before the invoice's
// own (invoice.paid). The invoice is then read from Stripe and recorded
// as its event would record it (putInvoice, as a resync does), and the
// money back is kept on that record; invoice.paid, when it comes, finds
// the record and keeps what went back. false when the invoice is not one
// of the gateway's (its customer or product unknown, Stripe has no such
// invoice): there is nothing to keep the money back on, as before.
func (s *Service) invoiceKept(ctx context.Context, pay store.Payments, invID string) (bool, error) {
	if _, err := pay.GetPaymentRecord(ctx, KindInvoice, invID); err == nil {
		return true, nil
	} else if !errors.Is(err, store.ErrNotFound) {
		return false, err
	}
	inv, err := s.sc.V1Invoices.Retrieve(ctx, invID, nil)
	if err != nil {
		var se *stripe.Error
		if errors.As(err, &se) && se.HTTPStatusCode == http.StatusNotFound {
			return false, nil
		}
		// Answered 500: Stripe sends the event again.
		return false, fmt.Errorf("asking Stripe for invoice %s, paid by a charge given back before its invoice event came: %w", invID, stripeErr(err))
	}
	cust := ""
	if inv.Customer != nil {
		cust = inv.Customer.ID
	}
	var bad badEventError
	user, err := s.userOfCustomer(ctx, pay, cust)
	if errors.As(err, &bad) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	id, subID, err := s.invoiceIdent(ctx, pay, inv, user)
	if errors.As(err, &bad) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	if err := s.putInvoice(ctx, pay, inv, id, subID, cust); err != nil {
		return false, fmt.Errorf("recording invoice %s read from Stripe: %w", invID, err)
	}
	return true, nil
}

// invoiceMoneyBack records on invoice invID what went back of it: the
// succeeded refunds of its charge charge, summed, as refunded, or a lost
// dispute's amount as disputed (charge is then the dispute's id). An
// invoice may be paid by more than one charge, so each charge's refunds
// (and each dispute) are kept apart and the record's Refunded and
// Disputed are their sums; each is only ever raised, so the same event
// twice, or an older one late, changes nothing. false when the gateway
// keeps no such invoice.
func (s *Service) invoiceMoneyBack(ctx context.Context, pay store.Payments, invID, charge string, refunded, disputed int64, what string) (bool, error) {
	invoiceMu.Lock()
	defer invoiceMu.Unlock()
	now := s.now()
	// Only over the record read: another node's change of it made since
	// (an invoice event, another refund, a dispute) is read again and kept.
	var more bool // what went back in all grew
	r, wrote, err := changeRecord(ctx, pay, KindInvoice, invID, now, func(r *InvoiceRecord) bool {
		was := r.Refunded + r.Disputed
		if !moneyBack(r, charge, refunded, disputed) {
			return false
		}
		more = r.Refunded+r.Disputed > was
		r.UpdatedAt = now.UTC()
		return true
	})
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("recording %s of invoice %s: %w", what, invID, err)
	}
	if !wrote || !more {
		return true, nil
	}
	s.auditMoneyBack(ctx, invID, what, r)
	return true, nil
}

// moneyBack raises what went back of invoice r by charge (a charge's
// refunds summed, refunded) or by a dispute (its id as charge, disputed),
// and sums them again into r.Refunded and r.Disputed; false when nothing
// changed (true also when only the per-charge amounts did: a charge an
// old record counted, see below). A record written before the amounts were kept per charge
// keeps what it said went back as RefundedBefore and DisputedBefore: of
// charges it does not name, so the sums are never less than those (a
// charge it counted, named again, is then counted once).
func moneyBack(r *InvoiceRecord, charge string, refunded, disputed int64) bool {
	if r.RefundedBy == nil && r.DisputedBy == nil {
		r.RefundedBefore, r.DisputedBefore = max(r.RefundedBefore, r.Refunded), max(r.DisputedBefore, r.Disputed)
	}
	changed := false
	raise := func(by *map[string]int64, amount int64) {
		if amount <= 0 || amount <= (*by)[charge] {
			return
		}
		if *by == nil {
			*by = map[string]int64{}
		}
		(*by)[charge] = amount
		changed = true
	}
	raise(&r.RefundedBy, refunded)
	raise(&r.DisputedBy, disputed)
	return sumMoneyBack(r) || changed
}

// sumMoneyBack sums what went back of invoice r, per charge and per
// dispute, into r.Refunded and r.Disputed, each at most r.AmountPaid;
// true when either grew. It is summed again whenever AmountPaid may have
// grown (putInvoice): a refund of a retry's charge may come while the
// record still says the invoice's first charge failed, nothing paid, so
// its sum then was held to 0.
func sumMoneyBack(r *InvoiceRecord) bool {
	sum := func(by map[string]int64, before int64) int64 {
		var n int64
		for _, v := range by {
			n += v
		}
		return min(max(n, before), r.AmountPaid)
	}
	ref, dis := sum(r.RefundedBy, r.RefundedBefore), sum(r.DisputedBy, r.DisputedBefore)
	grew := ref > r.Refunded || dis > r.Disputed
	// Only ever raised: AmountPaid read lower by an older event never
	// lowers what was recorded.
	r.Refunded, r.Disputed = max(r.Refunded, ref), max(r.Disputed, dis)
	return grew
}

// auditMoneyBack audits what went back of invoice r, grown by what.
func (s *Service) auditMoneyBack(ctx context.Context, invID, what string, r InvoiceRecord) {
	s.audit(ctx, AuditInvoiceStripe, r.UserID, r.ServiceID, fmt.Sprintf("invoice %s of product %s: %s; %s of %s paid went back",
		invID, r.ProductID, what, MinorMoney(min(r.Refunded+r.Disputed, r.AmountPaid), r.Currency), MinorMoney(r.AmountPaid, r.Currency)))
}

// invoiceRefunded records the succeeded refunds of charge ch on the
// invoice it paid; false when it paid none the gateway keeps.
func (s *Service) invoiceRefunded(ctx context.Context, pay store.Payments, raw []byte, ch *stripe.Charge, pi string, also *stripe.Refund) (bool, error) {
	invID, err := s.invoiceOf(ctx, raw, pi)
	if err != nil || invID == "" {
		return false, err
	}
	if ok, err := s.invoiceKept(ctx, pay, invID); !ok || err != nil {
		return false, err
	}
	refunds, err := s.refundsOf(ctx, ch)
	if err != nil {
		return false, err
	}
	var sum int64
	seen := false
	for _, r := range refunds {
		sum += r.Amount
		seen = seen || also != nil && r.ID == also.ID
	}
	if also != nil && !seen && also.Amount > 0 {
		sum += also.Amount // the list lags behind the event
	}
	return s.invoiceMoneyBack(ctx, pay, invID, ch.ID, sum, 0, "refund of charge "+ch.ID)
}
