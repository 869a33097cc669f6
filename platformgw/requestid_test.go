package platformgw

import (
	"testing"

	"github.com/google/uuid"
)

// TestNewRequestID: a version 4, RFC 4122 variant UUID in the canonical
// lower-case text form uuid.NewString wrote, different every time, in
// one allocation.
func TestNewRequestID(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := newRequestID()
		u, err := uuid.Parse(id)
		if err != nil || u.String() != id || u.Version() != 4 || u.Variant() != uuid.RFC4122 {
			t.Fatalf("%q: %v (version %d, variant %v)", id, err, u.Version(), u.Variant())
		}
		if seen[id] {
			t.Fatalf("%q twice", id)
		}
		seen[id] = true
	}
	if raceDetector {
		return // the race detector adds allocations of its own
	}
	if n := testing.AllocsPerRun(100, func() { newRequestID() }); n > 1 {
		t.Errorf("newRequestID made %.0f allocations, want 1", n)
	}
}
