package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/stripe/stripe-go/v82"

	"github.com/platformgw/gateway/internal/store"
)

// The metadata keys the gateway puts on what it creates in Stripe, so a
// webhook (or a person reading the Dashboard) can tell whose it is. The
// same as the subscriptions part's (checkout.go on branch i29-sub), which
// this file gives way to when both are merged.
const (
	MetaUser    = "platform_user_id"
	MetaService = "platform_service_id"
	MetaProduct = "platform_product_id"
)

// customerFor returns the user's Stripe customer, making it the first
// time. It is made once per user across restarts and a fleet: the Stripe
// request carries an Idempotency-Key derived from the user id (two nodes
// that race get the same customer back from Stripe within its 24 hours of
// idempotency), and the first KindCustomer record stored wins
// (InsertPaymentRecord is the claim); a node that lost the race uses the
// stored one.
func (s *Service) customerFor(ctx context.Context, userID string) (string, error) {
	if userID == "" {
		return "", errors.New("payments: a customer needs a user id")
	}
	pay, err := s.Payments()
	if err != nil {
		return "", err
	}
	if id, err := storedCustomer(ctx, pay, userID); err == nil || !errors.Is(err, store.ErrNotFound) {
		return id, err
	}
	s.custMu.Lock()
	defer s.custMu.Unlock()
	if id, err := storedCustomer(ctx, pay, userID); err == nil || !errors.Is(err, store.ErrNotFound) {
		return id, err
	}
	params := &stripe.CustomerCreateParams{
		Description: stripe.String("gateway user " + userID),
		Metadata:    map[string]string{MetaUser: userID},
	}
	params.SetIdempotencyKey("platform-customer-" + userID)
	c, err := s.sc.V1Customers.Create(ctx, params)
	if err != nil {
		return "", fmt.Errorf("creating the Stripe customer of user %s: %w", userID, err)
	}
	body, _ := json.Marshal(CustomerRecord{UserID: userID, CustomerID: c.ID, CreatedAt: s.now().UTC()})
	// The way back from the customer first, so a stored customer always
	// has it.
	if _, err := pay.InsertPaymentRecord(ctx, KindCustomerUser, c.ID, body, s.now()); err != nil && !errors.Is(err, store.ErrExists) {
		return "", fmt.Errorf("remembering the user of Stripe customer %s: %w", c.ID, err)
	}
	stored, err := pay.InsertPaymentRecord(ctx, KindCustomer, userID, body, s.now())
	switch {
	case errors.Is(err, store.ErrExists):
		var rec CustomerRecord
		if err := json.Unmarshal(stored, &rec); err != nil || rec.CustomerID == "" {
			return "", fmt.Errorf("the stored Stripe customer of user %s does not parse", userID)
		}
		return rec.CustomerID, nil
	case err != nil:
		return "", fmt.Errorf("remembering the Stripe customer of user %s: %w", userID, err)
	}
	return c.ID, nil
}

func storedCustomer(ctx context.Context, pay store.Payments, userID string) (string, error) {
	b, err := pay.GetPaymentRecord(ctx, KindCustomer, userID)
	if err != nil {
		return "", err
	}
	var rec CustomerRecord
	if err := json.Unmarshal(b, &rec); err != nil || rec.CustomerID == "" {
		return "", fmt.Errorf("the stored Stripe customer of user %s does not parse", userID)
	}
	return rec.CustomerID, nil
}
