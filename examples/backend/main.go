// Command backend is an example service backend behind the gateway. It
// checks the gateway's v3 signature on every request and answers with the
// caller context it was given, so an operator can see the whole path work:
//
//	GET|POST /hello     echo of the trusted caller context
//	POST     /complete  pretends to generate text and states the tokens it
//	                    used in X-<Brand>-Units (PER_TOKEN metering)
//
// It reads the shared secret from $BACKEND_SECRET, the brand from
// $HEADER_BRAND (default Platform) and listens on $BACKEND_ADDR
// (default 127.0.0.1:9001).
package main

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	secret := os.Getenv("BACKEND_SECRET")
	if secret == "" {
		log.Fatal("set BACKEND_SECRET to the service secret of the gateway's catalog")
	}
	brand := envOr("HEADER_BRAND", "Platform")
	addr := envOr("BACKEND_ADDR", "127.0.0.1:9001")
	b := &backend{secret: []byte(secret), x: "X-" + brand + "-"}

	mux := http.NewServeMux()
	mux.HandleFunc("/hello", b.verified(b.hello))
	mux.HandleFunc("POST /complete", b.verified(b.complete))
	log.Printf("example backend on http://%s (brand %s)", addr, brand)
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(srv.ListenAndServe())
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

type backend struct {
	secret []byte
	x      string // "X-Platform-"
}

// caller is the trusted context the gateway signed.
type caller struct {
	UserID             string `json:"userId"`
	ServiceProductID   string `json:"serviceProductId"`
	Roles              string `json:"roles"`
	SubscriptionStatus string `json:"subscriptionStatus"`
	BillingModel       string `json:"billingModel,omitempty"`
	MeasurementType    string `json:"measurementType,omitempty"`
	UnitLabel          string `json:"unitLabel,omitempty"`
	RequestID          string `json:"requestId"`
}

// verified checks the v3 signature: Base64(HMAC-SHA256(secret,
// body + timestamp + "3" + userId + productId + roles + status + billing
// model + measurement + unit label)), and a timestamp within 5 minutes.
func (b *backend) verified(next func(http.ResponseWriter, *http.Request, caller, []byte)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 10<<20))
		if err != nil {
			http.Error(w, "read body", http.StatusBadRequest)
			return
		}
		h := func(name string) string { return r.Header.Get(b.x + name) }
		c := caller{
			UserID: h("User-ID"), ServiceProductID: h("Service-Product-ID"), Roles: h("Roles"),
			SubscriptionStatus: h("Subscription-Status"), BillingModel: h("Billing-Model"),
			MeasurementType: h("Measurement-Type"), UnitLabel: h("Unit-Label"), RequestID: h("Request-ID"),
		}
		ts := h("Timestamp")
		sec, err := strconv.ParseInt(ts, 10, 64)
		if err != nil || h("Signing-Version") != "3" || time.Since(time.Unix(sec, 0)).Abs() > 5*time.Minute {
			http.Error(w, "missing or stale signature", http.StatusUnauthorized)
			return
		}
		mac := hmac.New(sha256.New, b.secret)
		mac.Write(body)
		mac.Write([]byte(ts))
		mac.Write([]byte("3" + c.UserID + c.ServiceProductID + c.Roles + c.SubscriptionStatus +
			c.BillingModel + c.MeasurementType + c.UnitLabel))
		want := base64.StdEncoding.EncodeToString(mac.Sum(nil))
		if !hmac.Equal([]byte(want), []byte(h("Signature"))) {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		next(w, r, c, body)
	}
}

func (b *backend) hello(w http.ResponseWriter, r *http.Request, c caller, body []byte) {
	writeJSON(w, map[string]any{
		"message": "hello from the example backend",
		"method":  r.Method,
		"query":   r.URL.RawQuery,
		"body":    string(body),
		"caller":  c,
	})
}

// complete "generates" one token per word of the prompt and reports them.
func (b *backend) complete(w http.ResponseWriter, _ *http.Request, c caller, body []byte) {
	tokens := len(strings.Fields(string(body)))
	w.Header().Set(b.x+"Units", strconv.Itoa(tokens))
	writeJSON(w, map[string]any{"completion": string(bytes.ToUpper(body)), "tokens": tokens, "caller": c})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}
