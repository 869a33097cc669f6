package billing_test

import (
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
)

func TestRateLimitDefaults(t *testing.T) {
	tests := []struct {
		name     string
		rl       billing.RateLimit
		window   time.Duration
		capacity int
	}{
		{"all set", billing.RateLimit{Requests: 10, WindowSeconds: 60, Burst: 3}, time.Minute, 3},
		{"window defaults to a second", billing.RateLimit{Requests: 10}, time.Second, 10},
		{"burst defaults to requests", billing.RateLimit{Requests: 5, WindowSeconds: 7}, 7 * time.Second, 5},
		{"negative window is a second", billing.RateLimit{Requests: 5, WindowSeconds: -3}, time.Second, 5},
		{"negative burst is requests", billing.RateLimit{Requests: 5, Burst: -1}, time.Second, 5},
		{"burst above requests kept", billing.RateLimit{Requests: 2, WindowSeconds: 1, Burst: 9}, time.Second, 9},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.rl.Window(); got != tt.window {
				t.Errorf("Window() = %v, want %v", got, tt.window)
			}
			if got := tt.rl.Capacity(); got != tt.capacity {
				t.Errorf("Capacity() = %d, want %d", got, tt.capacity)
			}
		})
	}
}
