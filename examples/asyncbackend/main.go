// Command asyncbackend is the example async backend behind the gateway
// (service jobs of Caddyfile.example). It accepts each job the gateway
// forwards with 202, then upper-cases the job's text in the background,
// posting progress at 50% and then the completion, with one unit per word,
// through the SDK client and the job's progress_url and callback_url. The
// caller polls the job's status URL and fetches the result.
//
//	POST /upper  the async endpoint (invoke it with /invoke/async)
//
// The handler is in package app. Configuration, from the environment:
//
//	BACKEND_SECRET      the service secret of the gateway's catalog (required)
//	HEADER_BRAND        the gateway's header_brand (default Platform)
//	BACKEND_ADDR        where to listen (default 127.0.0.1:9002)
//	GATEWAY_URL         base URL of the gateway's usage routes (default
//	                    http://127.0.0.1:8080); progress and completion go
//	                    to the URLs the gateway hands out with each job
//	GATEWAY_CA_FILE     PEM file of an extra CA to trust for an https GATEWAY_URL:
//	                    Caddy's local root for an https://localhost site
//	                    (~/.local/share/caddy/pki/authorities/local/root.crt);
//	                    SSL_CERT_FILE works too (it replaces the system roots)
//	SERVICE_ID          the service's id in the catalog (default jobs)
//	JOB_STEP            how long each half of a job takes (default 2s), so a
//	                    caller polling sees it RUNNING
//	RECONCILIATION_LOG  file the JSON-lines reconciliation log is appended to,
//	                    one line per completion (default: standard error)
//
// SIGINT or SIGTERM stops it: it takes no new jobs, finishes the running
// ones for up to 30 seconds, and completes those still running then as
// FAILED.
package main

import (
	"context"
	"log"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/platformgw/gateway/examples/asyncbackend/app"
	"github.com/platformgw/gateway/sdk"
)

func main() {
	secret := os.Getenv("BACKEND_SECRET")
	if secret == "" {
		log.Fatal("set BACKEND_SECRET to the service secret of the gateway's catalog")
	}
	brand := envOr("HEADER_BRAND", sdk.DefaultBrand)
	addr := envOr("BACKEND_ADDR", "127.0.0.1:9002")
	step, err := time.ParseDuration(envOr("JOB_STEP", "2s"))
	if err != nil {
		log.Fatalf("JOB_STEP: %v", err)
	}
	recon, closeLog, err := sdk.OpenJSONLinesLog(os.Getenv("RECONCILIATION_LOG"))
	if err != nil {
		log.Fatal(err)
	}
	defer closeLog()
	client, err := sdk.NewClient(envOr("GATEWAY_URL", "http://127.0.0.1:8080"), envOr("SERVICE_ID", "jobs"), secret,
		sdk.WithBrand(brand), sdk.WithCAFile(os.Getenv("GATEWAY_CA_FILE")), sdk.WithReconciliationLog(recon))
	if err != nil {
		log.Fatal(err)
	}
	v := sdk.NewVerifier(secret)
	v.Brand = brand
	backend := app.New(app.Config{Verifier: v, Client: client, Step: step})
	srv := &http.Server{Addr: addr, Handler: backend.Handler(), ReadHeaderTimeout: 10 * time.Second}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	log.Printf("example async backend on http://%s (brand %s, service %s)", addr, brand, client.ServiceID())

	select {
	case err := <-errc:
		log.Fatal(err) // could not listen
	case <-ctx.Done():
	}
	stop() // a second signal kills at once
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		log.Printf("shutdown: %v", err)
	}
	if err := backend.Shutdown(shutdownCtx); err != nil {
		log.Printf("shutdown: jobs still running were completed as FAILED: %v", err)
	}
	log.Print("example async backend stopped")
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
