package storetest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// testListSubscriptions: subscriptions page by (user, service), one user's
// pages stay within that user (a prefix "al" must not list "alice"), and a
// cursor of another listing or a malformed one is ErrBadCursor.
func testListSubscriptions(t *testing.T, c *suite) {
	s := c.store(t)
	for _, u := range []string{"al", "alice", "bob"} {
		for _, svc := range []string{"a", "b", "c"} {
			subscribe(t, s, u, svc, unlimited, 0)
		}
	}
	list := func(user string, limit int) []string {
		var got []string
		cursor := ""
		for range 100 {
			subs, next, err := s.ListSubscriptions(ctx, user, cursor, limit)
			if err != nil {
				t.Fatal(err)
			}
			if len(subs) > limit {
				t.Fatalf("a page of %d, limit %d", len(subs), limit)
			}
			for _, sub := range subs {
				got = append(got, sub.UserID+"/"+sub.ServiceID)
			}
			if next == "" {
				return got
			}
			cursor = next
		}
		t.Fatal("endless listing")
		return nil
	}
	if got := fmt.Sprint(list("al", 2)); got != "[al/a al/b al/c]" {
		t.Errorf("al's subscriptions: %s", got)
	}
	if got := list("", 4); len(got) != 9 || got[0] != "al/a" || got[8] != "bob/c" || !slices.IsSorted(got) {
		t.Errorf("all subscriptions: %v", got)
	}
	if got := list("nobody", 5); len(got) != 0 {
		t.Errorf("nobody's: %v", got)
	}
	_, next, err := s.ListSubscriptions(ctx, "bob", "", 1)
	if err != nil || next == "" {
		t.Fatalf("bob's first page: next %q, %v", next, err)
	}
	if _, _, err := s.ListSubscriptions(ctx, "alice", next, 1); !errors.Is(err, store.ErrBadCursor) {
		t.Errorf("bob's cursor on alice's listing: %v", err)
	}
	if _, _, err := s.ListSubscriptions(ctx, "", "!!", 1); !errors.Is(err, store.ErrBadCursor) {
		t.Errorf("a malformed cursor: %v", err)
	}
}

// testListJobs: jobs page in id order through the filter; following the
// cursors finds every match once.
func testListJobs(t *testing.T, c *suite) {
	s := c.store(t)
	for i := range 40 {
		j := newJob(fmt.Sprintf("j%02d", i), T0.Add(24*time.Hour))
		if i%10 == 3 {
			j.UserID = "rare"
		}
		if i%4 == 0 {
			j.ServiceID = "svc2"
		}
		if err := s.CreateJob(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.UpdateJob(ctx, "j05", func(j *store.Job) error { j.Status = store.JobRunning; return nil }); err != nil {
		t.Fatal(err)
	}
	list := func(f store.JobFilter, limit int) []string {
		var found []string
		cursor := ""
		for range 100 {
			jobs, next, err := s.ListJobs(ctx, f, cursor, limit)
			if err != nil {
				t.Fatal(err)
			}
			if len(jobs) > limit {
				t.Fatalf("a page of %d, limit %d", len(jobs), limit)
			}
			for _, j := range jobs {
				if !f.Matches(j) {
					t.Errorf("job %+v does not match %+v", j, f)
				}
				found = append(found, j.ID)
			}
			if next == "" {
				return found
			}
			cursor = next
		}
		t.Fatal("endless listing")
		return nil
	}
	if got := fmt.Sprint(list(store.JobFilter{UserID: "rare"}, 3)); got != "[j03 j13 j23 j33]" {
		t.Errorf("rare's jobs: %s", got)
	}
	if got := list(store.JobFilter{}, 7); len(got) != 40 || !slices.IsSorted(got) || got[0] != "j00" {
		t.Errorf("all jobs: %v", got)
	}
	if got := list(store.JobFilter{ServiceID: "svc2", UserID: "u1"}, 100); len(got) != 10 {
		t.Errorf("svc2's jobs: %v", got)
	}
	if got := fmt.Sprint(list(store.JobFilter{Status: store.JobRunning}, 2)); got != "[j05]" {
		t.Errorf("running jobs: %s", got)
	}
	if jobs, next, err := s.ListJobs(ctx, store.JobFilter{Status: store.JobPending}, "", 5); err != nil || len(jobs) != 5 || next == "" {
		t.Errorf("first page of 5: %d jobs, next %q, %v", len(jobs), next, err)
	}
	// Filters come from the console's query string and may be any bytes:
	// one that is not UTF-8 or holds NUL matches nothing, on every store.
	for _, f := range []store.JobFilter{{UserID: "u\xff"}, {ServiceID: "s\x00"}, {Status: "\xff"}} {
		if jobs, next, err := s.ListJobs(ctx, f, "", 5); err != nil || len(jobs) != 0 || next != "" {
			t.Errorf("ListJobs(%+v) = %d jobs, next %q, %v; want none", f, len(jobs), next, err)
		}
	}
	// A cursor that decodes to such bytes (a forged one) is refused as a
	// bad cursor or lists what follows, never a store error.
	if _, _, err := s.ListJobs(ctx, store.JobFilter{}, store.EncodeCursor([]byte("j\xff")), 5); err != nil && !errors.Is(err, store.ErrBadCursor) {
		t.Errorf("ListJobs(cursor j\\xff) = %v", err)
	}
}

func newAlert(user, threshold string) store.Alert {
	return store.Alert{UserID: user, ServiceID: "svc", ProductID: "basic", PeriodStart: T0.Add(-24 * time.Hour),
		Threshold: threshold, Value: whole(8), Limit: whole(8), Created: T0}
}

// testAlertFiresOnce: of many concurrent CreateAlert calls for one
// (subscription, period, threshold), one records it; another threshold,
// period or user is another alert.
func testAlertFiresOnce(t *testing.T, c *suite) {
	s := c.store(t)
	var (
		wg                 sync.WaitGroup
		mu                 sync.Mutex
		created, conflicts int
	)
	for range 20 {
		wg.Go(func() {
			_, err := s.CreateAlert(ctx, newAlert("u1", "quota 80%"))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				created++
			case errors.Is(err, store.ErrExists):
				conflicts++
			default:
				t.Errorf("CreateAlert: %v", err)
			}
		})
	}
	wg.Wait()
	if created != 1 || conflicts != 19 {
		t.Fatalf("created %d, conflicts %d; want 1 and 19", created, conflicts)
	}
	for _, a := range []store.Alert{newAlert("u1", "quota 100%"), newAlert("u2", "quota 80%"),
		func() store.Alert { a := newAlert("u1", "quota 80%"); a.PeriodStart = T0; return a }()} {
		got, err := s.CreateAlert(ctx, a)
		if err != nil || got.ID == "" || got.Status != store.AlertPending {
			t.Fatalf("CreateAlert %+v = %+v, %v", a, got, err)
		}
	}
	if c.reopen != nil { // recorded alerts outlive a restart, still pending
		s = c.restart(t, s)
	}
	if ok, err := s.HasAlert(ctx, "u1", "svc", T0.Add(-24*time.Hour), "quota 80%"); err != nil || !ok {
		t.Fatalf("HasAlert = %v, %v", ok, err)
	}
	if ok, _ := s.HasAlert(ctx, "u1", "svc", T0.Add(-24*time.Hour), "quota 90%"); ok {
		t.Fatal("HasAlert true for a threshold never recorded")
	}
	due, err := s.DueAlerts(ctx, T0, 100)
	if err != nil || len(due) != 4 {
		t.Fatalf("DueAlerts = %d alerts, %v; want 4", len(due), err)
	}
	for _, a := range due {
		if a.Status != store.AlertPending || a.Attempts != 0 {
			t.Fatalf("alert %+v: want pending with no attempts", a)
		}
	}
	if due, _ := s.DueAlerts(ctx, T0, 3); len(due) != 3 {
		t.Errorf("DueAlerts(limit 3) = %d alerts", len(due))
	}
}

// testAlertOverdrawn: a "credits below" alert fired for an overdrawn
// prepaid balance carries a negative value, and a usage figure summed from
// large reports can pass MaxUnits; such an alert reads back as it was
// recorded, from DueAlerts and ListAlerts, before and after a restart
// (one unreadable alert would stop every alert's delivery and the
// listing).
func testAlertOverdrawn(t *testing.T, c *suite) {
	s := c.store(t)
	low := newAlert("u1", "credits below 5")
	low.Value, low.Limit = -whole(2)-500_000, whole(5)
	big := newAlert("u2", "quota 80%")
	big.Value, big.Limit = billing.MaxUnits+whole(7), billing.MaxUnits
	for _, a := range []store.Alert{low, big} {
		if _, err := s.CreateAlert(ctx, a); err != nil {
			t.Fatalf("CreateAlert(value %s): %v", a.Value, err)
		}
	}
	check := func(when string) {
		t.Helper()
		due, err := s.DueAlerts(ctx, T0, 10)
		if err != nil || len(due) != 2 {
			t.Fatalf("%s: DueAlerts = %d alerts, %v; want 2", when, len(due), err)
		}
		listed, _, err := s.ListAlerts(ctx, store.AlertFilter{}, "", 10)
		if err != nil || len(listed) != 2 {
			t.Fatalf("%s: ListAlerts = %d alerts, %v; want 2", when, len(listed), err)
		}
		for _, got := range [][]store.Alert{due, listed} {
			values := map[string][2]billing.Units{}
			for _, a := range got {
				values[a.UserID] = [2]billing.Units{a.Value, a.Limit}
			}
			if values["u1"] != [2]billing.Units{low.Value, low.Limit} || values["u2"] != [2]billing.Units{big.Value, big.Limit} {
				t.Fatalf("%s: values and limits read back %v; want u1 %s/%s, u2 %s/%s", when, values,
					low.Value, low.Limit, big.Value, big.Limit)
			}
		}
	}
	check("recorded")
	if c.reopen != nil {
		s = c.restart(t, s)
		check("after a restart")
	}
}

// testAlertDeliveryStates: an attempt is recorded only by the sender that
// read the current attempts; a retry waits until its time; a delivered
// alert is never due again.
func testAlertDeliveryStates(t *testing.T, c *suite) {
	s := c.store(t)
	// What its figures count is kept through every update and a restart:
	// a retry sends the same bytes.
	spend := newAlert("u1", "spending_cap 90%")
	spend.Currency = "EUR"
	a, err := s.CreateAlert(ctx, spend)
	if err != nil {
		t.Fatal(err)
	}
	if due, _ := s.DueAlerts(ctx, T0.Add(-time.Second), 10); len(due) != 0 {
		t.Fatalf("due before its time: %+v", due)
	}
	failed := a
	failed.Attempts, failed.LastError, failed.NextAttempt = 1, "503 Service Unavailable", T0.Add(time.Minute)
	if _, err := s.UpdateAlert(ctx, failed, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpdateAlert(ctx, failed, 0); !errors.Is(err, store.ErrStale) {
		t.Fatalf("stale UpdateAlert: %v, want ErrStale", err)
	}
	if due, _ := s.DueAlerts(ctx, T0.Add(59*time.Second), 10); len(due) != 0 {
		t.Fatalf("due before its retry: %+v", due)
	}
	due, _ := s.DueAlerts(ctx, T0.Add(time.Minute), 10)
	if len(due) != 1 || due[0].Attempts != 1 || due[0].LastError != "503 Service Unavailable" || due[0].Currency != "EUR" {
		t.Fatalf("due at its retry: %+v", due)
	}
	done := due[0]
	done.Attempts, done.Status, done.LastError, done.DeliveredAt = 2, store.AlertDelivered, "", T0.Add(time.Minute)
	if _, err := s.UpdateAlert(ctx, done, 1); err != nil {
		t.Fatal(err)
	}
	if c.reopen != nil { // the delivery state outlives a restart
		s = c.restart(t, s)
	}
	if due, _ := s.DueAlerts(ctx, T0.Add(48*time.Hour), 10); len(due) != 0 {
		t.Fatalf("a delivered alert is due again: %+v", due)
	}
	list, _, err := s.ListAlerts(ctx, store.AlertFilter{}, "", 10)
	if err != nil || len(list) != 1 || list[0].Status != store.AlertDelivered || list[0].Attempts != 2 ||
		!list[0].DeliveredAt.Equal(T0.Add(time.Minute)) || !list[0].NextAttempt.IsZero() || list[0].Currency != "EUR" || list[0].Unit != "" {
		t.Fatalf("ListAlerts = %+v, %v", list, err)
	}
	if _, err := s.UpdateAlert(ctx, done, 2); !errors.Is(err, store.ErrStale) {
		t.Errorf("UpdateAlert of a delivered alert: %v, want ErrStale", err)
	}
}

// testAlertClaim: a delivery attempt is claimed by writing attempts + 1
// and the time its claim runs out as the next attempt (the old and the
// new config's loops overlap during a reload). Of many senders claiming
// one due alert at once, one wins; the claimed alert is not due to anyone
// until the claim runs out, and the winner's outcome is recorded; a claim
// that ran out (its sender died) is taken over, and the first sender's
// late outcome is then ErrStale and changes nothing.
func testAlertClaim(t *testing.T, c *suite) {
	s := c.store(t)
	a, err := s.CreateAlert(ctx, newAlert("u1", "quota 80%"))
	if err != nil {
		t.Fatal(err)
	}
	claim := a
	claim.Attempts, claim.NextAttempt = 1, T0.Add(15*time.Second)
	var (
		wg           sync.WaitGroup
		mu           sync.Mutex
		won, refused int
	)
	for range 20 {
		wg.Go(func() {
			_, err := s.UpdateAlert(ctx, claim, 0)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				won++
			case errors.Is(err, store.ErrStale):
				refused++
			default:
				t.Errorf("UpdateAlert: %v", err)
			}
		})
	}
	wg.Wait()
	if won != 1 || refused != 19 {
		t.Fatalf("claims won %d, refused %d; want 1 and 19", won, refused)
	}
	if due, _ := s.DueAlerts(ctx, T0.Add(15*time.Second-time.Nanosecond), 10); len(due) != 0 {
		t.Fatalf("a claimed alert is due before its claim runs out: %+v", due)
	}
	// The claim's sender records its outcome (a failed attempt).
	failed := claim
	failed.LastError, failed.NextAttempt = "webhook answered 503 Service Unavailable", T0.Add(time.Minute)
	if _, err := s.UpdateAlert(ctx, failed, 1); err != nil {
		t.Fatalf("recording the claimed attempt: %v", err)
	}
	// The retry's claim runs out without an outcome (its sender died);
	// another sender takes the alert over.
	due, _ := s.DueAlerts(ctx, T0.Add(time.Minute), 10)
	if len(due) != 1 || due[0].Attempts != 1 {
		t.Fatalf("due at its retry: %+v", due)
	}
	retry := due[0]
	retry.Attempts, retry.NextAttempt = 2, T0.Add(time.Minute+15*time.Second)
	if _, err := s.UpdateAlert(ctx, retry, 1); err != nil {
		t.Fatal(err)
	}
	due, _ = s.DueAlerts(ctx, T0.Add(time.Minute+15*time.Second), 10)
	if len(due) != 1 || due[0].Attempts != 2 {
		t.Fatalf("due once the claim ran out: %+v", due)
	}
	takeover := due[0]
	takeover.Attempts, takeover.NextAttempt = 3, T0.Add(time.Minute+30*time.Second)
	if _, err := s.UpdateAlert(ctx, takeover, 2); err != nil {
		t.Fatal(err)
	}
	late := retry
	late.Status, late.DeliveredAt, late.NextAttempt = store.AlertDelivered, T0.Add(time.Minute+20*time.Second), time.Time{}
	if got, err := s.UpdateAlert(ctx, late, 2); !errors.Is(err, store.ErrStale) || got.Attempts != 3 {
		t.Fatalf("the late outcome of a claim taken over: %+v, %v; want ErrStale with the stored alert", got, err)
	}
	if c.reopen != nil { // the claim outlives a restart
		s = c.restart(t, s)
	}
	list, _, err := s.ListAlerts(ctx, store.AlertFilter{}, "", 10)
	if err != nil || len(list) != 1 || list[0].Status != store.AlertPending || list[0].Attempts != 3 ||
		!list[0].NextAttempt.Equal(T0.Add(time.Minute+30*time.Second)) || list[0].LastError != failed.LastError {
		t.Fatalf("ListAlerts = %+v, %v; want the takeover's claim", list, err)
	}
}

// testListAlerts: alerts page newest first through the filter; a
// malformed cursor is ErrBadCursor.
func testListAlerts(t *testing.T, c *suite) {
	s := c.store(t)
	var u1 []string
	for i := range 7 {
		user := "u1"
		if i%2 == 1 {
			user = "u2"
		}
		a, err := s.CreateAlert(ctx, newAlert(user, fmt.Sprintf("quota %d%%", 10+i)))
		if err != nil {
			t.Fatal(err)
		}
		if user == "u1" {
			u1 = append([]string{a.ID}, u1...)
		}
	}
	var ids []string
	cursor := ""
	for pages := 0; ; pages++ {
		page, next, err := s.ListAlerts(ctx, store.AlertFilter{UserID: "u1"}, cursor, 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) > 2 {
			t.Fatalf("a page of %d, limit 2", len(page))
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
	if fmt.Sprint(ids) != fmt.Sprint(u1) {
		t.Fatalf("u1's alerts %v, want newest first %v", ids, u1)
	}
	if _, _, err := s.ListAlerts(ctx, store.AlertFilter{}, "zz", 2); !errors.Is(err, store.ErrBadCursor) {
		t.Fatalf("bad cursor: %v", err)
	}
}

// testChangedAccounts: a committed charge names its subscription once.
func testChangedAccounts(t *testing.T, c *suite) {
	s := c.store(t)
	s.ChangedAccounts() // turns the bookkeeping on
	a := subscribe(t, s, "u1", "svc", quotaBlock, 0)
	s.ChangedAccounts()
	r, err := s.Reserve(ctx, a, whole(1), T0)
	d := r.Decision
	if err != nil || !d.Allowed {
		t.Fatalf("Reserve: %v %+v", err, d)
	}
	if _, err := s.Settle(ctx, r, whole(1), EntryFor(a, whole(1), T0)); err != nil {
		t.Fatal(err)
	}
	var refs []store.AccountRef
	deadline := time.After(10 * time.Second)
	for len(refs) == 0 {
		var ready <-chan struct{}
		refs, ready = s.ChangedAccounts()
		if len(refs) > 0 {
			break
		}
		select {
		case <-ready:
		case <-deadline:
			t.Fatal("no change named 10s after a committed charge")
		}
	}
	if !slices.Contains(refs, store.AccountRef{UserID: "u1", ServiceID: "svc"}) {
		t.Fatalf("changed %v, want u1/svc", refs)
	}
	if refs, _ := s.ChangedAccounts(); slices.Contains(refs, store.AccountRef{UserID: "u1", ServiceID: "svc"}) {
		t.Fatalf("changed again without a write: %v", refs)
	}
}

// testChangedAccountsWithoutCalls: a change of balance or plan that no
// call makes (an operator's correction, a refund's reversal, a grant's
// expiry, a plan change) names its subscription and wakes the evaluator
// too: a prepaid balance taken below a credits_below threshold this way
// is refused every call after it, so no settlement would ever wake it.
func testChangedAccountsWithoutCalls(t *testing.T, c *suite) {
	s := c.store(t)
	s.ChangedAccounts() // turns the bookkeeping on
	subscribe(t, s, "u1", "svc", prepaid, whole(10))
	ref := store.AccountRef{UserID: "u1", ServiceID: "svc"}
	for _, tc := range []struct {
		what   string
		change func() error
	}{
		{"a negative correction of credits", func() error {
			_, err := s.AddCredits(ctx, "u1", "svc", -whole(9), T0)
			return err
		}},
		{"a change of plan", func() error {
			_, err := s.PutSubscription(ctx, store.Subscription{UserID: "u1", ServiceID: "svc", ProductID: quotaBlock.ID,
				Status: "ACTIVE", UpdatedAt: T0})
			return err
		}},
	} {
		// As the evaluator does: take what changed, then wait for more.
		_, ready := s.ChangedAccounts()
		if err := tc.change(); err != nil {
			t.Fatalf("%s: %v", tc.what, err)
		}
		var refs []store.AccountRef
		deadline := time.After(5 * time.Second)
		for !slices.Contains(refs, ref) {
			select {
			case <-ready:
			case <-deadline:
				t.Fatalf("%s: the evaluator was not woken 5s after it (named so far: %v)", tc.what, refs)
			}
			var more []store.AccountRef
			more, ready = s.ChangedAccounts()
			refs = append(refs, more...)
		}
	}
}

// testChangedAccountsRequeued: subscriptions an evaluation gave back
// (stopped by a reload, or a failed read) are named again by the next
// ChangedAccounts, once each, and wake the evaluator that waits.
func testChangedAccountsRequeued(t *testing.T, c *suite) {
	s := c.store(t)
	_, ready := s.ChangedAccounts() // turns the bookkeeping on
	a := store.AccountRef{UserID: "u1", ServiceID: "svc"}
	b := store.AccountRef{UserID: "u2", ServiceID: "svc"}
	s.RequeueChanged(nil)
	select {
	case <-ready:
		if refs, _ := s.ChangedAccounts(); len(refs) != 0 {
			t.Fatalf("nothing given back, named %v", refs)
		}
	default:
	}
	_, ready = s.ChangedAccounts()
	s.RequeueChanged([]store.AccountRef{a, b, a})
	select {
	case <-ready:
	case <-time.After(5 * time.Second):
		t.Fatal("the evaluator was not woken by what was given back")
	}
	refs, _ := s.ChangedAccounts()
	slices.SortFunc(refs, func(x, y store.AccountRef) int { return strings.Compare(x.UserID, y.UserID) })
	if !slices.Equal(refs, []store.AccountRef{a, b}) {
		t.Fatalf("named %v, want %v and %v once each", refs, a, b)
	}
	if refs, _ := s.ChangedAccounts(); len(refs) != 0 {
		t.Fatalf("named again without a change: %v", refs)
	}
}

// testAudit: entries get increasing sequence numbers and page newest first
// without losing or repeating one; a malformed cursor is ErrBadCursor.
func testAudit(t *testing.T, c *suite) {
	s := c.store(t)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var last uint64
	for i := range 5 {
		e, err := s.AppendAudit(ctx, store.AuditEntry{Time: at, Actor: "admin-api 127.0.0.1", Action: "key.create",
			UserID: "u1", KeyID: fmt.Sprint("k", i), Detail: "created"})
		if err != nil {
			t.Fatal(err)
		}
		if e.Seq <= last {
			t.Fatalf("seq %d after %d", e.Seq, last)
		}
		last = e.Seq
	}
	if got := auditPages(t, s, 2); got != "[k4 k3 k2 k1 k0]" {
		t.Fatalf("audit pages %v", got)
	}
	page, _, err := s.ListAudit(ctx, "", 1)
	if err != nil || len(page) != 1 || page[0].Actor != "admin-api 127.0.0.1" || page[0].Action != "key.create" ||
		page[0].UserID != "u1" || page[0].Detail != "created" || !page[0].Time.Equal(at) {
		t.Fatalf("newest entry %+v, %v", page, err)
	}
	// A cursor is a sequence number no store hands out past 2^63-1: one
	// past it is malformed in every store, not the whole log in one and
	// an error in the other.
	for _, bad := range []string{"x", "0", "-1", "9223372036854775808", "18446744073709551615"} {
		if _, _, err := s.ListAudit(ctx, bad, 2); !errors.Is(err, store.ErrBadCursor) {
			t.Fatalf("cursor %q: %v, want ErrBadCursor", bad, err)
		}
	}
}

func auditPages(t *testing.T, s store.Store, limit int) string {
	t.Helper()
	var got []string
	cursor := ""
	for range 100 {
		page, next, err := s.ListAudit(ctx, cursor, limit)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) > limit {
			t.Fatalf("a page of %d, limit %d", len(page), limit)
		}
		for _, e := range page {
			got = append(got, e.KeyID)
		}
		if next == "" {
			return fmt.Sprint(got)
		}
		cursor = next
	}
	t.Fatal("endless audit listing")
	return ""
}
