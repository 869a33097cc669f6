package platform

import (
	"fmt"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// TestCaddyfileListingErrors: every bad listing is refused at adapt time,
// at the line to fix.
func TestCaddyfileListingErrors(t *testing.T) {
	const svc = "\t\tbackend http://127.0.0.1:9000\n\t\tsecret {env.S}\n\t\tendpoint e\n"
	const usage = "\t\t\tbilling USAGE_POSTPAID\n\t\t\tmeasurement PER_REQUEST\n"
	for _, tc := range []struct {
		name  string
		block string
		want  []string
		line  int
	}{
		{"unknown currency", "platform {\n\tservice s {\n" + svc + "\t\tproduct p {\n" + usage + "\t\t\tcurrency EUX\n\t\t}\n\t}\n}", []string{"currency 'EUX' is not an ISO 4217 code"}, 10},
		{"currency in lower case", "platform {\n\tservice s {\n" + svc + "\t\tproduct p {\n" + usage + "\t\t\tcurrency usd\n\t\t}\n\t}\n}", []string{"currency 'usd'"}, 10},
		{"period price without currency", "platform {\n\tservice s {\n" + svc + "\t\tproduct p {\n" + usage + "\t\t\tperiod_price 10\n\t\t}\n\t}\n}", []string{"product 'p' of service 's'", "period_price 10 has no currency"}, 7},
		{"money price without currency on a public service", "platform {\n\tservice s {\n" + svc + "\t\tproduct p {\n" + usage + "\t\t\tprice 0.5\n\t\t}\n\t\tpublic\n\t}\n}", []string{"price 0.5 is money", "needs a currency"}, 7},
		{"self service and private", "platform {\n\tservice s {\n" + svc + "\t\tpublic\n\t\tproduct p {\n" + usage + "\t\t\tself_service\n\t\t\tprivate\n\t\t}\n\t}\n}", []string{"self_service and private together"}, 8},
		{"self service on a service not public", "platform {\n\tservice s {\n" + svc + "\t\tproduct p {\n" + usage + "\t\t\tself_service\n\t\t}\n\t}\n}", []string{"self_service on a service that is not public"}, 7},
		{"negative period price", "platform {\n\tservice s {\n" + svc + "\t\tproduct p {\n" + usage + "\t\t\tperiod_price -3\n\t\t}\n\t}\n}", []string{"period_price '-3'"}, 10},
		{"trial not in days", "platform {\n\tservice s {\n" + svc + "\t\tproduct p {\n" + usage + "\t\t\ttrial 36h\n\t\t}\n\t}\n}", []string{"trial '36h' must be whole days"}, 10},
		{"trial twice", "platform {\n\tservice s {\n" + svc + "\t\tproduct p {\n" + usage + "\t\t\ttrial 7d\n\t\t\ttrial 14d\n\t\t}\n\t}\n}", []string{"duplicate subdirective 'trial'"}, 11},
		{"self_service with an argument", "platform {\n\tservice s {\n" + svc + "\t\tproduct p {\n" + usage + "\t\t\tself_service yes\n\t\t}\n\t}\n}", []string{"self_service", "too many arguments"}, 10},
		{"bad logo", "platform {\n\tservice s {\n" + svc + "\t\tlogo_url ftp://x/logo.png\n\t}\n}", []string{"logo_url 'ftp://x/…'"}, 7},
		{"bad tag", "platform {\n\tservice s {\n" + svc + "\t\ttags ok Not-OK\n\t}\n}", []string{"tag 'Not-OK'"}, 7},
		{"tag twice across lines", "platform {\n\tservice s {\n" + svc + "\t\ttags a\n\t\ttags a\n\t}\n}", []string{"tag 'a' given twice"}, 8},
		{"feature without label", "platform {\n\tservice s {\n" + svc + "\t\tfeature fast\n\t}\n}", []string{"feature", "missing argument"}, 7},
		{"feature twice", "platform {\n\tservice s {\n" + svc + "\t\tfeature fast Fast\n\t\tfeature fast Quick\n\t}\n}", []string{"feature 'fast' declared twice"}, 8},
		{"display name twice", "platform {\n\tservice s {\n" + svc + "\t\tdisplay_name A\n\t\tdisplay_name B\n\t}\n}", []string{"duplicate subdirective 'display_name'"}, 8},
		{"broken openapi", "platform {\n\tservice s {\n" + svc + "\t\topenapi testdata/openapi/broken.json\n\t}\n}", []string{"openapi testdata/openapi/broken.json: invalid OpenAPI document"}, 7},
		{"missing openapi", "platform {\n\tservice s {\n" + svc + "\t\topenapi testdata/openapi/none.json\n\t}\n}", []string{"openapi testdata/openapi/none.json"}, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(platformConfig(tc.block)), nil)
			if err == nil {
				t.Fatalf("no error for\n%s", tc.block)
			}
			msg := err.Error()
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error does not mention %q: %s", w, msg)
				}
			}
			if at := fmt.Sprintf("Caddyfile:%d", tc.line); !strings.HasSuffix(msg, at) {
				t.Errorf("error does not point at %s: %s", at, msg)
			}
		})
	}
}
