package usagehandler

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/signing"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
)

// jobSigServer is a usage Handler over a real bbolt store and a catalog of
// n services (svc-0 … svc-<n-1>, each with its own secret), holding one
// job of svc-0.
type jobSigServer struct {
	h   *Handler
	at  time.Time
	hd  engine.Headers
	job string
}

func jobSecret(i int) string { return fmt.Sprintf("job-signature-secret-%04d-0123456789", i) }

func newJobSigServer(t *testing.T, n int) *jobSigServer {
	t.Helper()
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "platform.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	var svcs []*catalog.Service
	for i := range n {
		svcs = append(svcs, &catalog.Service{
			ID: fmt.Sprintf("svc-%d", i), Backend: "http://127.0.0.1:9", Secrets: []string{jobSecret(i)},
			Endpoints: []*catalog.Endpoint{{ID: "job", Async: true}},
			Products:  []*billing.Product{{ID: "basic", BillingModel: "SUBSCRIPTION", MeasurementType: billing.PerRequest, UnitLabel: "request"}},
		})
	}
	cat, err := catalog.Compile(svcs, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := &jobSigServer{at: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC), hd: engine.NewHeaders("Platform"), job: "3f0c2a4e-1b9d-4c3e-8f6a-2d5b9e1c0a77"}
	rt := engine.New(engine.Runtime{
		Catalog: cat,
		Data:    st,
		Clock:   func() time.Time { return s.at },
		Limits: engine.Limits{UsageMaxBodyBytes: 1 << 20, ResultMaxBytes: 1 << 10, JobTTL: time.Hour,
			TimestampTolerance: time.Minute},
	})
	s.h = &Handler{rt: rt, logger: zap.NewNop()}
	if err := st.CreateJob(context.Background(), store.Job{ID: s.job, UserID: "alice", ServiceID: "svc-0", EndpointID: "job",
		Status: store.JobPending, CreatedAt: s.at, UpdatedAt: s.at, ExpiresAt: s.at.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	return s
}

// complete posts body to the job's completion URL with the signature sig
// and answers the status.
func (s *jobSigServer) complete(body, sig string) int {
	code, _ := s.post("/api/usage/complete/"+s.job, body, sig)
	return code
}

// post posts body to path, signed with sig when it is not empty, and
// answers the status and the body.
func (s *jobSigServer) post(path, body, sig string) (int, string) {
	req := httptest.NewRequest("POST", path, strings.NewReader(body))
	if sig != "" {
		req.Header.Set(s.hd.Timestamp, signing.Timestamp(s.at))
		req.Header.Set(s.hd.Signature, sig)
	}
	w := httptest.NewRecorder()
	s.h.ServeHTTP(w, req, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		http.NotFound(w, r)
		return nil
	}))
	return w.Code, w.Body.String()
}

// TestJobSignatureCheckedOnlyAgainstItsService: a progress or completion
// whose signature the job's service did not make is 401
// invalid_signature, and costs the same whatever the catalog holds. It was
// checked against every secret of every other service first (to answer a
// valid signature of another service with 404): with a 1 MiB body, one
// HMAC pass over the body per service and secret, so any caller holding
// the id of one of its own jobs could make each unsigned request cost the
// gateway as many megabytes of hashing as the catalog had services.
func TestJobSignatureCheckedOnlyAgainstItsService(t *testing.T) {
	body := `{"status":"COMPLETED","timestamp":1772366400,"result":"` + strings.Repeat("x", 64<<10) + `"}`
	ts := signing.Timestamp(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	forged := signing.Sign([]byte("not any service's secret"), []byte(body), []byte(ts))

	big := newJobSigServer(t, 200)
	// Another service's valid signature is a wrong signature for this job.
	if code := big.complete(body, signing.Sign([]byte(jobSecret(7)), []byte(body), []byte(ts))); code != http.StatusUnauthorized {
		t.Errorf("completion signed by another service: %d, want 401", code)
	}
	if code := big.complete(body, forged); code != http.StatusUnauthorized {
		t.Errorf("forged completion: %d, want 401", code)
	}

	// The cost of a refused signature does not grow with the catalog:
	// hmac.New allocates, so 199 needless MACs show as ~1400 allocations.
	small := newJobSigServer(t, 2)
	allocs := func(s *jobSigServer) float64 {
		return testing.AllocsPerRun(10, func() { s.complete(body, forged) })
	}
	a2, a200 := allocs(small), allocs(big)
	if a200-a2 > 400 { // ~1400 more when every service is tried; some noise under -race
		t.Errorf("a forged completion allocates %.0f times with 200 services, %.0f with 2: it is checked against other services' secrets", a200, a2)
	}
	// The job's own service still completes it.
	if code := big.complete(body, signing.Sign([]byte(jobSecret(0)), []byte(body), []byte(ts))); code != http.StatusOK {
		t.Errorf("completion signed by the job's service: %d, want 200", code)
	}
}

// TestServiceSecretHashedOnce: a serviceSecret without serviceId (the
// pre-flight routes find its service by it) costs one hash of what the
// caller sent, whatever the catalog holds. It was hashed again for each
// service, so an unauthenticated validate with a 1 MiB serviceSecret made
// the gateway hash a megabyte once per service of its catalog.
func TestServiceSecretHashedOnce(t *testing.T) {
	body := `{"serviceKey":"psk_x","serviceSecret":"` + strings.Repeat("s", 1<<20-64) + `"}`
	// Each hash of what the caller sent copies it to a new 1 MiB slice:
	// one allocation per service when it is hashed once per service.
	allocs := func(s *jobSigServer) float64 {
		return testing.AllocsPerRun(3, func() {
			if code, got := s.post("/api/v1/service-keys/validate", body, ""); code != http.StatusUnauthorized || !strings.Contains(got, `"invalid_signature"`) {
				t.Fatalf("validate with a wrong serviceSecret: %d %s, want 401 invalid_signature", code, got)
			}
		})
	}
	small, big := newJobSigServer(t, 2), newJobSigServer(t, 500)
	a2, a500 := allocs(small), allocs(big)
	if a500-a2 > 250 { // ~500 more when it is hashed once per service
		t.Errorf("a wrong 1 MiB serviceSecret allocates %.0f times with 500 services, %.0f with 2: it is hashed once per service", a500, a2)
	}
	// The secret still finds its own service: the key is what it refuses.
	good := `{"serviceKey":"psk_x","serviceSecret":"` + jobSecret(150) + `"}`
	if code, got := big.post("/api/v1/service-keys/validate", good, ""); code != http.StatusUnauthorized || !strings.Contains(got, `"invalid_key"`) {
		t.Errorf("validate with svc-150's secret: %d %s, want 401 invalid_key", code, got)
	}
}
