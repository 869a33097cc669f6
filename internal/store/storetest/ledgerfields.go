package storetest

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// FullLedgerEntry is an entry with every field of store.LedgerFields set
// to a value no other field has and no encoder writes by default: what
// the tests of the entry's encoders round-trip. A field of a kind it does
// not know fails the test, so a new field gets a value here first.
func FullLedgerEntry(t testing.TB) store.LedgerEntry {
	t.Helper()
	var e store.LedgerEntry
	v := reflect.ValueOf(&e).Elem()
	for i, f := range store.LedgerFields() {
		fv := v.FieldByName(f.Name)
		if !fv.IsValid() {
			t.Fatalf("store.LedgerFields names %s, which LedgerEntry has not", f.Name)
		}
		n := int64(i + 1)
		switch x := fv.Addr().Interface().(type) {
		case *string:
			*x = fmt.Sprintf("%s-%d", f.JSON, n)
		case *uint64:
			*x = uint64(1000 + n)
		case *billing.Units:
			*x = billing.Units(n)*billing.Scale*7 + billing.Units(n*1234) // a fraction, and a different one each
		case *time.Time:
			*x = time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC).Add(time.Duration(n)*time.Hour + time.Duration(n*1001)*time.Microsecond)
		default:
			t.Fatalf("FullLedgerEntry has no value for %s (%s): give it one", f.Name, fv.Type())
		}
	}
	if e.UnitsClaimed <= e.Units {
		// A cut row claims more than it was charged (Uncharged > 0).
		t.Fatalf("FullLedgerEntry: UnitsClaimed %s not above Units %s", e.UnitsClaimed, e.Units)
	}
	return e
}

// CheckLedgerEntry fails, naming the encoder and the field, for every
// field of store.LedgerFields that got does not carry as want has it,
// but those in skip (each skipped field is a decision the caller's test
// states). Times compare as instants.
func CheckLedgerEntry(t testing.TB, encoder string, got, want store.LedgerEntry, skip ...string) {
	t.Helper()
	gv, wv := reflect.ValueOf(got), reflect.ValueOf(want)
next:
	for _, f := range store.LedgerFields() {
		for _, s := range skip {
			if s == f.Name {
				continue next
			}
		}
		g, w := gv.FieldByName(f.Name).Interface(), wv.FieldByName(f.Name).Interface()
		if gt, ok := g.(time.Time); ok {
			if !gt.Equal(w.(time.Time)) {
				t.Errorf("%s loses LedgerEntry.%s (%s): got %v, want %v", encoder, f.Name, f.JSON, g, w)
			}
			continue
		}
		if g != w {
			t.Errorf("%s loses LedgerEntry.%s (%s): got %v, want %v", encoder, f.Name, f.JSON, g, w)
		}
	}
}
