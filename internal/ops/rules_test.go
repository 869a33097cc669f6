package ops

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/platformgw/gateway/internal/billing"
)

func TestValidUserID(t *testing.T) {
	for _, tt := range []struct {
		id   string
		want bool
	}{
		{"alice", true},
		{"sub-ext-id", true},
		{"user@example.com", true},
		{"Jürgen Müller", true},
		{"+15551234567", true},
		{strings.Repeat("x", 128), true},
		{"", false},
		{strings.Repeat("x", 129), false},
		{"a/b", false},
		{"a\x00b", false},
		{"a\tb", false},
		{"a\r\nX-Injected: 1", false},
		{" alice", false},
		{"alice ", false},
		{"\xff", false},
		{"a\u200bb", false}, // zero-width space: not printable
	} {
		if got := ValidUserID(tt.id); got != tt.want {
			t.Errorf("ValidUserID(%q) = %v, want %v", tt.id, got, tt.want)
		}
	}
}

func TestParseSignedUnits(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want billing.Units
		ok   bool
	}{
		{`10.5`, 10_500_000, true},
		{`"10.5"`, 10_500_000, true},
		{`-0.25`, -250_000, true},
		{`"-3"`, -3_000_000, true},
		{`1e2`, 100_000_000, true},
		{`0`, 0, true},
		{`-`, 0, false},
		{`--1`, 0, false},
		{`-+1`, 0, false},
		{`"abc"`, 0, false},
		{`0.0000001`, 0, false},
		{`true`, 0, false},
	} {
		got, err := parseSignedUnits(json.RawMessage(tt.in))
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("parseSignedUnits(%s) = %v, %v; want %v, ok %v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

func TestCSVText(t *testing.T) {
	for in, want := range map[string]string{
		"":             "",
		"alice":        "alice",
		"=1+1":         "'=1+1",
		"+1":           "'+1",
		"-1":           "'-1",
		"@SUM(A1)":     "'@SUM(A1)",
		"\t=1":         "'\t=1",
		"\r=1":         "'\r=1",
		"a=b":          "a=b",
		"'already":     "'already",
		"req-1,with,,": "req-1,with,,",
	} {
		if got := csvText(in); got != want {
			t.Errorf("csvText(%q) = %q, want %q", in, got, want)
		}
	}
}
