package payments

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/stripe/stripe-go/v82"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/store"
)

// Errors of starting a Checkout or the customer portal, for the pages to
// word.
var (
	// ErrNotPaid: the product has no Stripe Price, so it is not sold
	// through Stripe.
	ErrNotPaid = errors.New("payments: the product has no Stripe price")
	// ErrNoCustomer: the user has never paid through Stripe, so there is
	// no customer portal to open.
	ErrNoCustomer = errors.New("payments: the user has no Stripe customer")
)

// The metadata keys the gateway puts on what it creates in Stripe, so a
// webhook (or a person reading the Dashboard) can tell whose it is.
const (
	MetaUser    = "platform_user_id"
	MetaService = "platform_service_id"
	MetaProduct = "platform_product_id"
)

// Sells reports whether the product is paid by a Stripe subscription:
// it has a recurring Price configured.
func (s *Service) Sells(serviceID, productID string) bool {
	p := s.cfg.PriceFor(serviceID, productID)
	return p != nil && p.Price != ""
}

// CustomerFor returns the user's Stripe customer id, creating the
// customer the first time. The create carries an Idempotency-Key derived
// from the user id, so two nodes (or a double click) that both find no
// record create one customer in Stripe and get the same id back; the
// store's InsertPaymentRecord then decides whose record stands, and the
// loser takes the winner's.
func (s *Service) CustomerFor(ctx context.Context, userID, email string) (string, error) {
	pay, err := s.Payments()
	if err != nil {
		return "", err
	}
	if id, err := s.storedCustomer(ctx, pay, userID); err == nil || !errors.Is(err, ErrNoCustomer) {
		return id, err
	}
	s.custMu.Lock()
	defer s.custMu.Unlock()
	if id, err := s.storedCustomer(ctx, pay, userID); err == nil || !errors.Is(err, ErrNoCustomer) {
		return id, err
	}
	params := &stripe.CustomerCreateParams{Metadata: map[string]string{MetaUser: userID}}
	if email != "" {
		params.Email = stripe.String(email)
	}
	params.SetIdempotencyKey(idemKey("customer", userID))
	c, err := s.sc.V1Customers.Create(ctx, params)
	if err != nil {
		return "", fmt.Errorf("create the Stripe customer: %w", stripeErr(err))
	}
	rec, _ := json.Marshal(CustomerRecord{UserID: userID, CustomerID: c.ID, CreatedAt: s.now().UTC()})
	// The way back from the customer first, so a stored customer always
	// has it (a crash between the two leaves a customer the webhooks can
	// name, never one they cannot).
	if _, err := pay.InsertPaymentRecord(ctx, KindCustomerUser, c.ID, rec, s.now()); err != nil && !errors.Is(err, store.ErrExists) {
		return "", err
	}
	stored, err := pay.InsertPaymentRecord(ctx, KindCustomer, userID, rec, s.now())
	if errors.Is(err, store.ErrExists) {
		var won CustomerRecord
		if json.Unmarshal(stored, &won) != nil || won.CustomerID == "" {
			return "", fmt.Errorf("payments: the stored Stripe customer of %s does not read", userID)
		}
		return won.CustomerID, nil
	}
	if err != nil {
		return "", err
	}
	return c.ID, nil
}

// storedCustomer is the user's remembered customer, or ErrNoCustomer.
func (s *Service) storedCustomer(ctx context.Context, pay store.Payments, userID string) (string, error) {
	b, err := pay.GetPaymentRecord(ctx, KindCustomer, userID)
	if errors.Is(err, store.ErrNotFound) {
		return "", ErrNoCustomer
	}
	if err != nil {
		return "", err
	}
	var c CustomerRecord
	if err := json.Unmarshal(b, &c); err != nil || c.CustomerID == "" {
		return "", fmt.Errorf("payments: the customer record of %s does not read: %v", userID, err)
	}
	return c.CustomerID, nil
}

// sessionUser is the customer of a Checkout session and the user the
// gateway made it for (userOfCustomer): whose session it is, whatever its
// metadata says.
func (s *Service) sessionUser(ctx context.Context, pay store.Payments, cs *stripe.CheckoutSession) (customer, user string, err error) {
	if cs.Customer != nil {
		customer = cs.Customer.ID
	}
	user, err = s.userOfCustomer(ctx, pay, customer)
	return customer, user, err
}

// userOfCustomer is the gateway user of a Stripe customer, or a
// badEvent: a customer the gateway did not make is none of its business.
func (s *Service) userOfCustomer(ctx context.Context, pay store.Payments, customerID string) (string, error) {
	if customerID == "" {
		return "", badEvent("the object names no customer")
	}
	b, err := pay.GetPaymentRecord(ctx, KindCustomerUser, customerID)
	if errors.Is(err, store.ErrNotFound) {
		return "", badEvent("customer %s is not one the gateway made", customerID)
	}
	if err != nil {
		return "", err
	}
	var c CustomerRecord
	if err := json.Unmarshal(b, &c); err != nil || c.UserID == "" {
		return "", fmt.Errorf("payments: the user record of customer %s does not read: %v", customerID, err)
	}
	return c.UserID, nil
}

// idemKey is a stable Idempotency-Key for creating what (a customer, a
// Product) for id. Stripe keeps keys 24 hours, longer than two nodes
// racing or a person double-clicking.
func idemKey(what, id string) string {
	sum := sha256.Sum256([]byte(what + "\x00" + id))
	return "platformgw-" + what + "-" + hex.EncodeToString(sum[:16])
}

// CheckoutRequest is a subscription Checkout to start.
type CheckoutRequest struct {
	UserID, Email        string
	ServiceID, ProductID string
	// SuccessURL and CancelURL are where Stripe sends the caller back.
	SuccessURL, CancelURL string
}

// StartSubscriptionCheckout creates a Checkout Session in subscription
// mode for a product with a Stripe Price and returns its URL. The line
// items are the product's Price (quantity 1) and its metered Price if it
// has one (no quantity: usage is reported to the meter); the session,
// its subscription and the customer carry the user, service and product
// in metadata, and client_reference_id is the user id. A trial of the
// listing becomes the subscription's trial_period_days when the user
// never had a subscription to the service (neverSubscribed).
//
// A user has at most one subscription Checkout open per service, on
// every node of a fleet: two paid sessions would be two Stripe
// subscriptions and two charges. The KindCheckoutOpen record of
// "service/user" is claimed before the session is created (an insert,
// or a swap over a record that may be replaced), the session is created
// with an Idempotency-Key of the claim, and the claim is swapped into the
// open session's record. A click that finds the claim of another (a
// second tab, a double submit, another node) waits up to checkoutWait
// for it to become a session and is sent to that session, or gets
// ErrCheckoutBusy; a claim this node has seen unchanged for
// checkoutClaimTTL of its own clock (its node died mid-create) is taken
// over (claimRunOut). A click that finds the session open (Stripe
// says so) is sent to it; one of another product, or no longer open, is
// replaced, and a replaced session still open at Stripe is expired there
// so that it can no longer be paid.
func (s *Service) StartSubscriptionCheckout(ctx context.Context, r CheckoutRequest) (string, error) {
	p := s.cfg.PriceFor(r.ServiceID, r.ProductID)
	if p == nil || p.Price == "" {
		return "", ErrNotPaid
	}
	cust, err := s.CustomerFor(ctx, r.UserID, r.Email)
	if err != nil {
		return "", err
	}
	pay, err := s.Payments()
	if err != nil {
		return "", err
	}
	url, claim, err := s.claimCheckout(ctx, pay, r)
	if err != nil || url != "" {
		return url, err
	}
	params, err := s.checkoutParams(ctx, r, p, cust)
	if err != nil {
		s.releaseCheckout(ctx, pay, r, claim)
		return "", err
	}
	return s.createCheckout(ctx, pay, r, claim, params)
}

// checkoutParams is the Checkout Session to create for r.
func (s *Service) checkoutParams(ctx context.Context, r CheckoutRequest, p *Price, cust string) (*stripe.CheckoutSessionCreateParams, error) {
	meta := map[string]string{MetaUser: r.UserID, MetaService: r.ServiceID, MetaProduct: r.ProductID}
	items := []*stripe.CheckoutSessionCreateLineItemParams{{Price: stripe.String(p.Price), Quantity: stripe.Int64(1)}}
	if p.MeteredPrice != "" {
		items = append(items, &stripe.CheckoutSessionCreateLineItemParams{Price: stripe.String(p.MeteredPrice)})
	}
	sd := &stripe.CheckoutSessionCreateSubscriptionDataParams{Metadata: meta}
	if svc, ok := s.cat.Service(r.ServiceID); ok {
		if l, ok := svc.Listing(r.ProductID); ok && l.TrialDays > 0 {
			first, err := s.neverSubscribed(ctx, r.UserID, r.ServiceID)
			if err != nil {
				return nil, err
			}
			if first {
				sd.TrialPeriodDays = stripe.Int64(int64(l.TrialDays))
			}
		}
	}
	return &stripe.CheckoutSessionCreateParams{
		Mode:              stripe.String(string(stripe.CheckoutSessionModeSubscription)),
		Customer:          stripe.String(cust),
		ClientReferenceID: stripe.String(r.UserID),
		Metadata:          meta,
		LineItems:         items,
		SubscriptionData:  sd,
		SuccessURL:        stripe.String(r.SuccessURL),
		CancelURL:         stripe.String(r.CancelURL),
	}, nil
}

// KindCheckoutOpen: the user's subscription Checkout of a service, by
// "service/user": the session last opened (openCheckoutRecord with a
// SessionID), or a click's claim to open one (with a Claim), so that a
// second click (another tab, a double submit, another node) goes back to
// the same session instead of opening a second one that would make a
// second Stripe subscription and a second charge.
const KindCheckoutOpen = "stripe_checkout_open"

// The bounds of a Checkout claim.
const (
	// checkoutClaimTTL: a claim a node has seen unchanged for this long,
	// by its own clock, is taken over; its node died (or stalled) before
	// it made the session.
	checkoutClaimTTL = 30 * time.Second
	// claimSightingsKept: a sighting older than this is forgotten (its
	// claim became a session or was given up unseen by this node).
	claimSightingsKept = 10 * checkoutClaimTTL
	// checkoutCreateTimeout bounds the create at Stripe, under the claim's
	// time, so that a claim is not taken over while its create may still
	// answer.
	checkoutCreateTimeout = 20 * time.Second
	// checkoutWait is how long a click waits for another's claim to
	// become a session before it is told to try again.
	checkoutWait = 5 * time.Second
	// checkoutPoll is how often a waiting click reads the record.
	checkoutPoll = 100 * time.Millisecond
	// checkoutTries bounds the claims lost to other clicks' swaps.
	checkoutTries = 20
)

// ErrCheckoutBusy: another click is opening the user's Checkout of the
// service (another tab, a double submit, another node) and did not
// finish within checkoutWait. Nothing was created; a click a few seconds
// later is sent to that Checkout.
var ErrCheckoutBusy = errors.New("payments: a Checkout of this service is being opened for the user; try again in a few seconds")

// ErrCheckoutPaid: the user's last Checkout of the service was paid (or
// its payment is on its way) and its Stripe subscription is live: it
// was applied, as its webhooks would apply it, and no second Checkout
// was opened (a second paid one is a second subscription and a second
// charge). The user is subscribed; the plans page shows the plan.
var ErrCheckoutPaid = errors.New("payments: the user's Checkout of this service was paid; no second one is opened")

// ErrCheckoutConfirming: the user's last Checkout of the service was
// completed at Stripe but could not be applied yet (Stripe unreachable,
// or a payment still on its way): nothing was created; a click in a
// minute finds it applied.
var ErrCheckoutConfirming = errors.New("payments: the user's payment for this service is being confirmed; try again in a minute")

type openCheckoutRecord struct {
	SessionID string    `json:"sessionId,omitempty"`
	URL       string    `json:"url,omitempty"`
	ProductID string    `json:"productId"`
	ExpiresAt time.Time `json:"expiresAt,omitzero"`
	// Claim is a click's claim to create the session (a random token,
	// and the Idempotency-Key's), ClaimedAt when it was made, by the
	// clock of the node that made it: for people, never compared with
	// another node's clock (claimRunOut). A record with neither a claim
	// nor a session is free.
	Claim     string    `json:"claim,omitempty"`
	ClaimedAt time.Time `json:"claimedAt,omitzero"`
}

func checkoutKey(r CheckoutRequest) string { return r.ServiceID + "/" + r.UserID }

// claimCheckout returns the URL of the user's open session of the
// product, or this click's claim (the body stored) to create one.
func (s *Service) claimCheckout(ctx context.Context, pay store.Payments, r CheckoutRequest) (string, []byte, error) {
	key := checkoutKey(r)
	deadline := time.Now().Add(checkoutWait)
	waited := false // a claim of the product was seen: its session is brand new
	for try := 1; ; try++ {
		if try > checkoutTries {
			return "", nil, ErrCheckoutBusy
		}
		token := make([]byte, 16)
		_, _ = rand.Read(token)
		mine, _ := json.Marshal(openCheckoutRecord{ProductID: r.ProductID, Claim: hex.EncodeToString(token), ClaimedAt: s.now().UTC()})
		b, err := pay.GetPaymentRecord(ctx, KindCheckoutOpen, key)
		if errors.Is(err, store.ErrNotFound) {
			_, err := pay.InsertPaymentRecord(ctx, KindCheckoutOpen, key, mine, s.now())
			if err == nil {
				return "", mine, nil
			}
			if !errors.Is(err, store.ErrExists) {
				return "", nil, err
			}
			continue // another click claimed first: read its claim
		}
		if err != nil {
			return "", nil, err
		}
		var rec openCheckoutRecord
		readable := json.Unmarshal(b, &rec) == nil
		expire := false // the replaced session may still be open at Stripe
		switch {
		case readable && rec.Claim != "" && !s.claimRunOut(key, rec.Claim):
			// Being opened by another click: wait for its session.
			waited = waited || rec.ProductID == r.ProductID
			if !time.Now().Before(deadline) {
				return "", nil, ErrCheckoutBusy
			}
			select {
			case <-ctx.Done():
				return "", nil, ctx.Err()
			case <-time.After(checkoutPoll):
			}
			try--
			continue
		case readable && rec.Claim == "" && rec.SessionID != "" && rec.ProductID == r.ProductID && rec.URL != "" && waited:
			return rec.URL, nil, nil // the session the click waited for, made just now
		case readable && rec.Claim == "" && rec.SessionID != "":
			// Stripe decides: a session that expired reads as not open,
			// one about to expire is replaced, one of another product
			// too. One the user completed (paid, or a payment on its
			// way) is applied and holds: replaced, it would be a second
			// subscription and a second charge.
			cs, err := s.readCheckout(ctx, rec.SessionID)
			if err != nil {
				return "", nil, err
			}
			switch {
			case cs != nil && cs.Status == stripe.CheckoutSessionStatusComplete:
				if err := s.settlePaidCheckout(ctx, pay, cs); err != nil {
					return "", nil, err
				}
				// Its subscription ended since: a new Checkout may be
				// paid. A complete session cannot be expired.
			case cs != nil && cs.Status == stripe.CheckoutSessionStatusOpen:
				exp := unix(cs.ExpiresAt)
				if rec.ProductID == r.ProductID && rec.URL != "" && (exp.IsZero() || exp.After(s.now().Add(time.Minute))) {
					return rec.URL, nil, nil
				}
				expire = true // another product's, or about to expire
			}
		}
		// Free, another product's, no longer open, or a claim past its
		// time: replaced by this click's claim, only as it was read.
		s.claimsSeen.forget(key)
		err = pay.SwapPaymentRecord(ctx, KindCheckoutOpen, key, b, mine, s.now())
		if err == nil {
			if expire {
				s.expireCheckout(ctx, rec.SessionID)
			}
			return "", mine, nil
		}
		if !errors.Is(err, store.ErrStale) && !errors.Is(err, store.ErrNotFound) {
			return "", nil, err
		}
	}
}

// claimRunOut reports whether this node has seen the claim of key
// unchanged for checkoutClaimTTL, by its own clock (a monotonic one: the
// app's clock is time.Now). The claim's ClaimedAt is the clock of the
// node that made it, which may be far from this one's: an hour ahead, a
// dead node's claim would hold the user back for an hour; an hour
// behind, a live node's claim would be taken over at once, while its
// session is being made. So the count starts when this node first sees
// the claim, and a claim another node made 30 s ago may be waited for
// up to 30 s more: a click on a node that never saw it (behind a
// balancer, or after a restart) is told to try again, and a click on
// the same node 30 s after the first takes it over.
func (s *Service) claimRunOut(key, claim string) bool {
	return s.claimsSeen.seenFor(key, claim, s.now()) >= checkoutClaimTTL
}

// claimSightings is when this node first saw each claim it waited for,
// by "service/user".
type claimSightings struct {
	mu sync.Mutex
	m  map[string]claimSighting
}

type claimSighting struct {
	claim string
	since time.Time
}

// seenFor is how long claim has been key's claim as this node saw it:
// zero at its first sight (or when key's claim changed since).
func (c *claimSightings) seenFor(key, claim string, now time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if sg, ok := c.m[key]; ok && sg.claim == claim {
		return now.Sub(sg.since)
	}
	if c.m == nil {
		c.m = make(map[string]claimSighting)
	}
	for k, sg := range c.m {
		if now.Sub(sg.since) > claimSightingsKept {
			delete(c.m, k)
		}
	}
	c.m[key] = claimSighting{claim: claim, since: now}
	return 0
}

// forget drops key's sighting: its claim is no longer waited for.
func (c *claimSightings) forget(key string) {
	c.mu.Lock()
	delete(c.m, key)
	c.mu.Unlock()
}

// readCheckout is the Checkout Session as Stripe has it now, nil for
// one Stripe does not know.
func (s *Service) readCheckout(ctx context.Context, id string) (*stripe.CheckoutSession, error) {
	cs, err := s.sc.V1CheckoutSessions.Retrieve(ctx, id, nil)
	var se *stripe.Error
	if errors.As(err, &se) && se.HTTPStatusCode == 404 {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the open Checkout Session: %w", stripeErr(err))
	}
	return cs, nil
}

// settlePaidCheckout decides a click that finds the user's last
// Checkout of the service complete at Stripe: paid (payment_status
// paid, or no_payment_required for a trial or a free first period), or
// paid by a payment still on its way (unpaid: a bank debit). Its
// webhooks may not have reached the gateway yet: the payment was made a
// second ago, or the endpoint is down. A subscription the gateway has
// not applied yet (no record, or one its checkout.session.completed
// only linked, or one still incomplete) is applied now as its webhooks
// would: linked by checkout.session.completed's own code (linkCheckout)
// and set from the subscription as Stripe has it now, read after its
// record, as invoice.paid does (applyState, fetch), stamped with the
// session's creation, Stripe's time, before any event of the
// subscription: every event that comes later applies as it would have,
// and one that says what the click applied writes nothing. Two clicks
// on two nodes at once link once (an insert) and write the gateway
// subscription once (applyState's lease and swaps).
//
// Then the subscription's state decides: live (active, trialing, past
// due, unpaid, paused) is ErrCheckoutPaid: the user is subscribed, and a
// second Checkout would be a second subscription; incomplete (its
// payment on its way) is ErrCheckoutConfirming; ended (canceled,
// incomplete_expired) is nil: the session is replaced, a new Checkout
// may be paid. Applying that fails (Stripe unreachable) is
// ErrCheckoutConfirming, nothing created. A session the gateway could
// never apply (its webhook is ignored too: badEvent) or that made no
// subscription is replaced, as before, with a warning.
func (s *Service) settlePaidCheckout(ctx context.Context, pay store.Payments, cs *stripe.CheckoutSession) error {
	if cs.Mode != stripe.CheckoutSessionModeSubscription || cs.Subscription == nil || cs.Subscription.ID == "" {
		s.log.Warn("a completed Checkout Session made no subscription; it is replaced", zap.String("session", cs.ID))
		return nil
	}
	subID := cs.Subscription.ID
	rec, found, err := s.getSubRecord(ctx, pay, subID)
	if err != nil {
		return err
	}
	if !found || rec.StripeStatus == "" || rec.StripeStatus == string(stripe.SubscriptionStatusIncomplete) {
		if err := s.applyPaidCheckout(ctx, pay, cs); err != nil {
			var be badEventError
			if errors.As(err, &be) {
				s.log.Warn("a completed Checkout Session cannot be applied (its webhook is ignored too); it is replaced",
					zap.String("session", cs.ID), zap.String("reason", be.Error()))
				return nil
			}
			s.log.Warn("a completed Checkout Session could not be applied; no second one is opened",
				zap.String("session", cs.ID), zap.String("subscription", subID), zap.Error(err))
			return fmt.Errorf("%w: %v", ErrCheckoutConfirming, err)
		}
		if rec, _, err = s.getSubRecord(ctx, pay, subID); err != nil {
			return err
		}
	}
	switch stripe.SubscriptionStatus(rec.StripeStatus) {
	case stripe.SubscriptionStatusCanceled, stripe.SubscriptionStatusIncompleteExpired:
		return nil
	case stripe.SubscriptionStatusIncomplete, "":
		return ErrCheckoutConfirming
	}
	return ErrCheckoutPaid
}

// applyPaidCheckout applies a completed subscription Checkout as its
// webhooks would (settlePaidCheckout).
func (s *Service) applyPaidCheckout(ctx context.Context, pay store.Payments, cs *stripe.CheckoutSession) error {
	id, cust, err := s.linkCheckout(ctx, pay, cs)
	if err != nil {
		return err
	}
	at := unix(cs.Created)
	if at.IsZero() {
		at = s.now().UTC().Truncate(time.Second)
	}
	return s.applyState(ctx, state{ID: cs.Subscription.ID, Customer: cust, fetch: true}, at, &id)
}

// createCheckout creates the session of claim at Stripe and swaps the
// claim into its record. The create carries an Idempotency-Key of the
// claim (Stripe's retries of it make one session) and runs to its end,
// within checkoutCreateTimeout, even when the click that made it is gone:
// the clicks waiting for the claim get its session.
func (s *Service) createCheckout(ctx context.Context, pay store.Payments, r CheckoutRequest, claim []byte, params *stripe.CheckoutSessionCreateParams) (string, error) {
	var c openCheckoutRecord
	_ = json.Unmarshal(claim, &c)
	params.SetIdempotencyKey(idemKey("checkout", checkoutKey(r)+"/"+r.ProductID+"/"+c.Claim))
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), checkoutCreateTimeout)
	defer cancel()
	cs, err := s.sc.V1CheckoutSessions.Create(cctx, params)
	if err == nil && cs.URL == "" {
		err = errors.New("Stripe gave no URL")
	}
	if err != nil {
		s.releaseCheckout(cctx, pay, r, claim)
		return "", fmt.Errorf("create the Checkout Session: %w", stripeErr(err))
	}
	exp := unix(cs.ExpiresAt)
	if exp.IsZero() {
		exp = s.now().Add(23 * time.Hour) // Stripe's default is 24 hours
	}
	b, _ := json.Marshal(openCheckoutRecord{SessionID: cs.ID, URL: cs.URL, ProductID: r.ProductID, ExpiresAt: exp.UTC()})
	if err := pay.SwapPaymentRecord(cctx, KindCheckoutOpen, checkoutKey(r), claim, b, s.now()); err != nil {
		// The claim was taken over (this node stalled past
		// checkoutClaimTTL) or cannot be replaced: the session is not
		// kept, so it is expired rather than given to a caller who
		// could pay it besides the one another click opens.
		s.log.Warn("a Checkout Session was made but its claim was lost; it is expired at Stripe",
			zap.String("user_id", r.UserID), zap.String("service_id", r.ServiceID), zap.String("session", cs.ID), zap.Error(err))
		s.expireCheckout(cctx, cs.ID)
		if errors.Is(err, store.ErrStale) || errors.Is(err, store.ErrNotFound) {
			return "", ErrCheckoutBusy
		}
		return "", err
	}
	return cs.URL, nil
}

// releaseCheckout gives a claim up (the create failed), so that the next
// click need not wait for it to run out. Failing leaves the claim to run
// out.
func (s *Service) releaseCheckout(ctx context.Context, pay store.Payments, r CheckoutRequest, claim []byte) {
	free, _ := json.Marshal(openCheckoutRecord{ProductID: r.ProductID})
	if err := pay.SwapPaymentRecord(context.WithoutCancel(ctx), KindCheckoutOpen, checkoutKey(r), claim, free, s.now()); err != nil &&
		!errors.Is(err, store.ErrStale) && !errors.Is(err, store.ErrNotFound) {
		s.log.Warn("a Checkout claim was not given up; it runs out by itself", zap.String("user_id", r.UserID),
			zap.String("service_id", r.ServiceID), zap.Error(err))
	}
}

// expireCheckout expires a replaced session at Stripe so that it can no
// longer be paid. Stripe refuses one that is complete or expired
// already, which is as good.
func (s *Service) expireCheckout(ctx context.Context, id string) {
	if _, err := s.sc.V1CheckoutSessions.Expire(context.WithoutCancel(ctx), id, nil); err != nil {
		s.log.Info("a replaced Checkout Session was not expired at Stripe", zap.String("session", id), zap.Error(stripeErr(err)))
	}
}

// neverSubscribed reports whether the user never had a subscription to
// the service: none in the gateway (of any status, ended ones included)
// and no Stripe subscription ever linked to it. A trial is for a first
// subscription only: cancelling and subscribing again is no new trial.
func (s *Service) neverSubscribed(ctx context.Context, userID, serviceID string) (bool, error) {
	_, err := s.Store().GetSubscription(ctx, userID, serviceID)
	if err == nil {
		return false, nil
	}
	if !errors.Is(err, store.ErrNotFound) && !errors.Is(err, store.ErrNoAccount) {
		return false, err
	}
	pay, err := s.Payments()
	if err != nil {
		return false, err
	}
	_, err = pay.GetPaymentRecord(ctx, KindSubscriptionOf, serviceID+"/"+userID)
	if err == nil {
		return false, nil
	}
	if !errors.Is(err, store.ErrNotFound) {
		return false, err
	}
	return true, nil
}

// BillingPortalURL opens Stripe's customer portal for the user, where
// they change their card and see Stripe's own invoices; returnURL is
// where its "back" link goes.
func (s *Service) BillingPortalURL(ctx context.Context, userID, returnURL string) (string, error) {
	pay, err := s.Payments()
	if err != nil {
		return "", err
	}
	cust, err := s.storedCustomer(ctx, pay, userID)
	if err != nil {
		return "", err
	}
	ps, err := s.sc.V1BillingPortalSessions.Create(ctx, &stripe.BillingPortalSessionCreateParams{
		Customer: stripe.String(cust), ReturnURL: stripe.String(returnURL)})
	if err != nil {
		return "", fmt.Errorf("create the customer portal session: %w", stripeErr(err))
	}
	return ps.URL, nil
}

// HasCustomer reports whether the user has a Stripe customer.
func (s *Service) HasCustomer(ctx context.Context, userID string) bool {
	pay, err := s.Payments()
	if err != nil {
		return false
	}
	_, err = s.storedCustomer(ctx, pay, userID)
	return err == nil
}

// InvoicesOf returns the user's invoices, newest first. It reads every
// invoice record (a scan; a gateway's invoices number in the thousands,
// not millions).
func (s *Service) InvoicesOf(ctx context.Context, userID string) ([]InvoiceRecord, error) {
	out, err := recordsOf(ctx, s, KindInvoice, func(inv InvoiceRecord) bool { return inv.UserID == userID })
	sort.SliceStable(out, func(i, j int) bool { return invoiceTime(out[i]).After(invoiceTime(out[j])) })
	return out, err
}

// TopUpsOf returns the user's paid top-ups, newest first: the credit
// purchases the portal's Billing page lists with their receipts. It reads
// every top-up record, as InvoicesOf reads every invoice.
func (s *Service) TopUpsOf(ctx context.Context, userID string) ([]TopUpRecord, error) {
	out, err := recordsOf(ctx, s, KindTopUp, func(t TopUpRecord) bool { return t.UserID == userID })
	sort.SliceStable(out, func(i, j int) bool { return out[i].PaidAt.After(out[j].PaidAt) })
	return out, err
}

// recordsOf reads every record of kind that decodes as T and keep accepts.
func recordsOf[T any](ctx context.Context, s *Service, kind string, keep func(T) bool) ([]T, error) {
	pay, err := s.Payments()
	if err != nil {
		return nil, err
	}
	var out []T
	for r, err := range store.PaymentRecords(ctx, pay, kind, "") {
		if err != nil {
			return nil, err
		}
		var v T
		if json.Unmarshal(r.Body, &v) == nil && keep(v) {
			out = append(out, v)
		}
	}
	return out, nil
}

func invoiceTime(inv InvoiceRecord) time.Time {
	switch {
	case !inv.PaidAt.IsZero():
		return inv.PaidAt
	case !inv.PeriodStart.IsZero():
		return inv.PeriodStart
	}
	return inv.UpdatedAt
}

// stripeErr keeps what a log may show of a Stripe error: its type, code
// and message, never the request (which carries no secret anyway, but
// the key is in the client).
func stripeErr(err error) error {
	var se *stripe.Error
	if errors.As(err, &se) {
		msg := strings.TrimSpace(se.Msg)
		return fmt.Errorf("stripe %s (%d %s): %s", se.Type, se.HTTPStatusCode, se.Code, msg)
	}
	return err
}
