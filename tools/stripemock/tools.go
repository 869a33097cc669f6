//go:build tools

// Package tools pins stripe-mock, the test double of Stripe's API the
// payments tests start on a loopback port (internal/payments/stripetest).
// Build it with `go build -o bin/stripe-mock github.com/stripe/stripe-mock`
// from this directory.
package tools

import _ "github.com/stripe/stripe-mock"
