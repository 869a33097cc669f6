package store

import (
	"cmp"
	"context"
	"slices"
	"time"
)

// ScanUsage calls fn with the hourly sums of the ledger rows f selects
// (From <= Time < To, user, service), in hour order and within an hour in
// (user, service, endpoint, product) order: what the console's charts and
// totals and the portal's charts read. The whole hours come from the
// store's hourly rollups (RollupReader), so a month's summary reads a few
// hundred rollups instead of millions of rows; the partial hours at the
// edges of a range that does not start or end on the hour, and everything
// for a store without rollups, are summed from the raw rows. The figures
// are the raw rows' either way, as long as the rows are kept: after a
// prune (LedgerPruner) the whole hours still count, the partial edge
// hours only what is left of them.
func ScanUsage(ctx context.Context, s Store, f LedgerFilter, fn func(Rollup) error) error {
	rr, ok := s.(RollupReader)
	if !ok {
		return SumLedger(ctx, s, f, fn)
	}
	lo, hi := f.From, f.To
	if !lo.IsZero() {
		if t := lo.Truncate(time.Hour); t.Before(lo) {
			lo = t.Add(time.Hour)
		}
	}
	if !hi.IsZero() {
		hi = hi.Truncate(time.Hour)
	}
	if !f.From.IsZero() && !f.To.IsZero() && !lo.Before(hi) {
		return SumLedger(ctx, s, f, fn) // no whole hour inside
	}
	if lo.After(f.From) {
		if err := SumLedger(ctx, s, LedgerFilter{UserID: f.UserID, ServiceID: f.ServiceID, From: f.From, To: lo}, fn); err != nil {
			return err
		}
	}
	if err := rr.ScanRollups(ctx, RollupFilter{UserID: f.UserID, ServiceID: f.ServiceID, From: lo, To: hi}, fn); err != nil {
		return err
	}
	if hi.Before(f.To) {
		return SumLedger(ctx, s, LedgerFilter{UserID: f.UserID, ServiceID: f.ServiceID, From: hi, To: f.To}, fn)
	}
	return nil
}

// SumLedger sums the raw ledger rows f selects into hourly rollups, as a
// store's RollupReader keeps them, and calls fn with them in ScanRollups'
// order: ScanUsage's edges, and its answer for a store without rollups.
func SumLedger(ctx context.Context, s Store, f LedgerFilter, fn func(Rollup) error) error {
	type key struct{ user, service, endpoint, product string }
	var hour time.Time
	sums := map[key]*Rollup{}
	flush := func() error {
		out := make([]*Rollup, 0, len(sums))
		for _, r := range sums {
			out = append(out, r)
		}
		slices.SortFunc(out, func(a, b *Rollup) int {
			return cmp.Or(cmp.Compare(a.UserID, b.UserID), cmp.Compare(a.ServiceID, b.ServiceID),
				cmp.Compare(a.EndpointID, b.EndpointID), cmp.Compare(a.ProductID, b.ProductID))
		})
		clear(sums)
		for _, r := range out {
			if err := fn(*r); err != nil {
				return err
			}
		}
		return nil
	}
	err := s.ScanLedger(ctx, f, func(e LedgerEntry) error {
		h := e.Time.UTC().Truncate(time.Hour)
		if !h.Equal(hour) {
			if err := flush(); err != nil {
				return err
			}
			hour = h
		}
		k := key{e.UserID, e.ServiceID, e.EndpointID, e.ProductID}
		r := sums[k]
		if r == nil {
			r = &Rollup{UserID: e.UserID, ServiceID: e.ServiceID, EndpointID: e.EndpointID, ProductID: e.ProductID, Hour: h}
			sums[k] = r
		}
		r.Calls++
		r.Units += e.Units
		r.Overage += e.Overage
		r.Cost += e.Cost
		if e.UnitsClaimed != 0 {
			r.Capped++
		}
		return nil
	})
	if err != nil {
		return err
	}
	return flush()
}
