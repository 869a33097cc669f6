package engine

import (
	"testing"
	"time"
)

func TestCallStats(t *testing.T) {
	s := new(Calls)
	for range 90 {
		s.observe(1000, 200, 80*time.Microsecond)
	}
	for range 5 {
		s.observe(1001, 429, 3*time.Millisecond)
	}
	for range 4 {
		s.observe(1002, 404, 3*time.Millisecond)
	}
	s.observe(1003, 502, 2*time.Second)
	got := s.snapshot(1003)
	if got.Calls != 100 || got.Share429 != 0.05 || got.Share4xx != 0.09 || got.Share5xx != 0.01 {
		t.Fatalf("%+v", got)
	}
	if got.P50 != 100*time.Microsecond || got.P99 != 5*time.Millisecond {
		t.Fatalf("p50 %v p99 %v", got.P50, got.P99)
	}
	// A minute later the old slots no longer count.
	if got := s.snapshot(1000 + statsWindow); got.Calls != 10 {
		t.Fatalf("after the window: %+v", got)
	}
	if got := s.snapshot(2000); got.Calls != 0 || got.P50 != 0 {
		t.Fatalf("long after: %+v", got)
	}
}
