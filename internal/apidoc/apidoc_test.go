package apidoc

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/platformgw/gateway/internal/e2etest"
	"github.com/platformgw/gateway/internal/openapidoc"

	_ "github.com/platformgw/gateway/internal/platformgw"
	_ "github.com/platformgw/gateway/internal/publiccatalog"
	_ "github.com/platformgw/gateway/internal/usagehandler"
)

var (
	adminPort = e2etest.EnvInt("E2E_ADMIN_PORT", 2999)
	httpPort  = e2etest.EnvInt("E2E_HTTP_PORT", 9080)
)

const docPath = "../../docs/openapi.json"

// document is what the test reads of docs/openapi.json.
type document struct {
	Paths map[string]map[string]struct {
		Parameters []struct {
			Name     string `json:"name"`
			In       string `json:"in"`
			Required bool   `json:"required"`
		} `json:"parameters"`
		Responses map[string]any `json:"responses"`
	} `json:"paths"`
}

func readDocument(t *testing.T) document {
	t.Helper()
	data, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := openapidoc.Check(data); err != nil {
		t.Fatalf("docs/openapi.json is not a valid OpenAPI document: %v", err)
	}
	var doc document
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

// Values of the path and query parameters the requests use: a public
// service and its endpoint, and ids nothing has.
var sample = map[string]string{
	"serviceId":  "weather",
	"endpointId": "forecast",
	"requestId":  "no-such-job",
	"keyId":      "no-such-key",
	"userId":     "alice",
	"before":     "2000-01-01T00:00:00Z",
}

func startGateway(t *testing.T) {
	t.Helper()
	cfg := fmt.Sprintf(`{
	admin localhost:%d
	http_port %d
	auto_https off
	grace_period 1s
	platform {
		store %s/platform.db
		service weather {
			backend http://127.0.0.1:1
			secret weather-secret-0123456789abcdef
			public
			endpoint forecast {
				async
			}
			product basic {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				quota 100
			}
		}
	}
}
:%d {
	bind 127.0.0.1
	handle_path /catalog/* {
		platform_catalog
	}
	handle {
		platform_usage
		platform_gateway
		reverse_proxy {
			dynamic platform
			transport platform
		}
	}
}
`, adminPort, httpPort, t.TempDir(), httpPort)
	caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort}).InitServer(cfg, "caddyfile")
}

// TestDocumentedRoutesAnswerAsDocumented sends each documented operation
// with no credentials and no body, as the first request of a client
// that has read only the document: the answer's status must be one the
// document lists for it, and a refusal the JSON error body. Then a
// method the document does not list for the path must be refused with
// 405 and an Allow header naming exactly the documented methods (401
// first where a service key is checked before the method).
func TestDocumentedRoutesAnswerAsDocumented(t *testing.T) {
	doc := readDocument(t)
	startGateway(t)
	site := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	admin := fmt.Sprintf("http://localhost:%d", adminPort)
	for path, item := range doc.Paths {
		base := site
		if strings.HasPrefix(path, "/platform/") {
			base = admin
		}
		var documented []string
		for method, op := range item {
			documented = append(documented, strings.ToUpper(method))
			url := base + fill(path)
			var query []string
			for _, p := range op.Parameters {
				if p.In == "query" && p.Required {
					query = append(query, p.Name+"="+sample[p.Name])
				}
			}
			if len(query) > 0 {
				url += "?" + strings.Join(query, "&")
			}
			status, body, _ := send(t, strings.ToUpper(method), url)
			if !listed(op.Responses, status) {
				t.Errorf("%s %s answered %d, which the document does not list (%v): %s", strings.ToUpper(method), path, status, keys(op.Responses), body)
			}
			if status >= 400 {
				var e struct{ Code string }
				if json.Unmarshal([]byte(body), &e) != nil || e.Code == "" {
					t.Errorf("%s %s: a %d without the JSON error body: %s", strings.ToUpper(method), path, status, body)
				}
			}
		}
		sort.Strings(documented)
		status, body, allow := send(t, "PATCH", base+fill(path))
		switch {
		case status == http.StatusUnauthorized && strings.Contains(path, "/invoke"):
			// The key comes before the route (docs/wire-contract.md, "Sync invoke").
		case status != http.StatusMethodNotAllowed:
			t.Errorf("PATCH %s: %d, want 405: %s", path, status, body)
		default:
			got := strings.Split(allow, ", ")
			got = slices.DeleteFunc(got, func(m string) bool { return m == "HEAD" && !slices.Contains(documented, "HEAD") })
			sort.Strings(got)
			if !slices.Equal(got, documented) {
				t.Errorf("%s: Allow %q, the document lists %v", path, allow, documented)
			}
		}
	}
	t.Run("pre-flight denials", func(t *testing.T) { preflightDenials(t, doc) })
}

func fill(path string) string {
	for name, v := range sample {
		path = strings.ReplaceAll(path, "{"+name+"}", v)
	}
	return path
}

func send(t *testing.T, method, url string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(b), resp.Header.Get("Allow")
}

func listed(responses map[string]any, status int) bool {
	if _, ok := responses[strconv.Itoa(status)]; ok {
		return true
	}
	_, ok := responses[strconv.Itoa(status/100)+"XX"]
	return ok
}

func keys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestAdminRoutesAreDocumented reads the admin API's route table (the
// route function of internal/platform/adminapi.go) and checks that each
// route and method is in the document, and the document has no admin
// route the table lacks. The store and catalog modules' few routes are
// listed here by hand.
func TestAdminRoutesAreDocumented(t *testing.T) {
	doc := readDocument(t)
	registered := adminRouteTable(t, "../platform/adminapi.go")
	for _, r := range []string{"GET /platform/store/", "GET /platform/store/backup", "GET /platform/catalog/", "GET /platform/catalog/{}"} {
		registered[r] = true
	}
	documented := map[string]bool{}
	for path, item := range doc.Paths {
		if !strings.HasPrefix(path, "/platform/") {
			continue
		}
		for method := range item {
			documented[strings.ToUpper(method)+" "+anyParam(path)] = true
		}
	}
	for r := range registered {
		if !documented[r] {
			t.Errorf("the admin API serves %s; docs/openapi.json does not document it", r)
		}
	}
	for r := range documented {
		if !registered[r] {
			t.Errorf("docs/openapi.json documents %s; the admin API does not serve it", r)
		}
	}
}

// anyParam writes every path parameter as {}.
func anyParam(path string) string {
	segs := strings.Split(path, "/")
	for i, s := range segs {
		if strings.HasPrefix(s, "{") {
			segs[i] = "{}"
		}
	}
	return strings.Join(segs, "/")
}

// adminRouteTable reads the cases of route(p []string): each case is a
// conjunction of len(p) == N and p[i] == "literal", and returns a map
// literal keyed by http.MethodX.
func adminRouteTable(t *testing.T, file string) map[string]bool {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		fn, ok := n.(*ast.FuncDecl)
		if !ok || fn.Name.Name != "route" || fn.Recv == nil {
			return true
		}
		for _, stmt := range fn.Body.List {
			sw, ok := stmt.(*ast.SwitchStmt)
			if !ok {
				continue
			}
			for _, c := range sw.Body.List {
				cc := c.(*ast.CaseClause)
				for _, cond := range cc.List {
					segs := caseSegments(t, cond)
					for _, m := range caseMethods(cc) {
						out[m+" /platform/"+strings.Join(segs, "/")] = true
					}
				}
			}
		}
		return false
	})
	if len(out) == 0 {
		t.Fatalf("no routes read from %s: has route() changed shape? update this test", file)
	}
	return out
}

func caseSegments(t *testing.T, cond ast.Expr) []string {
	var n int
	lits := map[int]string{}
	var walk func(e ast.Expr)
	walk = func(e ast.Expr) {
		b, ok := e.(*ast.BinaryExpr)
		if !ok {
			t.Fatalf("route(): a case condition this test cannot read: %T", e)
		}
		switch b.Op {
		case token.LAND:
			walk(b.X)
			walk(b.Y)
		case token.EQL:
			switch x := b.X.(type) {
			case *ast.CallExpr: // len(p) == N
				v, _ := strconv.Atoi(b.Y.(*ast.BasicLit).Value)
				n = v
			case *ast.IndexExpr: // p[i] == "lit"
				i, _ := strconv.Atoi(x.Index.(*ast.BasicLit).Value)
				s, _ := strconv.Unquote(b.Y.(*ast.BasicLit).Value)
				lits[i] = s
			}
		}
	}
	walk(cond)
	segs := make([]string, n)
	for i := range segs {
		if s, ok := lits[i]; ok {
			segs[i] = s
		} else {
			segs[i] = "{}"
		}
	}
	return segs
}

func caseMethods(cc *ast.CaseClause) []string {
	var out []string
	for _, s := range cc.Body {
		ret, ok := s.(*ast.ReturnStmt)
		if !ok || len(ret.Results) == 0 {
			continue
		}
		lit, ok := ret.Results[0].(*ast.CompositeLit)
		if !ok {
			continue
		}
		for _, el := range lit.Elts {
			kv := el.(*ast.KeyValueExpr)
			if sel, ok := kv.Key.(*ast.SelectorExpr); ok {
				out = append(out, strings.ToUpper(strings.TrimPrefix(sel.Sel.Name, "Method")))
			}
		}
	}
	return out
}

// preflightDenials: the statuses the pre-flight routes answer when they
// deny (403 for no subscription or a key of another user, 404 for an
// unknown service asked with a key, 429 past a quota) are in the
// document. It listed only 200, 400, 401, 405, 413 and 503 for the
// estimates, so a client generated from it had no case for the denials
// the wire contract makes part of an estimate's answer, and gave the
// billing estimate only its Bearer scheme, not the backend's signature.
// It runs on the gateway TestDocumentedRoutesAnswerAsDocumented started
// (a second one in the process would be a reload to another store).
func preflightDenials(t *testing.T, doc document) {
	site := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	admin := fmt.Sprintf("http://localhost:%d", adminPort)
	post := func(url, body string, header ...string) (int, string) {
		t.Helper()
		req, err := http.NewRequest("POST", url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	req, _ := http.NewRequest("PUT", admin+"/platform/subscriptions/alice/weather", strings.NewReader(`{"productId":"basic"}`))
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("subscribe: %v %v", resp, err)
	}
	status, body := post(admin+"/platform/keys", `{"userId":"alice"}`)
	var k struct{ Key string }
	if status != 201 || json.Unmarshal([]byte(body), &k) != nil {
		t.Fatalf("key: %d %s", status, body)
	}
	status, body = post(admin+"/platform/keys", `{"userId":"bob"}`)
	var bob struct{ Key string }
	if status != 201 || json.Unmarshal([]byte(body), &bob) != nil {
		t.Fatalf("key: %d %s", status, body)
	}
	const secret = "weather-secret-0123456789abcdef"
	for _, tc := range []struct {
		path, body, bearer string
		want               int
	}{
		{"/api/v1/service-keys/estimate-usage", `{"serviceKey":"` + k.Key + `","serviceSecret":"` + secret + `","estimatedUnits":1000}`, "", 429},
		{"/api/v1/service-keys/estimate-usage", `{"serviceKey":"` + bob.Key + `","serviceSecret":"` + secret + `","estimatedUnits":1}`, "", 403},
		{"/api/v1/billing/usage/estimate", `{"userId":"alice","serviceId":"weather","estimatedUnits":1000}`, k.Key, 429},
		{"/api/v1/billing/usage/estimate", `{"userId":"alice","serviceId":"weather","estimatedUnits":1}`, bob.Key, 403},
		{"/api/v1/billing/usage/estimate", `{"userId":"alice","serviceId":"nope","estimatedUnits":1}`, k.Key, 404},
	} {
		status, body := post(site+tc.path, tc.body, "Authorization", "Bearer "+tc.bearer)
		if status != tc.want {
			t.Errorf("%s %s: %d %s, want %d", tc.path, tc.body, status, body, tc.want)
			continue
		}
		if op := doc.Paths[tc.path]["post"]; !listed(op.Responses, status) {
			t.Errorf("POST %s answered %d, which the document does not list (%v): %s", tc.path, status, keys(op.Responses), body)
		}
	}
}
