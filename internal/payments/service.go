package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/stripe/stripe-go/v82"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store"
)

// Record kinds the Service keeps in the store (store.Payments).
const (
	// KindEvent: a webhook event handled, by Stripe's event id.
	KindEvent = "stripe_event"
	// KindCustomer: a user's Stripe customer, by user id.
	KindCustomer = "stripe_customer"
	// KindCustomerUser: the user of a Stripe customer, by customer id.
	KindCustomerUser = "stripe_customer_user"
)

// Deps is what the Service uses of the platform app.
type Deps struct {
	// Store returns the platform's store, which must implement
	// store.Payments. It is a function because the app opens its store at
	// Start, after the handlers that hold the Service are provisioned.
	Store func() store.Store
	// Catalog is the compiled catalog of the config.
	Catalog *catalog.Catalog
	// Ops audits and changes subscriptions the way operators do.
	Ops *ops.Ops
	// Now is the app's clock.
	Now func() time.Time
	// Logger never receives a key, a secret or a signature.
	Logger *zap.Logger
	// NodeID names this gateway in a fleet (leases).
	NodeID string
}

// Service is the payments integration of one config.
type Service struct {
	cfg    Config
	sc     *stripe.Client
	st     func() store.Store
	cat    *catalog.Catalog
	ops    *ops.Ops
	now    func() time.Time
	log    *zap.Logger
	nodeID string

	custMu sync.Mutex // one customer creation at a time per node

	// claimsSeen: when this node first saw the Checkout claims it waits
	// for (checkout.go claimRunOut).
	claimsSeen claimSightings

	shipMu sync.Mutex // one run of the meter shipper at a time (meters.go)
	ship   shipperState
}

// ErrNoPayments says the store cannot keep payments (it does not
// implement store.Payments).
var ErrNoPayments = errors.New("payments: this store does not keep payment records")

// New builds the Service; cfg must have passed Validate.
func New(cfg Config, d Deps) (*Service, error) {
	cfg.Defaults()
	if d.Store == nil {
		return nil, errors.New("payments: no store")
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Logger == nil {
		d.Logger = zap.NewNop()
	}
	s := &Service{cfg: cfg, st: d.Store, cat: d.Catalog, ops: d.Ops, now: d.Now, log: d.Logger, nodeID: d.NodeID}
	s.sc = NewStripeClient(cfg.SecretKey, cfg.APIBase)
	// The shipper's lease holder is this Service, not only this node: on a
	// reload the new config's shipper waits for the old one's to let go.
	s.ship.holder = d.NodeID + "/" + randomHex(4)
	return s, nil
}

// NewStripeClient is a stripe-go client for key, talking to base
// (https://api.stripe.com when empty).
func NewStripeClient(key, base string) *stripe.Client {
	if base == "" {
		return stripe.NewClient(key)
	}
	cfg := &stripe.BackendConfig{URL: stripe.String(base), MaxNetworkRetries: stripe.Int64(2),
		LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelError}}
	b := stripe.GetBackendWithConfig(stripe.APIBackend, cfg)
	return stripe.NewClient(key, stripe.WithBackends(&stripe.Backends{API: b, Connect: b, Uploads: b, MeterEvents: b}))
}

// Config is the Service's configuration, defaults filled.
func (s *Service) Config() Config { return s.cfg }

// Stripe is the API client.
func (s *Service) Stripe() *stripe.Client { return s.sc }

// Store is the platform's store.
func (s *Service) Store() store.Store { return s.st() }

// Payments is the payments part of the store, or ErrNoPayments.
func (s *Service) Payments() (store.Payments, error) {
	p, ok := s.st().(store.Payments)
	if !ok {
		return nil, ErrNoPayments
	}
	return p, nil
}

// Catalog is the compiled catalog.
func (s *Service) Catalog() *catalog.Catalog { return s.cat }

// Now is the app's clock.
func (s *Service) Now() time.Time { return s.now() }

// audit records a change made because of Stripe, as actor "stripe".
func (s *Service) audit(ctx context.Context, action, userID, serviceID, detail string) {
	for _, e := range s.auditEntry(action, userID, serviceID, detail) {
		_ = s.ops.RecordAudit(ctx, e)
	}
}

// auditEntry is the audit entry of a change made because of Stripe, for
// a store write that takes it with the change (store.Subscriptions); none
// without the operations (whose RecordAudit audit would call).
func (s *Service) auditEntry(action, userID, serviceID, detail string) []store.AuditEntry {
	if s.ops == nil {
		return nil
	}
	return []store.AuditEntry{{Time: s.now().UTC(), Actor: "stripe", Action: action,
		UserID: userID, ServiceID: serviceID, Detail: detail}}
}

// badEventError is an event the gateway can never apply (it names a user
// or product that does not exist); retrying it cannot help.
type badEventError struct{ msg string }

func (e badEventError) Error() string { return e.msg }

func badEvent(format string, args ...any) error { return badEventError{fmt.Sprintf(format, args...)} }

// decodeObject reads an event's data.object into v. An event without
// one (ev.Data nil: a body that verifies but is no object event) can
// never apply: a badEvent, as is an object that does not parse.
func decodeObject(ev *stripe.Event, v any) error {
	if ev.Data == nil || len(ev.Data.Raw) == 0 {
		return badEvent("%s: the event carries no data.object", ev.Type)
	}
	return json.Unmarshal(ev.Data.Raw, v)
}
