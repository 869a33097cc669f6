// Package storefront is the storefront, the platform_storefront HTTP
// handler: the public services as pages a person browses before asking
// for a key — the services as cards with search and tags, and per
// service its features, plans side by side, endpoints and a link to its
// API reference. It shows exactly what the public catalog lists (public
// services, products not private), server-rendered with no script and a
// strict Content-Security-Policy; the gateway makes no outside request
// for it. docs/storefront.md describes it.
package storefront

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/platform"
	"github.com/platformgw/gateway/internal/publiccatalog"
)

func init() {
	caddy.RegisterModule(new(Handler))
}

// DefaultTitle names the storefront when no title is configured.
const DefaultTitle = "API marketplace"

// DefaultMaxAge is how long browsers and shared caches may reuse a page
// without asking again, as the public catalog's answers.
const DefaultMaxAge = time.Minute

// Handler is the platform_storefront handler. Mount it on a path of its
// own with handle_path; it answers everything below that path and never
// calls the next handler.
type Handler struct {
	// Title is the storefront's name, in every page's header and title.
	Title string `json:"title,omitempty"`
	// SignInURL is the caller portal's sign-in page (platform_portal's
	// mount, "/portal/"): the page's call to action until callers can
	// subscribe themselves. Empty: the pages say to ask the operator.
	SignInURL string `json:"sign_in_url,omitempty"`
	// ContactURL is where a caller asks for access (mailto: or https).
	ContactURL string `json:"contact_url,omitempty"`
	// CatalogURL is where platform_catalog is mounted ("/catalog"): each
	// service page links to its API reference and OpenAPI document
	// there. Empty: no documentation link.
	CatalogURL string `json:"catalog_url,omitempty"`
	// ImageOrigins are the origins (https://cdn.example.com) whose
	// logos and cover images the pages show: the Content-Security-Policy
	// allows images from these and from the site itself, nothing else. A
	// service's image elsewhere is not shown (a monogram stands in).
	ImageOrigins []string `json:"image_origins,omitempty"`
	// MaxAge is the Cache-Control max-age of the pages; 1m.
	MaxAge caddy.Duration `json:"max_age,omitempty"`

	shop     *shop
	site     site
	csp      string
	services map[string]*resource // service pages, rendered once
	css      *resource
	// sells is the payments block's Sells, nil without one.
	sells  func(serviceID, productID string) bool
	logger *zap.Logger
}

// resource is a rendered answer and its ETag.
type resource struct {
	body []byte
	etag string
}

func newResource(body []byte) *resource {
	sum := sha256.Sum256(body)
	return &resource{body: body, etag: `"` + hex.EncodeToString(sum[:16]) + `"`}
}

// CaddyModule returns the Caddy module information.
func (*Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.platform_storefront", New: func() caddy.Module { return new(Handler) }}
}

// Provision builds the pages from the platform app's catalog.
func (h *Handler) Provision(ctx caddy.Context) error {
	app, err := platform.FromContext(ctx, "platform_storefront")
	if err != nil {
		return err
	}
	rt := app.Runtime()
	prefix := "/api"
	if len(rt.Prefixes.Gateway) > 0 {
		prefix = rt.Prefixes.Gateway[0]
	}
	if pay := app.PaymentsService(); pay != nil {
		h.sells = pay.Sells
	}
	return h.setup(rt.Catalog, prefix, ctx.Logger())
}

// setup checks the options and renders the pages (Provision, and tests
// with no Caddy).
func (h *Handler) setup(c *catalog.Catalog, gatewayPrefix string, logger *zap.Logger) error {
	h.logger = logger
	if err := h.check(); err != nil {
		return err
	}
	if h.Title == "" {
		h.Title = DefaultTitle
	}
	if h.MaxAge == 0 {
		h.MaxAge = caddy.Duration(DefaultMaxAge)
	}
	h.site = site{Title: h.Title, SignInURL: h.SignInURL, ContactURL: h.ContactURL}
	h.csp = contentSecurityPolicy(h.ImageOrigins)
	h.shop = newShop(c, options{gatewayPrefix: gatewayPrefix, catalogURL: h.CatalogURL, imageOrigins: h.ImageOrigins, sells: h.sells})
	h.services = make(map[string]*resource, len(h.shop.services))
	for id, page := range h.shop.services {
		body, err := render(servicePageT, pageData{Site: h.site, Base: "../", PageTitle: page.Name, Service: page})
		if err != nil {
			return fmt.Errorf("platform_storefront: service %s: %w", id, err)
		}
		h.services[id] = newResource(body)
	}
	h.css = newResource(stylesheet)
	for _, s := range c.Services() {
		for what, u := range map[string]string{"logo_url": s.LogoURL, "cover_image_url": s.CoverImageURL} {
			if s.Public && u != "" && !imageAllowed(u, h.ImageOrigins) {
				logger.Warn("an image of a public service is not on an image origin of the storefront; its page does not show it",
					zap.String("service", s.ID), zap.String(what, u))
			}
		}
	}
	return nil
}

// check rejects options that would make a broken page or a weak policy.
func (h *Handler) check() error {
	if err := checkMaxAge(time.Duration(h.MaxAge)); h.MaxAge != 0 && err != nil {
		return fmt.Errorf("platform_storefront: max_age %s: %w (a bare number in JSON is nanoseconds: write \"1m\")", time.Duration(h.MaxAge), err)
	}
	if err := catalog.CheckText("title", h.Title, catalog.MaxDisplayName, false); err != nil {
		return fmt.Errorf("platform_storefront: %w", err)
	}
	for what, u := range map[string]string{"sign_in_url": h.SignInURL, "catalog_url": h.CatalogURL} {
		if u != "" {
			if err := catalog.CheckLink(u, false); err != nil {
				return fmt.Errorf("platform_storefront: %s: %w", what, err)
			}
		}
	}
	if h.ContactURL != "" {
		if err := catalog.CheckLink(h.ContactURL, true); err != nil {
			return fmt.Errorf("platform_storefront: contact_url: %w", err)
		}
	}
	for _, o := range h.ImageOrigins {
		if err := CheckOrigin(o); err != nil {
			return fmt.Errorf("platform_storefront: image_origins: %w", err)
		}
	}
	return nil
}

// checkMaxAge holds max_age to whole seconds from 1s to 365d, for the
// Caddyfile and for any config: the header counts seconds, so less than
// a second would say max-age=0.
func checkMaxAge(d time.Duration) error {
	if d < time.Second || d%time.Second != 0 || d > 365*24*time.Hour {
		return errors.New("whole seconds, 1s to 365d")
	}
	return nil
}

// CheckOrigin checks an image origin: scheme and host (and port), as a
// Content-Security-Policy source names it, nothing more.
func CheckOrigin(s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
		u.Path != "" || u.RawQuery != "" || u.Fragment != "" || strings.ContainsAny(s, " ;,'*") {
		return fmt.Errorf("'%s' is not an origin such as https://cdn.example.com", catalog.ShownURL(s))
	}
	return nil
}

// contentSecurityPolicy allows the stylesheet, images from the site and
// the configured origins, and forms (the search) to the site; no script,
// no frame, no other request.
func contentSecurityPolicy(imageOrigins []string) string {
	img := "img-src 'self'"
	for _, o := range imageOrigins {
		img += " " + o
	}
	return "default-src 'none'; style-src 'self'; " + img + "; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
}

// ServeHTTP answers GET and HEAD of the storefront's pages.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	hdr := w.Header()
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Content-Security-Policy", h.csp)
	hdr.Set("Referrer-Policy", "no-referrer")
	hdr.Set("X-Frame-Options", "DENY")
	p := r.URL.Path
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		hdr.Set("Allow", "GET, HEAD")
		http.Error(w, "The storefront is read with GET.", http.StatusMethodNotAllowed)
		return nil
	}
	switch {
	case p == "/" || p == "":
		q, tag := r.URL.Query().Get("q"), r.URL.Query().Get("tag")
		if len(q) > 200 {
			q = strings.ToValidUTF8(q[:200], "")
		}
		if tag != "" && !slices.Contains(h.shop.tags, tag) {
			tag = ""
		}
		body, err := render(indexPage, pageData{
			Site: h.site, Cards: h.shop.filter(q, tag), Tags: h.shop.tags, Query: q, Tag: tag,
		})
		if err != nil {
			return caddyhttp.Error(http.StatusInternalServerError, err)
		}
		h.serve(w, r, newResource(body), htmlType)
		return nil
	case p == "/assets/storefront.css":
		h.serve(w, r, h.css, "text/css; charset=utf-8")
		return nil
	}
	if id, ok := strings.CutPrefix(p, "/services/"); ok {
		if page, found := h.services[id]; found {
			h.serve(w, r, page, htmlType)
			return nil
		}
		if trimmed := strings.TrimSuffix(id, "/"); trimmed != id && h.services[trimmed] != nil {
			// One address per page, so its relative links hold.
			hdr.Set("Location", "../"+trimmed)
			w.WriteHeader(http.StatusPermanentRedirect)
			return nil
		}
		// Only a name that could be a service's is repeated: any other
		// text of the address would put a stranger's words ("your account
		// is suspended, call …") on the operator's page.
		if catalog.ValidID(id) {
			return h.notFound(w, r, "There is no API called “"+id+"” here.")
		}
	}
	return h.notFound(w, r, "There is no page at this address.")
}

const htmlType = "text/html; charset=utf-8"

// serve writes a resource with its validators, or 304 when the client
// holds it already.
func (h *Handler) serve(w http.ResponseWriter, r *http.Request, res *resource, contentType string) {
	hdr := w.Header()
	hdr.Set("ETag", res.etag)
	hdr.Set("Cache-Control", "public, max-age="+strconv.Itoa(int(time.Duration(h.MaxAge)/time.Second)))
	if publiccatalog.ETagMatches(r.Header.Values("If-None-Match"), res.etag) {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	hdr.Set("Content-Type", contentType)
	hdr.Set("Content-Length", strconv.Itoa(len(res.body)))
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodGet {
		_, _ = w.Write(res.body)
	}
}

// notFound answers 404 with a page that leads back to the storefront.
func (h *Handler) notFound(w http.ResponseWriter, r *http.Request, message string) error {
	// A target with no '/' ("*", which Go's server passes on for any
	// method) is at the root: a negative count made Repeat panic.
	base := strings.Repeat("../", max(0, strings.Count(r.URL.Path, "/")-1))
	body, err := render(notFoundPage, pageData{Site: h.site, Base: base, PageTitle: "Not found", Message: message})
	if err != nil {
		return caddyhttp.Error(http.StatusInternalServerError, err)
	}
	hdr := w.Header()
	hdr.Set("Content-Type", htmlType)
	hdr.Set("Cache-Control", "no-cache")
	hdr.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusNotFound)
	if r.Method == http.MethodGet {
		_, _ = w.Write(body)
	}
	return nil
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
