package platformgw

import (
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// observedCall notes what the operator console's overview shows of an
// invoke call (engine.Runtime.ObserveCall): the status the caller got and
// the time spent in the rest of the route (the backend, through
// reverse_proxy), which is not latency the gateway adds. Unwrap keeps
// http.ResponseController (flush, hijack for upgrades) working through it.
type observedCall struct {
	caddyhttp.ResponseWriterWrapper
	next    caddyhttp.Handler
	status  int
	backend time.Duration
}

func (o *observedCall) WriteHeader(status int) {
	if o.status == 0 && status >= 200 {
		o.status = status
	}
	o.ResponseWriterWrapper.WriteHeader(status)
}

func (o *observedCall) Write(p []byte) (int, error) {
	if o.status == 0 {
		o.status = http.StatusOK
	}
	return o.ResponseWriterWrapper.Write(p)
}

// ServeHTTP runs the rest of the route, timing it.
func (o *observedCall) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	start := time.Now()
	// Deferred: a cut-off answer panics through here (http.ErrAbortHandler).
	defer func() { o.backend += time.Since(start) }()
	return o.next.ServeHTTP(w, r)
}
