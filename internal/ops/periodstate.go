package ops

import (
	"context"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/subscription"
)

// PeriodState is Summarize without the count of calls cut at a limit
// (Summarize adds it to what PeriodState reads):
// the period, the units used and held, the quota and the spending cap
// with what is left, the credits. It is one read of the store's billing
// state, where Summarize also scans the period's hourly rollups, so a
// page that checks every subscription's limits (the console's overview)
// reads one figure per subscription and not a month of sums.
func (o *Ops) PeriodState(ctx context.Context, sub store.Subscription, at time.Time) (PeriodSummary, error) {
	ps := PeriodSummary{
		ServiceID: sub.ServiceID, ProductID: sub.ProductID, Status: string(subscription.EffectiveStatus(sub, at)), EndsAt: sub.EndsAt,
		Credits: sub.Credits, CreditsHeld: sub.CreditsHeld,
	}
	svc, ok := o.rt.Catalog.Service(sub.ServiceID)
	if !ok {
		ps.ProductMissing = true
		return ps, nil
	}
	p, ok := svc.Product(sub.ProductID)
	if !ok {
		ps.ProductMissing = true
		return ps, nil
	}
	ps.BillingModel, ps.MeasurementType, ps.UnitLabel = p.BillingModel, p.MeasurementType, p.UnitLabel
	ps.CostUnit = p.CostUnit()
	ps.PeriodStart, ps.PeriodEnd = billing.PeriodBounds(p.Period, p.CalendarPeriods, sub.StartedAt, at)
	st, err := o.rt.Store().State(ctx, store.Account{UserID: sub.UserID, ServiceID: sub.ServiceID, Product: *p}, at)
	if err != nil {
		return ps, err
	}
	ps.UnitsUsed, ps.UnitsHeld = st.Used, st.Reserved
	ps.Spend, ps.SpendHeld = st.Spend, st.ReservedSpend
	ps.Credits, ps.CreditsHeld = st.Credits, st.CreditsHeld
	if p.Quota != nil {
		q := *p.Quota
		left := st.QuotaLeft(q)
		over := max(0, st.Used-q)
		ps.Quota, ps.UnitsRemaining, ps.OverageUnits = &q, &left, &over
	}
	if p.SpendingCap != nil {
		c := *p.SpendingCap
		left := st.SpendingCapLeft(c)
		ps.SpendingCap, ps.SpendRemaining = &c, &left
	}
	return ps, nil
}
