package boltstore

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/disktest"
	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/store"
)

func outcomeCalls(t *testing.T, s *Store) int64 {
	t.Helper()
	var n int64
	if err := s.ScanOutcomes(ctx, store.OutcomeFilter{}, func(r store.OutcomeRow) error {
		n += r.Calls
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// The bbolt store's disk full at a stop: the last flush of the call
// outcomes fails, and so does keeping them in the file next to the store
// (engine.(*OutcomeCounter).Keep answers the error, which the platform
// logs as the counts this stop loses); nothing is half written and the
// counts stay in memory. With room again, Keep writes them and the next
// process (LoadKept, Flush) adds every call once.
func TestOutcomesKeptAtStopOnFullDisk(t *testing.T) {
	dir := disktest.Small(t, "16m")
	path := filepath.Join(dir, "platform.db")
	kept := path + ".outcomes-kept"
	s, err := OpenWith(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	hour := time.Now().UTC().Truncate(time.Hour)
	k := engine.OutcomeCall{Hour: hour.Unix(), UserID: "u", ServiceID: "svc", EndpointID: "e", Product: "q", Outcome: "2xx"}
	c := engine.NewOutcomeCounter()
	for range 4 {
		c.Count(k, time.Millisecond, time.Millisecond)
	}
	if err := c.Flush(ctx, s, time.Now()); err != nil {
		t.Fatal(err)
	}
	filler := disktest.Fill(t, dir)
	// Rows enough that the file must grow (a commit that fits in the
	// file's free pages still succeeds on a full disk).
	for i := range 3000 {
		k := k
		k.UserID = fmt.Sprintf("user-%05d", i)
		c.Count(k, time.Millisecond, time.Millisecond)
	}
	if err := c.Flush(ctx, s, time.Now()); err == nil {
		t.Fatal("a flush on a full disk succeeded")
	}
	if _, _, err := c.Keep(kept, time.Now()); err == nil {
		t.Fatal("keeping the outcomes on a full disk succeeded")
	}
	if _, err := os.Stat(kept); !os.IsNotExist(err) {
		t.Fatalf("a failed Keep left a file: %v", err)
	}
	if _, err := os.Stat(kept + ".tmp"); !os.IsNotExist(err) {
		t.Fatalf("a failed Keep left its temporary file: %v", err)
	}
	c.Count(k, time.Millisecond, 0)
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	calls, dropped, err := c.Keep(kept, time.Now())
	if err != nil || calls != 3001 || dropped != 0 {
		t.Fatalf("Keep with room = %d calls, %d dropped, %v; want 3001, 0, nil", calls, dropped, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s2, err := OpenWith(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	next := engine.NewOutcomeCounter()
	if n, calls, err := next.LoadKept(kept); err != nil || n == 0 || calls != 3001 {
		t.Fatalf("LoadKept = %d batches, %d calls, %v; want 3001 calls", n, calls, err)
	}
	if err := next.Flush(ctx, s2, time.Now()); err != nil {
		t.Fatal(err)
	}
	if got := outcomeCalls(t, s2); got != 3005 {
		t.Fatalf("the store counts %d calls, want 3005", got)
	}
	if _, err := os.Stat(kept); !os.IsNotExist(err) {
		t.Fatalf("the kept file is still there once applied: %v", err)
	}
}
