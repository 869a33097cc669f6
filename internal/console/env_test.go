package console

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddytest"
	"golang.org/x/crypto/bcrypt"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	"github.com/platformgw/gateway/examples/backend/app"
	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/platform"
	_ "github.com/platformgw/gateway/internal/platformgw"
	_ "github.com/platformgw/gateway/internal/usagehandler"
	"github.com/platformgw/gateway/sdk"
)

// The in-process Caddy of these tests listens on E2E_ADMIN_PORT (admin,
// 2999 by default) and E2E_HTTP_PORT (the site, 9080), as in the e2e
// and platform packages.
func envPort(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

var (
	adminPort = envPort("E2E_ADMIN_PORT", 2999)
	httpPort  = envPort("E2E_HTTP_PORT", 9080)
)

const (
	testSecret   = "0123456789abcdef0123456789abcdef"
	testOperator = "operator"
	testPassword = "correct horse battery staple"
)

// env is a running gateway: the platform app on a fresh store, a backend
// that verifies the gateway's signatures with the SDK (examples/backend),
// the gateway routes, the console under /console behind basic_auth, and a
// console with no authentication in front of it under /open-console.
//
// local (local_test.go) builds the same console over a runtime and its
// operations with no Caddy: base and app are then unset.
type env struct {
	base string // http://127.0.0.1:port
	app  *platform.App
	rt   *engine.Runtime
	ops  *ops.Ops
}

// start runs env's gateway; extra goes into the platform block as is
// (a payments block).
func start(t *testing.T, extra ...string) *env {
	t.Helper()
	backend := httptest.NewServer(app.New(sdk.NewVerifier(testSecret)))
	t.Cleanup(backend.Close)
	hash, err := bcrypt.GenerateFromPassword([]byte(testPassword), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(t.TempDir(), "platform.db")
	config := fmt.Sprintf(`{
	admin localhost:%d
	http_port %d
	platform {
		store %s
		public_url http://127.0.0.1:%d
		%s
		service weather {
			backend %s
			secret %s
			endpoint hello {
				methods GET POST
				path /hello
			}
			product basic {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 100 per month
				overage block
			}
			product credits {
				billing PREPAID
				measurement PER_REQUEST
				unit request
				price 0.5
			}
		}
	}
}
http://127.0.0.1:%d {
	handle /console* {
		basic_auth {
			%s %s
		}
		platform_console {
			prefix /console
		}
	}
	handle /open-console* {
		platform_console {
			prefix /open-console
		}
	}
	handle {
		platform_usage
		platform_gateway
		reverse_proxy {
			dynamic platform
			transport platform
		}
	}
}`, adminPort, httpPort, db, httpPort, strings.Join(extra, "\n"), backend.URL, testSecret, httpPort, testOperator, hash)
	tester := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort})
	tester.InitServer(config, "caddyfile")
	if t.Failed() {
		t.FailNow()
	}
	a, err := caddy.ActiveContext().App("platform")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// An empty config closes the store before t.TempDir is removed.
		req, _ := http.NewRequest("POST", fmt.Sprintf("http://localhost:%d/load", adminPort),
			strings.NewReader(fmt.Sprintf(`{"admin": {"listen": "localhost:%d"}}`, adminPort)))
		req.Header.Set("Content-Type", "application/json")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	})
	app := a.(*platform.App)
	return &env{base: "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(httpPort)), app: app, rt: app.Runtime(), ops: app.Ops()}
}
