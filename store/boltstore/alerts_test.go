package boltstore

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/platformgw/gateway/store"
)

func newAlert(user, threshold string) store.Alert {
	return store.Alert{UserID: user, ServiceID: "svc", ProductID: "basic", PeriodStart: t0.Add(-24 * time.Hour),
		Threshold: threshold, Value: whole(8), Limit: whole(8), Created: t0}
}

// TestAlertFiresOnceAcrossRestartAndConcurrency: of many concurrent
// CreateAlert calls for one (subscription, period, threshold), one records
// it; after a restart it is still taken, and still pending.
func TestAlertFiresOnceAcrossRestartAndConcurrency(t *testing.T) {
	path := storePath(t)
	s := openAt(t, path)
	var wg sync.WaitGroup
	var mu sync.Mutex
	created, conflicts := 0, 0
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.CreateAlert(ctx, newAlert("u1", "quota 80%"))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				created++
			case errors.Is(err, store.ErrConflict):
				conflicts++
			default:
				t.Errorf("CreateAlert: %v", err)
			}
		}()
	}
	wg.Wait()
	if created != 1 || conflicts != 19 {
		t.Fatalf("created %d, conflicts %d; want 1 and 19", created, conflicts)
	}
	// Another threshold, period or user is another alert.
	for _, a := range []store.Alert{newAlert("u1", "quota 100%"), newAlert("u2", "quota 80%"),
		func() store.Alert { a := newAlert("u1", "quota 80%"); a.PeriodStart = t0; return a }()} {
		if _, err := s.CreateAlert(ctx, a); err != nil {
			t.Fatalf("CreateAlert %+v: %v", a, err)
		}
	}
	s.Close()

	s = openAt(t, path)
	if _, err := s.CreateAlert(ctx, newAlert("u1", "quota 80%")); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("after a restart CreateAlert: %v, want ErrConflict", err)
	}
	if ok, err := s.HasAlert(ctx, "u1", "svc", t0.Add(-24*time.Hour), "quota 80%"); err != nil || !ok {
		t.Fatalf("HasAlert = %v, %v", ok, err)
	}
	if ok, _ := s.HasAlert(ctx, "u1", "svc", t0.Add(-24*time.Hour), "quota 90%"); ok {
		t.Fatal("HasAlert true for a threshold never recorded")
	}
	due, err := s.DueAlerts(ctx, t0, 100)
	if err != nil || len(due) != 4 {
		t.Fatalf("DueAlerts = %d alerts, %v; want 4", len(due), err)
	}
	for _, a := range due {
		if a.Status != store.AlertPending || a.Attempts != 0 {
			t.Fatalf("restarted alert %+v: want pending with no attempts", a)
		}
	}
}

// TestAlertDeliveryStates: an attempt is recorded only by the sender that
// read the current attempts; a retry waits in the due index until its time;
// a delivered alert is never due again, across a restart too.
func TestAlertDeliveryStates(t *testing.T) {
	path := storePath(t)
	s := openAt(t, path)
	a, err := s.CreateAlert(ctx, newAlert("u1", "quota 80%"))
	if err != nil {
		t.Fatal(err)
	}
	if due, _ := s.DueAlerts(ctx, t0.Add(-time.Second), 10); len(due) != 0 {
		t.Fatalf("due before its time: %+v", due)
	}
	failed := a
	failed.Attempts, failed.LastError, failed.NextAttempt = 1, "503 Service Unavailable", t0.Add(time.Minute)
	if _, err := s.UpdateAlert(ctx, failed, 0); err != nil {
		t.Fatal(err)
	}
	// A second sender that read the alert before the first attempt.
	if _, err := s.UpdateAlert(ctx, failed, 0); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("stale UpdateAlert: %v, want ErrConflict", err)
	}
	if due, _ := s.DueAlerts(ctx, t0.Add(59*time.Second), 10); len(due) != 0 {
		t.Fatalf("due before its retry: %+v", due)
	}
	due, _ := s.DueAlerts(ctx, t0.Add(time.Minute), 10)
	if len(due) != 1 || due[0].Attempts != 1 || due[0].LastError != "503 Service Unavailable" {
		t.Fatalf("due at its retry: %+v", due)
	}
	done := due[0]
	done.Attempts, done.Status, done.LastError, done.DeliveredAt = 2, store.AlertDelivered, "", t0.Add(time.Minute)
	if _, err := s.UpdateAlert(ctx, done, 1); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = openAt(t, path)
	if due, _ := s.DueAlerts(ctx, t0.Add(48*time.Hour), 10); len(due) != 0 {
		t.Fatalf("a delivered alert is due again after a restart: %+v", due)
	}
	list, _, err := s.ListAlerts(ctx, store.AlertFilter{}, "", 10)
	if err != nil || len(list) != 1 || list[0].Status != store.AlertDelivered || list[0].Attempts != 2 ||
		!list[0].DeliveredAt.Equal(t0.Add(time.Minute)) || !list[0].NextAttempt.IsZero() {
		t.Fatalf("ListAlerts = %+v, %v", list, err)
	}
}

func TestListAlertsPagesNewestFirst(t *testing.T) {
	s := openTemp(t)
	for i := range 7 {
		user := "u1"
		if i%2 == 1 {
			user = "u2"
		}
		if _, err := s.CreateAlert(ctx, newAlert(user, fmt.Sprintf("quota %d%%", 10+i))); err != nil {
			t.Fatal(err)
		}
	}
	var ids []string
	cursor := ""
	for pages := 0; ; pages++ {
		page, next, err := s.ListAlerts(ctx, store.AlertFilter{UserID: "u1"}, cursor, 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range page {
			ids = append(ids, a.ID)
		}
		if next == "" {
			break
		}
		cursor = next
		if pages > 10 {
			t.Fatal("paging does not end")
		}
	}
	if fmt.Sprint(ids) != "[alt_7 alt_5 alt_3 alt_1]" {
		t.Fatalf("u1's alerts %v, want [alt_7 alt_5 alt_3 alt_1]", ids)
	}
	if _, _, err := s.ListAlerts(ctx, store.AlertFilter{}, "zz", 2); !errors.Is(err, store.ErrBadCursor) {
		t.Fatalf("bad cursor: %v", err)
	}
}

// TestChangedAccountsAfterCommit: a settled charge names its subscription
// once the commit is over, and only once.
func TestChangedAccountsAfterCommit(t *testing.T) {
	s := openTemp(t)
	refs, ready := s.ChangedAccounts() // turns the bookkeeping on
	if len(refs) != 0 {
		t.Fatalf("changes before any write: %v", refs)
	}
	a := subscribe(t, s, "u1", "svc", quotaBlock, 0)
	s.ChangedAccounts()
	r, d, _, err := s.Reserve(ctx, a, whole(1), t0)
	if err != nil || !d.Allowed {
		t.Fatalf("Reserve: %v %+v", err, d)
	}
	if _, err := s.Settle(ctx, r, whole(1), entryFor(a, whole(1), t0)); err != nil {
		t.Fatal(err)
	}
	// Settle returns once its commit is over, and published.
	select {
	case <-ready:
	default:
		t.Fatal("no signal after a committed charge")
	}
	refs, _ = s.ChangedAccounts()
	if len(refs) != 1 || refs[0] != (store.AccountRef{UserID: "u1", ServiceID: "svc"}) {
		t.Fatalf("changed %v, want u1/svc", refs)
	}
	if refs, _ := s.ChangedAccounts(); len(refs) != 0 {
		t.Fatalf("changed again without a write: %v", refs)
	}
}

// BenchmarkReserveSettleWithAlertFeed is BenchmarkReserveSettle with the
// usage alerts' change feed on and drained, as a gateway with alerts runs:
// compare the two for what the feed costs a call.
func BenchmarkReserveSettleWithAlertFeed(b *testing.B) {
	s := openTemp(b)
	const users = 64
	accounts := make([]store.Account, users)
	for i := range accounts {
		accounts[i] = subscribe(b, s, fmt.Sprintf("u%d", i), "svc", quotaAllow, 0)
		accounts[i].Product.SpendingCap = nil
	}
	stop := make(chan struct{})
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for {
			_, ready := s.ChangedAccounts()
			select {
			case <-stop:
				return
			case <-ready:
			}
		}
	}()
	defer func() { close(stop); <-drained }()
	var next atomic.Int64
	b.SetParallelism(32)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		a := accounts[next.Add(1)%users]
		for pb.Next() {
			res, dec, _, err := s.Reserve(ctx, a, whole(1), t0)
			if err != nil || !dec.Allowed {
				b.Errorf("Reserve: %+v, %v", dec, err)
				return
			}
			if _, err := s.Settle(ctx, res, whole(1), entryFor(a, 0, t0)); err != nil {
				b.Errorf("Settle: %v", err)
				return
			}
		}
	})
}
