package platformgw

import (
	"net/http"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/apierror"
)

// Every refusal of the invoke path ends here: a refused call (refuseCall)
// is counted under its outcome and told its allowance, then any refusal
// (refuse) is written as the JSON error with the call's request id,
// counted by code and logged once at INFO.

// refuseCall refuses an invoke call the route named: counted as outcome
// ("rejected", "backend_error") of its mode, with the allowance headers
// its checks filled, if any. known says the call's service and endpoint
// came from the catalog (an admitted call), so their ids need no lookup
// before they label the count.
func (h *Handler) refuseCall(w http.ResponseWriter, r *http.Request, c *call, known bool, outcome string, e *apierror.Error) {
	c.code = e.Code
	if known {
		h.rt.CountKnownInvoke(c.svc.ID, c.ep.ID, mode(c.route), outcome)
	} else {
		h.rt.CountInvoke(c.route.serviceID, c.route.endpointID, mode(c.route), outcome)
	}
	c.allowance.write(w.Header())
	h.refuse(w, r, c.requestID, e)
}

// refuse writes a JSON error, counts and logs it (never a key or secret).
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, requestID string, e *apierror.Error) {
	if requestID != "" {
		e.RequestID = requestID
		w.Header().Set(h.rt.Headers.RequestID, requestID)
	}
	h.rt.CountRejection(e.Code)
	// Checked first: a flood of refused calls (rate limited, bad keys)
	// builds no log fields while INFO is off.
	if ce := h.logger.Check(zap.InfoLevel, "invoke refused"); ce != nil {
		ce.Write(
			zap.String("code", e.Code),
			zap.String("request_id", requestID),
			zap.String("method", r.Method),
			zap.String("path", r.URL.Path),
			zap.String("remote", r.RemoteAddr))
	}
	apierror.Write(w, e)
}
