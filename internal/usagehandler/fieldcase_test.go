package usagehandler

import "testing"

// TestFieldNamedInAnotherCase: a body name that encoding/json would take
// for a field (any case, Unicode simple folding) is refused naming the
// field; other names are unknown fields, allowed.
func TestFieldNamedInAnotherCase(t *testing.T) {
	for _, tc := range []struct {
		body, name string
		refused    bool
	}{
		{`{"units":1}`, "units", false},
		{`{"Units":1}`, "units", true},
		{`{"units":1,"UNITS":2}`, "units", true},
		{`{"ſtatus":"FAILED"}`, "status", true},
		{`{"service\u212aey":"k"}`, "serviceKey", true}, // the Kelvin sign
		{`{"unitsUsed":1}`, "units", false},
		{`{"unit":1,"unitss":1,"_units":1,"":1}`, "units", false},
		{`{"result":{"Units":1}}`, "units", false},
	} {
		f, e := parseObject([]byte(tc.body))
		if e != nil {
			t.Fatalf("%s: %v", tc.body, e)
		}
		_, _, e = f.get(tc.name)
		if (e != nil) != tc.refused {
			t.Errorf("%s, field %s: refused %v, want %v", tc.body, tc.name, e, tc.refused)
		}
		if e != nil && e.Field != tc.name {
			t.Errorf("%s: field %q, want %q", tc.body, e.Field, tc.name)
		}
	}
}
