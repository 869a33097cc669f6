package platformgw

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
)

func TestParseInvokePath(t *testing.T) {
	prefixes := []string{"/api", "/gateway/api/v1"}
	cases := []struct {
		path              string
		ok, bad, async    bool
		service, endpoint string
	}{
		{"/api/service/s/endpoint/e/invoke", true, false, false, "s", "e"},
		{"/api/service/s/endpoint/e/invoke/async", true, false, true, "s", "e"},
		{"/gateway/api/v1/service/s.1/endpoint/e-2/invoke", true, false, false, "s.1", "e-2"},
		{"/api/service/s/endpoint/e/invoke/", true, true, false, "", ""},
		{"/api/service/s/endpoint/e", true, true, false, "", ""},
		{"/api/service//endpoint/e/invoke", true, true, false, "", ""},
		{"/api/service/s/endpoint//invoke", true, true, false, "", ""},
		{"/api/service/s/x/e/invoke", true, true, false, "", ""},
		{"/api/service/s/endpoint/e/invoke/sync", true, true, false, "", ""},
		{"/api/service/", true, true, false, "", ""},
		{"/api/usage/report", false, false, false, "", ""},
		{"/api/requests/1/status", false, false, false, "", ""},
		{"/apiservice/s/endpoint/e/invoke", false, false, false, "", ""},
		{"/other", false, false, false, "", ""},
	}
	for _, tc := range cases {
		r, ok := parseInvokePath(prefixes, tc.path)
		if ok != tc.ok || r.bad != tc.bad || r.async != tc.async || (!r.bad && (r.serviceID != tc.service || r.endpointID != tc.endpoint)) {
			t.Errorf("%s: got %+v ok=%v", tc.path, r, ok)
		}
	}
}

func TestStripCallerHeaders(t *testing.T) {
	h := http.Header{}
	h["X-Platform-User-Id"] = []string{"evil"}
	h["X_Platform_User_ID"] = []string{"evil"}
	h["x-platform-roles"] = []string{"admin"}
	h["X_PLATFORM_SIGNATURE"] = []string{"forged"}
	h.Set("Authorization", "Bearer psk_x")
	h.Set("Connection", "keep-alive, X-Platform-Signature, x_platform_user_id, Upgrade")
	h.Set("X-Other", "kept")
	h.Set("X-Platformish", "kept") // not the brand prefix: "x-platform-" needs the dash
	stripCallerHeaders(h, "x-platform-")
	for name := range h {
		if hasBrandPrefix(name, "x-platform-") || strings.EqualFold(name, "Authorization") {
			t.Errorf("%s survived", name)
		}
	}
	if h.Get("Connection") != "keep-alive, Upgrade" {
		t.Errorf("Connection %q", h.Get("Connection"))
	}
	if h.Get("X-Other") != "kept" || h.Get("X-Platformish") != "kept" {
		t.Error("unrelated headers removed")
	}
	h2 := http.Header{"Connection": {"X-Platform-Signature"}}
	stripCallerHeaders(h2, "x-platform-")
	if _, ok := h2["Connection"]; ok {
		t.Error("an emptied Connection header must go")
	}
}

func TestAllowanceHeaders(t *testing.T) {
	q := billing.Whole(1000)
	p := &billing.Product{Quota: &q}
	start := time.Date(2026, 11, 17, 0, 0, 0, 0, time.UTC)
	end := start.AddDate(0, 1, 0)
	now := end.Add(-90 * time.Second)
	var a allowance
	a.setQuota(p, billing.State{Used: billing.Whole(2), Reserved: 1_500_000}, start, end, now)
	a.rate(&billing.RateLimit{Requests: 20, WindowSeconds: 1}, 19, 50*time.Millisecond) // the next token in 50 ms
	h := http.Header{}
	a.write(h)
	want := map[string]string{
		"RateLimit-Policy":      `"quota";q=1000;w=2592000, "rate";q=20;w=1`,
		"RateLimit":             `"quota";r=996;t=90, "rate";r=19;t=1`,
		"X-RateLimit-Limit":     "1000",
		"X-RateLimit-Remaining": "996",
		"X-RateLimit-Reset":     "90",
	}
	for k, v := range want {
		if h.Get(k) != v {
			t.Errorf("%s = %q, want %q", k, h.Get(k), v)
		}
	}
	if a.resetAfter() != 90*time.Second {
		t.Errorf("reset %v", a.resetAfter())
	}
	var none allowance
	h = http.Header{}
	none.write(h)
	if len(h) != 0 {
		t.Errorf("no limits, no headers: %v", h)
	}
}
