package store_test

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/storetest"
)

// TestLedgerFieldsList holds store.LedgerFields to LedgerEntry: every
// field, in order, under its JSON name.
func TestLedgerFieldsList(t *testing.T) {
	typ := reflect.TypeFor[store.LedgerEntry]()
	list := store.LedgerFields()
	if typ.NumField() != len(list) {
		t.Errorf("LedgerEntry has %d fields, store.LedgerFields lists %d: list the new field (and carry it in every encoder)",
			typ.NumField(), len(list))
	}
	for i := range min(typ.NumField(), len(list)) {
		f := typ.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Name != list[i].Name || name != list[i].JSON {
			t.Errorf("field %d is %s (json %q), store.LedgerFields says %s (%q)", i, f.Name, name, list[i].Name, list[i].JSON)
		}
	}
}

// TestLedgerEntryJSONCarriesEveryField round-trips a full entry through
// the hand-written encoders.
func TestLedgerEntryJSONCarriesEveryField(t *testing.T) {
	e := storetest.FullLedgerEntry(t)
	b, err := store.AppendLedgerEntryJSON(nil, &e)
	if err != nil {
		t.Fatal(err)
	}
	var got store.LedgerEntry
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	storetest.CheckLedgerEntry(t, "AppendLedgerEntryJSON", got, e)

	// The detail leaves out what the PostgreSQL ledger keeps in columns.
	inColumns := []string{"Seq", "ID", "Time", "UserID", "ServiceID"}
	b, err = store.AppendLedgerEntryDetailJSON(nil, &e)
	if err != nil {
		t.Fatal(err)
	}
	got = store.LedgerEntry{}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	storetest.CheckLedgerEntry(t, "AppendLedgerEntryDetailJSON", got, e, inColumns...)
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(b, &keys); err != nil {
		t.Fatal(err)
	}
	for _, f := range store.LedgerFields() {
		_, has := keys[f.JSON]
		if want := !slices.Contains(inColumns, f.Name); has != want {
			t.Errorf("AppendLedgerEntryDetailJSON: %q written %v, want %v", f.JSON, has, want)
		}
	}
}
