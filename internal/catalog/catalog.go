// Package catalog describes what the marketplace sells: services, their
// endpoints and backends, their products (plans) and secrets. The catalog is
// Caddy configuration, so it is plain data here; Compile checks it and builds
// the lookup tables the handlers use on every request.
package catalog

import (
	"crypto/sha256"
	"fmt"
	"net/url"
	"regexp"
	"strings"

	"github.com/platformgw/gateway/internal/alerts"
	"github.com/platformgw/gateway/internal/billing"
)

// Service is one API sold through the gateway.
type Service struct {
	ID string `json:"id"`
	// Backend is the base URL requests are forwarded to: http or https,
	// host, optional port and optional path prefix.
	Backend string `json:"backend"`
	// Secrets are the HMAC secrets shared with the backend, newest first.
	// Two are allowed during a rotation: both verify, the first signs.
	// Caddy placeholders such as {env.SECRET} are replaced at load time.
	Secrets []string `json:"secrets"`
	// Owners are user ids that call the service free of charge.
	Owners    []string           `json:"owners,omitempty"`
	Endpoints []*Endpoint        `json:"endpoints"`
	Products  []*billing.Product `json:"products,omitempty"`
	// SyncResponse is how a sync invoke answers the caller: SyncRaw (the
	// default) passes the backend's response through, SyncWrapped puts a
	// 2xx body into the result object of the upstream platform's default
	// mode. Endpoints may override it.
	SyncResponse string `json:"sync_response,omitempty"`
	// Alerts are usage alert thresholds per product (alerts.go).
	Alerts []*ProductAlerts `json:"alerts,omitempty"`

	// How the service is shown (listing.go). Public lists it, with its
	// endpoints and the products not private, in the public catalog.
	Public          bool              `json:"public,omitempty"`
	DisplayName     string            `json:"display_name,omitempty"`
	Description     string            `json:"description,omitempty"`
	LogoURL         string            `json:"logo_url,omitempty"`
	CoverImageURL   string            `json:"cover_image_url,omitempty"`
	Features        []*Feature        `json:"features,omitempty"`
	Tags            []string          `json:"tags,omitempty"`
	ProductListings []*ProductListing `json:"product_listings,omitempty"`
	// OpenAPI is the path of the service's OpenAPI 3.0 or 3.1 document
	// (JSON or YAML), which the platform app reads and checks at load
	// (internal/openapidoc); without one the public catalog serves a
	// document built from the catalog.
	OpenAPI string `json:"openapi,omitempty"`

	backend  *url.URL
	secrets  [][]byte
	owners   map[string]bool
	byID     map[string]*Endpoint
	products map[string]*billing.Product
	alerts   map[string][]alerts.Threshold
	features []*Feature
	listings map[string]*ProductListing
}

// Endpoint is one operation of a service.
type Endpoint struct {
	ID string `json:"id"`
	// Methods allowed for the endpoint; GET, POST, PUT and DELETE when empty.
	Methods []string `json:"methods,omitempty"`
	// Path on the backend, appended to the service's base URL; "/" + ID when
	// empty.
	Path string `json:"path,omitempty"`
	// Cost in units of one call for PER_REQUEST products, and the amount
	// reserved up front for measured products; 1 when unset.
	Cost *billing.Units `json:"cost,omitempty"`
	// Async allows /invoke/async on the endpoint.
	Async bool `json:"async,omitempty"`
	// AsyncOnly refuses the sync /invoke on an async endpoint (Caddyfile
	// `async only`): the gateway answers it without charging or
	// forwarding it, rather than the backend refusing a paid call.
	AsyncOnly bool `json:"async_only,omitempty"`
	// Streaming marks an endpoint whose responses stream (SSE and the like);
	// PER_TIME_UNIT products may be invoked synchronously only on those.
	Streaming bool `json:"streaming,omitempty"`
	// AllowUpgrade lets callers send an Upgrade header (WebSocket); an h2c
	// offer is ignored by the gateway, not an upgrade.
	AllowUpgrade bool `json:"allow_upgrade,omitempty"`
	// SyncResponse overrides the service's sync_response for this
	// endpoint; empty inherits it.
	SyncResponse string `json:"sync_response,omitempty"`

	methods map[string]bool
	wrapped bool
}

// The values of sync_response.
const (
	SyncRaw     = "raw"
	SyncWrapped = "wrapped"
)

func validSyncResponse(v string) bool { return v == "" || v == SyncRaw || v == SyncWrapped }

// Catalog is the compiled set of services.
type Catalog struct {
	services map[string]*Service
	order    []*Service // as configured
}

var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._~-]{0,127}$`)

// ValidID reports whether s can be a service, endpoint or product id: URL
// path safe, no slashes, dots only inside.
func ValidID(s string) bool {
	return idPattern.MatchString(s) && s != "." && s != ".." && !strings.Contains(s, "..")
}

// Compile validates the services and builds the lookup tables. resolve
// expands placeholders in secrets (nil leaves them as written).
func Compile(services []*Service, resolve func(string) (string, error)) (*Catalog, error) {
	c := &Catalog{services: make(map[string]*Service, len(services))}
	for _, s := range services {
		if err := s.compile(resolve); err != nil {
			return nil, err
		}
		if _, dup := c.services[s.ID]; dup {
			return nil, fmt.Errorf("service %s declared twice", s.ID)
		}
		c.services[s.ID] = s
		c.order = append(c.order, s)
	}
	return c, nil
}

func (s *Service) compile(resolve func(string) (string, error)) error {
	if err := CheckID("service", s.ID); err != nil {
		return err
	}
	u, err := CheckBackend(s.Backend)
	if err != nil {
		return fmt.Errorf("service %s: %w", s.ID, err)
	}
	u.Path = strings.TrimRight(u.Path, "/")
	u.RawPath = ""
	s.backend = u
	if err := CheckSecrets(s.Secrets); err != nil {
		return fmt.Errorf("service %s: %w", s.ID, err)
	}
	s.secrets = nil
	for i, sec := range s.Secrets {
		if resolve != nil {
			if sec, err = resolve(sec); err != nil {
				return fmt.Errorf("service %s: secret %d: %w", s.ID, i+1, err)
			}
		}
		if len(sec) < minSecretLen {
			return fmt.Errorf("service %s: secret %d is shorter than %d bytes", s.ID, i+1, minSecretLen)
		}
		s.secrets = append(s.secrets, []byte(sec))
	}
	if !validSyncResponse(s.SyncResponse) {
		return fmt.Errorf("service %s: sync_response %q is not raw or wrapped", s.ID, s.SyncResponse)
	}
	s.owners = make(map[string]bool, len(s.Owners))
	for _, o := range s.Owners {
		if err := CheckOwner(o); err != nil {
			return fmt.Errorf("service %s: %w", s.ID, err)
		}
		s.owners[o] = true
	}
	if len(s.Endpoints) == 0 {
		return fmt.Errorf("service %s: no endpoints", s.ID)
	}
	s.byID = make(map[string]*Endpoint, len(s.Endpoints))
	for _, e := range s.Endpoints {
		if err := e.compile(s.SyncResponse); err != nil {
			return fmt.Errorf("service %s: %w", s.ID, err)
		}
		if _, dup := s.byID[e.ID]; dup {
			return fmt.Errorf("service %s: endpoint %s declared twice", s.ID, e.ID)
		}
		s.byID[e.ID] = e
	}
	s.products = make(map[string]*billing.Product, len(s.Products))
	for _, p := range s.Products {
		if p == nil {
			return fmt.Errorf("service %s: empty product", s.ID)
		}
		if err := p.Validate(); err != nil {
			return fmt.Errorf("service %s: %w", s.ID, err)
		}
		if err := CheckID("product", p.ID); err != nil {
			return fmt.Errorf("service %s: %w", s.ID, err)
		}
		if _, dup := s.products[p.ID]; dup {
			return fmt.Errorf("service %s: product %s declared twice", s.ID, p.ID)
		}
		s.products[p.ID] = p
	}
	if err := s.compileAlerts(); err != nil {
		return err
	}
	return s.compileListing()
}

// compile checks the endpoint; serviceSync is the service's sync_response.
func (e *Endpoint) compile(serviceSync string) error {
	if err := CheckID("endpoint", e.ID); err != nil {
		return err
	}
	if !validSyncResponse(e.SyncResponse) {
		return fmt.Errorf("endpoint %s: sync_response %q is not raw or wrapped", e.ID, e.SyncResponse)
	}
	e.wrapped = e.SyncResponse == SyncWrapped || e.SyncResponse == "" && serviceSync == SyncWrapped
	if e.Path == "" {
		e.Path = "/" + e.ID
	}
	if err := CheckPath(e.Path); err != nil {
		return fmt.Errorf("endpoint %s: %w", e.ID, err)
	}
	if e.Cost != nil && *e.Cost < 0 {
		return fmt.Errorf("endpoint %s: negative cost", e.ID)
	}
	if e.AsyncOnly && !e.Async {
		return fmt.Errorf("endpoint %s: async_only needs async", e.ID)
	}
	e.methods = make(map[string]bool)
	methods := e.Methods
	if len(methods) == 0 {
		methods = []string{"GET", "POST", "PUT", "DELETE"}
	}
	for _, m := range methods {
		up, err := CheckMethod(m)
		if err != nil {
			return fmt.Errorf("endpoint %s: %w", e.ID, err)
		}
		e.methods[up] = true
	}
	return nil
}

// Service returns the service with the given id.
func (c *Catalog) Service(id string) (*Service, bool) {
	s, ok := c.services[id]
	return s, ok
}

// Services returns every service in the order they were configured; the
// slice is the catalog's own and must not be changed.
func (c *Catalog) Services() []*Service { return c.order }

// Len returns the number of services.
func (c *Catalog) Len() int { return len(c.services) }

// SharedSecrets lists the services that hold a secret (current or
// previous) another service also holds, each as its id and the id of the
// first service configured with that secret, in configuration order. A
// backend's signature is checked against the secrets of the service it
// names, so each of such services can sign usage reports, job updates and
// pre-flight requests as the other: the gateway warns at load, and keeps
// the config (a rotation that moves a secret between services, or one
// backend serving two services, is the operator's choice).
func (c *Catalog) SharedSecrets() [][2]string {
	first := make(map[[sha256.Size]byte]string)
	var pairs [][2]string
	for _, s := range c.order {
		named := ""
		for _, sec := range s.secrets {
			h := sha256.Sum256(sec)
			other, seen := first[h]
			if !seen {
				first[h] = s.ID
				continue
			}
			if other != s.ID && other != named {
				pairs = append(pairs, [2]string{s.ID, other})
				named = other
			}
		}
	}
	return pairs
}

// Endpoint returns the endpoint with the given id.
func (s *Service) Endpoint(id string) (*Endpoint, bool) {
	e, ok := s.byID[id]
	return e, ok
}

// Product returns the product with the given id.
func (s *Service) Product(id string) (*billing.Product, bool) {
	p, ok := s.products[id]
	return p, ok
}

// BackendURL is the parsed backend base URL (path without trailing slash).
func (s *Service) BackendURL() *url.URL { return s.backend }

// SigningSecret is the secret outgoing requests are signed with.
func (s *Service) SigningSecret() []byte { return s.secrets[0] }

// VerifySecrets are the secrets incoming signatures may be made with.
func (s *Service) VerifySecrets() [][]byte { return s.secrets }

// IsOwner reports whether userID owns the service and calls it free.
func (s *Service) IsOwner(userID string) bool { return s.owners[userID] }

// Allows reports whether the endpoint accepts the HTTP method.
func (e *Endpoint) Allows(method string) bool { return e.methods[method] }

// WrapsSyncResponse reports whether a sync invoke of the endpoint answers
// with the wrapped result object (sync_response wrapped, set on the
// endpoint or inherited from its service).
func (e *Endpoint) WrapsSyncResponse() bool { return e.wrapped }

// UnitCost is the units one call costs or reserves.
func (e *Endpoint) UnitCost() billing.Units {
	if e.Cost == nil {
		return billing.Scale
	}
	return *e.Cost
}
