package platform

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/alerts"
	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/store"
)

// Usage alerts (docs/alerts.md): products set thresholds, the `alerts`
// block names the webhook. Off the hot path: a call's commit only notes
// which subscription it changed (store.Alerts.ChangedAccounts); a loop of
// this app reads those every Interval, records each threshold reached once
// in the store, and a second loop delivers the recorded alerts, signed,
// with retries.

// Defaults of the alerts block.
const (
	DefaultAlertInterval = time.Second
	DefaultAlertTimeout  = 10 * time.Second
)

// The values of sign_with.
const (
	SignWithSecret  = "secret"
	SignWithService = "service"
)

var signWiths = []string{SignWithSecret, SignWithService}

// AlertsConfig is the `alerts` block: where usage alerts are sent and how.
type AlertsConfig struct {
	// Webhook is the URL every alert is POSTed to.
	Webhook string `json:"webhook"`
	// Secret signs the webhooks when SignWith is "secret" (the default);
	// placeholders such as {env.ALERT_SECRET} are resolved at load time.
	Secret string `json:"secret,omitempty"`
	// SignWith is "secret" (the operator's Secret) or "service" (the
	// signing secret of the alert's service).
	SignWith string `json:"sign_with,omitempty"`
	// Interval is how often changed subscriptions are evaluated, and due
	// deliveries looked for; 1s.
	Interval caddy.Duration `json:"interval,omitempty"`
	// Timeout bounds one delivery attempt; 10s.
	Timeout caddy.Duration `json:"timeout,omitempty"`
	// RetryInitial, RetryMax and GiveUpAfter are the retry schedule:
	// 30s doubling up to 1h, given up 24h after the alert fired.
	RetryInitial caddy.Duration `json:"retry_initial,omitempty"`
	RetryMax     caddy.Duration `json:"retry_max,omitempty"`
	GiveUpAfter  caddy.Duration `json:"give_up_after,omitempty"`
}

// check validates what can be checked before placeholders are resolved.
func (c *AlertsConfig) check() error {
	switch {
	case c.Webhook == "":
		return errors.New("no webhook URL (webhook https://…)")
	case c.SignWith != "" && !slices.Contains(signWiths, c.SignWith):
		return fmt.Errorf("sign_with %q is not one of %s", c.SignWith, strings.Join(signWiths, ", "))
	case c.byService() && c.Secret != "":
		return errors.New("a secret and sign_with service: the webhooks are signed with one or the other")
	case !c.byService() && c.Secret == "":
		return errors.New("no secret to sign the webhooks with (secret {env.ALERT_SECRET}, or sign_with service)")
	case c.Interval < 0 || c.Timeout < 0 || c.RetryInitial < 0 || c.RetryMax < 0 || c.GiveUpAfter < 0:
		return errors.New("durations must be positive")
	case c.RetryMax > 0 && c.RetryInitial > c.RetryMax:
		return fmt.Errorf("retry_initial %s is longer than retry_max %s", time.Duration(c.RetryInitial), time.Duration(c.RetryMax))
	}
	if !strings.Contains(c.Webhook, "{") { // a placeholder is checked once resolved
		if err := validWebhookURL(c.Webhook); err != nil {
			return fmt.Errorf("webhook '%s': %v", catalog.ShownURL(c.Webhook), err)
		}
	}
	return nil
}

// byService reports whether webhooks are signed with the service's
// secret. (A literal on the right: the setting is public, not a secret,
// and e2e's constant-time check accepts a compare with a literal.)
func (c *AlertsConfig) byService() bool { return c.SignWith == "service" }

func validWebhookURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.Fragment != "" {
		return errors.New("must be an http or https URL with a host and no credentials or fragment")
	}
	return nil
}

// alerter is the provisioned alerts block.
type alerter struct {
	webhook  string
	secret   []byte // nil: each alert's service secret
	interval time.Duration
	schedule alerts.Schedule
	client   *http.Client
	wake     chan struct{}
}

// provisionAlerts checks the alerts block against the catalog and resolves
// its placeholders. Thresholds without a webhook are refused: they would
// never tell anyone.
func (a *App) provisionAlerts(repl *caddy.Replacer) error {
	c := a.Alerts
	if c == nil {
		if a.catalog.HasAlerts() {
			return errors.New("platform alerts: products set alert thresholds, but there is no alerts { webhook … } block to send them to")
		}
		return nil
	}
	if err := c.check(); err != nil {
		return fmt.Errorf("platform alerts: %w", err)
	}
	webhook, err := repl.ReplaceOrErr(c.Webhook, true, true)
	if err != nil {
		return fmt.Errorf("platform alerts: webhook: %w", err)
	}
	if err := validWebhookURL(webhook); err != nil {
		return fmt.Errorf("platform alerts: webhook: %v", err)
	}
	al := &alerter{
		webhook:  webhook,
		interval: orDefault(time.Duration(c.Interval), DefaultAlertInterval),
		schedule: alerts.Schedule{
			Initial:     orDefault(time.Duration(c.RetryInitial), alerts.DefaultSchedule.Initial),
			Max:         orDefault(time.Duration(c.RetryMax), alerts.DefaultSchedule.Max),
			GiveUpAfter: orDefault(time.Duration(c.GiveUpAfter), alerts.DefaultSchedule.GiveUpAfter),
		},
		wake: make(chan struct{}, 1),
	}
	if al.schedule.Initial > al.schedule.Max {
		return fmt.Errorf("platform alerts: retry_initial %s is longer than retry_max %s", al.schedule.Initial, al.schedule.Max)
	}
	if !c.byService() {
		secret, err := repl.ReplaceOrErr(c.Secret, true, true)
		if err != nil {
			return fmt.Errorf("platform alerts: secret: %w", err)
		}
		if len(secret) < 16 {
			return errors.New("platform alerts: the secret is shorter than 16 bytes")
		}
		al.secret = []byte(secret)
	}
	al.client = &http.Client{
		Timeout: orDefault(time.Duration(c.Timeout), DefaultAlertTimeout),
		// A redirect is a failed delivery, not a reason to send the signed
		// body somewhere else.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	a.alerter = al
	return nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// runAlerts evaluates changed subscriptions and delivers due alerts until
// stop is closed, then returns once both loops are over. No attempt starts
// after stop; one under way then runs to its end, bounded by its timeout,
// and records its outcome while the store is still open (Stop waits for
// it; the store closes in Cleanup, after Stop).
func (a *App) runAlerts(stop <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	evaluated := make(chan struct{})
	go func() {
		defer close(evaluated)
		a.evaluateAlerts(ctx, stop)
	}()
	go func() {
		<-stop
		cancel()
	}()
	a.deliverAlerts(ctx, stop)
	<-evaluated
}

// evaluateAlerts takes the subscriptions committed changes named, at most
// once per interval, and records the thresholds they reached.
func (a *App) evaluateAlerts(ctx context.Context, stop <-chan struct{}) {
	st := a.DataStore()
	pause := time.NewTimer(a.alerter.interval)
	defer pause.Stop()
	wait := a.alerter.interval
	for {
		refs, ready := st.ChangedAccounts()
		failed := false
		for i, ref := range refs {
			if ctx.Err() == nil && !failed {
				_, err := a.evaluate(ctx, ref)
				failed = err != nil
				if !failed {
					continue
				}
			}
			// A stopped round (a reload) leaves the rest to the next
			// config's loop; a failed one (the store's error, logged
			// once) to the next round: the subscription's next change
			// may never come (a quota refused at 100%, a balance below
			// zero), and with it the alert it reached.
			st.RequeueChanged(refs[i:])
			break
		}
		select {
		case <-stop:
			return
		case <-ready:
		}
		// Gather what a busy second changes into one round; after a
		// failed round, wait twice as long each time (at most
		// alertRetryMax), so a dead store costs a line a minute.
		if failed {
			wait = max(a.alerter.interval, min(2*wait, alertRetryMax))
		} else {
			wait = a.alerter.interval
		}
		pause.Reset(wait)
		select {
		case <-stop:
			return
		case <-pause.C:
		}
	}
}

// EvaluateAlerts records every alert threshold the subscription has reached
// in its current period and that was not recorded before, and wakes the
// delivery. It returns the alerts it recorded.
func (a *App) EvaluateAlerts(ctx context.Context, ref store.AccountRef) []store.Alert {
	fired, _ := a.evaluate(ctx, ref)
	return fired
}

// evaluate is EvaluateAlerts, and says whether a store read or write
// failed (the context's end included) so that the evaluation is not
// complete: what it recorded stays recorded, once, and another
// evaluation records the rest.
func (a *App) evaluate(ctx context.Context, ref store.AccountRef) ([]store.Alert, error) {
	if a.alerter == nil {
		return nil, nil
	}
	st := a.DataStore()
	sub, err := st.GetSubscription(ctx, ref.UserID, ref.ServiceID)
	if err != nil {
		// No subscription (an owner's free calls, one removed since) has
		// no thresholds: nothing to say.
		if errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrNoAccount) {
			return nil, nil
		}
		a.logFailed(ctx, "usage alerts: reading a subscription", ref, err)
		return nil, err
	}
	svc, ok := a.catalog.Service(ref.ServiceID)
	if !ok {
		return nil, nil
	}
	thresholds := svc.AlertThresholds(sub.ProductID)
	p, ok := svc.Product(sub.ProductID)
	if len(thresholds) == 0 || !ok {
		return nil, nil
	}
	t := a.Now()
	start, _ := billing.PeriodBounds(p.Period, p.CalendarPeriods, sub.StartedAt, t)
	fired, err := a.recordReached(ctx, ref, *p, thresholds, start, t, t)
	if periodic := periodThresholds(thresholds); len(periodic) > 0 && a.lateForPrevious(sub, start, t) {
		prev := start.Add(-time.Nanosecond)
		prevStart, _ := billing.PeriodBounds(p.Period, p.CalendarPeriods, sub.StartedAt, prev)
		late, lateErr := a.recordReached(ctx, ref, *p, periodic, prevStart, prev, t)
		fired = append(late, fired...)
		err = errors.Join(err, lateErr)
	}
	if len(fired) > 0 {
		select {
		case a.alerter.wake <- struct{}{}:
		default:
		}
	}
	return fired, err
}

// logFailed logs a failed store read or write of an evaluation, unless
// the evaluation was stopped (a reload or a stop ends its context; the
// subscription is evaluated again by the next loop).
func (a *App) logFailed(ctx context.Context, msg string, ref store.AccountRef, err error, fields ...zap.Field) {
	if ctx.Err() != nil {
		return
	}
	a.logger.Error(msg, append([]zap.Field{zap.String("user", ref.UserID), zap.String("service", ref.ServiceID),
		zap.Error(err)}, fields...)...)
}

// alertRetryMax bounds the wait after failed evaluation rounds.
const alertRetryMax = time.Minute

// alertLateWindow is how long into a period the previous one is
// evaluated too: a charge settled in a period's last moments is
// evaluated an interval after its commit, in the next period, whose
// counters do not hold it.
const alertLateWindow = time.Minute

// lateForPrevious reports whether an evaluation at t, in the period from
// start, also evaluates the previous period: t is within
// alertLateWindow (and an interval) of start, the subscription ran in
// that period, and it was not changed since (a plan changed at the
// period's end would read the old plan's usage against the new plan's
// thresholds).
func (a *App) lateForPrevious(sub store.Subscription, start, t time.Time) bool {
	return t.Sub(start) < alertLateWindow+a.alerter.interval && sub.StartedAt.Before(start) &&
		sub.UpdatedAt.Before(start)
}

// periodThresholds are those of ts that watch a period's counters (a
// share of the quota or of the spending cap): a balance is not a
// period's, and one below credits_below now says nothing of the
// previous period.
func periodThresholds(ts []alerts.Threshold) []alerts.Threshold {
	var out []alerts.Threshold
	for _, t := range ts {
		if t.Metric != alerts.MetricCreditsBelow {
			out = append(out, t)
		}
	}
	return out
}

// recordReached records every threshold the subscription's state at at
// (in the period from periodStart) has reached and that was not recorded
// before, as fired at now, and returns the alerts it recorded and the
// store's errors (each threshold is tried, and one recorded is kept).
func (a *App) recordReached(ctx context.Context, ref store.AccountRef, p billing.Product, thresholds []alerts.Threshold,
	periodStart, at, now time.Time) ([]store.Alert, error) {
	st := a.DataStore()
	state, err := st.State(ctx, store.Account{UserID: ref.UserID, ServiceID: ref.ServiceID, Product: p}, at)
	if err != nil {
		a.logFailed(ctx, "usage alerts: reading usage", ref, err)
		return nil, err
	}
	var fired []store.Alert
	var failed error
	for _, r := range alerts.Reached(p, state, thresholds) {
		name := r.Threshold.String()
		// A read first: a subscription past 80% stays past it for the
		// rest of the period, and every call on it would otherwise cost
		// a write.
		has, err := st.HasAlert(ctx, ref.UserID, ref.ServiceID, periodStart, name)
		if err != nil {
			a.logFailed(ctx, "usage alerts: reading an alert", ref, err, zap.String("threshold", name))
			failed = errors.Join(failed, err)
			continue
		}
		if has {
			continue
		}
		al, err := st.CreateAlert(ctx, store.Alert{
			UserID: ref.UserID, ServiceID: ref.ServiceID, ProductID: p.ID, PeriodStart: periodStart,
			Threshold: name, Value: r.Value, Limit: r.Limit, Currency: r.Currency, Unit: r.Unit, Created: now, NextAttempt: now,
		})
		if errors.Is(err, store.ErrExists) {
			continue // another evaluator recorded it first
		}
		if err != nil {
			a.logFailed(ctx, "usage alerts: recording an alert", ref, err, zap.String("threshold", name))
			failed = errors.Join(failed, err)
			continue
		}
		a.logger.Info("usage alert fired", zap.String("alert", al.ID), zap.String("user", al.UserID),
			zap.String("service", al.ServiceID), zap.String("threshold", name), zap.String("value", al.Value.String()), measureField(al))
		fired = append(fired, al)
	}
	return fired, failed
}

// alertBatch bounds the alerts one delivery round takes.
const alertBatch = 100

// deliverAlerts sends due alerts every interval, and at once when one
// fires.
func (a *App) deliverAlerts(ctx context.Context, stop <-chan struct{}) {
	tick := time.NewTicker(a.alerter.interval)
	defer tick.Stop()
	for {
		a.DeliverDueAlerts(ctx)
		select {
		case <-stop:
			return
		case <-tick.C:
		case <-a.alerter.wake:
		}
	}
}

// DeliverDueAlerts makes one attempt at every pending alert that is due,
// until ctx ends: an attempt begun then runs to its end (deliverAlert).
func (a *App) DeliverDueAlerts(ctx context.Context) {
	due, err := a.DataStore().DueAlerts(ctx, a.Now(), alertBatch)
	if err != nil {
		if ctx.Err() == nil { // not a reload or stop
			a.logger.Error("usage alerts: reading due alerts", zap.Error(err))
		}
		return
	}
	for _, al := range due {
		if ctx.Err() != nil {
			return // stopped: the next config's loop takes the rest
		}
		a.deliverAlert(ctx, al)
	}
}

// alertRecordWindow is how long an attempt has, past its send's timeout,
// to record its outcome: its claim lasts the timeout and this.
const alertRecordWindow = 5 * time.Second

// deliverAlert makes one attempt. The attempt is claimed in the store
// first (attempts + 1, the next try once the attempt's time is up), so two
// senders (the old and new config during a reload) never send one alert at
// once, and a crash mid-attempt leaves it due again once the claim runs
// out.
//
// An attempt once claimed is not the config's: ctx ending (a reload or a
// stop) starts no attempt but cancels none under way. The attempt runs on
// a context of its own that ends when its claim does (the send bounded by
// the client's timeout, the rest left to record the outcome), so what the
// receiver answered is recorded: a delivery accepted as the reload cut it
// off was recorded as interrupted and sent again by the new config.
func (a *App) deliverAlert(ctx context.Context, al store.Alert) {
	if ctx.Err() != nil {
		return
	}
	st := a.DataStore()
	lease := a.alerter.client.Timeout + alertRecordWindow
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lease)
	defer cancel()
	t := a.Now()
	claim := al
	claim.Attempts++
	claim.NextAttempt = t.Add(lease)
	claimed, err := st.UpdateAlert(actx, claim, al.Attempts)
	if err != nil {
		if !errors.Is(err, store.ErrStale) {
			a.logger.Error("usage alerts: claiming a delivery", zap.String("alert", al.ID), zap.Error(err))
		}
		return
	}
	sendErr := a.sendAlert(actx, claimed, t)
	done := claimed
	t = a.Now()
	if sendErr == nil {
		done.Status, done.DeliveredAt, done.LastError, done.NextAttempt = store.AlertDelivered, t, "", time.Time{}
	} else {
		done.LastError = sendErr.Error()
		next, retry := a.alerter.schedule.Next(claimed.Created, t, claimed.Attempts)
		if retry {
			done.NextAttempt = next
		} else {
			done.Status, done.NextAttempt = store.AlertFailed, time.Time{}
		}
	}
	// Recorded only if the attempts are still this claim's: a record
	// that came after the claim ran out and another sender claimed the
	// alert is ErrStale, and that sender's attempt is the one recorded.
	if _, err := st.UpdateAlert(actx, done, claimed.Attempts); err != nil {
		a.logger.Error("usage alerts: recording a delivery", zap.String("alert", al.ID), zap.Error(err))
		return
	}
	fields := []zap.Field{zap.String("alert", al.ID), zap.String("threshold", al.Threshold), zap.Int("attempt", claimed.Attempts)}
	switch done.Status {
	case store.AlertDelivered:
		a.logger.Info("usage alert delivered", fields...)
	case store.AlertFailed:
		a.logger.Error("usage alert given up", append(fields, zap.String("error", done.LastError))...)
	default:
		a.logger.Warn("usage alert delivery failed; will retry", append(fields,
			zap.String("error", done.LastError), zap.Time("next_attempt", done.NextAttempt))...)
	}
}

// sendAlert POSTs the alert's signed webhook; any answer but 2xx is an
// error. Errors name neither the URL (its query may hold a token) nor
// the secret.
func (a *App) sendAlert(ctx context.Context, al store.Alert, t time.Time) error {
	secret := a.alerter.secret
	if secret == nil {
		svc, ok := a.catalog.Service(al.ServiceID)
		if !ok {
			return fmt.Errorf("service %s is not in the catalog, so there is no secret to sign with", al.ServiceID)
		}
		secret = svc.SigningSecret()
	}
	body, err := alertEvent(al).Body()
	if err != nil {
		return err
	}
	sig, ts := alerts.Sign(secret, body, t)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.alerter.webhook, bytes.NewReader(body))
	if err != nil {
		return errors.New("cannot build the request to the webhook URL")
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "platform-gateway-alerts")
	req.Header.Set(a.headers.Signature, sig)
	req.Header.Set(a.headers.Timestamp, ts)
	req.Header.Set(alertEventIDHeader(a.headers), al.ID)
	resp, err := a.alerter.client.Do(req)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return fmt.Errorf("webhook unreachable: %v", err)
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("webhook answered %s", resp.Status)
	}
	return nil
}

// alertEventIDHeader is X-<Brand>-Event-ID.
func alertEventIDHeader(h Headers) string {
	return strings.TrimSuffix(h.Signature, "Signature") + "Event-ID"
}

// measureField is what an alert's value counts, for a log line: its
// currency, its unit, or, for the money of a product without a currency,
// that the currency is not named.
func measureField(al store.Alert) zap.Field {
	switch {
	case al.Currency != "":
		return zap.String("currency", al.Currency)
	case al.Unit != "":
		return zap.String("unit", al.Unit)
	}
	return zap.String("currency", "none named (the product's listing names no currency)")
}

func alertEvent(al store.Alert) alerts.Event {
	metric, _, _ := strings.Cut(al.Threshold, " ")
	return alerts.Event{
		EventID: al.ID, CreatedAt: al.Created, UserID: al.UserID, ServiceID: al.ServiceID, ProductID: al.ProductID,
		PeriodStart: al.PeriodStart, Threshold: al.Threshold, Metric: metric, Value: al.Value, Limit: al.Limit,
		Currency: al.Currency, Unit: al.Unit,
	}
}
