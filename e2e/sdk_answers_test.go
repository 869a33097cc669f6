package e2e

import (
	"context"
	"errors"
	"testing"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/sdk"
)

// TestSDKReadsOverdrawnAnswers: the SDK, against the real gateway, reads
// the answers whose figures go below zero. Every insufficient_credits
// estimate describes the balance after its units, below zero, and a
// report may overdraw a prepaid balance: the SDK's decoder refused
// negative amounts, so EstimateUsage returned an error instead of an
// Estimate that does not allow, and ReportUsage an "unreadable body"
// error for usage that was recorded (a caller retrying under a new key
// would be charged twice). The gateway's own check that a reused
// Idempotency-Key names the same report read the stored answer the same
// way, failed, and took another report for the first: answered as a
// replay, never counted.
func TestSDKReadsOverdrawnAnswers(t *testing.T) {
	be := newTestBackend(t, coreSecret, "Platform")
	g := startGateway(t, t.TempDir(), coreCatalog(be.URL))
	ctx := context.Background()
	key, _ := g.newKey("u-pre")
	g.subscribe("u-pre", "pre", "prepaid", "ACTIVE")
	g.credits("u-pre", "pre", "5")
	c, err := sdk.NewClient(gwBase, "pre", coreSecret, sdk.WithRetry(sdk.RetryPolicy{MaxAttempts: 1}))
	if err != nil {
		t.Fatal(err)
	}

	est, err := c.EstimateUsage(ctx, key, sdk.WholeUnits(3))
	if err != nil {
		t.Fatalf("an insufficient_credits estimate: %v, want an Estimate that does not allow", err)
	}
	if est.WouldAllow || est.SufficientCredits || est.Status != 403 || est.Code != "insufficient_credits" ||
		est.Breakdown.RemainingCredits == nil || *est.Breakdown.RemainingCredits >= 0 {
		t.Errorf("estimate %+v (remaining %v): want refused for credits, remainingCredits below zero", est, est.Breakdown.RemainingCredits)
	}

	before := len(g.ledger("u-pre"))
	res, err := c.ReportUsage(ctx, sdk.Report{UserID: "u-pre", UnitsUsed: sdk.WholeUnits(5), IdempotencyKey: "overdraw-1"})
	if err != nil {
		t.Fatalf("a report that overdraws the balance: %v (ledger %d → %d rows)", err, before, len(g.ledger("u-pre")))
	}
	if res.Breakdown.RemainingCredits == nil || *res.Breakdown.RemainingCredits != -billing.Whole(5) || !res.Breakdown.IsOverLimit {
		t.Errorf("report answer %+v: want remainingCredits -5, over the limit", res.Breakdown)
	}

	// The same key for another report: refused, nothing recorded.
	_, err = c.ReportUsage(ctx, sdk.Report{UserID: "u-pre", UnitsUsed: sdk.WholeUnits(1), IdempotencyKey: "overdraw-1"})
	var ae *sdk.APIError
	if !errors.As(err, &ae) || ae.Status != 400 || ae.Field != "Idempotency-Key" {
		t.Errorf("the key reused for another report: %v, want 400 invalid_request on Idempotency-Key", err)
	}
	// A true retry is the first answer again.
	again, err := c.ReportUsage(ctx, sdk.Report{UserID: "u-pre", UnitsUsed: sdk.WholeUnits(5), IdempotencyKey: "overdraw-1"})
	if err != nil || !again.Replayed {
		t.Errorf("a retry of the overdrawing report: %+v %v, want its first answer replayed", again, err)
	}
	if n := len(g.ledger("u-pre")); n != before+1 {
		t.Errorf("%d ledger rows after one report, a refused reuse and a retry; want %d", n, before+1)
	}
}
