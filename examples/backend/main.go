// Command backend is the example sync backend behind the gateway (service
// echo of Caddyfile.example). It verifies the gateway's v3 signature on
// every request with the SDK's middleware and answers with the caller
// context it was given, so an operator can see the whole path work:
//
//	GET|POST /hello     echo of the trusted caller context
//	POST     /complete  pretends to generate text and, for a PER_TOKEN
//	                    product, states the tokens it used in X-<Brand>-Units
//
// The handler is in package app. Configuration, from the environment:
//
//	BACKEND_SECRET  the service secret of the gateway's catalog (required)
//	HEADER_BRAND    the gateway's header_brand (default Platform)
//	BACKEND_ADDR    where to listen (default 127.0.0.1:9001)
//
// SIGINT or SIGTERM stops it after the requests in flight are answered.
package main

import (
	"context"
	"log"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/platformgw/gateway/examples/backend/app"
	"github.com/platformgw/gateway/sdk"
)

func main() {
	secret := os.Getenv("BACKEND_SECRET")
	if secret == "" {
		log.Fatal("set BACKEND_SECRET to the service secret of the gateway's catalog")
	}
	brand := envOr("HEADER_BRAND", sdk.DefaultBrand)
	addr := envOr("BACKEND_ADDR", "127.0.0.1:9001")

	v := sdk.NewVerifier(secret)
	v.Brand = brand
	srv := &http.Server{Addr: addr, Handler: app.New(v), ReadHeaderTimeout: 10 * time.Second}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	log.Printf("example backend on http://%s (brand %s)", addr, brand)

	select {
	case err := <-errc:
		log.Fatal(err) // could not listen
	case <-ctx.Done():
	}
	stop() // a second signal kills at once
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		log.Printf("shutdown: %v", err) // the deadline passed: open connections were dropped
	}
	log.Print("example backend stopped")
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
