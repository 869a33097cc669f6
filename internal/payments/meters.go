package payments

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v82"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// Metered usage reaches Stripe Billing Meters exactly once
// (docs/payments.md, "Metered usage").
//
// What is sent: for each metered product (`meter <service> <product>
// <event_name>`), the gateway's own priced cost of its ledger rows (the
// Cost of USAGE_POSTPAID rows, the overage cost of SUBSCRIPTION rows), in
// millionths of the currency's unit (billing.Units), summed per user,
// product and UTC hour from the ledger's hourly rollups. The metered
// Price attached to the meter charges one millionth of the currency per
// meter unit, so Stripe invoices exactly what the gateway priced.
//
// How once: each (user, service, product, hour) is a key; what was sent
// for it is kept as immutable records (KindMeterSent), one per event, the
// n-th event of a key carrying the identifier ...-n. A run computes, for
// every key, the rollup's cost less what the key's events already carry,
// and plans one event per positive difference: usage recorded after an
// hour was shipped (late rows) is a new event with its own identifier, an
// old identifier is never sent with another value. The plan is written to
// the lease's cursor (fenced: a node that lost the lease cannot write it)
// before anything is sent, and a run first finishes the plan it finds
// there, so a restart, a kill -9 or another node resends exactly the same
// identifiers and values, which Stripe deduplicates. Only after an event
// is sent is its record inserted; only then is it out of the plan.

// KindMeterSent is the record of one meter event sent to Stripe, by
// "<hour>/<key hash>/<n>" (MeterEvent is its body).
const KindMeterSent = "stripe_meter_sent"

// The shipper's constants.
const (
	// MeterLease is the store lease of the shipper: one node of a fleet
	// ships at a time.
	MeterLease = "stripe-meter"
	// StripeMeterWindow is how far back Stripe accepts a meter event's
	// timestamp (35 days); meterWindowMargin keeps clear of its edge.
	StripeMeterWindow = 35 * 24 * time.Hour
	meterWindowMargin = time.Hour
	// meterRecent is how far back every run looks for late rows; a sweep
	// of the whole window (meterSweepEvery) finds later ones.
	meterRecent     = 6 * time.Hour
	meterSweepEvery = time.Hour
	// meterMaxPlan bounds the events of one run (and so the cursor).
	meterMaxPlan = 500
	// meterMaxBackoff bounds the wait after Stripe failed.
	meterMaxBackoff = 10 * time.Minute
)

// MeterEvent is one meter event: planned in the cursor, then kept as the
// KindMeterSent record once sent.
type MeterEvent struct {
	Identifier string    `json:"identifier"`
	EventName  string    `json:"eventName"`
	Customer   string    `json:"customer"`
	UserID     string    `json:"userId"`
	ServiceID  string    `json:"serviceId"`
	ProductID  string    `json:"productId"`
	Hour       time.Time `json:"hour"`
	// From is where in the hour the event's usage starts: zero for the
	// top of the hour (the whole hour, or its part before a renewal of the
	// caller's Stripe subscription that falls inside it), the renewal for
	// the part from it on, which is stamped there so that Stripe bills it
	// in the new period. Each part is a key of its own (identifiers,
	// records, numbering).
	From time.Time `json:"from,omitzero"`
	// N numbers the events of the key from 1.
	N int `json:"n"`
	// Value is what this event adds, Total what the key's events carry
	// through this one, in millionths of Currency (billing.Units).
	Value    billing.Units `json:"value"`
	Total    billing.Units `json:"total"`
	Currency string        `json:"currency,omitempty"`
	// PlannedAt is when it was planned; SentAt when Stripe took it, with
	// the Timestamp sent (the hour, or the oldest Stripe accepts).
	PlannedAt time.Time `json:"plannedAt"`
	SentAt    time.Time `json:"sentAt,omitzero"`
	Timestamp int64     `json:"timestamp,omitempty"`
	// Error is why Stripe refused it, while it is held.
	Error string `json:"error,omitempty"`
	// Abandoned: Stripe refused it for longer than its meter window
	// (a deleted customer, a removed meter); it is recorded with its
	// error and never sent again, so the cursor does not grow for ever.
	// `caddy platform stripe reconcile` shows it as a difference.
	Abandoned bool `json:"abandoned,omitempty"`
	// NotBefore is when the caller's Stripe subscription started: usage
	// is stamped no earlier, so the first partial hour of a subscription,
	// and usage recorded before it began (a user who had no Stripe
	// customer yet), fall inside its first billing period (Stripe bills a
	// meter event by its timestamp: one stamped before the subscription
	// began would be in no invoice).
	NotBefore time.Time `json:"notBefore,omitzero"`
}

// key is the event's key: its user, service, product, hour and part.
func (e MeterEvent) key() meterKey {
	return meterKey{e.UserID, e.ServiceID, e.ProductID, e.Hour.UTC(), e.From.UTC()}
}

// recordID is the event's KindMeterSent id: hour first, so a listing
// from an hour on reads the records of the hours it scans.
func (e MeterEvent) recordID() string {
	return hourID(e.Hour) + "/" + e.key().hash() + "/" + fmt.Sprintf("%06d", e.N)
}

func hourID(h time.Time) string { return h.UTC().Format("2006010215") }

// keyHash names a (user, service, product, hour) key in ids: a digest, so
// ids containing any separator cannot collide.
func keyHash(user, service, product string, hour time.Time) string {
	h := sha256.Sum256([]byte(user + "\x00" + service + "\x00" + product + "\x00" + hour.UTC().Format(time.RFC3339)))
	return hex.EncodeToString(h[:12])
}

// hash names the key in ids: keyHash for the top of the hour (as before
// hours were split), a digest that also holds the part's start for the
// part of an hour from a renewal on.
func (k meterKey) hash() string {
	if k.from.IsZero() {
		return keyHash(k.user, k.service, k.product, k.hour)
	}
	h := sha256.Sum256([]byte(k.user + "\x00" + k.service + "\x00" + k.product + "\x00" + k.hour.UTC().Format(time.RFC3339) +
		"\x00" + k.from.UTC().Format(time.RFC3339Nano)))
	return hex.EncodeToString(h[:12])
}

// meterCursor is the lease's cursor.
type meterCursor struct {
	V int `json:"v"`
	// Install is a random id of this gateway's store, part of every
	// identifier: two gateways on one Stripe account never share one.
	Install string `json:"install"`
	// Since is the hour the shipper first ran: usage before it is not
	// sent (it was billed some other way).
	Since time.Time `json:"since"`
	// Through: every hour before it has been planned at least once.
	Through time.Time `json:"through"`
	// Metered holds, per metered product ("<service> <product>"), when
	// the shipper first found it metered: its usage before is not sent
	// (it was paid some other way: credits of a product that was
	// PREPAID, or invoiced by other means before the meter line came).
	// A cursor written before this was kept takes the products metered
	// at the upgrade as metered since Since.
	Metered map[string]time.Time `json:"metered,omitempty"`
	// Spans holds, per product ("<service> <product>"), the spans of
	// time the shipper found it metered, oldest first, the last one open
	// (zero To) while it is: only the usage inside them is sent. A
	// product whose meter is removed (moved to PREPAID: its callers pay
	// in credits) has its span closed at the first run that finds it so,
	// and one added back opens a new span then: the usage in between was
	// paid some other way. Metered is still written, for a node of the
	// version before Spans.
	Spans map[string][]meteredSpan `json:"spans,omitempty"`
	// Outbox is the plan being sent; Held the events Stripe refused
	// (4xx), retried every HeldRetry.
	Outbox    []MeterEvent `json:"outbox,omitempty"`
	Held      []MeterEvent `json:"held,omitempty"`
	HeldRetry time.Time    `json:"heldRetry,omitzero"`
}

// MeterRun says what one run of the shipper did.
type MeterRun struct {
	// Leader: this node held the lease and ran.
	Leader bool `json:"leader"`
	// Planned and Sent count events; Held the events Stripe refused that
	// wait for a retry.
	Planned int `json:"planned"`
	Sent    int `json:"sent"`
	Held    int `json:"held"`
	// NoCustomer lists the users with usage to send but no Stripe
	// customer: their usage waits (docs/payments.md).
	NoCustomer []string `json:"noCustomer,omitempty"`
}

// errLeaseLost stops a run whose node lost the lease.
var errLeaseLost = store.ErrLeaseLost

// meterKey is a (user, service, product, hour) and the part of the hour
// from `from` on (zero: from its top).
type meterKey struct {
	user, service, product string
	hour, from             time.Time
}

// metered is a product whose usage goes to a meter.
type metered struct {
	eventName string
	currency  string
}

// meteredProducts are the products with a meter whose rows cost money.
func (s *Service) meteredProducts() map[[2]string]metered {
	out := map[[2]string]metered{}
	for _, p := range s.cfg.Prices {
		if p.Meter == "" {
			continue
		}
		cur := ""
		if s.cat != nil {
			_, prod, err := lookup(s.cat, p.Service, p.Product)
			if err != nil || prod.BillingModel == billing.Prepaid {
				continue
			}
			cur = prod.Currency
		}
		out[[2]string{p.Service, p.Product}] = metered{eventName: p.Meter, currency: cur}
	}
	return out
}

// meterTTL is how long the shipper's lease lasts without renewal.
func (s *Service) meterTTL() time.Duration {
	return min(max(3*time.Duration(s.cfg.MeterInterval), 15*time.Second), 10*time.Minute)
}

// shipperState is what a Service's shipper keeps in memory between runs.
type shipperState struct {
	holder    string
	lastSweep time.Time
	failures  int
	retryAt   time.Time
}

// ShipMeters runs the shipper once: if this node holds (or takes) the
// lease, it finishes the plan in the cursor, plans the usage not sent yet
// and sends it. An error leaves everything to be resent by the next run.
func (s *Service) ShipMeters(ctx context.Context) (MeterRun, error) {
	s.shipMu.Lock()
	defer s.shipMu.Unlock()
	var run MeterRun
	pay, err := s.Payments()
	if err != nil {
		return run, err
	}
	now := s.now()
	lease, err := pay.TakeLease(ctx, MeterLease, s.ship.holder, s.meterTTL(), now)
	if err != nil || !lease.Held {
		return run, err
	}
	run.Leader = true
	sh := &shipRun{s: s, pay: pay, lease: lease, run: &run}
	if len(lease.Cursor) > 0 {
		if err := json.Unmarshal(lease.Cursor, &sh.cur); err != nil {
			return run, fmt.Errorf("stripe meters: the cursor does not parse: %w", err)
		}
	}
	if sh.cur.Install == "" {
		sh.cur = meterCursor{V: 1, Install: randomHex(8), Since: now.UTC().Truncate(time.Hour),
			Through: now.UTC().Truncate(time.Hour)}
		if err := sh.save(ctx); err != nil {
			return run, err
		}
	}
	// 0. A product metered since the last run (a reload added its meter
	// line, or moved it off PREPAID) is metered from now on.
	if sh.noteMetered(now) {
		if err := sh.save(ctx); err != nil {
			return run, err
		}
	}
	// 1. What a run before (here or on another node) planned is sent
	// first, as it was planned.
	if err := sh.flush(ctx); err != nil {
		return run, err
	}
	// 2. Events Stripe refused are tried again now and then.
	if len(sh.cur.Held) > 0 && !now.Before(sh.cur.HeldRetry) {
		if err := sh.retryHeld(ctx); err != nil {
			return run, err
		}
	}
	// 3. Plan what the ledger holds beyond what was sent, then send it.
	sweep := s.ship.lastSweep.IsZero() || now.Sub(s.ship.lastSweep) >= meterSweepEvery
	complete, err := sh.plan(ctx, now, sweep)
	if err != nil {
		return run, err
	}
	if complete {
		if h := now.UTC().Truncate(time.Hour); h.After(sh.cur.Through) {
			sh.cur.Through = h
		}
	}
	if err := sh.save(ctx); err != nil {
		return run, err
	}
	if sweep && complete {
		s.ship.lastSweep = now
	}
	if err := sh.flush(ctx); err != nil {
		return run, err
	}
	run.Held = len(sh.cur.Held)
	return run, nil
}

// meteredName names a product in meterCursor.Metered.
func meteredName(service, product string) string { return service + " " + product }

// noteMetered records in the cursor when each product metered now began
// to be (Metered: now, for one the cursor does not know yet; kept for
// good, for a node of the version before Spans) and the spans it was
// metered in (Spans: a product no longer metered ends its span now, one
// metered again starts a new one). It reports whether the cursor
// changed. The usage between two spans was paid some other way (the
// credits of a product moved to PREPAID) and is never sent; in a fleet
// whose nodes take a product's meter change one after the other, the
// usage of those minutes follows the config of the node that held the
// lease at each run (docs/payments.md, "Metered usage").
func (r *shipRun) noteMetered(now time.Time) bool {
	products := r.s.meteredProducts()
	changed := false
	if r.cur.Metered == nil {
		// A cursor from before products were noted: what is metered now
		// was metered since the shipper began, as that version sent it.
		r.cur.Metered = make(map[string]time.Time, len(products))
		for k := range products {
			r.cur.Metered[meteredName(k[0], k[1])] = r.cur.Since
		}
		changed = true
	}
	for k := range products {
		n := meteredName(k[0], k[1])
		if _, ok := r.cur.Metered[n]; !ok {
			r.cur.Metered[n] = now.UTC()
			changed = true
		}
	}
	if r.cur.Spans == nil {
		// A cursor from before spans were kept: each product noted was
		// metered since its time, and is until now if it is not now.
		r.cur.Spans = make(map[string][]meteredSpan, len(r.cur.Metered))
		for n, since := range r.cur.Metered {
			r.cur.Spans[n] = []meteredSpan{{From: since}}
		}
		changed = true
	}
	names := make(map[string]bool, len(products))
	for k := range products {
		n := meteredName(k[0], k[1])
		names[n] = true
		if sp := r.cur.Spans[n]; len(sp) == 0 || !sp[len(sp)-1].To.IsZero() {
			r.cur.Spans[n] = append(sp, meteredSpan{From: now.UTC()}) // metered (again) from now
			changed = true
		}
	}
	// A product no longer metered ends its span now; a span ended before
	// every hour a run may still plan is forgotten.
	keep := now.UTC().Add(-StripeMeterWindow)
	if r.cur.Through.Before(keep) {
		keep = r.cur.Through
	}
	keep = keep.Add(-time.Hour)
	for n, sp := range r.cur.Spans {
		if !names[n] && len(sp) > 0 && sp[len(sp)-1].To.IsZero() {
			sp[len(sp)-1].To = now.UTC()
			changed = true
		}
		for len(sp) > 1 && sp[0].To.Before(keep) {
			sp = sp[1:]
			changed = true
		}
		r.cur.Spans[n] = sp
	}
	return changed
}

// meteredSpan is a span of time a product was metered in (To zero: it
// still is).
type meteredSpan struct {
	From time.Time `json:"from"`
	To   time.Time `json:"to,omitzero"`
}

// meteredIn is the parts of the hour h the product named n was metered
// in, by the cursor: whole when it was for the whole hour (or the cursor
// holds no span of it), else the parts (none: not metered in it).
func (c *meterCursor) meteredIn(n string, h time.Time) (whole bool, parts [][2]time.Time) {
	sp, ok := c.Spans[n]
	if !ok {
		return true, nil
	}
	end := h.Add(time.Hour)
	for _, s := range sp {
		from, to := h, end
		if s.From.After(from) {
			from = s.From
		}
		if !s.To.IsZero() && s.To.Before(to) {
			to = s.To
		}
		if from.Before(to) {
			parts = append(parts, [2]time.Time{from, to})
		}
	}
	if len(parts) == 1 && parts[0][0].Equal(h) && parts[0][1].Equal(end) {
		return true, nil
	}
	return false, parts
}

// shipRun is one run of the shipper under the lease.
type shipRun struct {
	s     *Service
	pay   store.Payments
	lease store.Lease
	cur   meterCursor
	run   *MeterRun
}

// save writes the cursor, only while this node holds the lease (renewed
// first, so a long plan does not lose a lease nobody else took).
func (r *shipRun) save(ctx context.Context) error {
	if err := r.renew(ctx); err != nil {
		return err
	}
	b, err := json.Marshal(r.cur)
	if err != nil {
		return err
	}
	return r.pay.PutLeaseCursor(ctx, MeterLease, r.lease.Holder, r.lease.Epoch, b, r.s.now())
}

// renew extends the lease; a lease taken by another node stops the run.
func (r *shipRun) renew(ctx context.Context) error {
	l, err := r.pay.TakeLease(ctx, MeterLease, r.lease.Holder, r.s.meterTTL(), r.s.now())
	if err != nil {
		return err
	}
	if !l.Held || l.Epoch != r.lease.Epoch {
		return fmt.Errorf("stripe meters: the lease went to %s: %w", l.Holder, errLeaseLost)
	}
	r.lease = l
	return nil
}

// flush sends the outbox in order. Each event sent gets its record; an
// event Stripe refused moves to Held; the first failure worth retrying
// (an outage, a rate limit) stops the run with the rest still planned.
func (r *shipRun) flush(ctx context.Context) error {
	if len(r.cur.Outbox) == 0 {
		return nil
	}
	done := 0
	var ferr error
	for _, ev := range r.cur.Outbox {
		if err := r.renew(ctx); err != nil {
			ferr = err
			break
		}
		ev, err := r.s.sendMeterEvent(ctx, ev)
		if err != nil && !refused(err) {
			ferr = err
			break
		}
		if err != nil {
			ev.Error = err.Error()
			r.cur.Held = append(r.cur.Held, ev)
			if r.cur.HeldRetry.IsZero() {
				r.cur.HeldRetry = r.s.now().Add(meterSweepEvery)
			}
			r.s.log.Error("stripe refused a meter event; it is held and tried again hourly",
				zap.String("identifier", ev.Identifier), zap.String("user", ev.UserID), zap.Error(err))
		} else if err := r.record(ctx, ev); err != nil {
			ferr = err
			break
		}
		done++
	}
	r.cur.Outbox = r.cur.Outbox[done:]
	if errors.Is(ferr, errLeaseLost) {
		return ferr // the new holder finishes the outbox
	}
	if err := r.save(ctx); err != nil {
		return errors.Join(ferr, err)
	}
	return ferr
}

// record inserts the record of a sent event; a record already there (the
// node that sent it first inserted it) is the same event.
func (r *shipRun) record(ctx context.Context, ev MeterEvent) error {
	ev.Error = ""
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	if _, err := r.pay.InsertPaymentRecord(ctx, KindMeterSent, ev.recordID(), b, r.s.now()); err != nil && !errors.Is(err, store.ErrExists) {
		return err
	}
	r.run.Sent++
	return nil
}

// abandon records a held event Stripe has refused for longer than its
// meter window as abandoned: counted as planned (never planned again
// under a new identifier), never sent again, and logged.
func (r *shipRun) abandon(ctx context.Context, ev MeterEvent, why error) error {
	ev.Error, ev.Abandoned = why.Error(), true
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	if _, err := r.pay.InsertPaymentRecord(ctx, KindMeterSent, ev.recordID(), b, r.s.now()); err != nil && !errors.Is(err, store.ErrExists) {
		return err
	}
	r.s.log.Error("stripe refused a meter event for longer than its meter window; it is abandoned and shows in reconcile",
		zap.String("identifier", ev.Identifier), zap.String("user", ev.UserID), zap.Error(why))
	return nil
}

// retryHeld sends the held events again; those Stripe still refuses stay,
// until they are older than Stripe's meter window (abandon).
func (r *shipRun) retryHeld(ctx context.Context) error {
	var keep []MeterEvent
	var ferr error
	for i, ev := range r.cur.Held {
		if ferr != nil {
			keep = append(keep, r.cur.Held[i:]...)
			break
		}
		if err := r.renew(ctx); err != nil {
			return err
		}
		sent, err := r.s.sendMeterEvent(ctx, ev)
		switch {
		case err != nil && refused(err) && r.s.now().Sub(ev.PlannedAt) > StripeMeterWindow:
			if aerr := r.abandon(ctx, ev, err); aerr != nil {
				ferr = aerr
				keep = append(keep, ev)
			}
		case err != nil && refused(err):
			ev.Error = err.Error()
			keep = append(keep, ev)
		case err != nil:
			ferr = err
			keep = append(keep, ev)
		default:
			if err := r.record(ctx, sent); err != nil {
				ferr = err
				keep = append(keep, ev)
			}
		}
	}
	r.cur.Held = keep
	r.cur.HeldRetry = r.s.now().Add(meterSweepEvery)
	if err := r.save(ctx); err != nil {
		return errors.Join(ferr, err)
	}
	return ferr
}

// plan reads the usage of the hours to look at and what was sent for
// them, and puts an event for each positive difference in the outbox. It
// reports false when it planned only part (meterMaxPlan).
func (r *shipRun) plan(ctx context.Context, now time.Time, sweep bool) (bool, error) {
	s := r.s
	products := s.meteredProducts()
	if len(products) == 0 {
		return true, nil
	}
	back := meterRecent
	if sweep {
		back = StripeMeterWindow
	}
	from := now.UTC().Add(-back).Truncate(time.Hour)
	if r.cur.Through.Before(from) {
		from = r.cur.Through
	}
	if from.Before(r.cur.Since) {
		from = r.cur.Since
	}
	// What the ledger holds, per key.
	usage := map[meterKey]billing.Units{}
	services := map[string]bool{}
	for k := range products {
		services[k[0]] = true
	}
	for svc := range services {
		err := store.ScanUsage(ctx, s.Store(), store.LedgerFilter{ServiceID: svc, From: from}, func(ru store.Rollup) error {
			if _, ok := products[[2]string{ru.ServiceID, ru.ProductID}]; !ok || ru.Cost <= 0 {
				return nil
			}
			if whole, parts := r.cur.meteredIn(meteredName(ru.ServiceID, ru.ProductID), ru.Hour.UTC()); !whole && len(parts) == 0 {
				return nil // an hour the product was not metered in
			}
			usage[meterKey{ru.UserID, ru.ServiceID, ru.ProductID, ru.Hour.UTC(), time.Time{}}] += ru.Cost
			return nil
		})
		if err != nil {
			return false, fmt.Errorf("stripe meters: reading the usage: %w", err)
		}
	}
	// An hour a product was metered in for part of it only (it began,
	// ended or began again in it) counts its rows of those parts only
	// (its raw rows; none, when ledger_retention took them).
	began := map[meterKey]bool{}
	for k := range usage {
		whole, parts := r.cur.meteredIn(meteredName(k.service, k.product), k.hour)
		if whole {
			continue
		}
		var in billing.Units
		for _, p := range parts {
			f := store.LedgerFilter{UserID: k.user, ServiceID: k.service, From: p[0], To: p[1]}
			err := store.SumLedger(ctx, s.Store(), f, func(ru store.Rollup) error {
				if ru.UserID == k.user && ru.ProductID == k.product && ru.Cost > 0 {
					in += ru.Cost
				}
				return nil
			})
			if err != nil {
				return false, fmt.Errorf("stripe meters: reading the ledger of %s on %s from %s: %w", k.user, k.service, p[0].Format(time.RFC3339), err)
			}
		}
		usage[k] = min(usage[k], in)
		began[k] = true
	}
	if len(usage) == 0 {
		return true, nil
	}
	// What was sent (or is held), per key.
	sent, err := r.sentFrom(ctx, from)
	if err != nil {
		return false, err
	}
	keys := make([]meterKey, 0, len(usage))
	for k := range usage {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b meterKey) int {
		return cmp.Or(a.hour.Compare(b.hour), cmp.Compare(a.user, b.user), cmp.Compare(a.service, b.service), cmp.Compare(a.product, b.product))
	})
	customers := map[string]string{}
	subs := map[[2]string]SubscriptionRecord{}
	raw := map[rawKey]map[string][2]billing.Units{}
	waiting := map[string]bool{}
	complete := true
	for _, k := range keys {
		parts := sent[k]
		var got billing.Units
		for _, t := range parts {
			got += t.total
		}
		if usage[k]-got <= 0 {
			continue // sent; less than sent only once rollups were pruned
		}
		cust, ok := customers[k.user]
		if !ok {
			if cust, err = s.customerOf(ctx, k.user); err != nil {
				return false, err
			}
			customers[k.user] = cust
		}
		if cust == "" {
			waiting[k.user] = true
			continue
		}
		m := products[[2]string{k.service, k.product}]
		sub, known := subs[[2]string{k.user, k.service}]
		if !known {
			if sub, err = s.stripeSubscription(ctx, r.pay, k.user, k.service); err != nil {
				return false, err
			}
			subs[[2]string{k.user, k.service}] = sub
		}
		split := sub
		if began[k] {
			// Its usage is already the rows from a time inside the hour;
			// a renewal in the same hour leaves it whole.
			split = SubscriptionRecord{}
		}
		shares, err := r.split(ctx, k, usage[k], parts, split, raw)
		if err != nil {
			return false, err
		}
		for _, sh := range shares {
			if sh.delta <= 0 {
				continue
			}
			if len(r.cur.Outbox) == meterMaxPlan {
				complete = false
				break
			}
			pk := k
			pk.from = sh.from
			n := parts[sh.from].n + 1
			r.cur.Outbox = append(r.cur.Outbox, MeterEvent{
				Identifier: identifier(r.cur.Install, pk, n), EventName: m.eventName, Customer: cust,
				UserID: k.user, ServiceID: k.service, ProductID: k.product, Hour: k.hour, From: sh.from, N: n,
				Value: sh.delta, Total: parts[sh.from].total + sh.delta, Currency: m.currency, PlannedAt: now.UTC(),
				NotBefore: sub.StartDate,
			})
		}
		if !complete {
			break
		}
	}
	r.run.Planned += len(r.cur.Outbox)
	for u := range waiting {
		r.run.NoCustomer = append(r.run.NoCustomer, u)
	}
	slices.Sort(r.run.NoCustomer)
	if len(waiting) > 0 {
		// Said at each sweep (hourly), not at every run.
		logf := s.log.Debug
		if sweep {
			logf = s.log.Warn
		}
		logf("metered usage waits: these users have no Stripe customer yet; it is sent once they have one",
			zap.Strings("users", r.run.NoCustomer))
	}
	return complete, nil
}

// sentTotal is what a key's events carry and how many there are.
type sentTotal struct {
	total billing.Units
	n     int
}

// sentFrom sums the records of the hours from `from` on, and the held
// events (planned, not yet taken by Stripe, never to be planned again):
// per hour (the key with a zero from), per part of the hour.
func (r *shipRun) sentFrom(ctx context.Context, from time.Time) (map[meterKey]map[time.Time]sentTotal, error) {
	out := map[meterKey]map[time.Time]sentTotal{}
	add := func(ev MeterEvent) {
		k := ev.key()
		part := k.from
		k.from = time.Time{}
		if out[k] == nil {
			out[k] = map[time.Time]sentTotal{}
		}
		t := out[k][part]
		t.total += ev.Value
		t.n = max(t.n, ev.N)
		out[k][part] = t
	}
	for rec, err := range store.PaymentRecords(ctx, r.pay, KindMeterSent, hourID(from)) {
		if err != nil {
			return nil, fmt.Errorf("stripe meters: reading what was sent: %w", err)
		}
		var ev MeterEvent
		if err := json.Unmarshal(rec.Body, &ev); err != nil {
			return nil, fmt.Errorf("stripe meters: record %s does not parse: %w", rec.ID, err)
		}
		add(ev)
	}
	for _, ev := range r.cur.Held {
		add(ev)
	}
	return out, nil
}

// identifier is the event's identifier at Stripe: the same for a resend,
// another for each event of a key.
func identifier(install string, k meterKey, n int) string {
	return "gw_" + install + "_" + k.hash() + "_" + strconv.Itoa(n)
}

// meterShare is what to plan for a part of an hour.
type meterShare struct {
	from  time.Time
	delta billing.Units
}

// rawKey is a user's service and one of its hours split at a renewal.
type rawKey struct {
	user, service string
	hour, at      time.Time
}

// split divides what an hour's key still has to send (its rollup's cost
// less what its parts' events carry) between its parts. An hour that
// holds a renewal of the caller's Stripe subscription (periodBoundaryIn)
// is split there by its raw ledger rows, as the console's Revenue page
// splits the hour its last invoice ends in: the rows before the renewal
// are the top of the hour's key (stamped in the hour, billed in the
// period that ends), the rows from it on the part from the renewal
// (stamped at the renewal, billed in the new period). What a part's
// events carry beyond its rows (sent before the split was known) comes
// off the other part, so the hour is never sent more than it costs. An
// hour whose raw rows were pruned (ledger_retention) is not split: all
// of it goes to the top of the hour, as before.
func (r *shipRun) split(ctx context.Context, k meterKey, total billing.Units, parts map[time.Time]sentTotal,
	sub SubscriptionRecord, raw map[rawKey]map[string][2]billing.Units) ([]meterShare, error) {
	var got billing.Units
	for _, t := range parts {
		got += t.total
	}
	whole := []meterShare{{delta: total - got}}
	at, ok := periodBoundaryIn(sub, k.hour)
	if !ok {
		return whole, nil
	}
	rk := rawKey{k.user, k.service, k.hour, at}
	sums, ok := raw[rk]
	if !ok {
		sums = map[string][2]billing.Units{}
		for i, f := range []store.LedgerFilter{{From: k.hour, To: at}, {From: at, To: k.hour.Add(time.Hour)}} {
			f.UserID, f.ServiceID = k.user, k.service
			err := store.SumLedger(ctx, r.s.Store(), f, func(ru store.Rollup) error {
				if ru.UserID != k.user || ru.ServiceID != k.service || ru.Cost <= 0 {
					return nil
				}
				v := sums[ru.ProductID]
				v[i] += ru.Cost
				sums[ru.ProductID] = v
				return nil
			})
			if err != nil {
				return nil, fmt.Errorf("stripe meters: reading the ledger of %s on %s at %s: %w", k.user, k.service, at.Format(time.RFC3339), err)
			}
		}
		raw[rk] = sums
	}
	before, after := sums[k.product][0], sums[k.product][1]
	if before+after < total {
		// The hour's raw rows were pruned: it cannot be split.
		return whole, nil
	}
	var sentBefore, sentAfter billing.Units
	for from, t := range parts {
		if from.Before(at) {
			sentBefore += t.total
		} else {
			sentAfter += t.total
		}
	}
	db, da := before-sentBefore, after-sentAfter
	if db < 0 {
		da, db = da+db, 0
	}
	if da < 0 {
		db, da = db+da, 0
	}
	return []meterShare{{delta: db}, {from: at, delta: da}}, nil
}

// periodBoundaryIn is the renewal of the Stripe subscription sub that
// falls inside hour (after its top, before its end), if one does: its
// current period's start or end as the gateway last applied them, or
// its billing cycle anchor stepped by its interval (Stripe's months keep
// the anchor's day, or the month's last day when it has fewer). A record
// without an interval (written before it was kept) is taken as monthly
// from its start. Its start is no boundary here: usage before it is
// stamped at it (meterTimestamp).
func periodBoundaryIn(sub SubscriptionRecord, hour time.Time) (time.Time, bool) {
	start := sub.StartDate
	if start.IsZero() {
		return time.Time{}, false
	}
	end := hour.Add(time.Hour)
	inside := func(t time.Time) bool { return !t.IsZero() && t.After(hour) && t.Before(end) && t.After(start) }
	for _, t := range []time.Time{sub.CurrentPeriodStart, sub.CurrentPeriodEnd} {
		if inside(t) {
			return t.UTC(), true
		}
	}
	anchor := sub.BillingCycleAnchor
	if anchor.IsZero() {
		anchor = start
	}
	anchor = anchor.UTC()
	unit, n := sub.Interval, int(sub.IntervalCount)
	if unit == "" {
		unit, n = "month", 1
	}
	n = max(n, 1)
	switch unit {
	case "day", "week":
		step := time.Duration(n) * 24 * time.Hour
		if unit == "week" {
			step *= 7
		}
		i := int64(max(hour.Sub(anchor), 0) / step)
		for _, j := range []int64{i, i + 1} {
			if t := anchor.Add(time.Duration(j) * step); inside(t) {
				return t, true
			}
		}
	case "month", "year":
		if unit == "year" {
			n *= 12
		}
		i := ((hour.Year()-anchor.Year())*12 + int(hour.Month()) - int(anchor.Month())) / n
		for j := i - 1; j <= i+1; j++ {
			if j < 0 {
				continue
			}
			if t := addMonths(anchor, j*n); inside(t) {
				return t, true
			}
		}
	}
	return time.Time{}, false
}

// addMonths is t moved n months on as Stripe moves a billing cycle
// anchor: the same day, or the month's last day when it has fewer.
func addMonths(t time.Time, n int) time.Time {
	m := int(t.Month()) - 1 + n
	y := t.Year() + m/12
	m %= 12
	last := time.Date(y, time.Month(m+2), 0, 0, 0, 0, 0, time.UTC).Day()
	return time.Date(y, time.Month(m+1), min(t.Day(), last), t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), time.UTC)
}

// customerOf returns the user's Stripe customer, "" when they have none.
func (s *Service) customerOf(ctx context.Context, userID string) (string, error) {
	pay, err := s.Payments()
	if err != nil {
		return "", err
	}
	id, err := s.storedCustomer(ctx, pay, userID)
	if errors.Is(err, ErrNoCustomer) {
		return "", nil
	}
	return id, err
}

// meterTimestamp is the timestamp an event is sent with at now: its hour,
// or the start of its part of the hour (a renewal inside it); never
// before the caller's Stripe subscription started (notBefore), also for
// usage recorded before it (it would be in no invoice); and, for an hour
// older than Stripe accepts (after a long outage), the oldest time Stripe
// accepts, so the usage is billed late but billed.
func meterTimestamp(hour, from, notBefore, now time.Time) int64 {
	oldest := now.Add(-StripeMeterWindow + meterWindowMargin)
	ts := hour
	if from.After(ts) {
		ts = from
	}
	if notBefore.After(ts) {
		ts = notBefore
	}
	if ts.Before(oldest) {
		ts = oldest
	}
	if ts.After(now) {
		ts = now
	}
	return ts.Unix()
}

// sendMeterEvent sends one event and returns it as sent.
func (s *Service) sendMeterEvent(ctx context.Context, ev MeterEvent) (MeterEvent, error) {
	now := s.now()
	ts := meterTimestamp(ev.Hour, ev.From, ev.NotBefore, now)
	p := &stripe.BillingMeterEventCreateParams{
		EventName:  stripe.String(ev.EventName),
		Identifier: stripe.String(ev.Identifier),
		Payload:    map[string]string{"stripe_customer_id": ev.Customer, "value": strconv.FormatInt(int64(ev.Value), 10)},
		Timestamp:  stripe.Int64(ts),
	}
	if _, err := s.sc.V1BillingMeterEvents.Create(ctx, p); err != nil {
		if alreadySent(err) {
			err = nil
		} else {
			return ev, err
		}
	}
	ev.SentAt, ev.Timestamp, ev.Error = now.UTC(), ts, ""
	return ev, nil
}

// refused reports whether Stripe refused the request as it is (a 4xx
// other than a rate limit, a conflict or an authentication failure): it
// is held and tried again later rather than stopping every other event.
func refused(err error) bool {
	var se *stripe.Error
	if !errors.As(err, &se) {
		return false
	}
	switch se.HTTPStatusCode {
	case 400, 404, 422:
		return true
	}
	return false
}

// alreadySent reports Stripe's answer to an identifier it has seen.
func alreadySent(err error) bool {
	var se *stripe.Error
	if !errors.As(err, &se) || se.HTTPStatusCode != 400 {
		return false
	}
	return se.Code == stripe.ErrorCodeResourceAlreadyExists ||
		strings.Contains(strings.ToLower(se.Msg), "identifier") && strings.Contains(strings.ToLower(se.Msg), "already")
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// StartMeters runs the shipper every meter_interval until stop is closed,
// and returns a channel closed once it has stopped (the lease released).
// A failed run waits longer each time (up to 10 minutes) before the next.
func (s *Service) StartMeters(stop <-chan struct{}) <-chan struct{} {
	done := make(chan struct{})
	if len(s.meteredProducts()) == 0 {
		close(done)
		return done
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-stop
		cancel()
	}()
	go func() {
		defer close(done)
		defer cancel()
		interval := time.Duration(s.cfg.MeterInterval)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			s.shipTick(ctx, interval)
			select {
			case <-ctx.Done():
				if pay, err := s.Payments(); err == nil {
					rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
					_ = pay.ReleaseLease(rctx, MeterLease, s.ship.holder)
					rcancel()
				}
				return
			case <-t.C:
			}
		}
	}()
	return done
}

// shipTick runs the shipper unless it is backing off after a failure.
func (s *Service) shipTick(ctx context.Context, interval time.Duration) {
	if s.now().Before(s.ship.retryAt) {
		return
	}
	run, err := s.ShipMeters(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		s.ship.failures++
		wait := min(interval<<min(s.ship.failures, 10), meterMaxBackoff)
		s.ship.retryAt = s.now().Add(wait)
		s.log.Warn("stripe meters: the run stopped; everything not sent is sent by a later run",
			zap.Error(err), zap.Duration("retry_in", wait))
		return
	}
	s.ship.failures, s.ship.retryAt = 0, time.Time{}
	if run.Sent > 0 || run.Held > 0 {
		s.log.Info("stripe meters", zap.Int("sent", run.Sent), zap.Int("held", run.Held))
	}
}
