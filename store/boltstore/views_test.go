package boltstore

import (
	"errors"
	"fmt"
	"testing"

	"github.com/platformgw/gateway/store"
)

// Subscriptions page by (user, service), one user's pages stay within that
// user (a prefix "al" must not list "alice"), and a cursor of another
// listing is refused; a reopened file lists the same.
func TestListSubscriptionsPages(t *testing.T) {
	path := storePath(t)
	s := openAt(t, path)
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
	if got := list("", 4); len(got) != 9 || got[0] != "al/a" || got[8] != "bob/c" {
		t.Errorf("all subscriptions: %v", got)
	}
	if got := list("nobody", 5); len(got) != 0 {
		t.Errorf("nobody's: %v", got)
	}
	_, next, _ := s.ListSubscriptions(ctx, "bob", "", 1)
	if _, _, err := s.ListSubscriptions(ctx, "alice", next, 1); !errors.Is(err, store.ErrBadCursor) {
		t.Errorf("bob's cursor on alice's listing: %v", err)
	}
	if _, _, err := s.ListSubscriptions(ctx, "", "!!", 1); !errors.Is(err, store.ErrBadCursor) {
		t.Errorf("a malformed cursor: %v", err)
	}
	s.Close()
	s = openAt(t, path)
	if got := list("", 100); len(got) != 9 {
		t.Errorf("after reopening: %v", got)
	}
}

// A job listing examines a bounded number of jobs per call: a sparse
// filter gives short (even empty) pages with a cursor, and still finds
// every match.
func TestListJobsScanBudget(t *testing.T) {
	s := openTemp(t)
	defer func(b int) { jobScanBudget = b }(jobScanBudget)
	jobScanBudget = 7
	for i := range 40 {
		j := newJob(fmt.Sprintf("j%02d", i), t0.Add(24*3600e9))
		if i%10 == 3 {
			j.UserID = "rare"
		}
		if err := s.CreateJob(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	var found []string
	cursor, calls, empty := "", 0, 0
	for {
		calls++
		jobs, next, err := s.ListJobs(ctx, store.JobFilter{UserID: "rare"}, cursor, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(jobs) == 0 && next != "" {
			empty++
		}
		for _, j := range jobs {
			found = append(found, j.ID)
		}
		if next == "" {
			break
		}
		cursor = next
		if calls > 20 {
			t.Fatal("endless listing")
		}
	}
	if fmt.Sprint(found) != "[j03 j13 j23 j33]" || calls != 6 || empty == 0 {
		t.Errorf("found %v in %d calls (%d empty pages)", found, calls, empty)
	}
	if jobs, next, _ := s.ListJobs(ctx, store.JobFilter{Status: store.JobPending}, "", 5); len(jobs) != 5 || next == "" {
		t.Errorf("first page of 5: %d jobs, next %q", len(jobs), next)
	}
}
