package boltstore

import (
	"fmt"
	"testing"

	"github.com/platformgw/gateway/internal/store"
)

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
