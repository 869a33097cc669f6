package onceform

import (
	"testing"
	"time"
)

// TestBookBounded: the book remembers at most max values; when full it
// forgets the older half and refuses values made up to then as stale, so
// a forgotten value is never taken again.
func TestBookBounded(t *testing.T) {
	b, err := NewRandom("test")
	if err != nil {
		t.Fatal(err)
	}
	b.max = 4
	at := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	b.Now = func() time.Time { return at }
	var vals []string
	for range 7 {
		at = at.Add(time.Second)
		v := b.Mint("op")
		id, verdict, _ := b.Claim(v, "op")
		if verdict != OK {
			t.Fatalf("a fresh value: verdict %s", verdict)
		}
		b.Finish(id, Made)
		vals = append(vals, v)
		if len(b.used) > b.max {
			t.Fatalf("%d values remembered, max %d", len(b.used), b.max)
		}
	}
	for i, v := range vals {
		_, verdict, state := b.Claim(v, "op")
		if verdict == OK {
			t.Errorf("value %d taken a second time", i)
		}
		if verdict == Taken && state != Made {
			t.Errorf("value %d: state %d", i, state)
		}
	}
	if _, verdict, _ := b.Claim(vals[0], "op"); verdict != Stale {
		t.Errorf("the oldest value, forgotten: verdict %s, want stale", verdict)
	}
	if _, verdict, _ := b.Claim(vals[6], "op"); verdict != Taken {
		t.Errorf("the newest value: verdict %s, want taken", verdict)
	}
	// Past TTL the values are forgotten and refused as stale.
	at = at.Add(TTL + 2*time.Minute)
	if _, verdict, _ := b.Claim(b.Mint("op"), "op"); verdict != OK || len(b.used) != 1 {
		t.Errorf("after a day: verdict %s, %d remembered", verdict, len(b.used))
	}
	if _, verdict, _ := b.Claim(vals[6], "op"); verdict != Stale {
		t.Errorf("a day-old value: verdict %s, want stale", verdict)
	}
}

// TestClaimRefusals: a value of another book or person, cut short or
// none is bad; one given back (Unchanged) is taken again; one taken is
// answered with its first POST's state.
func TestClaimRefusals(t *testing.T) {
	b, _ := NewRandom("test")
	other, _ := NewRandom("test")
	v := b.Mint("alice")
	for name, bad := range map[string]string{"none": "", "another book's": other.Mint("alice"), "cut short": v[:20]} {
		if _, verdict, _ := b.Claim(bad, "alice"); verdict != Bad {
			t.Errorf("%s: verdict %s", name, verdict)
		}
	}
	if _, verdict, _ := b.Claim(v, "bob"); verdict != Bad {
		t.Errorf("another person's: verdict %s", verdict)
	}
	id, verdict, _ := b.Claim(v, "alice")
	if verdict != OK {
		t.Fatalf("fresh: %s", verdict)
	}
	if _, verdict, state := b.Claim(v, "alice"); verdict != Taken || state != InFlight {
		t.Errorf("while in flight: %s %d", verdict, state)
	}
	b.Finish(id, Unchanged)
	id, verdict, _ = b.Claim(v, "alice")
	if verdict != OK {
		t.Fatalf("given back: %s", verdict)
	}
	b.Finish(id, Failed)
	if _, verdict, state := b.Claim(v, "alice"); verdict != Taken || state != Failed {
		t.Errorf("after a failure: %s %d", verdict, state)
	}
}
