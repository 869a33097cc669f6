package console

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/subscription"
)

// Bounds of the overview's "needs attention": the subscriptions it reads
// the period of (one store read each), and how long a job may sit without
// a progress report before it counts as stuck.
const (
	maxAttentionSubs = 2000
	stuckAfter       = 15 * time.Minute
	maxAttention     = 50
)

// concern is one line of "needs attention": what, about whom, how bad,
// and where to act on it.
type concern struct {
	Level  string // amber or red
	Tag    string // what kind of concern, in two or three words
	UserID string
	What   string
	Limit  *limit
	Link   string
	LinkTo string
}

// attention gathers what an operator should look at now: subscriptions
// near or past a quota or a spending cap, prepaid balances at or below
// zero, alert deliveries still pending, jobs that stopped reporting, and
// services whose backends fail (failingBackends). Red first.
func (h *Handler) attention(ctx context.Context, now time.Time) ([]concern, bool, error) {
	var out []concern
	subs, partial, err := h.allSubscriptions(ctx, "")
	if err != nil {
		return nil, false, err
	}
	if len(subs) > maxAttentionSubs {
		subs, partial = subs[:maxAttentionSubs], true
	}
	for _, sub := range subs {
		if !subscription.EffectiveStatus(sub, now).GrantsAccess() {
			continue // a limit of a subscription that grants nothing refuses nothing
		}
		ps, err := h.ops.PeriodState(ctx, sub, now)
		if err != nil {
			return nil, false, fmt.Errorf("summarize %s on %s: %w", sub.UserID, sub.ServiceID, err)
		}
		for _, l := range limits(ps, h.overageAllowed(ps.ServiceID, ps.ProductID), h.costKindOf(ps.ServiceID, ps.ProductID)) {
			if l.Level == levelOK {
				continue
			}
			l := l
			tag := "Near the limit"
			if l.Level == levelRed {
				tag = "Over the limit"
			}
			out = append(out, concern{Level: l.Level, Tag: tag, UserID: sub.UserID, Limit: &l,
				What: fmt.Sprintf("%s on %s (%s): %s at %d%%", sub.UserID, sub.ServiceID, ps.ProductID, l.What, l.Percent),
				Link: h.link(nil, "users", sub.UserID), LinkTo: "Open " + sub.UserID})
		}
		if ps.BillingModel == billing.Prepaid && ps.CreditsFree() <= 0 {
			out = append(out, concern{Level: levelRed, Tag: "No credits left", UserID: sub.UserID,
				What: fmt.Sprintf("%s on %s (%s): credit balance %s, calls refused until credits are added", sub.UserID, sub.ServiceID, ps.ProductID, ps.Credits),
				Link: h.link(nil, "users", sub.UserID), LinkTo: "Add credits"})
		}
	}
	pending, err := h.ops.ListAlerts(ctx, ops.AlertQuery{Status: "PENDING", Limit: 100})
	if err != nil {
		return nil, false, err
	}
	if n := len(pending.Alerts); n > 0 {
		what := fmt.Sprintf("%d alert deliveries pending", n)
		if n == 1 {
			what = "1 alert delivery pending"
		}
		if pending.NextCursor != "" {
			what = fmt.Sprintf("%d or more alert deliveries pending", n)
		}
		out = append(out, concern{Level: levelAmber, Tag: "Alerts not delivered",
			What: what + " (the webhook has not taken them yet)",
			Link: h.link(map[string][]string{"status": {"PENDING"}}, "alerts"), LinkTo: "Pending alerts"})
	}
	for _, status := range []string{store.JobRunning, store.JobPending} {
		jobs, _, err := h.rt.Store().ListJobs(ctx, store.JobFilter{Status: status}, "", pageRows)
		if err != nil {
			return nil, false, err
		}
		for _, j := range jobs {
			if now.Sub(j.UpdatedAt) < stuckAfter {
				continue
			}
			out = append(out, concern{Level: levelAmber, Tag: "Job stuck", UserID: j.UserID,
				What: fmt.Sprintf("job %s (%s / %s) %s with no report for %s", j.ID, j.ServiceID, j.EndpointID, jobStateWords(j.Status), ago(now.Sub(j.UpdatedAt))),
				Link: h.link(nil, "jobs", j.ID), LinkTo: "Open the job"})
		}
	}
	failing, err := h.failingBackends(ctx, now)
	if err != nil {
		return nil, false, err
	}
	out = append(out, failing...)
	rank := map[string]int{levelRed: 0, levelAmber: 1}
	slices.SortStableFunc(out, func(a, b concern) int { return cmp.Compare(rank[a.Level], rank[b.Level]) })
	if len(out) > maxAttention {
		out, partial = out[:maxAttention], true
	}
	return out, partial, nil
}

// ago says a duration to the minute, as a person reads it: "1 h 5 min".
func ago(d time.Duration) string {
	d = d.Truncate(time.Minute)
	h, m := int(d.Hours()), int(d.Minutes())%60
	switch {
	case h == 0:
		return fmt.Sprintf("%d min", m)
	case m == 0:
		return fmt.Sprintf("%d h", h)
	}
	return fmt.Sprintf("%d h %d min", h, m)
}
