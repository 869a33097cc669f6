package publiccatalog

import (
	"bytes"
	"embed"
	"fmt"
	"html/template"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"
)

// A service's API reference as a server-rendered page, from its OpenAPI
// document (attached or built), so a caller reads the docs without a
// script or an outside request: html/template, one embedded stylesheet,
// a Content-Security-Policy that allows nothing else. Descriptions are
// shown as plain text (Markdown is not rendered). The storefront may
// replace it with richer pages; the document stays the source.

//go:embed templates/docs.html
var docsTemplate string

//go:embed assets/docs.css
var assetFS embed.FS

// docsContentSecurityPolicy allows the one stylesheet and nothing else.
const docsContentSecurityPolicy = "default-src 'none'; style-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"

var docsPage = template.Must(template.New("docs").Parse(docsTemplate))

type docsView struct {
	Links                                StorefrontLinks
	Title, Description, Version, OpenAPI string
	Servers                              []string
	Operations                           []docsOperation
}

type docsOperation struct {
	Anchor, Method, Path, Summary, Description, Auth string
	// Curl is a command to try the operation with, the caller's key read
	// from $SERVICE_KEY (keys are kept only as hashes: no page can show
	// one after it was made; the portal fills it in once, when it makes a
	// key).
	Curl       string
	Parameters []docsParameter
	Body       []string
	Responses  []docsResponse
}

type docsParameter struct {
	Name, In, Description string
	Required              bool
}

type docsResponse struct{ Status, Description string }

// methodOrder sorts operations of one path the way people read them.
var methodOrder = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "QUERY"}

// StorefrontLinks are where an API reference page links back to: the
// storefront's list of services and the service's own page (its plans
// and how to sign in). Empty: no links.
type StorefrontLinks struct{ Services, Service string }

// RenderDocs renders the API reference page of an OpenAPI document (as
// JSON, already validated), with links back to the storefront when links
// are given.
func RenderDocs(doc []byte, links StorefrontLinks) ([]byte, error) {
	loader := openapi3.NewLoader()
	loader.IsExternalRefsAllowed = false
	d, err := loader.LoadFromData(doc)
	if err != nil {
		return nil, fmt.Errorf("read the OpenAPI document: %w", err)
	}
	v := docsView{OpenAPI: d.OpenAPI, Links: links}
	if d.Info != nil {
		v.Title, v.Description, v.Version = d.Info.Title, d.Info.Description, d.Info.Version
	}
	for _, s := range d.Servers {
		v.Servers = append(v.Servers, s.URL)
	}
	schemes := securityNames(d)
	if d.Paths != nil {
		paths := d.Paths.Map()
		keys := make([]string, 0, len(paths))
		for k := range paths {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, p := range keys {
			ops := paths[p].Operations()
			methods := make([]string, 0, len(ops))
			for m := range ops {
				methods = append(methods, m)
			}
			slices.SortFunc(methods, func(a, b string) int {
				return slices.Index(methodOrder, a) - slices.Index(methodOrder, b)
			})
			for _, m := range methods {
				o := operationView(p, m, ops[m], paths[p], d, schemes)
				o.Curl = curlExample(v.Servers, o)
				v.Operations = append(v.Operations, o)
			}
		}
	}
	var buf bytes.Buffer
	if err := docsPage.Execute(&buf, v); err != nil {
		return nil, fmt.Errorf("render the API reference: %w", err)
	}
	return buf.Bytes(), nil
}

// securityNames describes each security scheme for people.
func securityNames(d *openapi3.T) map[string]string {
	out := map[string]string{}
	if d.Components == nil {
		return out
	}
	for name, ref := range d.Components.SecuritySchemes {
		s := ref.Value
		if s == nil {
			continue
		}
		switch {
		case s.Type == "http" && strings.EqualFold(s.Scheme, "bearer"):
			out[name] = "Authorization: Bearer <" + name + ">"
		case s.Type == "apiKey":
			out[name] = s.Name + " (" + s.In + ")"
		default:
			out[name] = name + " (" + s.Type + ")"
		}
	}
	return out
}

func operationView(path, method string, op *openapi3.Operation, item *openapi3.PathItem, d *openapi3.T, schemes map[string]string) docsOperation {
	o := docsOperation{
		Anchor: op.OperationID, Method: method, Path: path,
		Summary: op.Summary, Description: op.Description,
	}
	if o.Anchor == "" {
		o.Anchor = strings.ToLower(method) + strings.NewReplacer("/", "-", "{", "", "}", "").Replace(path)
	}
	security := d.Security
	if op.Security != nil {
		security = *op.Security
	}
	var auth []string
	for _, req := range security {
		for name := range req {
			if s, ok := schemes[name]; ok && !slices.Contains(auth, s) {
				auth = append(auth, s)
			}
		}
	}
	sort.Strings(auth)
	o.Auth = strings.Join(auth, " or ")
	for _, params := range []openapi3.Parameters{item.Parameters, op.Parameters} {
		for _, ref := range params {
			if p := ref.Value; p != nil {
				o.Parameters = append(o.Parameters, docsParameter{Name: p.Name, In: p.In, Description: p.Description, Required: p.Required})
			}
		}
	}
	if op.RequestBody != nil && op.RequestBody.Value != nil {
		for ct := range op.RequestBody.Value.Content {
			o.Body = append(o.Body, ct)
		}
		sort.Strings(o.Body)
	}
	if op.Responses != nil {
		for status, ref := range op.Responses.Map() {
			desc := ""
			if ref.Value != nil && ref.Value.Description != nil {
				desc = *ref.Value.Description
			}
			o.Responses = append(o.Responses, docsResponse{Status: status, Description: desc})
		}
		slices.SortFunc(o.Responses, func(a, b docsResponse) int { return strings.Compare(a.Status, b.Status) })
	}
	return o
}

// curlExample is a curl command for o: the document's first server (or a
// placeholder host), path parameters as upper-case placeholders (curl
// would read braces as a glob), the key from $SERVICE_KEY in the header
// the operation's security names, and a JSON body when it takes one (a
// body of any type, */*, among them); never a media range as the body's
// Content-Type. A relative server (the gateway's own document is served
// with "/" when public_url is not set) is joined onto the placeholder
// host: curl refuses a URL without one.
func curlExample(servers []string, o docsOperation) string {
	const placeholder = "https://gateway.example"
	base := placeholder
	if len(servers) > 0 && servers[0] != "" {
		base = servers[0]
		if u, err := url.Parse(base); err != nil || u.Scheme == "" || u.Host == "" {
			base = placeholder + "/" + strings.TrimLeft(base, "/")
		}
	}
	path := pathParam.ReplaceAllStringFunc(o.Path, func(m string) string {
		return strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(m[1 : len(m)-1]))
	})
	var b strings.Builder
	b.WriteString("curl")
	if o.Method != "GET" {
		b.WriteString(" -X " + o.Method)
	}
	b.WriteString(" '" + strings.TrimRight(base, "/") + path + "'")
	switch {
	case strings.HasPrefix(o.Auth, "Authorization: Bearer"):
		b.WriteString(` -H "Authorization: Bearer $SERVICE_KEY"`)
	case o.Auth != "":
		if name, _, ok := strings.Cut(o.Auth, " ("); ok && strings.Contains(o.Auth, "(header)") {
			b.WriteString(` -H "` + name + `: $SERVICE_KEY"`)
		}
	}
	if len(o.Body) > 0 {
		ct := o.Body[0]
		if slices.Contains(o.Body, "application/json") || slices.Contains(o.Body, "*/*") || slices.Contains(o.Body, "application/*") {
			ct = "application/json"
		}
		// A media range ("text/*") is no type a request may send.
		if !strings.Contains(ct, "*") {
			b.WriteString(" -H 'Content-Type: " + ct + "'")
		}
		if ct == "application/json" {
			b.WriteString(" -d '{}'")
		}
	}
	return b.String()
}

// pathParam matches a path template's parameter ({id}).
var pathParam = regexp.MustCompile(`\{[^}/]+\}`)

// wantsHTML reports whether a request asks for a page (a browser's
// navigation says text/html), not for the catalog's JSON.
func wantsHTML(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		if strings.Contains(v, "text/html") {
			return true
		}
	}
	return false
}

var docsNotFoundPage = template.Must(template.New("notfound").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>No such API reference</title>
<link rel="stylesheet" href="../../assets/docs.css">
</head>
<body>
<main>
<h1>No such API reference</h1>
<p>There is no public API called “{{.}}” here: the link may be mistyped, or the service is no longer public.</p>
<p class="muted">Error code <code>service_not_found</code>.</p>
</main>
</body>
</html>
`))

// docsNotFound answers a browser asking for the API reference of a
// service that is not public (or does not exist) with a page saying so,
// 404 under the reference's policy, instead of the catalog's JSON error
// (which clients that do not ask for HTML still get).
func docsNotFound(w http.ResponseWriter, id string) {
	var b strings.Builder
	_ = docsNotFoundPage.Execute(&b, id)
	hdr := w.Header()
	hdr.Set("Content-Type", htmlType)
	hdr.Set("Content-Security-Policy", docsContentSecurityPolicy)
	hdr.Set("Referrer-Policy", "no-referrer")
	hdr.Set("X-Frame-Options", "DENY")
	hdr.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusNotFound)
	_, _ = io.WriteString(w, b.String())
}
