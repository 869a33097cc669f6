package ops

import (
	"strings"
	"testing"
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
