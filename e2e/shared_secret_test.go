package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/e2etest"
)

// TestSharedSecretWarned: a backend's signature is checked against the
// secrets of the service it names, so two services configured with one
// secret can each sign usage reports, job updates and pre-flight
// requests as the other. The config still loads (one backend may serve
// two services), and the log says which services share one, never the
// secret (docs/configuration.md, "Secrets").
func TestSharedSecretWarned(t *testing.T) {
	const secret = "shared-SECRET-0123456789"
	t.Setenv("E2E_SHARED_SECRET", secret)
	t.Setenv("E2E_OWN_SECRET", "own-SECRET-0123456789")
	adminPort, httpPort := e2etest.FreePort(t), e2etest.FreePort(t)
	dir := t.TempDir()
	services := `
		service alpha {
			backend http://127.0.0.1:9
			secret {env.E2E_SHARED_SECRET}
			endpoint e
		}
		service beta {
			backend http://127.0.0.1:9
			secret {env.E2E_OWN_SECRET} {env.E2E_SHARED_SECRET}
			endpoint e
		}
		service gamma {
			backend http://127.0.0.1:9
			secret {env.E2E_OWN_SECRET}x
			endpoint e
		}`
	g := startSharedPortsGateway(t, dir, sharedPortsConfig(t, dir, adminPort, httpPort, services))
	waitServing(t, httpPort, dir, g)

	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(g.out.String(), "two services share a secret") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	out := g.out.String()
	var warned []string
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "two services share a secret") {
			warned = append(warned, line)
		}
	}
	if len(warned) != 1 || !strings.Contains(warned[0], `"service":"beta"`) || !strings.Contains(warned[0], `"shares_secret_with":"alpha"`) {
		t.Fatalf("want one warning naming beta and alpha, got %d:\n%s", len(warned), strings.Join(warned, "\n"))
	}
	if strings.Contains(out, secret) || strings.Contains(out, "own-SECRET") {
		t.Fatalf("the log repeats a secret:\n%s", out)
	}
}
