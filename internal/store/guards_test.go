package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

func TestCursor(t *testing.T) {
	tests := []struct {
		name   string
		key    []byte
		cursor string
	}{
		{"none", nil, ""},
		{"subscription", []byte("alice\x00svc"), "YWxpY2UAc3Zj"},
		{"alert", []byte{0, 0, 0, 0, 0, 0, 1, 0xff}, "AAAAAAAAAf8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := store.EncodeCursor(tt.key)
			if c != tt.cursor {
				t.Fatalf("EncodeCursor = %q, want %q", c, tt.cursor)
			}
			back, err := store.DecodeCursor(c)
			if err != nil || string(back) != string(tt.key) || (back == nil) != (tt.key == nil) {
				t.Errorf("DecodeCursor(%q) = %q, %v", c, back, err)
			}
		})
	}
	for _, bad := range []string{"!!", "YWxpY2U=", "a"} {
		if _, err := store.DecodeCursor(bad); !errors.Is(err, store.ErrBadCursor) {
			t.Errorf("DecodeCursor(%q) = %v, want ErrBadCursor", bad, err)
		}
	}
	if k, err := store.DecodeAlertCursor("AAAAAAAAAf8"); err != nil || len(k) != 8 {
		t.Errorf("DecodeAlertCursor of 8 bytes = %v, %v", k, err)
	}
	if k, err := store.DecodeAlertCursor(""); err != nil || k != nil {
		t.Errorf("DecodeAlertCursor(\"\") = %v, %v", k, err)
	}
	if _, err := store.DecodeAlertCursor("YWxpY2UAc3Zj"); !errors.Is(err, store.ErrBadCursor) {
		t.Errorf("DecodeAlertCursor of 9 bytes = %v, want ErrBadCursor", err)
	}
}

func TestGuards(t *testing.T) {
	for _, tt := range []struct {
		u  billing.Units
		ok bool
	}{{0, true}, {1, true}, {billing.MaxUnits, true}, {-1, false}} {
		if err := store.CheckUnits(tt.u); (err == nil) != tt.ok || err != nil && !errors.Is(err, billing.ErrInvalidUnits) {
			t.Errorf("CheckUnits(%s) = %v", tt.u, err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	//lint:ignore SA1012 a nil context is what CtxErr guards against
	if store.CtxErr(nil) != nil || store.CtxErr(ctx) != nil {
		t.Error("CtxErr of a live or nil context is not nil")
	}
	cancel()
	if !errors.Is(store.CtxErr(ctx), context.Canceled) {
		t.Error("CtxErr of a cancelled context is not Canceled")
	}
	s := billing.State{Used: 1, Reserved: 2, Spend: 3, ReservedSpend: 4, Credits: 5, CreditsHeld: 6}
	if got, want := store.PricingState(s), (billing.State{Used: 1, Spend: 3, ReservedSpend: 4, Credits: 5, CreditsHeld: 6}); got != want {
		t.Errorf("PricingState = %+v, want %+v", got, want)
	}
}
