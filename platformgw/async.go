package platformgw

import (
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/platformgw/gateway/apierror"
)

// invokeAsync is filled in by the async issue.
func (h *Handler) invokeAsync(w http.ResponseWriter, r *http.Request, c *call, next caddyhttp.Handler) error {
	h.refuse(w, r, c.requestID, apierror.New(apierror.EndpointNotFound, "async invocation is not available yet"))
	return nil
}
