package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"time"

	"github.com/stripe/stripe-go/v82"
	"github.com/stripe/stripe-go/v82/webhook"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/store"
)

// An EventHandler applies one verified Stripe event. It must be
// idempotent: the same event may be delivered twice (Stripe retries, and
// two nodes of a fleet may take the same retry), and events come in any
// order. It returns badEvent(...) for an event that can never apply
// (answered 200 and recorded as ignored: retrying cannot help) and any
// other error for one worth retrying (500).
type EventHandler func(s *Service, ctx context.Context, ev *stripe.Event) error

// handlers maps event types to their handlers; each feature registers its
// own in an init function (subscriptions.go, topups.go).
var handlers = map[stripe.EventType]EventHandler{}

func handle(t stripe.EventType, h EventHandler) {
	if _, dup := handlers[t]; dup {
		panic("payments: two handlers for " + string(t))
	}
	handlers[t] = h
}

// HandledEvents lists the event types the webhook endpoint acts on: the
// ones to enable on Stripe's webhook endpoint (docs/payments.md).
func HandledEvents() []string {
	out := make([]string, 0, len(handlers))
	for t := range handlers {
		out = append(out, string(t))
	}
	sort.Strings(out)
	return out
}

// eventRecord is what KindEvent keeps of a handled event.
type eventRecord struct {
	Type      string    `json:"type"`
	Created   time.Time `json:"created"`
	HandledAt time.Time `json:"handledAt"`
	Ignored   bool      `json:"ignored,omitempty"`
	// Reason says why an event of a handled type was ignored: it
	// verified but can never apply (a customer, price or metadata the
	// gateway does not know).
	Reason string `json:"reason,omitempty"`
}

// ServeWebhook is the webhook endpoint: it verifies the signature and its
// timestamp, applies a new event once and answers 200; a duplicate is 200
// and changes nothing; a bad signature, stale timestamp or a body that is
// no Stripe event is 400 with the documented JSON error and changes
// nothing; an event that verifies but can never apply (a badEvent) is 200
// with "ignored" and its reason, recorded, and changes nothing, since
// Stripe retries anything else for days and then disables the endpoint;
// an event that failed to apply is 500 so that Stripe sends it again.
func (s *Service) ServeWebhook(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		apierror.Write(w, apierror.New(apierror.MethodNotAllowed, "the Stripe webhook endpoint takes POST"))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxWebhookBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			apierror.Write(w, apierror.New(apierror.PayloadTooLarge, "a webhook body is at most 1 MiB"))
			return
		}
		apierror.Write(w, apierror.New(apierror.InvalidRequest, "the webhook body could not be read"))
		return
	}
	ev, err := webhook.ConstructEventWithOptions(body, r.Header.Get("Stripe-Signature"), s.cfg.WebhookSecret,
		webhook.ConstructEventOptions{Tolerance: time.Duration(s.cfg.WebhookTolerance), IgnoreAPIVersionMismatch: true})
	if err != nil {
		code, msg := apierror.InvalidSignature, "the Stripe-Signature header does not verify with the webhook secret"
		switch {
		case errors.Is(err, webhook.ErrTooOld):
			code, msg = apierror.StaleTimestamp, "the Stripe-Signature timestamp is outside the webhook tolerance"
		case errors.Is(err, webhook.ErrNotSigned), errors.Is(err, webhook.ErrInvalidHeader):
			msg = "the Stripe-Signature header is missing or malformed"
		case !errors.Is(err, webhook.ErrNoValidSignature):
			code, msg = apierror.InvalidRequest, "the webhook body is not a Stripe event"
		}
		s.log.Warn("stripe webhook refused", zap.String("code", code))
		// Stripe expects a 4xx for a delivery it should not retry as is.
		writeJSONError(w, http.StatusBadRequest, code, msg)
		return
	}
	status, dup, ignored, err := s.applyEvent(r.Context(), &ev)
	if err != nil {
		s.log.Error("stripe event not applied", zap.String("event_id", ev.ID), zap.String("type", string(ev.Type)), zap.Error(err))
		code := apierror.InternalError
		if status == http.StatusBadRequest {
			code = apierror.InvalidRequest
		}
		writeJSONError(w, status, code, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	if ignored != "" {
		_ = json.NewEncoder(w).Encode(map[string]any{"received": true, "ignored": ignored})
		return
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"received": true, "duplicate": dup})
}

// applyEvent applies a verified event unless it was handled before. The
// event's id is recorded after its handler succeeded: a crash in between
// re-applies it on Stripe's retry, which the handlers' idempotence makes
// harmless, while recording first would lose the event. An event its
// handler finds can never apply (badEvent) is recorded as ignored with
// the reason, which ignored returns: the answer is 200 all the same.
func (s *Service) applyEvent(ctx context.Context, ev *stripe.Event) (status int, duplicate bool, ignored string, err error) {
	if ev.ID == "" {
		return http.StatusBadRequest, false, "", badEvent("the event has no id")
	}
	pay, err := s.Payments()
	if err != nil {
		return http.StatusInternalServerError, false, "", err
	}
	if _, err := pay.GetPaymentRecord(ctx, KindEvent, ev.ID); err == nil {
		return http.StatusOK, true, "", nil
	} else if !errors.Is(err, store.ErrNotFound) {
		return http.StatusInternalServerError, false, "", err
	}
	h, known := handlers[ev.Type]
	if known {
		if err := h(s, ctx, ev); err != nil {
			var be badEventError
			if !errors.As(err, &be) {
				// Worth retrying: Stripe sends it again on a 500.
				return http.StatusInternalServerError, false, "", err
			}
			ignored = be.Error()
		}
	}
	rec, _ := json.Marshal(eventRecord{Type: string(ev.Type), Created: time.Unix(ev.Created, 0).UTC(),
		HandledAt: s.now().UTC(), Ignored: !known || ignored != "", Reason: ignored})
	if _, err := pay.InsertPaymentRecord(ctx, KindEvent, ev.ID, rec, s.now()); err != nil && !errors.Is(err, store.ErrExists) {
		return http.StatusInternalServerError, false, "", err
	}
	if ignored != "" {
		// The reason names Stripe ids (customers, prices, sessions), never
		// a key or a secret.
		s.log.Warn("stripe event ignored: it verifies but can never apply; nothing changed",
			zap.String("event_id", ev.ID), zap.String("type", string(ev.Type)), zap.String("reason", ignored))
		s.audit(ctx, AuditEventIgnored, "", "", fmt.Sprintf("Stripe event %s (%s) ignored, nothing changed: %s", ev.ID, ev.Type, ignored))
	}
	return http.StatusOK, false, ignored, nil
}

// AuditEventIgnored is the audit action of an event that verified but
// could never apply; the actor is "stripe".
const AuditEventIgnored = "stripe.event_ignored"

// writeJSONError answers with the wire contract's JSON error at a status
// of Stripe's conventions (400 for a delivery not to retry as is, 500 for
// one to retry) rather than the code's own.
func writeJSONError(w http.ResponseWriter, status int, code, msg string) {
	apierror.WriteStatus(w, status, apierror.New(code, msg))
}

// checkoutByMode holds the handlers of checkout.session.completed, one
// event type for both kinds of Checkout: a subscription's
// (subscriptions.go) and a top-up's payment (topups.go).
var checkoutByMode = map[stripe.CheckoutSessionMode]EventHandler{}

func init() {
	handle(stripe.EventTypeCheckoutSessionCompleted, func(s *Service, ctx context.Context, ev *stripe.Event) error {
		var cs stripe.CheckoutSession
		if err := decodeObject(ev, &cs); err != nil {
			return badEvent("checkout.session.completed: the session does not parse: %v", err)
		}
		h, ok := checkoutByMode[cs.Mode]
		if !ok {
			return nil // a Checkout the gateway did not start (setup mode): nothing to do
		}
		return h(s, ctx, ev)
	})
}
