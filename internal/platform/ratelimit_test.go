package platform

import (
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
)

// TestLimitersPooled: the buckets outlive a reload (the new config takes
// them before the old one lets go) and are dropped with the last config.
func TestLimitersPooled(t *testing.T) {
	rl := &billing.RateLimit{Requests: 1, WindowSeconds: 60}
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	old := &App{limiters: newLimiterSet()}
	if ok, _, _ := old.Allow("key-pooled", "svc", rl, at); !ok {
		t.Fatal("first call refused")
	}
	reloaded := &App{limiters: newLimiterSet()}
	old.releaseLimiters()
	if ok, _, _ := reloaded.Allow("key-pooled", "svc", rl, at); ok {
		t.Error("a reload handed the key a fresh bucket")
	}
	reloaded.releaseLimiters()
	reloaded.releaseLimiters() // twice is harmless
	fresh := &App{limiters: newLimiterSet()}
	defer fresh.releaseLimiters()
	if ok, _, _ := fresh.Allow("key-pooled", "svc", rl, at); !ok {
		t.Error("the buckets outlived every config")
	}
}
