package sdk_test

import (
	"context"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/platformgw/gateway/sdk"
)

// newTLSUsageServer serves the fake usage service over HTTPS with
// httptest's own CA, as a gateway on https://localhost serves with Caddy's
// local CA, and writes that CA's certificate to a PEM file.
func newTLSUsageServer(t *testing.T) (*usageServer, *httptest.Server, string) {
	t.Helper()
	s := newUsageServer(t)
	srv := httptest.NewTLSServer(http.HandlerFunc(s.serve))
	t.Cleanup(srv.Close)
	caFile := filepath.Join(t.TempDir(), "root.crt")
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(caFile, pemBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	return s, srv, caFile
}

// With the CA file, progress and completion reach an HTTPS gateway whose
// certificate the system does not trust.
func TestClientWithCAFileReportsOverTLS(t *testing.T) {
	s, srv, caFile := newTLSUsageServer(t)
	sl := newSleeps()
	s.clock = sl.now
	c, err := sdk.NewClient(srv.URL, "svc-1", secret, sdk.WithClock(sl.now), sdk.WithSleep(sl.sleep), sdk.WithCAFile(caFile))
	if err != nil {
		t.Fatal(err)
	}
	progressURL, _ := handedOut(srv.URL, "progress")
	if _, err := c.ReportProgress(context.Background(), progressURL, sdk.Progress{Stage: "half", PercentageComplete: 50}); err != nil {
		t.Fatalf("ReportProgress over TLS with the CA file: %v", err)
	}
	if res, err := c.ReportUsage(context.Background(), sdk.Report{UserID: "user-1", UnitsUsed: sdk.WholeUnits(2)}); err != nil || res.Status != "ok" {
		t.Fatalf("ReportUsage over TLS with the CA file: %+v, %v", res, err)
	}
	if s.count("progress") != 1 || s.unitsOf("user-1") != sdk.WholeUnits(2) {
		t.Errorf("server saw %d progress posts, %s units", s.count("progress"), s.unitsOf("user-1"))
	}

	// The same with a pool (WithRootCAs).
	pool := srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	c2, err := sdk.NewClient(srv.URL, "svc-1", secret, sdk.WithClock(sl.now), sdk.WithSleep(sl.sleep), sdk.WithRootCAs(pool))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c2.ReportProgress(context.Background(), progressURL, sdk.Progress{Stage: "more", PercentageComplete: 60}); err != nil {
		t.Fatalf("ReportProgress over TLS with WithRootCAs: %v", err)
	}
}

// Without it, the error says the certificate is not trusted and what to
// do, at once: no retries against a certificate that will not change.
func TestClientUntrustedCertificateError(t *testing.T) {
	s, srv, _ := newTLSUsageServer(t)
	sl := newSleeps()
	s.clock = sl.now
	c, err := sdk.NewClient(srv.URL, "svc-1", secret, sdk.WithClock(sl.now), sdk.WithSleep(sl.sleep))
	if err != nil {
		t.Fatal(err)
	}
	callbackURL, _ := handedOut(srv.URL, "complete")
	_, err = c.ReportCompletion(context.Background(), callbackURL, sdk.Completion{Result: "done"})
	if err == nil {
		t.Fatal("a completion to an untrusted certificate succeeded")
	}
	if !errors.Is(err, sdk.ErrUntrustedCertificate) {
		t.Errorf("error does not wrap ErrUntrustedCertificate: %v", err)
	}
	for _, want := range []string{"certificate signed by unknown authority", "sdk.WithCAFile", "SSL_CERT_FILE", "pki/authorities/local/root.crt"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	if d := sl.recorded(); len(d) != 0 {
		t.Errorf("retried an untrusted certificate, waiting %v", d)
	}
	if s.count("complete") != 0 {
		t.Error("the server saw the completion")
	}
}

// Bad CA options fail NewClient, not the first report an hour later.
func TestClientCAOptionErrors(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	os.WriteFile(notPEM, []byte("hello"), 0o600)
	for name, opts := range map[string][]sdk.Option{
		"missing file":     {sdk.WithCAFile(filepath.Join(dir, "absent.crt"))},
		"no certificate":   {sdk.WithCAFile(notPEM)},
		"nil pool":         {sdk.WithRootCAs(nil)},
		"with http client": {sdk.WithCAFile(writeSelfCA(t, dir)), sdk.WithHTTPClient(&http.Client{})},
	} {
		if _, err := sdk.NewClient("https://localhost", "svc-1", secret, opts...); err == nil {
			t.Errorf("%s: NewClient succeeded", name)
		}
	}
	// An empty path (an unset environment variable) is no option at all.
	if _, err := sdk.NewClient("https://localhost", "svc-1", secret, sdk.WithCAFile("")); err != nil {
		t.Errorf("WithCAFile(\"\"): %v", err)
	}
}

func writeSelfCA(t *testing.T, dir string) string {
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	defer srv.Close()
	p := filepath.Join(dir, "ok.crt")
	os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600)
	return p
}
