// Package storetest is the contract every store.Store implementation
// keeps: the promises of the store package's doc comments, as tests. An
// implementation runs it from its own test file:
//
//	func TestContract(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) store.Store { return openTemp(t) },
//			storetest.Reopen(reopen), storetest.Sync(sync))
//	}
//
// Each case opens a fresh, empty store. The times a case stores are given
// explicitly (T0 is "now"), never read from the clock. A case an
// implementation cannot keep yet is named with Known, with the reason,
// until it is fixed.
package storetest

import (
	"context"
	"crypto/sha256"
	"os"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// T0 is the suite's "now": times are passed explicitly, never waited for.
var T0 = time.Date(2024, 3, 20, 12, 0, 0, 0, time.UTC)

var ctx = context.Background()

// Option adds what an implementation can do beyond opening an empty store.
type Option func(*suite)

// Reopen gives the suite a restart: fn closes s (as a process that exits
// with nothing in flight, which for the holds of sync calls is the same as
// kill -9) and opens the same data again. Without it the durability cases
// are skipped.
func Reopen(fn func(t *testing.T, s store.Store) store.Store) Option {
	return func(c *suite) { c.reopen = fn }
}

// Sync gives the suite a barrier: fn returns once every write that returned
// before it is visible to State. Reserve may return before its hold is
// durable (store.Meter), so without a barrier a State read right after it
// may not show the hold yet. Without it the suite assumes reads see every
// returned write at once.
func Sync(fn func(t *testing.T, s store.Store)) Option {
	return func(c *suite) { c.sync = fn }
}

// Known skips cases an implementation is known to fail, each with the
// reason, so the rest guards it meanwhile; STORETEST_ALL=1 runs them
// anyway. The names are those of Run's subtests ("ReserveSettle").
func Known(cases map[string]string) Option {
	return func(c *suite) { c.known = cases }
}

type suite struct {
	known  map[string]string
	open   func(t *testing.T) store.Store
	reopen func(t *testing.T, s store.Store) store.Store
	sync   func(t *testing.T, s store.Store)
}

// Run runs every contract case against stores from open, which must return
// a new, empty store and may register its own cleanup (the suite closes
// the store when a case ends too; a second Close must be harmless).
func Run(t *testing.T, open func(t *testing.T) store.Store, opts ...Option) {
	c := &suite{open: open}
	for _, o := range opts {
		o(c)
	}
	cases := []struct {
		name string
		fn   func(t *testing.T, c *suite)
	}{
		{"Keys", testKeys},
		{"KeyIDAnyCase", testKeyIDAnyCase},
		{"Subscriptions", testSubscriptions},
		{"RestartPeriods", testRestartPeriods},
		{"SubscriptionEnd", testSubscriptionEnd},
		{"PutSubscriptionIf", testPutSubscriptionIf},
		{"BlockedQuotaHeldSpend", testBlockedQuotaHeldSpend},
		{"NegativeBalance", testNegativeBalance},
		{"ReserveAsDecide", testReserveAsDecide},
		{"ReserveSettle", testReserveSettle},
		{"ReserveRefused", testReserveRefused},
		{"SettleAmongHolds", testSettleAmongHolds},
		{"Periods", testPeriods},
		{"NoSubscription", testNoSubscription},
		{"Free", testFree},
		{"Record", testRecord},
		{"NegativeUnits", testNegativeUnits},
		{"OveragePricedOnce", testOveragePricedOnce},
		{"CapAfterProductChange", testCapAfterProductChange},
		{"SpendPerCostUnit", testSpendPerCostUnit},
		{"JobSpendInItsUnit", testJobSpendInItsUnit},
		{"SpendUnitRoundTrip", testSpendUnitRoundTrip},
		{"CurrencyReload", testCurrencyReload},
		{"StoredExtremes", testStoredExtremes},
		{"HardLimitsUnderConcurrency", testHardLimitsUnderConcurrency},
		{"OverClaimsUnderConcurrency", testOverClaimsUnderConcurrency},
		{"OverClaimOnTheLimit", testOverClaimOnTheLimit},
		{"HoldKeptPastOutsideCharges", testHoldKeptPastOutsideCharges},
		{"CountersEqualLedger", testCountersEqualLedger},
		{"RecordIdempotent", testRecordIdempotent},
		{"PruneIdempotency", testPruneIdempotency},
		{"ScanLedger", testScanLedger},
		{"Rollups", testRollups},
		{"RollupsSaturate", testRollupsSaturate},
		{"SaturatedCountersRefuse", testSaturatedCountersRefuse},
		{"PruneLedger", testPruneLedger},
		{"PruneLedgerAudited", testPruneLedgerAudited},
		{"PruneRollups", testPruneRollups},
		{"PruneBadCutoff", testPruneBadCutoff},
		{"Outcomes", testOutcomes},
		{"OutcomesConcurrent", testOutcomesConcurrent},
		{"PruneOutcomes", testPruneOutcomes},
		{"Jobs", testJobs},
		{"CompleteJobChargesOnce", testCompleteJobChargesOnce},
		{"CompleteJobWithoutSubscription", testCompleteJobWithoutSubscription},
		{"ExpireJobs", testExpireJobs},
		{"ExpireJobsBoundary", testExpireJobsBoundary},
		{"CreateJobReserved", testCreateJobReserved},
		{"CompleteJobSettlesHold", testCompleteJobSettlesHold},
		{"JobEndsReleaseHold", testJobEndsReleaseHold},
		{"CompleteJobNegativeUnits", testCompleteJobNegativeUnits},
		{"JobHoldProductChanged", testJobHoldProductChanged},
		{"JobWithoutTermsCharged", testJobWithoutTermsCharged},
		{"JobTermsPriceChanged", testJobTermsPriceChanged},
		{"JobTermsKept", testJobTermsKept},
		{"JobTermsProductRemoved", testJobTermsProductRemoved},
		{"JobHoldPeriod", testJobHoldPeriod},
		{"CreateJobReservedConcurrent", testCreateJobReservedConcurrent},
		{"JobCompletionBesideSyncHold", testJobCompletionBesideSyncHold},
		{"PutSubscriptionShowsHolds", testPutSubscriptionShowsHolds},
		{"ListSubscriptions", testListSubscriptions},
		{"ListJobs", testListJobs},
		{"AlertFiresOnce", testAlertFiresOnce},
		{"AlertOverdrawn", testAlertOverdrawn},
		{"AlertDeliveryStates", testAlertDeliveryStates},
		{"AlertClaim", testAlertClaim},
		{"ListAlerts", testListAlerts},
		{"ChangedAccounts", testChangedAccounts},
		{"ChangedAccountsWithoutCalls", testChangedAccountsWithoutCalls},
		{"ChangedAccountsRequeued", testChangedAccountsRequeued},
		{"OddTextQueries", testOddTextQueries},
		{"Audit", testAudit},
		{"AuditWithChange", testAuditWithChange},
		{"PaymentRecords", testPaymentRecords},
		{"PaymentRecordsConcurrent", testPaymentRecordsConcurrent},
		{"SwapPaymentRecord", testSwapPaymentRecord},
		{"SwapPaymentRecordConcurrent", testSwapPaymentRecordConcurrent},
		{"Leases", testLeases},
		{"CreditGrants", testCreditGrants},
		{"CreditGrantsConcurrent", testCreditGrantsConcurrent},
		{"CreditGrantsBalanceRange", testCreditGrantsBalanceRange},
		{"ExpireCredits", testExpireCredits},
		{"ExpireCreditsHeld", testExpireCreditsHeld},
		{"ExpireCreditsHeldCalls", testExpireCreditsHeldCalls},
		{"ExpireCreditsHeldRefund", testExpireCreditsHeldRefund},
		{"ExpireCreditsHeldRefundConcurrent", testExpireCreditsHeldRefundConcurrent},
		{"ExpireCreditsHeldOrder", testExpireCreditsHeldOrder},
		{"ExpireCreditsSaturated", testExpireCreditsSaturated},
		{"Close", testClose},
		{"DurableAcrossReopen", testDurableAcrossReopen},
		{"RestartReleasesSyncHolds", testRestartReleasesSyncHolds},
		{"JobHoldSurvivesRestart", testJobHoldSurvivesRestart},
		{"JobTermsSurviveRestart", testJobTermsSurviveRestart},
	}
	names := map[string]bool{}
	for _, tc := range cases {
		names[tc.name] = true
	}
	for name := range c.known {
		if !names[name] {
			t.Errorf("Known names %q, which is not a case of the suite", name)
		}
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if why, ok := c.known[tc.name]; ok && os.Getenv("STORETEST_ALL") != "1" {
				t.Skipf("known to fail (STORETEST_ALL=1 runs it): %s", why)
			}
			tc.fn(t, c)
		})
	}
}

// store opens a fresh store and closes it when the test ends.
func (c *suite) store(t *testing.T) store.Store {
	t.Helper()
	s := c.open(t)
	t.Cleanup(func() { s.Close() })
	return s
}

// restart closes s and opens the same data again, skipping the test when
// the implementation gave no Reopen.
func (c *suite) restart(t *testing.T, s store.Store) store.Store {
	t.Helper()
	if c.reopen == nil {
		t.Skip("no Reopen option: the implementation cannot be restarted in a test")
	}
	s = c.reopen(t, s)
	t.Cleanup(func() { s.Close() })
	return s
}

func (c *suite) needRestart(t *testing.T) {
	if c.reopen == nil {
		t.Skip("no Reopen option: the implementation cannot be restarted in a test")
	}
}

// state reads the state once every write returned before has landed.
func (c *suite) state(t *testing.T, s store.Store, a store.Account, now time.Time) billing.State {
	t.Helper()
	if c.sync != nil {
		c.sync(t, s)
	}
	st, err := s.State(ctx, a, now)
	if err != nil {
		t.Fatalf("State(%s/%s): %v", a.UserID, a.ServiceID, err)
	}
	return st
}

func ptr(u billing.Units) *billing.Units { return &u }

var whole = billing.Whole

// Products of every billing model.
var (
	quotaBlock = billing.Product{ID: "quota-block", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest,
		Quota: ptr(whole(10))}
	quotaAllow = billing.Product{ID: "quota-allow", BillingModel: billing.Subscription, MeasurementType: billing.PerToken,
		Quota: ptr(whole(10)), Overage: "allow", Price: 500_000, SpendingCap: ptr(whole(10))}
	unlimited = billing.Product{ID: "unlimited", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest}
	prepaid   = billing.Product{ID: "prepaid", BillingModel: billing.Prepaid, MeasurementType: billing.PerToken,
		Price: 250_000}
	postpaid = billing.Product{ID: "postpaid", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerByte,
		Price: 10_000, SpendingCap: ptr(whole(5))}
	instant = billing.Product{ID: "instant", BillingModel: billing.UsageInstant, MeasurementType: billing.PerTimeUnit,
		Price: whole(2)}
	// prepaidWhole costs a whole credit a unit, so what fits a balance is
	// exact.
	prepaidWhole = billing.Product{ID: "prepaid-whole", BillingModel: billing.Prepaid, MeasurementType: billing.PerToken,
		Price: whole(1)}
)

// subscribe gives user a subscription to service under p, started an hour
// before T0, with the given prepaid credits, and returns the account.
func subscribe(t testing.TB, s store.Store, user, service string, p billing.Product, credits billing.Units) store.Account {
	t.Helper()
	_, err := s.PutSubscription(ctx, store.Subscription{
		UserID: user, ServiceID: service, ProductID: p.ID, Status: "ACTIVE", UpdatedAt: T0.Add(-time.Hour),
	})
	if err != nil {
		t.Fatalf("PutSubscription: %v", err)
	}
	if credits != 0 {
		if _, err := s.AddCredits(ctx, user, service, credits, T0); err != nil {
			t.Fatalf("AddCredits: %v", err)
		}
	}
	return store.Account{UserID: user, ServiceID: service, Product: p}
}

// Ledger returns every ledger entry matching f (a helper for the stores'
// own tests too).
func Ledger(t testing.TB, s store.Store, f store.LedgerFilter) []store.LedgerEntry {
	t.Helper()
	var out []store.LedgerEntry
	if err := s.ScanLedger(ctx, f, func(e store.LedgerEntry) error {
		out = append(out, e)
		return nil
	}); err != nil {
		t.Fatalf("ScanLedger: %v", err)
	}
	return out
}

// SumUnits adds up the units and the cost of entries.
func SumUnits(entries []store.LedgerEntry) (units, cost billing.Units) {
	for _, e := range entries {
		units += e.Units
		cost += e.Cost
	}
	return units, cost
}

// EntryFor is a usage report's ledger entry of units for a, at at.
func EntryFor(a store.Account, units billing.Units, at time.Time) store.LedgerEntry {
	return store.LedgerEntry{
		Time: at, UserID: a.UserID, ServiceID: a.ServiceID, ProductID: a.Product.ID,
		Units: units, Source: store.SourceReport,
	}
}

// OKResponse is a Record response that names the entry it answers.
func OKResponse(e store.LedgerEntry, st billing.State) ([]byte, error) {
	return []byte(`{"id":"` + e.ID + `","used":"` + st.Used.String() + `"}`), nil
}

// KeyHash is a service key's hash as the stores keep it.
func KeyHash(key string) [32]byte { return sha256.Sum256([]byte(key)) }
