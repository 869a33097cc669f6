package sdk_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/platformgw/gateway/internal/signing"
)

// FuzzVerifierVerify is the backend side of the v3 signature: whatever
// headers and body arrive, Verify never panics, never accepts a call whose
// signature is not the HMAC of the body (or of the async canonical string
// rebuilt from an envelope) under the secret, and always accepts one the
// gateway signed.
func FuzzVerifierVerify(f *testing.F) {
	ts := strconv.FormatInt(now.Unix(), 10)
	f.Add([]byte(`{"prompt":"hi"}`), "", ts, "u-1", "prod-1", "roleA,roleB", "ACTIVE", true)
	f.Add([]byte(`{"request_id":"r-1","payload":"x<y","progress_url":"p","callback_url":"c"}`), "", ts, "u", "", "", "TRIAL", true)
	f.Add([]byte{}, "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=", ts, "", "", "", "", false)
	f.Add([]byte("x"), "not base64", "1e9", "u", "p", ",,", "ACTIVE", false)
	f.Add([]byte(`{"request_id":"","payload":1}`), "", "0", "u", "p", " a , b ", "ACTIVE", true)
	const secret = "fuzz-secret-fuzz-secret-00000001"
	v := newVerifier(secret)
	f.Fuzz(func(t *testing.T, body []byte, sig, ts, user, product, roles, status string, signIt bool) {
		h := http.Header{}
		h.Set("X-Platform-User-ID", user)
		h.Set("X-Platform-Service-Product-ID", product)
		h.Set("X-Platform-Roles", roles)
		h.Set("X-Platform-Subscription-Status", status)
		h.Set("X-Platform-Signing-Version", "3")
		uc := signing.UserContext{UserID: user, ServiceProductID: product, SubscriptionStatus: status}
		if roles != "" {
			uc.Roles = strings.Split(roles, ",")
		}
		if signIt {
			sig = signing.SignV3([]byte(secret), body, ts, uc)
		}
		h.Set("X-Platform-Signature", sig)
		h.Set("X-Platform-Timestamp", ts)
		cc, err := v.Verify(h, body)
		if err != nil {
			if signIt && ts == strconv.FormatInt(now.Unix(), 10) {
				t.Fatalf("a call the gateway signed is refused: %v", err)
			}
			return
		}
		payload := body
		if cc.Job != nil {
			payload = signing.AsyncCanonical(cc.Job.Payload, cc.Job.RequestID)
		}
		if signing.SignV3([]byte(secret), payload, ts, uc) != sig {
			t.Fatalf("accepted a signature that is not the HMAC of what was verified: %q", sig)
		}
		if cc.UserID != user || cc.ServiceProductID != product || cc.SubscriptionStatus != status {
			t.Fatalf("context %+v is not the signed headers", cc)
		}
	})
}
