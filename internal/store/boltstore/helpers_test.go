package boltstore

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/storetest"
)

// t0 is the tests' "now": times are passed explicitly, never waited for.
var t0 = time.Date(2024, 3, 20, 12, 0, 0, 0, time.UTC)

var ctx = context.Background()

func ptr(u billing.Units) *billing.Units { return &u }

var whole = billing.Whole

// Products of every billing model, shared by the metering tests.
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
)

func storePath(t testing.TB) string { return filepath.Join(t.TempDir(), "platform.db") }

// openAt opens the store at path and closes it when the test ends (a second
// Close is harmless).
func openAt(t testing.TB, path string) *Store {
	t.Helper()
	s, err := Open(path)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func openTemp(t testing.TB) *Store { return openAt(t, storePath(t)) }

// subscribe gives user a subscription to service under p, started at t0,
// with the given prepaid credits, and returns the account to meter.
func subscribe(t testing.TB, s *Store, user, service string, p billing.Product, credits billing.Units) store.Account {
	t.Helper()
	_, err := s.PutSubscription(ctx, store.Subscription{
		UserID: user, ServiceID: service, ProductID: p.ID, Status: "ACTIVE", UpdatedAt: t0.Add(-time.Hour),
	})
	if err != nil {
		t.Fatalf("PutSubscription: %v", err)
	}
	if credits != 0 {
		if _, err := s.AddCredits(ctx, user, service, credits, t0); err != nil {
			t.Fatalf("AddCredits: %v", err)
		}
	}
	return store.Account{UserID: user, ServiceID: service, Product: p}
}

// stateOf reads the state (in memory, where it is decided).
func stateOf(t testing.TB, s *Store, a store.Account, now time.Time) billing.State {
	t.Helper()
	st, err := s.State(ctx, a, now)
	if err != nil {
		t.Fatalf("State: %v", err)
	}
	return st
}

// The contract suite's helpers, shared by this package's own tests.
var (
	sumUnits   = storetest.SumUnits
	entryFor   = storetest.EntryFor
	okResponse = storetest.OKResponse
	keyHash    = storetest.KeyHash
)

// ledger returns every ledger entry matching f.
func ledger(t testing.TB, s *Store, f store.LedgerFilter) []store.LedgerEntry {
	t.Helper()
	return storetest.Ledger(t, s, f)
}

func newJob(id string, expires time.Time) store.Job {
	return store.Job{ID: id, UserID: "u1", KeyID: "key_1", ServiceID: "svc", EndpointID: "ep", ProductID: quotaAllow.ID,
		Status: store.JobPending, CreatedAt: t0, UpdatedAt: t0, ExpiresAt: expires}
}

// errOtherCompletion is how complete refuses a job that finished with
// another completion (the store returns fn's error as is).
var errOtherCompletion = errors.New("the job finished with another completion")

func complete(status string, digest string) func(*store.Job) error {
	return func(j *store.Job) error {
		if j.Terminal() {
			if j.CompletionDigest == digest {
				return nil // the same completion again: nothing changes
			}
			return errOtherCompletion
		}
		j.Status, j.CompletionDigest, j.Result = status, digest, "done"
		j.UpdatedAt, j.CompletedAt = t0.Add(time.Minute), t0.Add(time.Minute)
		return nil
	}
}
