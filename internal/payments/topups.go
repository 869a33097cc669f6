package payments

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/stripe/stripe-go/v82"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/subscription"
)

// Prepaid top-ups (docs/payments.md, "Prepaid top-ups"): a caller of a
// prepaid product buys a pack of credits (`topup` in the payments block)
// through a Checkout Session in payment mode; the paid session grants the
// pack's credits once, by the PaymentIntent's id (store.Payments
// GrantCredits); a refund takes back credits in proportion to the money
// returned, once per refund id, and a lost dispute the rest, once per
// dispute id (ReverseCredits); the balance may go negative. Grants with an
// expires_after end at their time, oldest first (ExpireCredits, run by the
// platform's maintenance).

// MetaPack is the metadata key naming the pack a top-up's Checkout
// Session (and its PaymentIntent) bought, beside MetaUser, MetaService and
// MetaProduct: who bought which pack. The webhook trusts it because only
// the gateway makes these sessions and the event is signed.
const MetaPack = "platform_pack"

func init() {
	checkoutByMode[stripe.CheckoutSessionModePayment] = topUpPaid
	// A delayed payment method (a bank debit) completes the session
	// unpaid and pays later: the grant waits for this event.
	handle(stripe.EventTypeCheckoutSessionAsyncPaymentSucceeded, topUpPaid)
	handle(stripe.EventTypeCheckoutSessionAsyncPaymentFailed, topUpFailed)
	handle(stripe.EventTypeChargeRefunded, chargeRefunded)
	// A refund that was pending when charge.refunded came takes its
	// credits when it succeeds.
	handle(stripe.EventTypeChargeRefundUpdated, refundUpdated)
	handle(stripe.EventTypeChargeDisputeClosed, disputeClosed)
}

// Errors of StartTopUp, for the portal to word.
var (
	ErrUnknownPack    = errors.New("payments: no such credit pack")
	ErrNoSubscription = errors.New("payments: no running subscription to buy credits for")
)

// Pack finds the credit pack name of a product.
func (s *Service) Pack(serviceID, productID, name string) (TopUp, bool) {
	for _, t := range s.cfg.TopUpsFor(serviceID, productID) {
		if t.Name == name {
			return t, true
		}
	}
	return TopUp{}, false
}

// StartTopUp opens a Checkout Session in payment mode for one pack of
// credits bought by userID, and returns the URL of Stripe's page to send
// the caller to. The caller must have a subscription to the service, to
// the pack's product, that grants access now (else ErrNoSubscription,
// wrapped with which it is). successURL and cancelURL are where Stripe sends them
// back.
func (s *Service) StartTopUp(ctx context.Context, userID, serviceID, productID, pack, successURL, cancelURL string) (string, error) {
	t, ok := s.Pack(serviceID, productID, pack)
	if !ok {
		return "", ErrUnknownPack
	}
	sub, err := s.Store().GetSubscription(ctx, userID, serviceID)
	if errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrNoAccount) {
		return "", ErrNoSubscription
	}
	if err != nil {
		return "", err
	}
	// The credits go to the caller's subscription: it must be to the
	// pack's product, or they would be granted to a plan that does not
	// spend them.
	if sub.ProductID != productID {
		return "", fmt.Errorf("%w: the subscription to %s is to product %s, not %s, whose pack this is", ErrNoSubscription, serviceID, sub.ProductID, productID)
	}
	if st := subscription.EffectiveStatus(sub, s.now()); !st.GrantsAccess() {
		return "", fmt.Errorf("%w: the subscription to %s is %s", ErrNoSubscription, serviceID, st)
	}
	customer, err := s.CustomerFor(ctx, userID, "")
	if err != nil {
		return "", err
	}
	meta := map[string]string{MetaUser: userID, MetaService: serviceID, MetaProduct: productID, MetaPack: t.Name}
	params := &stripe.CheckoutSessionCreateParams{
		Mode:              stripe.String(string(stripe.CheckoutSessionModePayment)),
		Customer:          stripe.String(customer),
		ClientReferenceID: stripe.String(userID),
		LineItems:         []*stripe.CheckoutSessionCreateLineItemParams{{Price: stripe.String(t.Price), Quantity: stripe.Int64(1)}},
		Metadata:          meta,
		// The PaymentIntent carries it too, so that a charge's refund or
		// dispute can be traced in Stripe's dashboard.
		PaymentIntentData: &stripe.CheckoutSessionCreatePaymentIntentDataParams{Metadata: meta},
		SuccessURL:        stripe.String(successURL),
		CancelURL:         stripe.String(cancelURL),
	}
	cs, err := s.sc.V1CheckoutSessions.Create(ctx, params)
	if err != nil {
		return "", fmt.Errorf("creating the Checkout Session of pack %s of %s/%s: %w", t.Name, serviceID, productID, err)
	}
	if cs.URL == "" {
		return "", fmt.Errorf("stripe answered Checkout Session %s without a URL", cs.ID)
	}
	return cs.URL, nil
}

// PackPrice is what a pack costs, from its Stripe Price (asked once per
// Price and remembered). ok is false when Stripe could not say (down, or
// a Price without a unit amount, which the config check refuses): the
// portal then shows the listing's currency and leaves the amount to
// Checkout.
func (s *Service) PackPrice(ctx context.Context, t TopUp) (catalog.Money, bool) {
	p, err := s.packPrice(ctx, t)
	return p.base, err == nil
}

// packPriceOf is what a pack's Price charges: its unit_amount in its
// currency, and in each of its currency_options (a Price Checkout may
// charge in the customer's currency), by upper-case currency.
type packPriceOf struct {
	base       catalog.Money
	byCurrency map[string]catalog.Money
}

// packPrice is what a pack costs. A Price without a fixed unit_amount
// (the customer chooses the price, tiers, a fraction of a minor unit) is
// a badEvent: a pack is sold for a fixed amount, and what such a
// Checkout was paid says nothing of the pack. Stripe out of reach is an
// error worth retrying.
func (s *Service) packPrice(ctx context.Context, t TopUp) (packPriceOf, error) {
	if m, ok := priceCache.Load(t.Price); ok {
		return m.(packPriceOf), nil
	}
	return s.readPackPrice(ctx, t)
}

// readPackPrice asks Stripe what pack t costs and remembers it
// (priceCache). A failure leaves what was remembered as it was.
func (s *Service) readPackPrice(ctx context.Context, t TopUp) (packPriceOf, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	params := &stripe.PriceRetrieveParams{}
	params.AddExpand("currency_options")
	p, err := s.sc.V1Prices.Retrieve(ctx, t.Price, params)
	if err != nil {
		return packPriceOf{}, fmt.Errorf("reading Price %s of pack %s from Stripe: %w", t.Price, t.Name, stripeErr(err))
	}
	if p.Currency == "" || p.UnitAmount <= 0 {
		return packPriceOf{}, badEvent("Price %s of pack %s has no fixed unit_amount (a price the customer chooses, tiered or fractional): a pack is sold for a fixed amount", t.Price, t.Name)
	}
	out := packPriceOf{base: MinorMoney(p.UnitAmount, string(p.Currency)), byCurrency: map[string]catalog.Money{}}
	for cur, o := range p.CurrencyOptions {
		if o != nil && o.UnitAmount > 0 && o.CustomUnitAmount == nil && len(o.Tiers) == 0 {
			m := MinorMoney(o.UnitAmount, cur)
			out.byCurrency[m.Currency] = m
		}
	}
	out.byCurrency[out.base.Currency] = out.base
	priceCache.Store(t.Price, out)
	return out, nil
}

// paidForPack checks that a paid session was sold at what pack t costs.
// Its amount_subtotal and currency are the line's price before discounts
// and taxes (a promotion code the operator allows, or tax Stripe adds,
// changes what was charged, not which pack was bought); with Stripe's
// Adaptive Pricing (the customer's local currency) currency_conversion
// holds it in the Price's own currency.
//
// The Price remembered may be older than the session: an operator can
// add or change a Price's currency_options in Stripe at any time, and
// Checkout then charges in the new currency. So a session that does not
// match the Price remembered is checked again against the Price read
// afresh before it is refused (a refusal is for good: the event is
// answered 200). Only such a mismatch, rare, costs a Stripe read.
func (s *Service) paidForPack(ctx context.Context, cs *stripe.CheckoutSession, t TopUp) error {
	paid := MinorMoney(cs.AmountSubtotal, string(cs.Currency))
	if cc := cs.CurrencyConversion; cc != nil && cc.SourceCurrency != "" {
		paid = MinorMoney(cc.AmountSubtotal, string(cc.SourceCurrency))
	}
	price, err := s.packPrice(ctx, t)
	if err != nil {
		return err
	}
	if want, ok := price.byCurrency[paid.Currency]; ok && want == paid {
		return nil
	}
	// Read it again: it may have changed since. Not forgotten first: a
	// failed read (Stripe out of reach, 500, sent again) keeps the Price
	// remembered for the sessions that match it.
	if price, err = s.readPackPrice(ctx, t); err != nil {
		return err
	}
	if want, ok := price.byCurrency[paid.Currency]; ok && want == paid {
		return nil
	}
	return badEvent("session %s paid %s, but pack %s of %s costs %s (Price %s): not credited", cs.ID, paid, t.Name, t.Product, price.base, t.Price)
}

// priceCache holds the Prices of packs asked of Stripe (packPriceOf),
// by id. A Price's unit_amount never changes in Stripe (a new amount is a
// new Price), but its currency_options may: paidForPack reads a Price
// again when a session does not match the one remembered.
var priceCache sync.Map

// MinorMoney is an amount in a currency's minor units, as Stripe gives it
// (1000 usd is 10.00 USD, 500 jpy is 500 JPY, 100000 isk is 1000 ISK):
// Stripe's minor units, which are not ISO 4217's for every currency
// (StripeMinorDigits).
func MinorMoney(amount int64, currency string) catalog.Money {
	code := strings.ToUpper(currency)
	per := int64(billing.Scale)
	for range StripeMinorDigits(code) {
		per /= 10
	}
	return catalog.Money{Amount: billing.Units(amount * per), Currency: code}
}

// StripeMinorDigits is how many minor digits Stripe's API counts an
// amount of the currency in. It is ISO 4217's (catalog.MinorDigits) but
// for the currencies Stripe documents otherwise (docs.stripe.com/currencies,
// "Zero-decimal currencies" and "Special cases"): MGA is zero-decimal in
// Stripe (ISO: 2), and ISK stays two-decimal in Stripe's API, whole
// kronur only, an amount of 100 being 1 króna (ISO: 0). Reading 5000 mga
// with ISO's digits recorded a payment of 5000 MGA as 50.00 MGA, and
// `stripe sync` asked 100 times a listing's MGA price (and a hundredth of
// an ISK one).
func StripeMinorDigits(code string) int {
	switch strings.ToUpper(code) {
	case "MGA":
		return 0
	case "ISK":
		return 2
	}
	return catalog.MinorDigits(code)
}

// StripeMinorUnits is m as a whole number of Stripe's minor units of its
// currency (Price.unit_amount); false when m is finer than what Stripe
// can charge (0.5 MGA, 0.50 ISK, 0.001 USD).
func StripeMinorUnits(m catalog.Money) (int64, bool) {
	n, ok := m.MinorUnitsOf(StripeMinorDigits(m.Currency))
	if ok && strings.EqualFold(m.Currency, "ISK") && n%100 != 0 {
		return 0, false // Stripe takes whole kronur only
	}
	return n, ok
}

// topUpOf resolves the metadata of a top-up's session: an event naming a
// user without a subscription, a product or a pack this config does not
// have can never apply (a badEvent: 200, recorded as ignored, nothing
// changes).
func (s *Service) topUpOf(ctx context.Context, meta map[string]string) (TopUp, error) {
	userID, serviceID, productID, pack := meta[MetaUser], meta[MetaService], meta[MetaProduct], meta[MetaPack]
	if userID == "" || serviceID == "" || productID == "" || pack == "" {
		return TopUp{}, badEvent("the session's metadata does not name a user, service, product and pack of a top-up")
	}
	if _, _, err := lookup(s.cat, serviceID, productID); err != nil {
		return TopUp{}, badEvent("the session names %s/%s: %v", serviceID, productID, err)
	}
	t, ok := s.Pack(serviceID, productID, pack)
	if !ok {
		return TopUp{}, badEvent("the session names pack %q, which %s/%s does not have", pack, serviceID, productID)
	}
	if _, err := s.Store().GetSubscription(ctx, userID, serviceID); errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrNoAccount) {
		return TopUp{}, badEvent("the session names user %q, who has no subscription to %s", userID, serviceID)
	} else if err != nil {
		return TopUp{}, err
	}
	return t, nil
}

// topUpCustomer checks that a top-up's session is the gateway's for
// the user its metadata names: its customer is the one the gateway made
// for that user, and so is its client_reference_id when set. Anything
// else is a badEvent, as for a subscription's Checkout: a session of
// another gateway on the same Stripe account (whose user may have the
// same id here), or one whose metadata names another user than the one
// who paid, grants nothing.
func (s *Service) topUpCustomer(ctx context.Context, cs *stripe.CheckoutSession) error {
	pay, err := s.Payments()
	if err != nil {
		return err
	}
	cust, user, err := s.sessionUser(ctx, pay, cs)
	if err != nil {
		var bad badEventError
		if errors.As(err, &bad) {
			return badEvent("session %s: %s", cs.ID, bad.msg)
		}
		return err
	}
	if mu := cs.Metadata[MetaUser]; mu != user || cs.ClientReferenceID != "" && cs.ClientReferenceID != user {
		return badEvent("session %s: started for another user than its customer's (customer %s is %s's)", cs.ID, cust, user)
	}
	return nil
}

// topUpPaid grants a paid top-up's credits: checkout.session.completed
// in payment mode when it is paid, and
// checkout.session.async_payment_succeeded. The grant's id is the
// PaymentIntent's, so the same payment grants once whichever events and
// however many times they come. One paid and not granted that an
// operator marked resolved is not granted (skipResolved).
func topUpPaid(s *Service, ctx context.Context, ev *stripe.Event) error {
	var cs stripe.CheckoutSession
	if err := decodeObject(ev, &cs); err != nil {
		return badEvent("%s: the session does not parse: %v", ev.Type, err)
	}
	if cs.Mode != stripe.CheckoutSessionModePayment {
		return nil // a subscription's session: its invoices drive it
	}
	if cs.PaymentStatus != stripe.CheckoutSessionPaymentStatusPaid {
		return nil // a delayed payment: async_payment_succeeded grants
	}
	if !ours(cs.Metadata) {
		return nil // a payment the gateway did not start (a Payment Link)
	}
	userID := cs.Metadata[MetaUser]
	t, err := s.topUpOf(ctx, cs.Metadata)
	if err == nil {
		err = s.topUpCustomer(ctx, &cs)
	}
	if err != nil {
		return s.ignoredTopUp(ctx, &cs, ev, err)
	}
	if cs.AmountTotal <= 0 || cs.Currency == "" {
		return badEvent("session %s: a top-up is paid with money; amount_total %d %q", cs.ID, cs.AmountTotal, cs.Currency)
	}
	if cs.PaymentIntent == nil || cs.PaymentIntent.ID == "" {
		return badEvent("session %s: a paid top-up without a payment_intent has nothing to grant by", cs.ID)
	}
	pi := cs.PaymentIntent.ID
	paid := MinorMoney(cs.AmountTotal, string(cs.Currency))
	// What was paid must be what the pack costs (quantity 1, no discount
	// nor tax on the gateway's sessions): the credits are the pack's, so
	// a session paid otherwise (a custom amount, another Price) is not
	// credited.
	if err := s.paidForPack(ctx, &cs, t); err != nil {
		return s.ignoredTopUp(ctx, &cs, ev, err)
	}
	// The event's time, the same on every delivery, so the grant is the
	// same whichever delivery makes it (unless it comes late: grantTime).
	paidAt := time.Unix(ev.Created, 0).UTC()
	g := store.CreditGrant{ID: pi, UserID: userID, ServiceID: t.Service, Credits: t.Credits, GrantedAt: grantTime(paidAt, s.now()),
		Source: "stripe", Reference: fmt.Sprintf("pack %s of %s, %s paid, Checkout %s", t.Name, t.Product, paid, cs.ID)}
	if t.ExpiresAfter > 0 {
		g.ExpiresAt = g.GrantedAt.Add(time.Duration(t.ExpiresAfter))
	}
	pay, err := s.Payments()
	if err != nil {
		return err
	}
	if skipped, err := s.skipResolved(ctx, pay, pi, ev); skipped || err != nil {
		return err
	}
	if err := s.listUnlisted(ctx, pay, pi); err != nil {
		return err
	}
	if _, err := pay.GrantCredits(ctx, g); err != nil && !errors.Is(err, store.ErrReplayed) {
		if errors.Is(err, store.ErrNoAccount) || errors.Is(err, store.ErrBadInput) {
			return badEvent("session %s: %v", cs.ID, err)
		}
		return fmt.Errorf("granting top-up %s: %w", pi, err)
	}
	if _, err := pay.GetPaymentRecord(ctx, KindTopUp, pi); err == nil {
		// Recorded by an earlier delivery, which may have failed taking
		// back what went back before the grant.
		return s.catchUpMoneyBack(ctx, pay, pi, ev.Created)
	}
	rec := TopUpRecord{ID: pi, SessionID: cs.ID, UserID: userID, ServiceID: t.Service, ProductID: t.Product, Pack: t.Name,
		Credits: t.Credits.String(), Amount: cs.AmountTotal, Currency: strings.ToUpper(string(cs.Currency)),
		PaidAt: paidAt, ReceiptURL: s.receiptURL(ctx, pi), UpdatedAt: s.now().UTC()}
	body, _ := json.Marshal(rec)
	if _, err := pay.InsertPaymentRecord(ctx, KindTopUp, pi, body, s.now()); err != nil && !errors.Is(err, store.ErrExists) {
		return fmt.Errorf("recording top-up %s: %w", pi, err)
	}
	// After the record, so that a refund seen as not granted meanwhile
	// (seenNotGranted, which reads this record after writing its own)
	// is found by one of the two.
	return s.catchUpMoneyBack(ctx, pay, pi, ev.Created)
}

// skipResolved is true when the top-up of PaymentIntent pi, whose paid
// event ev the config can grant now, was paid and not granted and an
// operator marked it resolved since (ResolveNotGranted: refunded in
// Stripe, or its credits granted by hand): the paid event grants nothing
// (answered 200, Stripe stops; granting it is the operator's decision
// now), and the first such event is kept on its ignored top-up record
// (GrantSkipped) and audited. A top-up granted before the mark (its
// record there) is not skipped: its grant is replayed, nothing more.
func (s *Service) skipResolved(ctx context.Context, pay store.Payments, pi string, ev *stripe.Event) (bool, error) {
	ig, found, err := readIgnored(ctx, pay, pi)
	if !found || err != nil {
		return false, err
	}
	if ig.Resolved == nil {
		return false, nil
	}
	switch _, err := pay.GetPaymentRecord(ctx, KindTopUp, pi); {
	case err == nil:
		return false, nil
	case !errors.Is(err, store.ErrNotFound):
		return false, err
	}
	now := s.now().UTC()
	ig, changed, err := changeRecord(ctx, pay, KindTopUpIgnored, pi, now, func(r *IgnoredTopUp) bool {
		if r.GrantSkipped != nil {
			return false
		}
		r.GrantSkipped = &SkippedGrant{Event: ev.ID, At: now}
		return true
	})
	if err != nil {
		return false, fmt.Errorf("recording that top-up %s, marked resolved, was not granted: %w", pi, err)
	}
	fields := []zap.Field{zap.String("payment_intent", pi), zap.String("event_id", ev.ID), zap.String("user_id", ig.UserID),
		zap.String("service_id", ig.ServiceID), zap.String("resolved_by", ig.Resolved.By)}
	if !changed {
		s.log.Info("paid event of a top-up marked resolved: not granted (again)", fields...)
		return true, nil
	}
	s.log.Warn("paid event of a top-up marked resolved came later: not granted, the operator dealt with it", fields...)
	amount := "amount not recorded"
	if ig.Amount > 0 {
		amount = MinorMoney(ig.Amount, ig.Currency).String()
	}
	s.audit(ctx, AuditTopUpGrantSkipped, ig.UserID, ig.ServiceID, fmt.Sprintf("top-up %s (%s, pack %s) marked resolved by %s at %s: its paid event %s came later and granted nothing",
		pi, amount, cmp.Or(ig.Pack, "?"), ig.Resolved.By, ig.Resolved.At.Format(time.RFC3339), ev.ID))
	return true, nil
}

// catchUpMoneyBack takes back, from the top-up of PaymentIntent pi just
// granted, what went back of it before it was granted: the refunds and
// the lost dispute seen while it could not be (its paid event not
// applied yet and the config unable to grant it, or ignored), kept on
// its KindTopUpIgnored record. Each by its id, so once, as its own event
// would have (and as a later event of its charge does).
func (s *Service) catchUpMoneyBack(ctx context.Context, pay store.Payments, pi string, evCreated int64) error {
	// Again after the grant: a refund seen while the grant was being made.
	if err := s.listUnlisted(ctx, pay, pi); err != nil {
		return err
	}
	ig, found, err := readIgnored(ctx, pay, pi)
	if !found || err != nil {
		return err
	}
	if len(ig.Refunds) == 0 && ig.DisputeID == "" {
		return nil
	}
	rec, err := s.topUpRecord(ctx, pay, pi)
	if err != nil {
		return err
	}
	if rec.Amount <= 0 {
		return nil
	}
	if len(ig.Refunds) > 0 {
		var refunds []*stripe.Refund
		for _, r := range ig.Refunds {
			refunds = append(refunds, &stripe.Refund{ID: r.ID, Amount: r.Amount, Created: r.Created, Status: stripe.RefundStatusSucceeded})
		}
		sortRefunds(refunds)
		ch := &stripe.Charge{Amount: rec.Amount, Currency: stripe.Currency(strings.ToLower(rec.Currency))}
		if err := s.takeRefunds(ctx, pay, rec, ch, refunds, evCreated); err != nil {
			return err
		}
	}
	if ig.DisputeID != "" {
		return s.takeDispute(ctx, pay, rec, ig.DisputeID, ig.Disputed, rec.Currency, time.Unix(evCreated, 0).UTC())
	}
	return nil
}

// lateGrant is how long after its payment a top-up's grant may come and
// still be dated at the payment (grantTime).
const lateGrant = time.Hour

// grantTime is the time of a top-up's grant, from which its expiry
// counts and by which it is spent oldest first: the payment's, paidAt,
// the same whichever delivery makes the grant; but when the grant comes
// more than lateGrant after the payment (the webhook endpoint was down,
// or its secret wrong, and the event is delivered days later or resent
// from Stripe's Dashboard), the grant's own, now: the caller could not
// spend the credits before, and a pack delivered later than its
// expires_after after its payment was granted already expired, paid for
// and never spendable. The top-up record keeps the payment's time.
func grantTime(paidAt, now time.Time) time.Time {
	if now.Sub(paidAt) > lateGrant {
		return now.UTC().Truncate(time.Second)
	}
	return paidAt
}

// ignoredTopUp remembers a paid top-up that err (a badEvent) keeps from
// being granted, by its PaymentIntent, so that its refund or dispute is
// known for one that takes nothing back (notGrantedYet) even once the
// reason is gone (its user subscribed since): answered with an error, it
// came back for Stripe's three days of retries. It keeps who paid what
// (the session's metadata and amount, at the event's time) for the
// Revenue page, which lists it as paid and not granted. A failure to
// remember it is an error, so that Stripe sends the event again.
func (s *Service) ignoredTopUp(ctx context.Context, cs *stripe.CheckoutSession, ev *stripe.Event, err error) error {
	var bad badEventError
	if !errors.As(err, &bad) || cs.PaymentIntent == nil || cs.PaymentIntent.ID == "" {
		return err
	}
	pay, perr := s.Payments()
	if perr != nil {
		return perr
	}
	// A session whose customer this gateway did not make (another
	// gateway's on the same Stripe account, or none) is remembered so
	// that its refund is known, but its money is not this gateway's: the
	// Revenue page neither counts nor lists it (Foreign).
	var notOurs badEventError
	_, _, uerr := s.sessionUser(ctx, pay, cs)
	if uerr != nil && !errors.As(uerr, &notOurs) {
		return uerr
	}
	now := s.now().UTC()
	ig := IgnoredTopUp{ID: cs.PaymentIntent.ID, SessionID: cs.ID, Reason: bad.msg, At: now,
		UserID: cs.Metadata[MetaUser], ServiceID: cs.Metadata[MetaService], ProductID: cs.Metadata[MetaProduct], Pack: cs.Metadata[MetaPack],
		Amount: cs.AmountTotal, Currency: strings.ToUpper(string(cs.Currency)), PaidAt: time.Unix(ev.Created, 0).UTC(),
		Foreign: uerr != nil}
	if perr := s.keepIgnored(ctx, pay, ig, func(old *IgnoredTopUp) bool {
		// A record a refund or dispute wrote first: the session's own
		// facts fill in what it did not know.
		changed := old.SessionID == "" || old.Amount == 0 && ig.Amount > 0 || ig.Foreign && !old.Foreign
		old.Foreign = old.Foreign || ig.Foreign
		old.SessionID = cmp.Or(old.SessionID, ig.SessionID)
		old.Reason = ig.Reason
		old.UserID, old.ServiceID = cmp.Or(old.UserID, ig.UserID), cmp.Or(old.ServiceID, ig.ServiceID)
		old.ProductID, old.Pack = cmp.Or(old.ProductID, ig.ProductID), cmp.Or(old.Pack, ig.Pack)
		if old.Amount == 0 && ig.Amount > 0 {
			old.Amount, old.Currency = ig.Amount, ig.Currency
		}
		if old.PaidAt.IsZero() {
			old.PaidAt = ig.PaidAt
		}
		return changed
	}); perr != nil {
		return fmt.Errorf("recording the ignored top-up %s: %w", cs.PaymentIntent.ID, perr)
	}
	return err
}

// keepIgnored inserts the ignored top-up record ig, or, when there is
// one, makes change on it (changeRecord: another node's change made
// meanwhile is kept).
func (s *Service) keepIgnored(ctx context.Context, pay store.Payments, ig IgnoredTopUp, change func(*IgnoredTopUp) bool) error {
	body, _ := json.Marshal(ig)
	_, err := pay.InsertPaymentRecord(ctx, KindTopUpIgnored, ig.ID, body, s.now())
	if !errors.Is(err, store.ErrExists) {
		return err
	}
	_, _, err = changeRecord(ctx, pay, KindTopUpIgnored, ig.ID, s.now(), change)
	return err
}

// seen is what a refund's or dispute's event tells of money gone back
// of a payment (notGrantedYet): the charge's succeeded refunds (asked
// only when needed), or a lost dispute; and what the charge was paid,
// when the event says.
type seen struct {
	refunds func() ([]*stripe.Refund, error)
	// event is the id of the event that tells it: kept as Unlisted when
	// refunds cannot be listed.
	event     string
	disputeID string
	disputed  int64
	amount    int64
	currency  string
	paidAt    time.Time
}

// seenNotGranted keeps on the ignored top-up record of pi (made if there
// is none, with meta's user, service, product and pack) the money back
// that an event of a top-up not granted tells (back), so that a grant
// made later takes it back (catchUpMoneyBack) and the Revenue page
// counts the payment net of it. Then it reads the top-up's record: a
// grant made meanwhile, which may have read the ignored record before
// this write, is an error, so that Stripe sends the event again and it
// takes back from the grant.
func (s *Service) seenNotGranted(ctx context.Context, pay store.Payments, pi string, meta map[string]string, reason string, back seen) error {
	ig := IgnoredTopUp{ID: pi, Reason: reason, At: s.now().UTC(), UserID: meta[MetaUser], ServiceID: meta[MetaService],
		ProductID: meta[MetaProduct], Pack: meta[MetaPack], Amount: back.amount, Currency: strings.ToUpper(back.currency), PaidAt: back.paidAt}
	// facts fills in what the event says of the payment.
	facts := func(r *IgnoredTopUp) bool {
		changed := false
		if r.Amount == 0 && back.amount > 0 {
			r.Amount, r.Currency, changed = back.amount, strings.ToUpper(back.currency), true
		}
		if r.PaidAt.IsZero() && !back.paidAt.IsZero() {
			r.PaidAt, changed = back.paidAt, true
		}
		return changed
	}
	var refunds []SeenRefund
	if back.refunds != nil {
		rs, err := back.refunds()
		if err != nil && back.event != "" {
			// Money went back, by how much Stripe cannot say now: kept
			// as such before the 500, so that a grant made before this
			// event is sent again lists the refunds itself, and is not
			// made while it cannot, rather than grant the whole pack.
			ig.Unlisted = []string{back.event}
			if kerr := s.keepIgnored(ctx, pay, ig, func(r *IgnoredTopUp) bool {
				changed := facts(r)
				if !slices.Contains(r.Unlisted, back.event) {
					r.Unlisted, changed = append(r.Unlisted, back.event), true
				}
				return changed
			}); kerr != nil {
				return fmt.Errorf("recording that money went back of top-up %s, not granted: %w (and %w)", pi, kerr, err)
			}
		}
		if err != nil {
			return err
		}
		refunds = seenRefunds(rs)
	}
	if len(refunds) == 0 && back.disputeID == "" {
		// Nothing went back (a refund still pending); this event's
		// earlier delivery may have been kept as unlisted.
		_, _, err := changeRecord(ctx, pay, KindTopUpIgnored, pi, s.now(), func(r *IgnoredTopUp) bool {
			n := len(r.Unlisted)
			r.Unlisted = slices.DeleteFunc(r.Unlisted, func(e string) bool { return e == back.event })
			return len(r.Unlisted) != n
		})
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		return err
	}
	change := func(r *IgnoredTopUp) bool {
		changed := keepSeenRefunds(r, refunds)
		if n := len(r.Unlisted); back.event != "" && n > 0 {
			r.Unlisted = slices.DeleteFunc(r.Unlisted, func(e string) bool { return e == back.event })
			changed = changed || len(r.Unlisted) != n
		}
		if back.disputeID != "" && (r.DisputeID != back.disputeID || back.disputed > r.Disputed) {
			r.DisputeID, r.Disputed = back.disputeID, max(r.Disputed, back.disputed)
			changed = true
		}
		return facts(r) || changed
	}
	change(&ig)
	if err := s.keepIgnored(ctx, pay, ig, change); err != nil {
		return fmt.Errorf("recording what went back of top-up %s, not granted: %w", pi, err)
	}
	if _, err := pay.GetPaymentRecord(ctx, KindTopUp, pi); err == nil {
		return fmt.Errorf("top-up %s was granted while its refund or dispute was being recorded; Stripe sends it again", pi)
	} else if !errors.Is(err, store.ErrNotFound) {
		return err
	}
	return nil
}

// readIgnored reads the ignored top-up record of PaymentIntent pi; found
// is false when there is none.
func readIgnored(ctx context.Context, pay store.Payments, pi string) (ig IgnoredTopUp, found bool, err error) {
	b, err := pay.GetPaymentRecord(ctx, KindTopUpIgnored, pi)
	if errors.Is(err, store.ErrNotFound) {
		return ig, false, nil
	} else if err != nil {
		return ig, false, err
	}
	if err := json.Unmarshal(b, &ig); err != nil {
		return ig, true, fmt.Errorf("ignored top-up record %s does not parse: %w", pi, err)
	}
	return ig, true, nil
}

// seenRefunds is what the ignored top-up record keeps of refunds.
func seenRefunds(rs []*stripe.Refund) []SeenRefund {
	var out []SeenRefund
	for _, r := range rs {
		out = append(out, SeenRefund{ID: r.ID, Amount: r.Amount, Created: r.Created})
	}
	return out
}

// keepSeenRefunds adds refunds to the ignored top-up record r, each once
// by its id (an amount only ever raised), and sums them again into
// r.Refunded, at most what was paid; true when the refunds changed.
func keepSeenRefunds(r *IgnoredTopUp, refunds []SeenRefund) bool {
	changed := false
	for _, x := range refunds {
		i := slices.IndexFunc(r.Refunds, func(y SeenRefund) bool { return y.ID == x.ID })
		switch {
		case i < 0:
			r.Refunds = append(r.Refunds, x)
			changed = true
		case x.Amount > r.Refunds[i].Amount:
			r.Refunds[i].Amount = x.Amount
			changed = true
		}
	}
	var sum int64
	for _, x := range r.Refunds {
		sum += x.Amount
	}
	if r.Amount > 0 {
		sum = min(sum, r.Amount)
	}
	r.Refunded = max(r.Refunded, sum)
	return changed
}

// listUnlisted lists, when the ignored top-up record of pi says money
// went back of it before its grant by events whose refunds Stripe could
// not list then (Unlisted), the refunds of the payment now, by its
// PaymentIntent, and keeps them on the record for the grant to take back
// (catchUpMoneyBack). Called before the grant: a record that does not
// read, or Stripe out of reach, is an error, the paid event's 500, and
// nothing is granted; Stripe sends it again. The whole pack is never
// granted while money is known to have gone back of it.
func (s *Service) listUnlisted(ctx context.Context, pay store.Payments, pi string) error {
	ig, found, err := readIgnored(ctx, pay, pi)
	if !found || err != nil {
		return err
	}
	if len(ig.Unlisted) == 0 {
		return nil
	}
	// Read before the listing: the refunds of these events are in it.
	listed := ig.Unlisted
	var refunds []*stripe.Refund
	for r, err := range s.sc.V1Refunds.List(ctx, &stripe.RefundListParams{PaymentIntent: stripe.String(pi)}) {
		if err != nil {
			return fmt.Errorf("top-up %s: money went back of it before its grant, and its refunds cannot be listed now (%w): not granted yet; Stripe sends it again", pi, stripeErr(err))
		}
		if r != nil && r.ID != "" && r.Amount > 0 && r.Status == stripe.RefundStatusSucceeded {
			refunds = append(refunds, r)
		}
	}
	seen := seenRefunds(refunds)
	_, _, err = changeRecord(ctx, pay, KindTopUpIgnored, pi, s.now(), func(r *IgnoredTopUp) bool {
		changed := keepSeenRefunds(r, seen)
		n := len(r.Unlisted)
		r.Unlisted = slices.DeleteFunc(r.Unlisted, func(e string) bool { return slices.Contains(listed, e) })
		return changed || len(r.Unlisted) != n
	})
	if err != nil {
		return fmt.Errorf("recording the refunds of top-up %s, listed before its grant: %w", pi, err)
	}
	return nil
}

// receiptURL is the receipt of the payment's charge, or "" when Stripe
// cannot say now (a later charge.refunded fills it in): the credits are
// granted either way.
func (s *Service) receiptURL(ctx context.Context, pi string) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	params := &stripe.PaymentIntentRetrieveParams{}
	params.AddExpand("latest_charge")
	p, err := s.sc.V1PaymentIntents.Retrieve(ctx, pi, params)
	if err != nil || p.LatestCharge == nil {
		return ""
	}
	return p.LatestCharge.ReceiptURL
}

// topUpFailed records that a delayed payment failed: nothing is granted.
func topUpFailed(s *Service, ctx context.Context, ev *stripe.Event) error {
	var cs stripe.CheckoutSession
	if err := decodeObject(ev, &cs); err != nil {
		return badEvent("%s: the session does not parse: %v", ev.Type, err)
	}
	if cs.Mode != stripe.CheckoutSessionModePayment || !ours(cs.Metadata) {
		return nil
	}
	t, err := s.topUpOf(ctx, cs.Metadata)
	if err == nil {
		err = s.topUpCustomer(ctx, &cs)
	}
	if err != nil {
		return err
	}
	s.audit(ctx, "topup.failed", cs.Metadata[MetaUser], t.Service,
		fmt.Sprintf("the payment of pack %s of %s failed (Checkout %s); no credits granted", t.Name, t.Product, cs.ID))
	return nil
}

// topUpRecord reads the top-up paid by PaymentIntent pi, or ErrNotFound
// when pi paid no top-up (a subscription's invoice).
func (s *Service) topUpRecord(ctx context.Context, pay store.Payments, pi string) (TopUpRecord, error) {
	var rec TopUpRecord
	if pi == "" {
		return rec, store.ErrNotFound
	}
	b, err := pay.GetPaymentRecord(ctx, KindTopUp, pi)
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, fmt.Errorf("top-up record %s does not parse: %w", pi, err)
	}
	return rec, nil
}

// ours reports whether a session's metadata is a top-up the gateway
// started: it names at least one of its keys (all four are checked
// after).
func ours(meta map[string]string) bool {
	return meta[MetaUser] != "" || meta[MetaService] != "" || meta[MetaProduct] != "" || meta[MetaPack] != ""
}

// complete reports whether meta names all four keys of a top-up.
func complete(meta map[string]string) bool {
	return meta[MetaUser] != "" && meta[MetaService] != "" && meta[MetaProduct] != "" && meta[MetaPack] != ""
}

// notGrantedYet decides about a refund or dispute of a payment with no
// top-up record: a payment that bought no top-up (a subscription's
// invoice) changes nothing, but a top-up's whose grant has not come yet
// (events come in any order) is an error, so that Stripe sends the event
// again after the grant. Which it is, the PaymentIntent's metadata says
// (Stripe is asked only when the charge's does not). customer is the
// payment's Stripe customer when the event names it ("": the
// PaymentIntent's is asked of Stripe when it matters): a top-up this
// config could grant but paid by a customer the gateway did not make for
// the user it names (another gateway's on the same Stripe account, whose
// paid session this one never saw) was never this gateway's to grant,
// and its refund takes nothing back.
func (s *Service) notGrantedYet(ctx context.Context, pi, customer string, meta map[string]string, what string, back seen) error {
	if pi == "" {
		return nil
	}
	pay, err := s.Payments()
	if err != nil {
		return err
	}
	if b, err := pay.GetPaymentRecord(ctx, KindTopUpIgnored, pi); err == nil {
		var ig IgnoredTopUp
		_ = json.Unmarshal(b, &ig) // the reason is for the log line only
		if err := s.seenNotGranted(ctx, pay, pi, meta, ig.Reason, back); err != nil {
			return err
		}
		return badEvent("%s: top-up %s was ignored when it was paid (%s): nothing to take back", what, pi, ig.Reason)
	} else if !errors.Is(err, store.ErrNotFound) {
		return err
	}
	var intent *stripe.PaymentIntent
	if !complete(meta) {
		// The gateway puts all four keys on the PaymentIntent; a charge
		// or dispute carries them only when Stripe copied them.
		p, err := s.sc.V1PaymentIntents.Retrieve(ctx, pi, nil)
		switch {
		case err != nil && meta[MetaPack] == "":
			return fmt.Errorf("%s: asking Stripe whether PaymentIntent %s bought a top-up: %w", what, pi, err)
		case err == nil:
			intent = p
			if p.Metadata[MetaPack] != "" {
				meta = p.Metadata
			}
		}
	}
	if meta[MetaPack] == "" {
		return nil
	}
	// A top-up this config can never grant (its pack, product or service
	// gone, its user without a subscription) was ignored when it was
	// paid, and the operator is told to refund it: its refund or dispute
	// is ignored too. Answered with an error, it came back for Stripe's
	// three days of retries and could then get the endpoint disabled,
	// stopping every later payment event.
	if _, err := s.topUpOf(ctx, meta); err != nil {
		var bad badEventError
		if complete(meta) && errors.As(err, &bad) {
			// Kept: should its paid event yet be applied (Stripe's retry,
			// a resend from the Dashboard, once the config has its pack),
			// the grant takes this back at once. Only a payment its
			// customer made for the user it names: another gateway's on
			// the same Stripe account is none of this one's.
			var notOurs badEventError
			if err := s.ownTopUp(ctx, pay, pi, customer, intent, meta[MetaUser]); errors.As(err, &notOurs) {
				return badEvent("%s: top-up %s was never granted and cannot be (%s): nothing to take back", what, pi, notOurs.msg)
			} else if err != nil {
				return err
			}
			if err := s.seenNotGranted(ctx, pay, pi, meta, "its refund or dispute came before it was granted, and it could not be: "+bad.msg, back); err != nil {
				return err
			}
			return badEvent("%s: top-up %s was never granted and cannot be (%s): nothing to take back", what, pi, bad.msg)
		}
		if complete(meta) {
			return err
		}
	} else if err := s.ownTopUp(ctx, pay, pi, customer, intent, meta[MetaUser]); err != nil {
		var bad badEventError
		if errors.As(err, &bad) {
			return badEvent("%s: top-up %s was never granted and cannot be (%s): nothing to take back", what, pi, bad.msg)
		}
		return err
	}
	return fmt.Errorf("%s before top-up %s was granted; Stripe sends it again", what, pi)
}

// ownTopUp checks, as topUpCustomer does for its paid session, that the
// payment pi was made by the customer the gateway made for user: the
// customer the event named, else the PaymentIntent's (intent, or asked of
// Stripe). Another customer is a badEvent; Stripe out of reach an error
// worth retrying.
func (s *Service) ownTopUp(ctx context.Context, pay store.Payments, pi, customer string, intent *stripe.PaymentIntent, user string) error {
	if customer == "" {
		if intent == nil {
			p, err := s.sc.V1PaymentIntents.Retrieve(ctx, pi, nil)
			if err != nil {
				return fmt.Errorf("asking Stripe for the customer of PaymentIntent %s: %w", pi, stripeErr(err))
			}
			intent = p
		}
		if intent.Customer != nil {
			customer = intent.Customer.ID
		}
	}
	got, err := s.userOfCustomer(ctx, pay, customer)
	if err != nil {
		return err
	}
	if got != user {
		return badEvent("it was paid by customer %s, who is %s's, not %s's", customer, got, user)
	}
	return nil
}

// share is credits*part/whole rounded down, for 0 <= part <= whole: the
// credits a part of the money paid bought.
func share(credits billing.Units, part, whole int64) billing.Units {
	if credits <= 0 || part <= 0 || whole <= 0 {
		return 0
	}
	if part >= whole {
		return credits
	}
	hi, lo := bits.Mul64(uint64(credits), uint64(part))
	q, _ := bits.Div64(hi, lo, uint64(whole)) // hi < whole since part < whole
	return billing.Units(q)
}

// chargeRefunded takes back the credits of refunded money, in proportion:
// each succeeded refund of the charge (oldest first) takes what the
// refunds up to and including it bought less what the ones before it
// bought, so the parts add up to the whole grant when everything is
// refunded, and each is taken once by its refund id, in whatever order
// the events come. A refund still pending takes nothing yet (it may fail
// and return no money): charge.refund.updated takes it when it succeeds.
func chargeRefunded(s *Service, ctx context.Context, ev *stripe.Event) error {
	var ch stripe.Charge
	if err := decodeObject(ev, &ch); err != nil {
		return badEvent("charge.refunded: the charge does not parse: %v", err)
	}
	pay, err := s.Payments()
	if err != nil {
		return err
	}
	var pi string
	if ch.PaymentIntent != nil {
		pi = ch.PaymentIntent.ID
	}
	rec, err := s.topUpRecord(ctx, pay, pi)
	if errors.Is(err, store.ErrNotFound) {
		if ok, err := s.invoiceRefunded(ctx, pay, ev.Data.Raw, &ch, pi, nil); ok || err != nil {
			return err
		}
		cust := ""
		if ch.Customer != nil {
			cust = ch.Customer.ID
		}
		return s.notGrantedYet(ctx, pi, cust, ch.Metadata, "charge "+ch.ID+" refunded", seen{event: ev.ID,
			refunds: func() ([]*stripe.Refund, error) { return s.refundsOf(ctx, &ch) },
			amount:  ch.Amount, currency: string(ch.Currency), paidAt: unix(ch.Created)})
	} else if err != nil {
		return err
	}
	if ch.Amount <= 0 {
		return badEvent("charge %s: amount %d", ch.ID, ch.Amount)
	}
	refunds, err := s.refundsOf(ctx, &ch)
	if err != nil {
		return err
	}
	rec.ReceiptURL = cmp.Or(rec.ReceiptURL, ch.ReceiptURL)
	return s.takeRefunds(ctx, pay, rec, &ch, refunds, ev.Created)
}

// refundUpdated applies charge.refund.updated: a refund that succeeded
// (a pending one, typically, that charge.refunded left alone) takes its
// share of the top-up's credits, by its id, so once however many events
// say it; one that failed or was canceled takes nothing.
func refundUpdated(s *Service, ctx context.Context, ev *stripe.Event) error {
	var r stripe.Refund
	if err := decodeObject(ev, &r); err != nil {
		return badEvent("charge.refund.updated: the refund does not parse: %v", err)
	}
	if r.ID == "" {
		return badEvent("charge.refund.updated: the refund has no id")
	}
	if r.Status != stripe.RefundStatusSucceeded {
		return nil // pending, failed or canceled: no money went back
	}
	chargeID := ""
	if r.Charge != nil {
		chargeID = r.Charge.ID
	}
	if chargeID == "" {
		return badEvent("charge.refund.updated: refund %s names no charge", r.ID)
	}
	var pi string
	if r.PaymentIntent != nil {
		pi = r.PaymentIntent.ID
	}
	if pi == "" {
		ch, err := s.sc.V1Charges.Retrieve(ctx, chargeID, nil)
		if err != nil {
			return fmt.Errorf("refund %s: asking Stripe for charge %s: %w", r.ID, chargeID, stripeErr(err))
		}
		if ch.PaymentIntent != nil {
			pi = ch.PaymentIntent.ID
		}
	}
	pay, err := s.Payments()
	if err != nil {
		return err
	}
	rec, err := s.topUpRecord(ctx, pay, pi)
	if errors.Is(err, store.ErrNotFound) {
		if ok, err := s.invoiceRefunded(ctx, pay, ev.Data.Raw, &stripe.Charge{ID: chargeID}, pi, &r); ok || err != nil {
			return err
		}
		return s.notGrantedYet(ctx, pi, "", r.Metadata, "refund "+r.ID+" succeeded", seen{event: ev.ID, refunds: func() ([]*stripe.Refund, error) {
			refunds, err := s.refundsOf(ctx, &stripe.Charge{ID: chargeID})
			if err == nil && !slices.ContainsFunc(refunds, func(x *stripe.Refund) bool { return x.ID == r.ID }) && r.Amount > 0 {
				refunds = append(refunds, &r) // the list lags behind the event
			}
			return refunds, err
		}})
	} else if err != nil {
		return err
	}
	if rec.Amount <= 0 {
		return badEvent("refund %s: top-up %s paid %d", r.ID, pi, rec.Amount)
	}
	// The top-up's charge: its amount is what the top-up paid. Its
	// refunds are listed from Stripe, this one among them even when the
	// list lags behind the event.
	ch := &stripe.Charge{ID: chargeID, Amount: rec.Amount, Currency: stripe.Currency(strings.ToLower(rec.Currency))}
	refunds, err := s.refundsOf(ctx, ch)
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(refunds, func(x *stripe.Refund) bool { return x.ID == r.ID }) && r.Amount > 0 {
		refunds = append(refunds, &r)
		sortRefunds(refunds)
	}
	return s.takeRefunds(ctx, pay, rec, ch, refunds, ev.Created)
}

// takeRefunds takes back the credits of the succeeded refunds of the
// top-up rec's charge ch (oldest first), each once by its id, and records
// what was refunded.
func (s *Service) takeRefunds(ctx context.Context, pay store.Payments, rec TopUpRecord, ch *stripe.Charge, refunds []*stripe.Refund, evCreated int64) error {
	credits, err := billing.ParseUnits(rec.Credits)
	if err != nil {
		return fmt.Errorf("top-up record %s: credits %q: %w", rec.ID, rec.Credits, err)
	}
	var cum int64
	for _, r := range refunds {
		before := cum
		cum = min(cum+r.Amount, ch.Amount)
		take := share(credits, cum, ch.Amount) - share(credits, before, ch.Amount)
		if take <= 0 {
			continue
		}
		at := time.Unix(cmp.Or(r.Created, evCreated), 0).UTC()
		_, _, err := pay.ReverseCredits(ctx, store.CreditReversal{ID: r.ID, GrantID: rec.ID, Credits: take, At: at,
			Reason: fmt.Sprintf("refund of %s of %s paid", MinorMoney(r.Amount, string(ch.Currency)), MinorMoney(ch.Amount, string(ch.Currency)))})
		if err != nil && !errors.Is(err, store.ErrReplayed) {
			return fmt.Errorf("taking back the credits of refund %s: %w", r.ID, err)
		}
	}
	err = s.changeTopUp(ctx, pay, rec.ID, func(old *TopUpRecord) bool {
		if cum <= old.Refunded && (old.ReceiptURL != "" || rec.ReceiptURL == "") {
			return false
		}
		old.Refunded = max(old.Refunded, cum)
		old.ReceiptURL = cmp.Or(old.ReceiptURL, rec.ReceiptURL)
		return true
	})
	if err != nil {
		return fmt.Errorf("recording the refund of top-up %s: %w", rec.ID, err)
	}
	return nil
}

// changeTopUp makes change on the top-up record of PaymentIntent pi and
// writes it, stamped now, unless change says there is nothing to write
// (changeRecord: a change another node made meanwhile is kept).
func (s *Service) changeTopUp(ctx context.Context, pay store.Payments, pi string, change func(*TopUpRecord) bool) error {
	now := s.now()
	_, _, err := changeRecord(ctx, pay, KindTopUp, pi, now, func(rec *TopUpRecord) bool {
		if !change(rec) {
			return false
		}
		rec.UpdatedAt = now.UTC()
		return true
	})
	return err
}

// refundsOf lists the refunds of a charge that returned money (status
// succeeded: not pending, failed or canceled), oldest first: from the
// event when it carries them, else from Stripe (charges in events do not
// carry their refunds since API version 2022-11-15).
func (s *Service) refundsOf(ctx context.Context, ch *stripe.Charge) ([]*stripe.Refund, error) {
	var all []*stripe.Refund
	if ch.Refunds != nil && len(ch.Refunds.Data) > 0 && !ch.Refunds.HasMore {
		all = ch.Refunds.Data
	} else {
		for r, err := range s.sc.V1Refunds.List(ctx, &stripe.RefundListParams{Charge: stripe.String(ch.ID)}) {
			if err != nil {
				return nil, fmt.Errorf("listing the refunds of charge %s: %w", ch.ID, err)
			}
			all = append(all, r)
		}
	}
	var out []*stripe.Refund
	for _, r := range all {
		if r == nil || r.ID == "" || r.Amount <= 0 || r.Status != stripe.RefundStatusSucceeded {
			continue
		}
		out = append(out, r)
	}
	sortRefunds(out)
	return out, nil
}

func sortRefunds(rs []*stripe.Refund) {
	slices.SortFunc(rs, func(a, b *stripe.Refund) int {
		return cmp.Or(cmp.Compare(a.Created, b.Created), strings.Compare(a.ID, b.ID))
	})
}

// disputeClosed takes back what is left of a top-up's grant when its
// dispute is lost (the money went back to the card holder), once by the
// dispute's id. A won dispute changes nothing.
func disputeClosed(s *Service, ctx context.Context, ev *stripe.Event) error {
	var d stripe.Dispute
	if err := decodeObject(ev, &d); err != nil {
		return badEvent("charge.dispute.closed: the dispute does not parse: %v", err)
	}
	if d.Status != stripe.DisputeStatusLost {
		return nil
	}
	if d.ID == "" {
		return badEvent("charge.dispute.closed: the dispute has no id")
	}
	pay, err := s.Payments()
	if err != nil {
		return err
	}
	var pi string
	switch {
	case d.PaymentIntent != nil && d.PaymentIntent.ID != "":
		pi = d.PaymentIntent.ID
	case d.Charge != nil && d.Charge.PaymentIntent != nil:
		pi = d.Charge.PaymentIntent.ID
	}
	rec, err := s.topUpRecord(ctx, pay, pi)
	if errors.Is(err, store.ErrNotFound) {
		if invID, err := s.invoiceOf(ctx, ev.Data.Raw, pi); err != nil {
			return err
		} else if invID != "" {
			if ok, err := s.invoiceKept(ctx, pay, invID); err != nil {
				return err
			} else if ok {
				_, err := s.invoiceMoneyBack(ctx, pay, invID, d.ID, 0, d.Amount, "dispute "+d.ID+" lost")
				return err
			}
		}
		return s.notGrantedYet(ctx, pi, "", d.Metadata, "dispute "+d.ID+" lost", seen{disputeID: d.ID, disputed: d.Amount})
	} else if err != nil {
		return err
	}
	return s.takeDispute(ctx, pay, rec, d.ID, d.Amount, string(d.Currency), time.Unix(ev.Created, 0).UTC())
}

// takeDispute takes back what is left of top-up rec's grant for lost
// dispute id of amount (in currency's minor units), once by its id, and
// records the amount disputed.
func (s *Service) takeDispute(ctx context.Context, pay store.Payments, rec TopUpRecord, id string, amount int64, currency string, at time.Time) error {
	pi := rec.ID
	credits, err := billing.ParseUnits(rec.Credits)
	if err != nil {
		return fmt.Errorf("top-up record %s: credits %q: %w", pi, rec.Credits, err)
	}
	// All of it: the store takes back only what the grant has left.
	_, _, err = pay.ReverseCredits(ctx, store.CreditReversal{ID: id, GrantID: pi, Credits: credits,
		At: at, Reason: fmt.Sprintf("dispute lost, %s", MinorMoney(amount, currency))})
	if err != nil && !errors.Is(err, store.ErrReplayed) {
		return fmt.Errorf("taking back the credits of dispute %s: %w", id, err)
	}
	err = s.changeTopUp(ctx, pay, pi, func(rec *TopUpRecord) bool {
		if amount <= rec.Disputed {
			return false
		}
		rec.Disputed = amount
		return true
	})
	if err != nil {
		return fmt.Errorf("recording the dispute of top-up %s: %w", pi, err)
	}
	return nil
}

// ExpireCredits ends the credit grants due at now, oldest first
// (store.ExpireGrants); the store audits each. Every node of a fleet may
// call it: a grant expires once.
func ExpireCredits(ctx context.Context, st store.Store, now time.Time) ([]store.CreditGrant, error) {
	pay, ok := st.(store.Payments)
	if !ok {
		return nil, nil
	}
	return pay.ExpireCredits(ctx, now)
}
