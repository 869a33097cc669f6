// Command reporter is the example non-proxied backend (service wordcount of
// Caddyfile.example): callers reach it directly with their service key, and
// it asks the platform itself, through the SDK client, whether the key is
// valid (ValidateKey) and the work allowed (EstimateUsage), does the work,
// and reports the units (ReportUsage), keeping a JSON-lines reconciliation
// log of every report.
//
//	POST /count  counts the words of the body, one unit per word
//
//	curl -H "Authorization: Bearer psk_..." -d 'the text to count' http://127.0.0.1:9003/count
//
// The handler is in package app. Configuration, from the environment:
//
//	BACKEND_SECRET      the service secret of the gateway's catalog (required)
//	HEADER_BRAND        the gateway's header_brand (default Platform)
//	BACKEND_ADDR        where to listen (default 127.0.0.1:9003)
//	GATEWAY_URL         base URL of the gateway's usage and core routes
//	                    (default http://127.0.0.1:8080)
//	GATEWAY_CA_FILE     PEM file of an extra CA to trust for an https GATEWAY_URL:
//	                    Caddy's local root for an https://localhost site
//	                    (~/.local/share/caddy/pki/authorities/local/root.crt);
//	                    SSL_CERT_FILE works too (it replaces the system roots)
//	SERVICE_ID          the service's id in the catalog (default wordcount)
//	RECONCILIATION_LOG  file the JSON-lines reconciliation log is appended to,
//	                    one line per report (default: standard error); keep
//	                    it at least 24 months (docs/sdk.md)
//
// SIGINT or SIGTERM stops it after the requests in flight are answered
// and reported.
package main

import (
	"context"
	"log"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/platformgw/gateway/examples/reporter/app"
	"github.com/platformgw/gateway/sdk"
)

func main() {
	secret := os.Getenv("BACKEND_SECRET")
	if secret == "" {
		log.Fatal("set BACKEND_SECRET to the service secret of the gateway's catalog")
	}
	brand := envOr("HEADER_BRAND", sdk.DefaultBrand)
	addr := envOr("BACKEND_ADDR", "127.0.0.1:9003")
	recon, closeLog, err := sdk.OpenJSONLinesLog(os.Getenv("RECONCILIATION_LOG"))
	if err != nil {
		log.Fatal(err)
	}
	defer closeLog()
	client, err := sdk.NewClient(envOr("GATEWAY_URL", "http://127.0.0.1:8080"), envOr("SERVICE_ID", "wordcount"), secret,
		sdk.WithBrand(brand), sdk.WithCAFile(os.Getenv("GATEWAY_CA_FILE")), sdk.WithReconciliationLog(recon))
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Addr: addr, Handler: app.New(app.Config{Client: client}), ReadHeaderTimeout: 10 * time.Second}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	log.Printf("example reporter on http://%s (brand %s, service %s)", addr, brand, client.ServiceID())

	select {
	case err := <-errc:
		log.Fatal(err) // could not listen
	case <-ctx.Done():
	}
	stop() // a second signal kills at once
	// Long enough for a request in flight to finish its report.
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 35*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		log.Printf("shutdown: %v", err)
	}
	log.Print("example reporter stopped")
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
