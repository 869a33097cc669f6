package sdk_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/platformgw/gateway/sdk"
)

const (
	serviceKey = "psk_0123456789abcdefghijABCDEFGHIJ0123456"
	validBody  = `{"valid":true,"serviceKeyId":"019aa8d2-3c1f-7b4e-9a2d-5f60c1e8b7a4","userId":"user-1","serviceId":"svc-1","serviceProductId":"prod-1","roles":["reader"],"subscriptionStatus":"ACTIVE","billingModelType":"PREPAID","measurementType":"PER_TOKEN","unitLabel":"token","timestamp":$TS,"error":null,"validationSchemaVersion":3}`
	badKeyBody = `{"valid":false,"error":"key_revoked","code":"key_revoked","message":"the service key was revoked","requestId":"srv-9","validationSchemaVersion":3,"timestamp":$TS}`
)

func estimateBody(allow bool, code string) string {
	b, _ := json.Marshal(map[string]any{
		"sufficientCredits": code != "insufficient_credits", "wouldExceedCap": code == "quota_exceeded",
		"wouldAllow": allow, "estimatedCost": 2.5, "billingModelType": "PREPAID", "measurementType": "PER_TOKEN",
		"unitLabel": "token", "breakdown": map[string]any{"unitsUsed": 10, "totalUnitsUsedThisCycle": 0,
			"isOverLimit": false, "isOverage": false, "isOverageAllowed": false, "remainingCredits": 7.5},
		"estimateSchemaVersion": 3, "timestamp": nowUnix,
	})
	if code != "" {
		var m map[string]any
		json.Unmarshal(b, &m)
		m["code"], m["message"] = code, "no"
		b, _ = json.Marshal(m)
	}
	return string(b)
}

func TestValidateKey(t *testing.T) {
	s := newUsageServer(t)
	s.preflightStatus, s.preflightBody = http.StatusOK, validBody
	c := newClient(t, s, newSleeps())
	v, err := c.ValidateKey(context.Background(), serviceKey)
	if err != nil {
		t.Fatalf("ValidateKey: %v", err)
	}
	if !v.Valid || v.UserID != "user-1" || v.ServiceKeyID != "019aa8d2-3c1f-7b4e-9a2d-5f60c1e8b7a4" || v.ServiceProductID != "prod-1" ||
		len(v.Roles) != 1 || v.ValidationSchemaVersion != 3 || v.SubscriptionStatus != "ACTIVE" ||
		v.BillingModelType != "PREPAID" || v.UnitLabel != "token" || !v.IsSubscriber() || !v.Timestamp.Equal(now) {
		t.Errorf("validation = %+v", v)
	}
	// The request: {serviceKey, serviceId}, signed like a report (the
	// server verified it).
	var req map[string]string
	json.Unmarshal([]byte(s.body("validate", 0)), &req)
	if len(req) != 2 || req["serviceKey"] != serviceKey || req["serviceId"] != "svc-1" {
		t.Errorf("request body = %s", []byte(s.body("validate", 0)))
	}
}

func TestValidateKeyVerdicts(t *testing.T) {
	for _, tt := range []struct {
		name    string
		setup   func(*usageServer)
		opts    []sdk.Option
		secret  string
		check   func(*testing.T, *sdk.KeyValidation, error)
		retries int
	}{
		{name: "revoked key is a signed answer, not an error",
			setup: func(s *usageServer) { s.preflightStatus, s.preflightBody = http.StatusUnauthorized, badKeyBody },
			check: func(t *testing.T, v *sdk.KeyValidation, err error) {
				if err != nil || v.Valid || v.Code != "key_revoked" || v.RequestID != "srv-9" {
					t.Fatalf("validation %+v, err %v", v, err)
				}
			}},
		{name: "tampered answer",
			setup: func(s *usageServer) {
				s.preflightStatus, s.preflightBody, s.preflightTamper = http.StatusOK, validBody, true
			},
			check: func(t *testing.T, v *sdk.KeyValidation, err error) {
				if !errors.Is(err, sdk.ErrResponseSignature) || v != nil {
					t.Fatalf("validation %+v, err %v; want ErrResponseSignature", v, err)
				}
			}},
		{name: "unsigned answer",
			setup: func(s *usageServer) {
				s.preflightStatus, s.preflightBody, s.preflightUnsigned = http.StatusOK, validBody, true
			},
			check: func(t *testing.T, v *sdk.KeyValidation, err error) {
				if !errors.Is(err, sdk.ErrResponseSignature) {
					t.Fatalf("err %v; want ErrResponseSignature", err)
				}
			}},
		{name: "replayed old answer",
			setup: func(s *usageServer) {
				s.preflightStatus, s.preflightBody, s.preflightSignedAt = http.StatusOK, validBody, now.Add(-10*time.Minute)
			},
			check: func(t *testing.T, v *sdk.KeyValidation, err error) {
				if !errors.Is(err, sdk.ErrResponseSignature) {
					t.Fatalf("err %v; want ErrResponseSignature", err)
				}
			}},
		{name: "answer signed with a secret the client does not hold",
			setup: func(s *usageServer) {
				s.preflightStatus, s.preflightBody = http.StatusOK, validBody
				s.secrets = []string{newSecret, secret} // rotated: answers signed with the new one
			},
			check: func(t *testing.T, v *sdk.KeyValidation, err error) {
				if !errors.Is(err, sdk.ErrResponseSignature) {
					t.Fatalf("err %v; want ErrResponseSignature", err)
				}
			}},
		{name: "rotation: the client knows the new secret",
			setup: func(s *usageServer) {
				s.preflightStatus, s.preflightBody = http.StatusOK, validBody
				s.secrets = []string{newSecret, secret}
			},
			opts: []sdk.Option{sdk.WithResponseSecrets(newSecret)},
			check: func(t *testing.T, v *sdk.KeyValidation, err error) {
				if err != nil || !v.Valid {
					t.Fatalf("validation %+v, err %v", v, err)
				}
			}},
		{name: "this service's own request refused",
			secret: "not-the-secret",
			setup:  func(s *usageServer) { s.preflightStatus, s.preflightBody = http.StatusOK, validBody },
			check: func(t *testing.T, v *sdk.KeyValidation, err error) {
				if !sdk.IsCode(err, sdk.CodeInvalidSignature) || v != nil {
					t.Fatalf("validation %+v, err %v; want an invalid_signature APIError", v, err)
				}
			}},
		{name: "an answer about another service",
			setup: func(s *usageServer) {
				s.preflightStatus = http.StatusOK
				s.preflightBody = `{"valid":true,"userId":"user-1","serviceId":"svc-2","validationSchemaVersion":3,"timestamp":$TS}`
			},
			check: func(t *testing.T, v *sdk.KeyValidation, err error) {
				if err == nil {
					t.Fatalf("validation %+v accepted", v)
				}
			}},
		{name: "unavailable is retried",
			setup: func(s *usageServer) {
				s.preflightStatus, s.preflightBody = http.StatusOK, validBody
				s.faults = func(_ string, n int) fault {
					if n == 1 {
						return fail503
					}
					return noFault
				}
			},
			retries: 1,
			check: func(t *testing.T, v *sdk.KeyValidation, err error) {
				if err != nil || !v.Valid {
					t.Fatalf("validation %+v, err %v", v, err)
				}
			}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newUsageServer(t)
			tt.setup(s)
			sl := newSleeps()
			key := secret
			if tt.secret != "" {
				key = tt.secret
			}
			c, err := sdk.NewClient(s.srv.URL, "svc-1", key, append([]sdk.Option{sdk.WithClock(sl.now), sdk.WithSleep(sl.sleep)}, tt.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			v, err := c.ValidateKey(context.Background(), serviceKey)
			tt.check(t, v, err)
			if got := s.count("validate"); got != 1+tt.retries {
				t.Errorf("%d requests, want %d", got, 1+tt.retries)
			}
		})
	}
}

func TestValidateKeyCorePrefixAndBase(t *testing.T) {
	core := newUsageServer(t)
	core.preflightStatus, core.preflightBody = http.StatusOK, validBody
	c, err := sdk.NewClient("http://usage.invalid", "svc-1", secret,
		sdk.WithCoreBaseURL(core.srv.URL), sdk.WithCorePrefix("core/api/v1"), sdk.WithClock(fixedClock))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ValidateKey(context.Background(), serviceKey); err != nil {
		t.Fatalf("ValidateKey: %v", err)
	}
	if p := core.seen["validate"][0].URL.Path; p != "/core/api/v1/service-keys/validate" {
		t.Errorf("path = %s", p)
	}
}

func TestEstimateUsage(t *testing.T) {
	for _, tt := range []struct {
		name   string
		status int
		body   string
		check  func(*testing.T, *sdk.Estimate, error)
	}{
		{"allowed", http.StatusOK, estimateBody(true, ""), func(t *testing.T, e *sdk.Estimate, err error) {
			if err != nil || !e.WouldAllow || !e.SufficientCredits || e.WouldExceedCap || e.Status != 200 ||
				e.EstimatedCost != units(t, "2.5") || e.EstimateSchemaVersion != 3 || e.UnitLabel != "token" ||
				e.Breakdown.RemainingCredits == nil || *e.Breakdown.RemainingCredits != units(t, "7.5") || !e.Timestamp.Equal(now) {
				t.Fatalf("estimate %+v, err %v", e, err)
			}
		}},
		{"insufficient credits", http.StatusForbidden, estimateBody(false, "insufficient_credits"), func(t *testing.T, e *sdk.Estimate, err error) {
			if err != nil || e.WouldAllow || e.SufficientCredits || e.Status != 403 || e.Code != "insufficient_credits" {
				t.Fatalf("estimate %+v, err %v", e, err)
			}
		}},
		{"quota would be exceeded: an answer, not retried", http.StatusTooManyRequests, estimateBody(false, "quota_exceeded"), func(t *testing.T, e *sdk.Estimate, err error) {
			if err != nil || e.WouldAllow || !e.WouldExceedCap || e.Status != 429 || e.RetryAfter != time.Hour {
				t.Fatalf("estimate %+v, err %v", e, err)
			}
		}},
		{"bad key is an error", http.StatusUnauthorized, `{"code":"invalid_key","message":"unknown key"}`, func(t *testing.T, e *sdk.Estimate, err error) {
			var ae *sdk.APIError
			if !errors.As(err, &ae) || ae.Status != 401 || ae.Code != "invalid_key" || e != nil {
				t.Fatalf("estimate %+v, err %v", e, err)
			}
		}},
		{"no subscription is an error", http.StatusForbidden, `{"code":"no_subscription","message":"none"}`, func(t *testing.T, e *sdk.Estimate, err error) {
			if !sdk.IsCode(err, sdk.CodeNoSubscription) || e != nil {
				t.Fatalf("estimate %+v, err %v", e, err)
			}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newUsageServer(t)
			s.preflightStatus, s.preflightBody = tt.status, tt.body
			sl := newSleeps()
			c := newClient(t, s, sl)
			e, err := c.EstimateUsage(context.Background(), serviceKey, sdk.WholeUnits(10))
			tt.check(t, e, err)
			if s.count("estimate") != 1 || len(sl.recorded()) != 0 {
				t.Errorf("%d requests, waits %v", s.count("estimate"), sl.recorded())
			}
			var req map[string]json.RawMessage
			json.Unmarshal([]byte(s.body("estimate", 0)), &req)
			if string(req["estimatedUnits"]) != "10" || string(req["serviceId"]) != `"svc-1"` || string(req["serviceKey"]) != `"`+serviceKey+`"` {
				t.Errorf("request body = %s", []byte(s.body("estimate", 0)))
			}
		})
	}
}

func TestEstimateUsageTamperedDenialRefused(t *testing.T) {
	// A denial rewritten into an allowance on the way must not be trusted.
	for _, status := range []int{http.StatusOK, http.StatusForbidden} {
		s := newUsageServer(t)
		s.preflightStatus, s.preflightBody, s.preflightTamper = status, estimateBody(false, "insufficient_credits"), true
		c := newClient(t, s, newSleeps())
		e, err := c.EstimateUsage(context.Background(), serviceKey, sdk.WholeUnits(10))
		if !errors.Is(err, sdk.ErrResponseSignature) || e != nil {
			t.Errorf("status %d: estimate %+v, err %v; want ErrResponseSignature", status, e, err)
		}
	}
}
