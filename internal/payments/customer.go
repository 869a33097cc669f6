package payments

import "context"

// customerFor is the user's Stripe customer for a top-up, made the first
// time: CustomerFor (checkout.go) with no email.
func (s *Service) customerFor(ctx context.Context, userID string) (string, error) {
	return s.CustomerFor(ctx, userID, "")
}
