package portal

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/store"
)

// What became of a caller's calls: charged, cut at a limit, or refused
// (and why). The section "What became of your calls" and the banner's
// "slow down" read it through outcomesSource, so the per-call outcome
// rollups plug in by giving one: until then the ledger's fallback
// (ledgerOutcomes) counts what the ledger records, charged calls and
// calls cut at a hard limit, and says refused calls are not recorded.

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

// outcomesFor is the source a dashboard reads, given the store and the
// caller's hourly ledger sums the dashboard already read (since from).
// To wire the outcome rollups, return a source over them here when st
// keeps them.
var outcomesFor = func(st store.Store, ledger []store.Rollup) outcomesSource {
	return ledgerOutcomes(ledger)
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
	case apierror.ServiceError, apierror.ServiceTimeout:
		return "Failed at the service (not charged)"
	}
	return "Refused: " + strings.ReplaceAll(code, "_", " ")
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
	for key, n := range sums {
		refused := key.outcome != outcomeCharged && key.outcome != outcomeCut
		v.Rows = append(v.Rows, outcomeRow{ServiceID: key.svc, EndpointID: key.ep, Outcome: key.outcome,
			Words: outcomeWords(key.outcome), Calls: n, Refused: refused})
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
