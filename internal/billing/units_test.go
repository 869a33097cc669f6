package billing_test

import (
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/platformgw/gateway/internal/billing"
)

func TestParseUnits(t *testing.T) {
	tests := []struct {
		in   string
		want billing.Units
		bad  bool
	}{
		{in: "0", want: 0},
		{in: "12", want: billing.Whole(12)},
		{in: "007", want: billing.Whole(7)},
		{in: "0.5", want: 500_000},
		{in: "0.1", want: 100_000},
		{in: "1.25", want: 1_250_000},
		{in: "0.000001", want: 1},
		{in: "123.456789", want: 123_456_789},
		{in: "0.0000010", want: 1}, // trailing zeros past six places change nothing
		{in: "0.0000001", bad: true},
		{in: "1.0000001", bad: true},
		{in: "+3", want: billing.Whole(3)},
		{in: "+.5", want: 500_000},
		{in: ".5", want: 500_000},
		{in: "5.", want: billing.Whole(5)},
		{in: "1e3", want: billing.Whole(1000)},
		{in: "1E3", want: billing.Whole(1000)},
		{in: "1e+3", want: billing.Whole(1000)},
		{in: "1.5e3", want: billing.Whole(1500)},
		{in: "1e-6", want: 1},
		{in: "1.5e-5", want: 15},
		{in: "1.5e-6", bad: true}, // 0.0000015: seven places
		{in: "1e-7", bad: true},
		{in: "0e-7", want: 0},
		{in: "0e30", want: 0},
		{in: "1000000000000", want: billing.MaxUnits},
		{in: "1e12", want: billing.MaxUnits},
		{in: "1000000000000.000001", bad: true},
		{in: "1000000000001", bad: true},
		{in: "99999999999999999999", bad: true},
		{in: "1e13", bad: true},
		{in: "1e30", bad: true},
		{in: "1e31", bad: true},
		{in: "1e99999999999999999999", bad: true},
		{in: "", bad: true},
		{in: "+", bad: true},
		{in: ".", bad: true},
		{in: "-1", bad: true},
		{in: "-0.5", bad: true},
		{in: "++1", bad: true},
		{in: "+-1", bad: true},
		{in: " 1", bad: true},
		{in: "1 ", bad: true},
		{in: "1,5", bad: true},
		{in: "1_000", bad: true},
		{in: "1.2.3", bad: true},
		{in: "0x10", bad: true},
		{in: "e3", bad: true},
		{in: "1e", bad: true},
		{in: "1e3.5", bad: true},
		{in: "NaN", bad: true},
		{in: "Inf", bad: true},
		{in: "abc", bad: true},
		{in: "١", bad: true}, // an Arabic-Indic digit is not a decimal digit here
	}
	for _, tt := range tests {
		got, err := billing.ParseUnits(tt.in)
		if tt.bad {
			if err == nil {
				t.Errorf("ParseUnits(%q) = %d, want an error", tt.in, got)
			} else if !errors.Is(err, billing.ErrInvalidUnits) {
				t.Errorf("ParseUnits(%q) error %v does not wrap ErrInvalidUnits", tt.in, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseUnits(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		}
	}
}

func TestUnitsString(t *testing.T) {
	tests := []struct {
		u    billing.Units
		want string
	}{
		{0, "0"},
		{1, "0.000001"},
		{500_000, "0.5"},
		{1_500_000, "1.5"},
		{billing.Whole(2), "2"},
		{123_456_789, "123.456789"},
		{billing.MaxUnits, "1000000000000"},
		{-1_500_000, "-1.5"},
		{math.MaxInt64, "9223372036854.775807"},
		{math.MinInt64, "-9223372036854.775808"},
	}
	for _, tt := range tests {
		if got := tt.u.String(); got != tt.want {
			t.Errorf("Units(%d).String() = %q, want %q", int64(tt.u), got, tt.want)
		}
	}
}

func TestUnitsStringRoundTrip(t *testing.T) {
	values := []billing.Units{0, 1, 9, 10, 99, 100_000, 999_999, 1_000_000, 1_000_001,
		123_456_789, billing.MaxUnits - 1, billing.MaxUnits}
	for u := billing.Units(1); u < billing.MaxUnits/7; u = u*7 + 3 {
		values = append(values, u)
	}
	for _, u := range values {
		got, err := billing.ParseUnits(u.String())
		if err != nil || got != u {
			t.Errorf("ParseUnits(%q) = %d, %v; want %d", u.String(), got, err, u)
		}
	}
}

func TestUnitsJSON(t *testing.T) {
	type doc struct {
		A billing.Units  `json:"a"`
		B *billing.Units `json:"b,omitempty"`
	}
	for _, u := range []billing.Units{0, 1, 250_000, billing.Whole(42), 123_456_789, billing.MaxUnits} {
		raw, err := json.Marshal(doc{A: u, B: &u})
		if err != nil {
			t.Fatal(err)
		}
		want := `{"a":` + u.String() + `,"b":` + u.String() + `}`
		if string(raw) != want {
			t.Errorf("Marshal(%d) = %s, want %s", u, raw, want)
		}
		var back doc
		if err := json.Unmarshal(raw, &back); err != nil || back.A != u || back.B == nil || *back.B != u {
			t.Errorf("round trip of %s: %+v, %v", raw, back, err)
		}
		// The string form, as some clients send numbers.
		quoted := `{"a":"` + u.String() + `","b":"` + u.String() + `"}`
		back = doc{}
		if err := json.Unmarshal([]byte(quoted), &back); err != nil || back.A != u || *back.B != u {
			t.Errorf("Unmarshal(%s) = %+v, %v", quoted, back, err)
		}
	}

	good := []struct {
		in   string
		want billing.Units
	}{
		{`{"a":1e3}`, billing.Whole(1000)},
		{`{"a":0.1}`, 100_000},
		{`{"a":"0.000001"}`, 1},
		{`{"a":2.50}`, 2_500_000},
	}
	for _, tt := range good {
		var d doc
		if err := json.Unmarshal([]byte(tt.in), &d); err != nil || d.A != tt.want {
			t.Errorf("Unmarshal(%s) = %d, %v; want %d", tt.in, d.A, err, tt.want)
		}
	}
	for _, in := range []string{`{"a":-1}`, `{"a":0.0000001}`, `{"a":""}`, `{"a":"x"}`, `{"a":true}`, `{"a":1e13}`} {
		var d doc
		if err := json.Unmarshal([]byte(in), &d); err == nil {
			t.Errorf("Unmarshal(%s) = %d, want an error", in, d.A)
		}
	}

	// null leaves the value alone, as encoding/json does for its own types.
	d := doc{A: 7}
	if err := json.Unmarshal([]byte(`{"a":null,"b":null}`), &d); err != nil || d.A != 7 || d.B != nil {
		t.Errorf("Unmarshal of null = %+v, %v; want A untouched and B nil", d, err)
	}
}

func TestMul(t *testing.T) {
	tests := []struct {
		u, price, want billing.Units
	}{
		{billing.Whole(3), billing.Whole(2), billing.Whole(6)},
		{billing.Whole(10), 250_000, 2_500_000},
		{1, 1, 0},         // 1e-12 rounds to zero
		{1, 499_999, 0},   // 0.499999 millionth rounds down
		{1, 500_000, 1},   // exactly half a millionth rounds up
		{3, 500_000, 2},   // 1.5 millionths rounds up
		{1, 1_500_000, 2}, // 1.5 millionths rounds up
		{billing.Whole(1), 333_333, 333_333},
		{333_333, 3_000_000, 999_999},
		{0, billing.Whole(5), 0},
		{billing.Whole(5), 0, 0},
		{-billing.Whole(5), billing.Whole(5), 0},
		{billing.MaxUnits, billing.Whole(1), billing.MaxUnits},
		{billing.MaxUnits, billing.Whole(9), 9 * billing.MaxUnits},
		{billing.MaxUnits, billing.Whole(10), math.MaxInt64}, // 1e19 millionths saturates
		{billing.MaxUnits, billing.MaxUnits, math.MaxInt64},
		{math.MaxInt64, math.MaxInt64, math.MaxInt64},
	}
	for _, tt := range tests {
		if got := billing.Mul(tt.u, tt.price); got != tt.want {
			t.Errorf("Mul(%s, %s) = %s, want %s", tt.u, tt.price, got, tt.want)
		}
	}
}

func TestDiv(t *testing.T) {
	tests := []struct {
		budget, price, want billing.Units
	}{
		{billing.Whole(10), billing.Whole(2), billing.Whole(5)},
		{billing.Whole(10), billing.Whole(3), 3_333_333}, // rounded down
		{billing.Whole(1), 250_000, billing.Whole(4)},
		{1, billing.Whole(2), 0},
		{0, billing.Whole(2), 0},
		{-5, billing.Whole(2), 0},
		{billing.Whole(10), 0, math.MaxInt64},
		{math.MaxInt64, 1, math.MaxInt64},
		{billing.MaxUnits, billing.Whole(1), billing.MaxUnits},
	}
	for _, tt := range tests {
		if got := billing.Div(tt.budget, tt.price); got != tt.want {
			t.Errorf("Div(%s, %s) = %s, want %s", tt.budget, tt.price, got, tt.want)
		}
	}
	// What Div says is affordable costs at most the budget, and one millionth
	// more does not.
	for _, c := range []struct{ budget, price billing.Units }{
		{billing.Whole(10), billing.Whole(3)}, {7_777_777, 123_457}, {billing.Whole(1), 3},
	} {
		n := billing.Div(c.budget, c.price)
		if billing.Mul(n, c.price) > c.budget {
			t.Errorf("Div(%s, %s) = %s costs %s, over budget", c.budget, c.price, n, billing.Mul(n, c.price))
		}
	}
}

func TestParseStoredUnits(t *testing.T) {
	tests := []struct {
		in   string
		want billing.Units
		ok   bool
	}{
		{"0", 0, true},
		{"-0", 0, true},
		{"12", billing.Whole(12), true},
		{"1.5", 1_500_000, true},
		{"0.000001", 1, true},
		{"-2.25", -2_250_000, true},
		{"007.100000", 7_100_000, true},
		{"3.", billing.Whole(3), true},
		{"9223372036854.775807", math.MaxInt64, true},
		{"-9223372036854.775808", math.MinInt64, true},
		{"2000000000000", billing.Whole(2_000_000_000_000), true}, // past MaxUnits: stored figures go there
		{"9223372036854.775808", 0, false},
		{"-9223372036854.775809", 0, false},
		{"99999999999999999999", 0, false},
		{"", 0, false},
		{"-", 0, false},
		{".5", 0, false},
		{"+1", 0, false},
		{"1e3", 0, false},
		{"1.0000001", 0, false},
		{"1.2.3", 0, false},
		{"--1", 0, false},
		{" 1", 0, false},
		{"1_000", 0, false},
		{"0x10", 0, false},
	}
	for _, tt := range tests {
		got, err := billing.ParseStoredUnits(tt.in)
		if tt.ok && (err != nil || got != tt.want) {
			t.Errorf("ParseStoredUnits(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		}
		if !tt.ok && (err == nil || !errors.Is(err, billing.ErrInvalidUnits)) {
			t.Errorf("ParseStoredUnits(%q) = %d, %v; want an invalid-units error", tt.in, got, err)
		}
	}
	// Whatever String writes reads back.
	r := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		u := billing.Units(r.Int64())
		if r.IntN(2) == 0 {
			u = -u
		}
		if got, err := billing.ParseStoredUnits(u.String()); err != nil || got != u {
			t.Fatalf("ParseStoredUnits(%q) = %d, %v; want %d", u.String(), got, err, u)
		}
	}
}

func TestGrouped(t *testing.T) {
	for in, want := range map[string]string{"0": "0", "999": "999", "1000": "1,000", "100000": "100,000", "2000000": "2,000,000",
		"1234.5": "1,234.5", "-1234567.25": "-1,234,567.25", "0.000001": "0.000001"} {
		u, err := billing.ParseStoredUnits(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := u.Grouped(); got != want {
			t.Errorf("%s: %q, want %q", in, got, want)
		}
	}
}
