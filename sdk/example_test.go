package sdk_test

import (
	"context"
	"encoding/json"
	"errors"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/platformgw/gateway/sdk"
)

// A backend behind the gateway verifies every call and reads the trusted
// caller context.
func ExampleVerifier_Middleware() {
	v := sdk.NewVerifier(os.Getenv("SERVICE_SECRET"))
	mux := http.NewServeMux()
	mux.HandleFunc("POST /summarize", func(w http.ResponseWriter, r *http.Request) {
		caller, _ := sdk.FromContext(r.Context())
		if !caller.HasRole("writer") {
			http.Error(w, "writers only", http.StatusForbidden)
			return
		}
		// ... do the work, then state the tokens it took (PER_TOKEN).
		sdk.SetUnits(w.Header(), "", sdk.WholeUnits(42))
		json.NewEncoder(w).Encode(map[string]string{"user": caller.UserID})
	})
	log.Fatal(http.ListenAndServe("127.0.0.1:9001", v.Middleware(mux)))
}

// An async endpoint answers at once and reports on the job later.
func ExampleClient_ReportCompletion() {
	client, err := sdk.NewClient("https://api.example.com", "summarizer", os.Getenv("SERVICE_SECRET"))
	if err != nil {
		log.Fatal(err)
	}
	v := sdk.NewVerifier(os.Getenv("SERVICE_SECRET"))
	handler := v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		caller, _ := sdk.FromContext(r.Context())
		job := caller.Job
		if job == nil {
			http.Error(w, "call this endpoint with /invoke/async", http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusAccepted)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			defer cancel()
			client.ReportProgress(ctx, job.ProgressURL, sdk.Progress{Stage: "reading", PercentageComplete: 10})
			summary := summarize(job.Payload)
			tokens := sdk.WholeUnits(int64(len(summary)))
			if _, err := client.ReportCompletion(ctx, job.CallbackURL, sdk.Completion{
				Result: summary, ContentType: "text/plain", Units: &tokens, UserID: caller.UserID,
			}); err != nil {
				log.Printf("job %s: completion: %v", job.RequestID, err)
			}
		}()
	}))
	log.Fatal(http.ListenAndServe("127.0.0.1:9002", handler))
}

func summarize(s string) string { return s }

// A backend the gateway does not proxy checks the caller's key, asks
// whether the work is affordable, does it, and reports the usage.
func ExampleClient_ReportUsage() {
	logFile, err := os.OpenFile("usage-reconciliation.jsonl", os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		log.Fatal(err)
	}
	client, err := sdk.NewClient("https://api.example.com", "summarizer", os.Getenv("SERVICE_SECRET"),
		sdk.WithReconciliationLog(sdk.NewJSONLinesLog(logFile)))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	serviceKey := "psk_…" // from the caller's Authorization header

	key, err := client.ValidateKey(ctx, serviceKey)
	if err != nil {
		log.Fatal(err) // no trustworthy answer: try later
	}
	if !key.Valid {
		log.Printf("refused: %s", key.Code) // answer the caller 401
		return
	}
	est, err := client.EstimateUsage(ctx, serviceKey, sdk.WholeUnits(500))
	if err != nil {
		log.Fatal(err)
	}
	if !est.WouldAllow {
		log.Printf("refused: %s, retry in %s", est.Code, est.RetryAfter) // answer 403 or 429
		return
	}
	// ... do the work ...
	res, err := client.ReportUsage(ctx, sdk.Report{
		UserID:           key.UserID,
		UnitsUsed:        sdk.MustUnits("487.5"),
		BackendRequestID: "job-2291",
		KeyRef:           key.ServiceKeyID,
		Endpoint:         "POST /summarize",
	})
	var apiErr *sdk.APIError
	switch {
	case errors.As(err, &apiErr):
		log.Printf("usage refused: %s (%s)", apiErr.Code, apiErr.Message)
	case err != nil:
		log.Printf("usage outcome unknown, resend later with the logged idempotency key: %v", err)
	default:
		log.Printf("%s %s used this cycle", res.Breakdown.TotalUnitsUsedThisCycle, res.UnitLabel)
	}
}
