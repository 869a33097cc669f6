package engine

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/store"
)

func keyOf(user string) OutcomeCall {
	return OutcomeCall{Hour: hour0.Unix(), UserID: user, ServiceID: "svc", EndpointID: "ep", Product: "basic", Outcome: store.Outcome2xx}
}

// TestOutcomeKeepAfterLostAnswer: the stop's last flush was applied but
// its answer lost; the batch is kept all the same, and sending it again
// from the next process adds nothing, while what was counted after it is
// added once.
func TestOutcomeKeepAfterLostAnswer(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "kept")
	m := newMemOutcomes()
	c := NewOutcomeCounter()
	for range 3 {
		c.Count(keyOf("a"), time.Millisecond, 0)
	}
	m.lose = true
	if err := c.Flush(ctx, m, hour0); err == nil {
		t.Fatal("a lost answer was a success")
	}
	c.Count(keyOf("b"), time.Millisecond, 0)
	calls, dropped, err := c.Keep(path, hour0)
	if err != nil || calls != 4 || dropped != 0 {
		t.Fatalf("Keep = %d, %d, %v; want 4 calls", calls, dropped, err)
	}
	next := NewOutcomeCounter()
	if n, calls, err := next.LoadKept(path); err != nil || n != 2 || calls != 4 {
		t.Fatalf("LoadKept = %d batches, %d calls, %v; want 2, 4", n, calls, err)
	}
	if err := next.Flush(ctx, m, hour0); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := m.calls(); n != 4 {
		t.Fatalf("the store counts %d calls, want 4", n)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("the kept file outlived its batches: %v", err)
	}
	// Nothing left: a Keep writes no file.
	if calls, _, err := next.Keep(path, hour0); err != nil || calls != 0 {
		t.Fatalf("Keep of nothing = %d, %v", calls, err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("a Keep of nothing wrote a file: %v", err)
	}
}

// TestOutcomeKeepBounded: an outage over several stops keeps at most
// KeepMaxRows rows, dropping the oldest batches and saying how many calls
// they held; a batch still waiting to be sent again (the store down)
// stays kept through a failed flush.
func TestOutcomeKeepBounded(t *testing.T) {
	defer func(n int) { KeepMaxRows = n }(KeepMaxRows)
	KeepMaxRows = 2
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "kept")
	m := newMemOutcomes()
	m.down = true

	first := NewOutcomeCounter()
	first.Count(keyOf("a"), time.Millisecond, 0)
	first.Count(keyOf("a"), time.Millisecond, 0)
	if calls, dropped, err := first.Keep(path, hour0); err != nil || calls != 2 || dropped != 0 {
		t.Fatalf("first Keep = %d, %d, %v", calls, dropped, err)
	}
	second := NewOutcomeCounter()
	if n, _, err := second.LoadKept(path); err != nil || n != 1 {
		t.Fatalf("LoadKept = %d, %v", n, err)
	}
	if err := second.Flush(ctx, m, hour0); err == nil {
		t.Fatal("a flush into a store that is down succeeded")
	}
	second.Count(keyOf("b"), time.Millisecond, 0)
	second.Count(keyOf("c"), time.Millisecond, 0)
	calls, dropped, err := second.Keep(path, hour0)
	if err != nil || calls != 2 || dropped != 2 {
		t.Fatalf("second Keep = %d kept, %d dropped, %v; want 2, 2", calls, dropped, err)
	}
	third := NewOutcomeCounter()
	if _, _, err := third.LoadKept(path); err != nil {
		t.Fatal(err)
	}
	m.down = false
	if err := third.Flush(ctx, m, hour0); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := m.calls(); n != 2 {
		t.Fatalf("the store counts %d calls, want the 2 kept", n)
	}
}

// TestOutcomeLoadKeptDamaged: a file that is not a kept-outcomes file is
// an error (the platform moves it aside), never a partial load.
func TestOutcomeLoadKeptDamaged(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kept")
	for _, data := range []string{`{"version":1,"batches":[{"writer":`, `{"version":9,"batches":[]}`} {
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		c := NewOutcomeCounter()
		if n, _, err := c.LoadKept(path); err == nil || n != 0 {
			t.Errorf("LoadKept(%q) = %d, %v; want an error", data, n, err)
		}
	}
}
