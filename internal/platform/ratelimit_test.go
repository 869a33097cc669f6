package platform

import (
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
)

// TestLimitersPooled: the buckets and the hold estimates outlive a reload
// (the new config takes them before the old one lets go) and are dropped
// with the last config.
func TestLimitersPooled(t *testing.T) {
	rl := &billing.RateLimit{Requests: 1, WindowSeconds: 60}
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cost := billing.Whole(1)
	pooled := func() *App {
		a := &App{}
		a.limiters, a.claims = newLimiterSet()
		return a
	}
	old := pooled()
	if ok, _, _ := old.Allow("key-pooled", "svc", rl, at); !ok {
		t.Fatal("first call refused")
	}
	old.claims.Note("u", "svc", "ep", cost, billing.Whole(5))
	reloaded := pooled()
	old.releaseLimiters()
	if ok, _, _ := reloaded.Allow("key-pooled", "svc", rl, at); ok {
		t.Error("a reload handed the key a fresh bucket")
	}
	if got := reloaded.claims.Hold("u", "svc", "ep", cost); got != billing.Whole(5) {
		t.Errorf("a reload put the hold back at the cost: %s", got)
	}
	reloaded.releaseLimiters()
	reloaded.releaseLimiters() // twice is harmless
	fresh := pooled()
	defer fresh.releaseLimiters()
	if ok, _, _ := fresh.Allow("key-pooled", "svc", rl, at); !ok {
		t.Error("the buckets outlived every config")
	}
	if got := fresh.claims.Hold("u", "svc", "ep", cost); got != cost {
		t.Errorf("the hold estimates outlived every config: %s", got)
	}
}
