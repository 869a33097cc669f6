package usagehandler

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/store"
)

// A store that cannot be reached (wrapped, as the stores return it) is a
// 503 with Retry-After on the usage routes, like an invoke; any other
// failure stays a 500 naming what failed.
func TestStoreFailure(t *testing.T) {
	unreachable := fmt.Errorf("job lookup: %w", store.ErrUnavailable)
	e := storeFailure(unreachable, "job lookup failed")
	if e.Code != apierror.StoreUnavailable || apierror.Status(e.Code) != http.StatusServiceUnavailable {
		t.Fatalf("unreachable store: %s (%d), want store_unavailable 503", e.Code, apierror.Status(e.Code))
	}
	if e.RetryAfter <= 0 {
		t.Fatalf("unreachable store: no Retry-After")
	}
	other := storeFailure(errors.New("bad page"), "job lookup failed")
	if other.Code != apierror.InternalError || other.Message != "job lookup failed" {
		t.Fatalf("other failure: %s %q, want internal_error", other.Code, other.Message)
	}
}
