package servicekey_test

import (
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/servicekey"
)

func TestStatusAt(t *testing.T) {
	now := time.Date(2024, 3, 20, 12, 0, 0, 0, time.UTC)
	var never time.Time
	tests := []struct {
		name             string
		revoked, expires time.Time
		want             servicekey.Status
	}{
		{"neither", never, never, servicekey.Active},
		{"expires later", never, now.Add(time.Nanosecond), servicekey.Active},
		{"expires exactly now", never, now, servicekey.Expired},
		{"expired before", never, now.Add(-time.Hour), servicekey.Expired},
		{"revoked", now.Add(-time.Hour), never, servicekey.Revoked},
		{"revoked in the future still counts", now.Add(time.Hour), never, servicekey.Revoked},
		{"revoked wins over expired", now.Add(-time.Hour), now.Add(-2 * time.Hour), servicekey.Revoked},
		{"revoked, expiring later", now.Add(-time.Hour), now.Add(time.Hour), servicekey.Revoked},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := servicekey.StatusAt(tt.revoked, tt.expires, now); got != tt.want {
				t.Errorf("StatusAt(%v, %v, now) = %q, want %q", tt.revoked, tt.expires, got, tt.want)
			}
			if got := servicekey.ActiveAt(tt.revoked, tt.expires, now); got != (tt.want == servicekey.Active) {
				t.Errorf("ActiveAt(%v, %v, now) = %v for status %q", tt.revoked, tt.expires, got, tt.want)
			}
		})
	}
}
