package pgstore

import (
	"testing"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// TestEndedParts: what lease rows' give-back expired, split among them
// top first, with what does not expire under the lowest expired credit
// of each part (a late charge spends it first).
func TestEndedParts(t *testing.T) {
	u := billing.Units(1)
	for _, tc := range []struct {
		name string
		st   store.HeldStack
		pres []billing.Units
		want []preEnded
	}{
		{"credits not from a grant under the deferred ones",
			store.HeldStack{Layers: []store.HeldLayer{{ID: "A", Below: 50 * u, Deferred: 50 * u}}},
			[]billing.Units{100 * u}, []preEnded{{credits: 50 * u, below: 50 * u}}},
		{"the top is above: not below",
			store.HeldStack{Layers: []store.HeldLayer{{ID: "A", Deferred: 50 * u}}, Top: 50 * u},
			[]billing.Units{100 * u}, []preEnded{{credits: 50 * u}}},
		{"only under the lowest deferred credits",
			store.HeldStack{Layers: []store.HeldLayer{{ID: "B", Below: 20 * u, Deferred: 30 * u}, {ID: "A", Below: 40 * u, Deferred: 10 * u}}},
			[]billing.Units{100 * u}, []preEnded{{credits: 40 * u, below: 20 * u}}},
		{"two rows, the first the top",
			store.HeldStack{Layers: []store.HeldLayer{{ID: "A", Below: 50 * u, Deferred: 50 * u}}, Top: 10 * u},
			[]billing.Units{40 * u, 70 * u}, []preEnded{{credits: 30 * u}, {credits: 20 * u, below: 50 * u}}},
		{"a row that took no deferred credits keeps nothing",
			store.HeldStack{Layers: []store.HeldLayer{{ID: "A", Below: 50 * u, Deferred: 10 * u}}, Top: 10 * u},
			[]billing.Units{10 * u, 5 * u}, []preEnded{{}, {credits: 5 * u}}},
	} {
		var sum billing.Units
		for _, p := range tc.pres {
			sum += p
		}
		after, exp, _ := tc.st.GiveBack(sum)
		got := endedParts(tc.st, after, exp, tc.pres)
		if len(got) != len(tc.want) {
			t.Fatalf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("%s: row %d: %+v, want %+v", tc.name, i, got[i], tc.want[i])
			}
		}
	}
}
