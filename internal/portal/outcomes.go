package portal

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/store"
)

// What became of a caller's calls: charged, cut at a limit, failed at the
// service, or refused (and why). The section "What became of your calls"
// and the banner's "slow down" read it through outcomesSource: over the
// call outcome rollups (store.Outcomes) where the store keeps them, which
// count refused calls too; otherwise the ledger's fallback
// (ledgerOutcomes), which counts charged calls and calls cut at a hard
// limit, and says refused calls are not recorded.

// Outcome codes besides the refusals' error codes (apierror's
// quota_exceeded, rate_limited, …).
const (
	outcomeCharged = "charged"
	outcomeCut     = "cut_at_limit"
)

// outcomeCount is how many of a user's calls to one endpoint ended with
// one outcome in one hour.
type outcomeCount struct {
	Hour       time.Time
	ServiceID  string
	EndpointID string
	// Outcome is outcomeCharged, outcomeCut, or the error code the
	// gateway answered a refused call with (apierror's codes).
	Outcome string
	Calls   int64
}

// outcomesSource counts a user's call outcomes per hour, service,
// endpoint and outcome.
type outcomesSource interface {
	// CallOutcomes returns userID's counts with from <= Hour < to, only
	// ever that user's.
	CallOutcomes(ctx context.Context, userID string, from, to time.Time) ([]outcomeCount, error)
	// RecordsRefusals says whether refused calls are among the counts; a
	// source that cannot see them makes the page say so.
	RecordsRefusals() bool
}

// outcomeFlusher is what adds this node's counted outcomes to the store
// before a read (*ops.Ops has it), so a caller sees a call refused a
// second ago and not only those of the last flush.
type outcomeFlusher interface {
	FlushOutcomes(ctx context.Context)
}

// outcomesFor is the source a dashboard reads, given the store, the
// portal's operations and the caller's hourly ledger sums the dashboard
// already read (since from): the outcome rollups when st keeps them, the
// ledger's fallback otherwise.
var outcomesFor = func(st store.Store, o Operations, ledger []store.Rollup) outcomesSource {
	rollups, ok := st.(store.Outcomes)
	if !ok {
		return ledgerOutcomes(ledger)
	}
	src := rollupOutcomes{st: rollups, ledger: ledger}
	if f, ok := o.(outcomeFlusher); ok {
		src.flush = f.FlushOutcomes
	}
	return src
}

// rollupOutcomes reads the call outcome rollups: every call the gateway
// answered for the caller, refusals and failures included. A call the
// backend answered (1xx to 4xx) was charged; the ledger's hourly sums say
// how many of those a hard limit cut short.
type rollupOutcomes struct {
	st     store.Outcomes
	ledger []store.Rollup
	flush  func(context.Context)
}

func (rollupOutcomes) RecordsRefusals() bool { return true }

func (r rollupOutcomes) CallOutcomes(ctx context.Context, userID string, from, to time.Time) ([]outcomeCount, error) {
	if userID == "" {
		return nil, nil // an empty filter would select every user's
	}
	if r.flush != nil {
		r.flush(ctx)
	}
	type k struct {
		hour    time.Time
		svc, ep string
	}
	capped := map[k]int64{}
	for _, l := range r.ledger {
		if l.UserID == userID && l.Capped > 0 {
			capped[k{l.Hour, l.ServiceID, l.EndpointID}] += l.Capped
		}
	}
	var out []outcomeCount
	err := r.st.ScanOutcomes(ctx, store.OutcomeFilter{UserID: userID, From: from, To: to}, func(row store.OutcomeRow) error {
		if row.UserID != userID {
			return nil
		}
		c := outcomeCount{Hour: row.Hour, ServiceID: row.ServiceID, EndpointID: row.EndpointID, Outcome: row.Outcome, Calls: row.Calls}
		switch row.Outcome {
		case store.Outcome1xx, store.Outcome2xx, store.Outcome3xx, store.Outcome4xx:
			c.Outcome = outcomeCharged
			key := k{row.Hour, row.ServiceID, row.EndpointID}
			if n := min(capped[key], c.Calls); n > 0 {
				capped[key] -= n
				c.Calls -= n
				out = append(out, outcomeCount{Hour: row.Hour, ServiceID: row.ServiceID, EndpointID: row.EndpointID, Outcome: outcomeCut, Calls: n})
			}
		}
		if c.Calls > 0 {
			out = append(out, c)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("scan call outcomes of %s: %w", userID, err)
	}
	return out, nil
}

// ledgerOutcomes is the fallback source: the ledger's hourly sums, which
// know the calls that were charged and those a hard limit cut short,
// and nothing of refused calls (they leave no ledger row).
type ledgerOutcomes []store.Rollup

func (l ledgerOutcomes) RecordsRefusals() bool { return false }

func (l ledgerOutcomes) CallOutcomes(_ context.Context, userID string, from, to time.Time) ([]outcomeCount, error) {
	var out []outcomeCount
	for _, r := range l {
		if r.UserID != userID || r.Hour.Before(from) || !r.Hour.Before(to) {
			continue
		}
		if n := r.Calls - r.Capped; n > 0 {
			out = append(out, outcomeCount{Hour: r.Hour, ServiceID: r.ServiceID, EndpointID: r.EndpointID, Outcome: outcomeCharged, Calls: n})
		}
		if r.Capped > 0 {
			out = append(out, outcomeCount{Hour: r.Hour, ServiceID: r.ServiceID, EndpointID: r.EndpointID, Outcome: outcomeCut, Calls: r.Capped})
		}
	}
	return out, nil
}

// outcomeWords says an outcome in a caller's words.
func outcomeWords(code string) string {
	switch code {
	case outcomeCharged:
		return "Charged"
	case outcomeCut:
		return "Cut at a limit (charged in part)"
	case apierror.QuotaExceeded:
		return "Refused: quota used up or spending cap reached"
	case apierror.InsufficientCredits:
		return "Refused: not enough credits"
	case apierror.RateLimited:
		return "Refused: too fast (rate limit)"
	case apierror.SubscriptionInactive:
		return "Refused: subscription not active"
	case apierror.NoSubscription:
		return "Refused: no subscription"
	case apierror.KeyRevoked:
		return "Refused: key revoked"
	case apierror.KeyExpired:
		return "Refused: key expired"
	case apierror.InvalidKey, apierror.MissingKey:
		return "Refused: key missing or not valid"
	case apierror.ServiceError, apierror.ServiceTimeout, store.Outcome5xx:
		return "Failed at the service (not charged)"
	case store.OutcomeCutOff:
		return "Cut off before the answer ended"
	}
	return "Refused: " + strings.ReplaceAll(code, "_", " ")
}

// isRefusal says whether an outcome is the gateway refusing the call, not
// a call that was answered, failed at the service or was cut off.
func isRefusal(code string) bool {
	switch code {
	case outcomeCharged, outcomeCut, store.Outcome5xx, store.OutcomeCutOff, apierror.ServiceError, apierror.ServiceTimeout:
		return false
	}
	return true
}

// outcomeRow is one line of the outcomes table: an endpoint's calls with
// one outcome over the window.
type outcomeRow struct {
	ServiceID, EndpointID string
	Outcome               string
	Words                 string
	Calls                 int64
	Refused               bool
}

// outcomesView is the section's figures.
type outcomesView struct {
	Since           time.Time
	Rows            []outcomeRow
	RecordsRefusals bool
	// RateLimited are the services that refused a call of the caller's
	// for its rate in this hour or the one before.
	RateLimited map[string]bool
}

// summarizeOutcomes sums counts per endpoint and outcome, charged and
// cut before refused; a rate-limit refusal in this hour or the one
// before marks its service rate-limited (the banner's "slow down").
func summarizeOutcomes(counts []outcomeCount, since, now time.Time, recordsRefusals bool) outcomesView {
	v := outcomesView{Since: since, RecordsRefusals: recordsRefusals, RateLimited: map[string]bool{}}
	type k struct{ svc, ep, outcome string }
	sums := map[k]int64{}
	for _, c := range counts {
		sums[k{c.ServiceID, c.EndpointID, c.Outcome}] += c.Calls
		if c.Outcome == apierror.RateLimited && !c.Hour.Before(now.Add(-2*time.Hour)) {
			v.RateLimited[c.ServiceID] = true
		}
	}
	for g, n := range sums {
		refused := isRefusal(g.outcome)
		v.Rows = append(v.Rows, outcomeRow{ServiceID: g.svc, EndpointID: g.ep, Outcome: g.outcome,
			Words: outcomeWords(g.outcome), Calls: n, Refused: refused})
	}
	slices.SortFunc(v.Rows, func(a, b outcomeRow) int {
		if c := strings.Compare(a.ServiceID, b.ServiceID); c != 0 {
			return c
		}
		if c := strings.Compare(a.EndpointID, b.EndpointID); c != 0 {
			return c
		}
		if a.Refused != b.Refused {
			if a.Refused {
				return 1
			}
			return -1
		}
		return strings.Compare(a.Outcome, b.Outcome)
	})
	return v
}
