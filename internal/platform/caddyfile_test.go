package platform

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
)

var update = flag.Bool("update", false, "rewrite the expected JSON of the adapt golden files from the adapter's output")

// goldenSeparator is the line between the Caddyfile and the expected JSON
// in a testdata/adapt file, as in Caddy's caddyfile_adapt tests.
var goldenSeparator = regexp.MustCompile(`(?m)^----------\r?$`)

// TestCaddyfileAdapt adapts each testdata/adapt/*.caddyfiletest Caddyfile
// and compares the JSON with the expected one after the separator line.
func TestCaddyfileAdapt(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "adapt", "*.caddyfiletest"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden files: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			parts := goldenSeparator.Split(string(data), 2)
			if len(parts) != 2 {
				t.Fatalf("%s: no ---------- line between the Caddyfile and the JSON", file)
			}
			caddyfile := strings.TrimSpace(parts[0]) + "\n"
			got := adapt(t, caddyfile)
			if *update {
				if err := os.WriteFile(file, []byte(caddyfile+"----------\n"+got+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := normalizeJSON([]byte(parts[1]))
			if err != nil {
				t.Fatalf("%s: expected JSON: %v", file, err)
			}
			if got != want {
				t.Errorf("adapted JSON differs (go test -run TestCaddyfileAdapt -update rewrites it)\n--- got\n%s\n--- want\n%s", got, want)
			}
			checkCompiles(t, got)
		})
	}
}

// adapt runs the Caddyfile adapter and returns the normalised JSON.
func adapt(t *testing.T, caddyfile string) string {
	t.Helper()
	out, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
	if err != nil {
		t.Fatalf("adapt: %v", err)
	}
	for _, w := range warnings {
		t.Logf("warning: line %d: %s: %s", w.Line, w.Directive, w.Message)
	}
	got, err := normalizeJSON(out)
	if err != nil {
		t.Fatalf("adapter output: %v", err)
	}
	return got
}

// normalizeJSON indents JSON with sorted keys, so that the golden files are
// compared by content, not by layout. Numbers keep their exact text.
func normalizeJSON(b []byte) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return "", err
	}
	out, err := json.MarshalIndent(v, "", "\t")
	return string(out), err
}

// checkCompiles loads the platform app of an adapted config back into the
// App and compiles its catalog, so that nothing the Caddyfile accepts is
// refused when the app is provisioned. Placeholder secrets get a value long
// enough to pass, as the environment would supply.
func checkCompiles(t *testing.T, config string) {
	t.Helper()
	var cfg struct {
		Apps struct {
			Platform json.RawMessage `json:"platform"`
		} `json:"apps"`
	}
	if err := json.Unmarshal([]byte(config), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Apps.Platform == nil {
		t.Fatal("no platform app in the adapted config")
	}
	var app App
	dec := json.NewDecoder(bytes.NewReader(cfg.Apps.Platform))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&app); err != nil {
		t.Fatalf("platform app JSON does not load: %v", err)
	}
	resolve := func(s string) (string, error) {
		if strings.HasPrefix(s, "{") {
			return "a-secret-from-the-environment", nil
		}
		return s, nil
	}
	if _, err := catalog.Compile(app.Services, resolve); err != nil {
		t.Errorf("catalog refuses what the Caddyfile accepted: %v", err)
	}
}

// platformConfig wraps a platform block in the global options, followed by
// a trivial site: the block's first line is line 2 of the Caddyfile.
func platformConfig(block string) string {
	indented := "\t" + strings.ReplaceAll(block, "\n", "\n\t")
	return "{\n" + indented + "\n}\n\n:8080 {\n\trespond \"ok\"\n}\n"
}

func TestCaddyfileErrors(t *testing.T) {
	// svc is a valid service body around which the cases put one mistake.
	const svc = "\t\tbackend http://127.0.0.1:9000\n\t\tsecret {env.S}\n\t\tendpoint e\n"
	for _, tc := range []struct {
		name  string
		block string
		want  []string // substrings of the error
		line  int      // line the error points at
	}{
		// unknown subdirectives, at each level
		{"unknown top level", "platform {\n\tbogus 1\n}", []string{"unrecognized", "'bogus'", "platform"}, 3},
		{"unknown in prefixes", "platform {\n\tprefixes {\n\t\tadmin /x\n\t}\n}", []string{"'admin'", "prefixes"}, 4},
		{"unknown in service", "platform {\n\tservice s {\n" + svc + "\t\tbackends http://x\n\t}\n}", []string{"'backends'", "service 's'"}, 7},
		{"unknown in endpoint", "platform {\n\tservice s {\n" + svc + "\t\tendpoint f {\n\t\t\tmethod GET\n\t\t}\n\t}\n}", []string{"'method'", "endpoint 'f'"}, 8},
		{"unknown in product", "platform {\n\tservice s {\n" + svc + "\t\tproduct p {\n\t\t\tbilling PREPAID\n\t\t\tprize 1\n\t\t}\n\t}\n}", []string{"'prize'", "product 'p'"}, 9},

		// duplicate subdirectives
		{"duplicate store", "platform {\n\tstore /a\n\tstore /b\n}", []string{"duplicate", "'store'", "line 3"}, 4},
		{"duplicate prefix group", "platform {\n\tprefixes {\n\t\tcore /a\n\t\tcore /b\n\t}\n}", []string{"duplicate", "'core'"}, 5},
		{"duplicate backend", "platform {\n\tservice s {\n" + svc + "\t\tbackend http://other\n\t}\n}", []string{"duplicate", "'backend'", "service 's'"}, 7},
		{"duplicate secret", "platform {\n\tservice s {\n" + svc + "\t\tsecret {env.T}\n\t}\n}", []string{"duplicate", "'secret'"}, 7},
		{"duplicate path", "platform {\n\tservice s {\n" + svc + "\t\tendpoint f {\n\t\t\tpath /a\n\t\t\tpath /b\n\t\t}\n\t}\n}", []string{"duplicate", "'path'", "endpoint 'f'"}, 9},
		{"duplicate price", "platform {\n\tservice s {\n" + svc + "\t\tproduct p {\n\t\t\tprice 1\n\t\t\tprice 2\n\t\t}\n\t}\n}", []string{"duplicate", "'price'", "product 'p'"}, 9},
		{"second platform block", "platform {\n}\nplatform {\n}", []string{"'platform' given twice"}, 4},
		{"jwt without a key", "platform {\n\tjwt {\n\t\tissuer https://idp\n\t}\n}", []string{"jwt needs a key"}, 3},
		{"jwt with an argument", "platform {\n\tjwt x {\n\t}\n}", []string{"'jwt' takes no arguments"}, 3},
		{"unknown in jwt", "platform {\n\tjwt {\n\t\ths256_secret s\n\t\tissuers x\n\t}\n}", []string{"'issuers'", "jwt"}, 5},
		{"jwt leeway too long", "platform {\n\tjwt {\n\t\ths256_secret s\n\t\tleeway 1h\n\t}\n}", []string{"leeway"}, 5},
		{"bad sync_response", "platform {\n\tservice s {\n" + svc + "\t\tsync_response json\n\t}\n}", []string{"sync_response 'json' is not one of raw, wrapped"}, 7},
		{"duplicate endpoint sync_response", "platform {\n\tservice s {\n" + svc + "\t\tendpoint f {\n\t\t\tsync_response raw\n\t\t\tsync_response wrapped\n\t\t}\n\t}\n}", []string{"duplicate", "'sync_response'", "endpoint 'f'"}, 9},

		{"bad durability", "platform {\n\tdurability fsync\n}", []string{"durability 'fsync'", "sync", "write"}, 3},
		{"bad flush_interval", "platform {\n\tflush_interval soon\n}", []string{"flush_interval"}, 3},
		{"bad group_commit", "platform {\n\tgroup_commit lazy\n}", []string{"group_commit 'lazy'", "paced", "eager"}, 3},

		// argument counts
		{"platform argument", "platform x {\n}", []string{"'x'", "no arguments"}, 2},
		{"store missing", "platform {\n\tstore\n}", []string{"store", "missing argument"}, 3},
		{"store two", "platform {\n\tstore /a /b\n}", []string{"store", "too many", "'/b'"}, 3},
		{"store with block", "platform {\n\tstore /a {\n\t\tx\n\t}\n}", []string{"store takes no block", "'x'"}, 4},
		{"store postgres without dsn", "platform {\n\tstore postgres {\n\t\tnode_id a\n\t}\n}", []string{"dsn is required"}, 5},
		{"store postgres unknown", "platform {\n\tstore postgres {\n\t\tdsn x\n\t\tpool 3\n\t}\n}", []string{"unknown setting 'pool'"}, 5},
		{"store postgres bad ttl", "platform {\n\tstore postgres {\n\t\tdsn x\n\t\tlease_ttl 10ms\n\t}\n}", []string{"lease_ttl '10ms'"}, 5},
		{"store postgres bad max", "platform {\n\tstore postgres {\n\t\tdsn x\n\t\tlease_max -1\n\t}\n}", []string{"lease_max '-1'"}, 5},
		{"store postgres bad settle", "platform {\n\tstore postgres {\n\t\tdsn x\n\t\tsettle later\n\t}\n}", []string{"settle 'later'", "log", "commit"}, 5},
		{"store postgres bad ship interval", "platform {\n\tstore postgres {\n\t\tdsn x\n\t\tship_interval 0s\n\t}\n}", []string{"ship_interval '0s'"}, 5},
		{"store postgres log_dir twice", "platform {\n\tstore postgres {\n\t\tdsn x\n\t\tlog_dir a\n\t\tlog_dir b\n\t}\n}", []string{"log_dir set twice"}, 6},
		{"prefixes without block", "platform {\n\tprefixes\n}", []string{"prefixes needs a block"}, 3},
		{"prefix group empty", "platform {\n\tprefixes {\n\t\tusage\n\t}\n}", []string{"usage", "missing argument"}, 4},
		// A secret is never repeated in an error (config errors are logged).
		{"three secrets", "platform {\n\tservice s {\n\t\tsecret a b c\n\t}\n}", []string{"secret", "too many", "not repeated"}, 4},
		{"same secret twice", "platform {\n\tservice s {\n\t\tsecret {env.A} {env.A}\n\t}\n}", []string{"the same secret is given twice"}, 4},
		{"owners empty", "platform {\n\tservice s {\n\t\towners\n\t}\n}", []string{"owners", "missing argument"}, 4},
		{"owner not a user id", "platform {\n\tservice s {\n\t\towners alice team/bob\n\t}\n}", []string{"owner 'team/bob'", "128 bytes"}, 4},
		{"service without id", "platform {\n\tservice {\n" + svc + "\t}\n}", []string{"service: missing id"}, 3},
		{"service two ids", "platform {\n\tservice a b {\n" + svc + "\t}\n}", []string{"service 'a'", "unexpected 'b'"}, 3},
		{"endpoint without id", "platform {\n\tservice s {\n" + svc + "\t\tendpoint\n\t}\n}", []string{"endpoint: missing id"}, 7},
		{"async with argument", "platform {\n\tservice s {\n" + svc + "\t\tendpoint f {\n\t\t\tasync true\n\t\t}\n\t}\n}", []string{"async", "'true'", "'only'"}, 8},
		{"async with two arguments", "platform {\n\tservice s {\n" + svc + "\t\tendpoint f {\n\t\t\tasync only now\n\t\t}\n\t}\n}", []string{"async", "too many", "'now'"}, 8},
		{"quota missing", "platform {\n\tservice s {\n" + svc + "\t\tproduct p {\n\t\t\tquota\n\t\t}\n\t}\n}", []string{"quota", "missing argument"}, 8},
		{"quota without per", "platform {\n\tservice s {\n" + svc + "\t\tproduct p {\n\t\t\tquota 10 day\n\t\t}\n\t}\n}", []string{"quota takes", "'10 day'"}, 8},

		// invalid ids
		{"bad service id", "platform {\n\tservice a/b {\n" + svc + "\t}\n}", []string{"service id 'a/b'"}, 3},
		{"bad endpoint id", "platform {\n\tservice s {\n" + svc + "\t\tendpoint ../x\n\t}\n}", []string{"endpoint id '../x'"}, 7},
		{"bad product id", "platform {\n\tservice s {\n" + svc + "\t\tproduct p? {\n\t\t}\n\t}\n}", []string{"product id 'p?'"}, 7},

		// decimals
		{"bad cost", "platform {\n\tservice s {\n" + svc + "\t\tendpoint f {\n\t\t\tcost 1,5\n\t\t}\n\t}\n}", []string{"cost '1,5'", "invalid decimal"}, 8},
		{"negative price", "platform {\n\tservice s {\n" + svc + "\t\tproduct p {\n\t\t\tprice -1\n\t\t}\n\t}\n}", []string{"price '-1'"}, 8},
		{"too precise price", "platform {\n\tservice s {\n" + svc + "\t\tproduct p {\n\t\t\tprice 0.0000001\n\t\t}\n\t}\n}", []string{"price '0.0000001'", "6 decimal places"}, 8},
		{"bad quota", "platform {\n\tservice s {\n" + svc + "\t\tproduct p {\n\t\t\tquota lots\n\t\t}\n\t}\n}", []string{"quota 'lots'"}, 8},
		{"bad spending cap", "platform {\n\tservice s {\n" + svc + "\t\tproduct p {\n\t\t\tspending_cap $50\n\t\t}\n\t}\n}", []string{"spending_cap '$50'"}, 8},

		// enumerations
		{"bad method", "platform {\n\tservice s {\n" + svc + "\t\tendpoint f {\n\t\t\tmethods GET PATCH\n\t\t}\n\t}\n}", []string{"method 'PATCH'"}, 8},
		{"bad billing", "platform {\n\tservice s {\n" + svc + "\t\tproduct p {\n\t\t\tbilling FREE\n\t\t}\n\t}\n}", []string{"billing 'FREE'", "SUBSCRIPTION"}, 8},
		{"bad measurement", "platform {\n\tservice s {\n" + svc + "\t\tproduct p {\n\t\t\tmeasurement PER_CALL\n\t\t}\n\t}\n}", []string{"measurement 'PER_CALL'", "PER_REQUEST"}, 8},
		{"bad period", "platform {\n\tservice s {\n" + svc + "\t\tproduct p {\n\t\t\tquota 10 per fortnight\n\t\t}\n\t}\n}", []string{"period 'fortnight'"}, 8},
		{"bad overage", "platform {\n\tservice s {\n" + svc + "\t\tproduct p {\n\t\t\toverage maybe\n\t\t}\n\t}\n}", []string{"overage 'maybe'", "block, allow"}, 8},

		// rate limits
		{"rate without window", "platform {\n\tservice s {\n" + svc + "\t\tproduct p {\n\t\t\trate_limit 10\n\t\t}\n\t}\n}", []string{"rate_limit '10'", "<requests>/<window>"}, 8},
		{"rate zero", "platform {\n\tservice s {\n" + svc + "\t\tproduct p {\n\t\t\trate_limit 0/s\n\t\t}\n\t}\n}", []string{"rate_limit '0/s'", "positive"}, 8},
		{"rate bad window", "platform {\n\tservice s {\n" + svc + "\t\tproduct p {\n\t\t\trate_limit 10/fortnight\n\t\t}\n\t}\n}", []string{"rate_limit '10/fortnight'", "'fortnight'"}, 8},
		{"rate sub-second window", "platform {\n\tservice s {\n" + svc + "\t\tproduct p {\n\t\t\trate_limit 10/500ms\n\t\t}\n\t}\n}", []string{"'500ms'", "whole number of seconds"}, 8},
		{"rate bad burst", "platform {\n\tservice s {\n" + svc + "\t\tproduct p {\n\t\t\trate_limit 10/s burst many\n\t\t}\n\t}\n}", []string{"burst 'many'"}, 8},
		{"rate bad keyword", "platform {\n\tservice s {\n" + svc + "\t\tproduct p {\n\t\t\trate_limit 10/s bursts 20\n\t\t}\n\t}\n}", []string{"rate_limit takes", "'10/s bursts 20'"}, 8},

		// durations and sizes
		{"bad duration", "platform {\n\ttimestamp_tolerance 5 minutes\n}", []string{"timestamp_tolerance", "too many", "'minutes'"}, 3},
		{"unparsable duration", "platform {\n\tjob_ttl soon\n}", []string{"job_ttl 'soon'", "not a duration"}, 3},
		{"zero duration", "platform {\n\tjob_ttl 0s\n}", []string{"job_ttl '0s'", "positive"}, 3},
		{"bad size", "platform {\n\tmax_body_bytes 10 MiB\n}", []string{"max_body_bytes", "'MiB'"}, 3},
		{"unparsable size", "platform {\n\tresult_max_bytes big\n}", []string{"result_max_bytes 'big'", "not a size"}, 3},
		{"zero size", "platform {\n\tusage_max_body_bytes 0\n}", []string{"usage_max_body_bytes '0'"}, 3},

		// other values
		{"bad brand", "platform {\n\theader_brand X-Tollara\n}", []string{"header_brand 'X-Tollara'"}, 3},
		{"bad public url", "platform {\n\tpublic_url api.example.com\n}", []string{"public_url '(no scheme; value not repeated)'"}, 3},
		{"bad backend", "platform {\n\tservice s {\n\t\tbackend ftp://files\n\t}\n}", []string{"backend 'ftp://files'"}, 4},
		{"bad prefix", "platform {\n\tprefixes {\n\t\tgateway api/\n\t}\n}", []string{"gateway prefix 'api/'"}, 4},
		{"prefix twice in a group", "platform {\n\tprefixes {\n\t\tcore /a /a\n\t}\n}", []string{"core prefix '/a' listed twice"}, 4},
		{"prefix in two groups", "platform {\n\tprefixes {\n\t\tusage /api\n\t}\n}", []string{"prefix '/api'", "gateway", "usage"}, 3},
		{"bad path", "platform {\n\tservice s {\n" + svc + "\t\tendpoint f {\n\t\t\tpath v1?x=1\n\t\t}\n\t}\n}", []string{"path 'v1?x=1'"}, 8},

		// what a service and a product must have
		{"service without backend", "platform {\n\tservice s {\n\t\tsecret {env.S}\n\t\tendpoint e\n\t}\n}", []string{"service 's' has no backend"}, 3},
		{"service without secret", "platform {\n\tservice s {\n\t\tbackend http://x\n\t\tendpoint e\n\t}\n}", []string{"service 's' has no secret"}, 3},
		{"service without endpoint", "platform {\n\tservice s {\n\t\tbackend http://x\n\t\tsecret {env.S}\n\t}\n}", []string{"service 's' has no endpoint"}, 3},
		{"service without block", "platform {\n\tservice s\n}", []string{"service 's' has no backend"}, 3},
		{"product without billing", "platform {\n\tservice s {\n" + svc + "\t\tproduct p {\n\t\t\tmeasurement PER_TOKEN\n\t\t}\n\t}\n}", []string{"product 'p'", "no billing model"}, 7},
		{"product without measurement", "platform {\n\tservice s {\n" + svc + "\t\tproduct p {\n\t\t\tbilling PREPAID\n\t\t}\n\t}\n}", []string{"product 'p'", "no measurement type"}, 7},

		// duplicate ids
		{"duplicate service", "platform {\n\tservice s {\n" + svc + "\t}\n\tservice s {\n" + svc + "\t}\n}", []string{"service 's' declared twice", "line 3"}, 8},
		{"duplicate endpoint", "platform {\n\tservice s {\n" + svc + "\t\tendpoint e {\n\t\t\tasync\n\t\t}\n\t}\n}", []string{"endpoint 'e' declared twice", "line 6"}, 7},
		{"duplicate product", "platform {\n\tservice s {\n" + svc + "\t\tproduct p {\n\t\t\tbilling PREPAID\n\t\t\tmeasurement PER_TOKEN\n\t\t}\n\t\tproduct p {\n\t\t\tbilling PREPAID\n\t\t\tmeasurement PER_TOKEN\n\t\t}\n\t}\n}", []string{"product 'p' declared twice", "line 7"}, 11},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(platformConfig(tc.block)), nil)
			if err == nil {
				t.Fatalf("no error for\n%s", tc.block)
			}
			msg := err.Error()
			t.Log(msg)
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

// TestCaddyfileErrorsKeepSecrets: an error about a setting that holds a
// secret does not repeat it. A config error is logged, and "secret
// 's3cr3t…' given twice" wrote a service's signing secret there.
func TestCaddyfileErrorsKeepSecrets(t *testing.T) {
	for _, block := range []string{
		"platform {\n\tservice s {\n\t\tsecret aaaa-first-secret bbbb-second-secret cccc-third-secret\n\t}\n}",
		"platform {\n\tservice s {\n\t\tsecret cccc-third-secret cccc-third-secret\n\t}\n}",
		"platform {\n\talerts {\n\t\tsecret aaaa-first-secret cccc-third-secret\n\t}\n}",
		"platform {\n\tpayments stripe {\n\t\twebhook_secret whsec_aaaa cccc-third-secret\n\t}\n}",
	} {
		_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(platformConfig(block)), nil)
		if err == nil {
			t.Fatalf("no error for\n%s", block)
		}
		t.Log(err)
		if strings.Contains(err.Error(), "cccc-third-secret") {
			t.Errorf("the error repeats a secret: %s", err)
		}
	}
}

// TestCaddyfileURLErrorsKeepSecrets: an error about a URL names its
// scheme and host, never the rest. "webhook 'https://ops:TOKEN@hooks…'"
// and "backend 'https://svc:PASSWORD@10.0.0.5'" wrote a receiver's token
// and a backend's password to the log (a review of security by default).
func TestCaddyfileURLErrorsKeepSecrets(t *testing.T) {
	const secret = "tok-SECRET"
	for _, tc := range []struct{ block, want string }{
		{"platform {\n\talerts {\n\t\twebhook https://ops:tok-SECRET@hooks.example.com/alerts\n\t\tsecret {env.A}\n\t}\n}", "webhook 'https://hooks.example.com/…'"},
		{"platform {\n\talerts {\n\t\twebhook https://hooks.example.com/alerts?token=tok-SECRET#x\n\t\tsecret {env.A}\n\t}\n}", "webhook 'https://hooks.example.com/…'"},
		{"platform {\n\talerts {\n\t\twebhook htps://hooks.slack.com/services/T0/B0/tok-SECRET\n\t\tsecret {env.A}\n\t}\n}", "webhook 'htps://hooks.slack.com/…'"},
		{"platform {\n\talerts {\n\t\twebhook hooks.slack.com/services/T0/B0/tok-SECRET\n\t\tsecret {env.A}\n\t}\n}", "webhook '(no scheme; value not repeated)'"},
		{"platform {\n\tservice s {\n\t\tbackend https://svc:tok-SECRET@10.0.0.5:8443\n\t\tsecret {env.S}\n\t\tendpoint e\n\t}\n}", "backend 'https://10.0.0.5:8443/…'"},
		{"platform {\n\tservice s {\n\t\tbackend svc:tok-SECRET@10.0.0.5\n\t\tsecret {env.S}\n\t\tendpoint e\n\t}\n}", "backend 'svc:…'"},
		{"platform {\n\tpublic_url https://api.example.com/?k=tok-SECRET\n}", "public_url 'https://api.example.com/…'"},
		{"platform {\n\tservice s {\n\t\tbackend http://x\n\t\tsecret {env.S}\n\t\tendpoint e\n\t}\n\tpayments stripe {\n\t\tsecret_key {env.K}\n\t\twebhook_secret {env.W}\n\t\tapi_base https://u:tok-SECRET@stripe.example\n\t}\n}", "api_base 'https://stripe.example/…'"},
	} {
		_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(platformConfig(tc.block)), nil)
		switch {
		case err == nil:
			t.Errorf("no error for\n%s", tc.block)
		case strings.Contains(err.Error(), secret):
			t.Errorf("the error repeats the URL's secret: %s", err)
		case !strings.Contains(err.Error(), tc.want):
			t.Errorf("error %q does not say %q", err, tc.want)
		}
	}
	// JSON config (no Caddyfile): the same checks at provision.
	c := &AlertsConfig{Webhook: "https://ops:tok-SECRET@hooks.example.com/a", Secret: "0123456789abcdef0123"}
	if err := c.check(); err == nil || strings.Contains(err.Error(), secret) {
		t.Errorf("AlertsConfig.check() = %v, want an error without the token", err)
	}
	a := &App{PublicURL: "api.example.com/tok-SECRET"}
	if err := a.defaults(); err == nil || strings.Contains(err.Error(), secret) {
		t.Errorf("App public_url: %v, want an error without the secret", err)
	}
}

// A secret's length is checked when placeholders are resolved at
// provision, not at parse time: {env.S} is shorter than any real secret.
func TestCaddyfileKeepsSecretsAsWritten(t *testing.T) {
	got := adapt(t, platformConfig("platform {\n\tservice s {\n\t\tbackend http://x\n\t\tsecret {env.S} short\n\t\tendpoint e\n\t}\n}"))
	if !strings.Contains(got, `"{env.S}"`) || !strings.Contains(got, `"short"`) {
		t.Errorf("secrets not kept as written:\n%s", got)
	}
}

func TestParseRate(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want billing.RateLimit
		err  string
	}{
		{in: "10/s", want: billing.RateLimit{Requests: 10, WindowSeconds: 1}},
		{in: "600/m", want: billing.RateLimit{Requests: 600, WindowSeconds: 60}},
		{in: "1000/h", want: billing.RateLimit{Requests: 1000, WindowSeconds: 3600}},
		{in: "5000/d", want: billing.RateLimit{Requests: 5000, WindowSeconds: 86400}},
		{in: "100/10s", want: billing.RateLimit{Requests: 100, WindowSeconds: 10}},
		{in: "5/1m30s", want: billing.RateLimit{Requests: 5, WindowSeconds: 90}},
		{in: "10", err: "<requests>/<window>"},
		{in: "/s", err: "request count ''"},
		{in: "-1/s", err: "request count '-1'"},
		{in: "1.5/s", err: "request count '1.5'"},
		{in: "10/", err: "window ''"},
		{in: "10/x", err: "window 'x'"},
		{in: "10/1.5s", err: "whole number of seconds"},
		{in: "10/0s", err: "at least 1s"},
		{in: "10/-1s", err: "window '-1s'"},
	} {
		got, err := parseRate(tc.in)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("parseRate(%q) error = %v, want one mentioning %q", tc.in, err, tc.err)
		case tc.err == "" && err != nil:
			t.Errorf("parseRate(%q): %v", tc.in, err)
		case tc.err == "" && *got != tc.want:
			t.Errorf("parseRate(%q) = %+v, want %+v", tc.in, *got, tc.want)
		}
	}
}
