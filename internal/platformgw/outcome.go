package platformgw

import (
	"net/http"
	"time"

	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/store"
)

// endCall tells the runtime how an invoke call ended, once, however it
// ended: the console's figures of the last minute (ObserveCall) and the
// hourly call outcomes (CountOutcome), each with the time the gateway
// added (the call's time outside the rest of the route) and the backend's.
func (h *Handler) endCall(c *call, start time.Time, err *error) {
	o := &c.observed
	status := o.status
	if status == 0 && *err != nil {
		status = http.StatusInternalServerError
	}
	added := time.Since(start) - o.backend
	h.rt.ObserveCall(status, added)
	if h.rt.Outcomes == nil {
		return
	}
	k := engine.OutcomeCall{Hour: hourOf(c.started), Outcome: outcome(c, status)}
	if c.key.ID != "" {
		k.UserID = c.key.UserID
	}
	// Ids the catalog knows only: a caller's made-up path names no row.
	if c.svc != nil {
		k.ServiceID = c.svc.ID
	}
	if c.ep != nil {
		k.EndpointID = c.ep.ID
	}
	if c.product != nil {
		k.Product = c.product.ID
	}
	h.rt.CountOutcome(k, added, o.backend)
}

// outcome is a call's outcome (store.Outcomes): the error code it was
// refused with, cut off, or the class of the status the caller got.
func outcome(c *call, status int) string {
	switch {
	case c.code != "":
		return c.code
	case c.cutOff:
		return store.OutcomeCutOff
	case status < 200:
		return store.Outcome1xx
	case status < 300:
		return store.Outcome2xx
	case status < 400:
		return store.Outcome3xx
	case status < 500:
		return store.Outcome4xx
	default:
		return store.Outcome5xx
	}
}

// hourOf is the UTC hour t falls in, in Unix seconds.
func hourOf(t time.Time) int64 {
	if t.IsZero() {
		t = time.Now()
	}
	s := t.Unix()
	return s - ((s%3600)+3600)%3600
}
