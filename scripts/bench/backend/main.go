// Command backend is the loopback service backend of `make bench`: it
// answers as cheaply as it can, so that what the benchmark measures is the
// gateway and Caddy's reverse_proxy, not the backend. Paths pick the mode:
//
//	/instant  answers at once
//	/slow     answers after -delay (5 ms), like a real service
//	/job      accepts an async job envelope (202)
//
// It does not verify signatures: the e2e tests do that; here it would only
// add the same cost to every row except the baseline.
package main

import (
	"flag"
	"io"
	"log"
	"net/http"
	"time"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9401", "listen address (loopback)")
	delay := flag.Duration("delay", 5*time.Millisecond, "how long /slow takes")
	flag.Parse()

	body := []byte(`{"ok":true,"result":"0123456789abcdef0123456789abcdef"}`)
	answer := func(w http.ResponseWriter, r *http.Request, status int) {
		// Drain the request so the connection is reused.
		io.Copy(io.Discard, r.Body)
		h := w.Header()
		h["Content-Type"] = []string{"application/json"}
		w.WriteHeader(status)
		w.Write(body)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/instant", func(w http.ResponseWriter, r *http.Request) { answer(w, r, http.StatusOK) })
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(*delay)
		answer(w, r, http.StatusOK)
	})
	mux.HandleFunc("/job", func(w http.ResponseWriter, r *http.Request) { answer(w, r, http.StatusAccepted) })
	srv := &http.Server{Addr: *addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(srv.ListenAndServe())
}
