// Package publiccatalog is the public catalog, the platform_catalog HTTP
// handler: what the gateway sells, as JSON anyone may read without a key
// (the public services, their endpoints and products, their feature
// bullets and prices) and each public service's OpenAPI document. It is
// what a storefront, an SDK generator or another site reads; the views
// and the document are built once per config load, with an ETag, so
// clients revalidate for free. docs/wire-contract.md, "Public catalog",
// is its contract.
package publiccatalog

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/platform"
	"github.com/platformgw/gateway/internal/wire"
)

func init() {
	caddy.RegisterModule(new(Handler))
}

// DefaultMaxAge is how long clients and shared caches may reuse an answer
// without asking again.
const DefaultMaxAge = time.Minute

// Handler is the platform_catalog handler. Mount it on a path of its own
// with handle_path; it answers everything below that path and never calls
// the next handler.
type Handler struct {
	// MaxAge is the Cache-Control max-age of the answers; 1m. A reload
	// that changes the catalog changes the ETags, so revalidation sees
	// it at once.
	MaxAge caddy.Duration `json:"max_age,omitempty"`

	// StorefrontURL is where platform_storefront is mounted ("/store"):
	// each API reference page then links back to the service's page there
	// (its plans) and to the list of services, so a person who came to
	// the docs from a search finds how to buy. Without it the pages link
	// nowhere: the catalog may be published on a site with no storefront.
	StorefrontURL string `json:"storefront_url,omitempty"`

	resources map[string]*resource
	public    map[string]bool // the public services' ids
	logger    *zap.Logger
}

// resource is one answer, built at provision.
type resource struct {
	body        []byte
	etag        string
	contentType string
}

// CaddyModule returns the Caddy module information.
func (*Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.platform_catalog", New: func() caddy.Module { return new(Handler) }}
}

// Provision builds every answer from the platform app's catalog.
func (h *Handler) Provision(ctx caddy.Context) error {
	app, err := platform.FromContext(ctx, "platform_catalog")
	if err != nil {
		return err
	}
	rt := app.Runtime()
	return h.setup(rt.Catalog, DocOptions{
		Options:   Options{GatewayPrefix: first(rt.Prefixes.Gateway)},
		Headers:   rt.Headers,
		ServerURL: rt.PublicURL,
		Attached:  app.OpenAPIDocument,
	}, ctx.Logger())
}

func first(prefixes []string) string {
	if len(prefixes) == 0 {
		return "/api"
	}
	return prefixes[0]
}

// setup builds the answers (Provision, and tests with no Caddy).
func (h *Handler) setup(c *catalog.Catalog, o DocOptions, logger *zap.Logger) error {
	h.logger = logger
	if h.MaxAge < 0 {
		return fmt.Errorf("platform_catalog: max_age %s is negative", time.Duration(h.MaxAge))
	}
	if h.MaxAge == 0 {
		h.MaxAge = caddy.Duration(DefaultMaxAge)
	}
	if h.StorefrontURL != "" {
		if err := catalog.CheckLink(h.StorefrontURL, false); err != nil {
			return fmt.Errorf("platform_catalog: storefront_url: %w", err)
		}
	}
	if o.Headers.RequestID == "" {
		o.Headers = wire.NewHeaders("Platform")
	}
	h.resources = make(map[string]*resource)
	h.public = make(map[string]bool)
	if err := h.add("/services", List(c, o.Options)); err != nil {
		return err
	}
	for _, s := range c.Services() {
		if !s.Public {
			continue
		}
		h.public[s.ID] = true
		if err := h.add("/services/"+s.ID, View(s, o.Options)); err != nil {
			return err
		}
		doc, err := OpenAPIDocument(s, o)
		if err != nil {
			return fmt.Errorf("platform_catalog: service %s: OpenAPI document: %w", s.ID, err)
		}
		h.resources["/services/"+s.ID+"/openapi.json"] = newResource(doc, jsonType)
		page, err := RenderDocs(doc, h.storefrontLinks(s.ID))
		if err != nil {
			return fmt.Errorf("platform_catalog: service %s: %w", s.ID, err)
		}
		h.resources["/services/"+s.ID+"/docs"] = newResource(page, htmlType)
	}
	css, err := assetFS.ReadFile("assets/docs.css")
	if err != nil {
		return fmt.Errorf("platform_catalog: %w", err)
	}
	h.resources["/assets/docs.css"] = newResource(css, "text/css; charset=utf-8")
	return nil
}

// storefrontLinks are the API reference page's links to the storefront,
// none without storefront_url.
func (h *Handler) storefrontLinks(id string) StorefrontLinks {
	if h.StorefrontURL == "" {
		return StorefrontLinks{}
	}
	base := strings.TrimRight(h.StorefrontURL, "/")
	return StorefrontLinks{Services: base + "/", Service: base + "/services/" + url.PathEscape(id)}
}

const (
	jsonType = "application/json"
	htmlType = "text/html; charset=utf-8"
)

func (h *Handler) add(path string, v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("platform_catalog: %s: %w", path, err)
	}
	h.resources[path] = newResource(buf.Bytes(), jsonType)
	return nil
}

func newResource(body []byte, contentType string) *resource {
	sum := sha256.Sum256(body)
	return &resource{body: body, etag: `"` + hex.EncodeToString(sum[:16]) + `"`, contentType: contentType}
}

// ServeHTTP answers GET and HEAD of the catalog's routes.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	hdr := w.Header()
	hdr.Set("X-Content-Type-Options", "nosniff")
	// Public data, read by storefronts on other sites; no credentials
	// are ever involved, so any origin may read it.
	hdr.Set("Access-Control-Allow-Origin", "*")
	p := r.URL.Path
	res, ok := h.resources[p]
	if trimmed := strings.TrimSuffix(p, "/"); !ok && trimmed != p && h.resources[trimmed] != nil {
		// One location per answer, so the page's relative links hold.
		hdr.Set("Location", "../"+path.Base(trimmed))
		w.WriteHeader(http.StatusPermanentRedirect)
		return nil
	}
	if !ok {
		if id, found := strings.CutPrefix(p, "/services/"); found {
			id, _, _ = strings.Cut(id, "/")
			if !h.public[id] {
				if rest, _ := strings.CutPrefix(p, "/services/"+id); rest == "/docs" && wantsHTML(r) {
					docsNotFound(w, id)
					return nil
				}
				apierror.Write(w, apierror.New(apierror.ServiceNotFound, "no public service '"+id+"'"))
				return nil
			}
		}
		apierror.Write(w, apierror.New(apierror.NotFound, "no catalog route "+r.URL.Path+"; the services are at services"))
		return nil
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		hdr.Set("Allow", "GET, HEAD")
		apierror.Write(w, apierror.New(apierror.MethodNotAllowed, r.Method+" is not allowed; the catalog is read with GET"))
		return nil
	}
	hdr.Set("ETag", res.etag)
	hdr.Set("Cache-Control", "public, max-age="+strconv.Itoa(int(time.Duration(h.MaxAge)/time.Second)))
	if ETagMatches(r.Header.Values("If-None-Match"), res.etag) {
		w.WriteHeader(http.StatusNotModified)
		return nil
	}
	hdr.Set("Content-Type", res.contentType)
	if res.contentType == htmlType {
		hdr.Set("Content-Security-Policy", docsContentSecurityPolicy)
		hdr.Set("Referrer-Policy", "no-referrer")
		hdr.Set("X-Frame-Options", "DENY")
	}
	hdr.Set("Content-Length", strconv.Itoa(len(res.body)))
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodGet {
		_, _ = w.Write(res.body)
	}
	return nil
}

// ETagMatches reports whether an If-None-Match header names etag: "*", or
// the tag in the list, weak or strong (RFC 9110 section 13.1.2 compares
// weakly for If-None-Match). The storefront's pages revalidate by it too.
func ETagMatches(values []string, etag string) bool {
	for _, v := range values {
		for _, tag := range strings.Split(v, ",") {
			tag = strings.TrimSpace(tag)
			if tag == "*" || strings.TrimPrefix(tag, "W/") == etag {
				return true
			}
		}
	}
	return false
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
