package engine

import "github.com/platformgw/gateway/internal/wire"

// Prefixes are the path prefixes of each group of routes. Several prefixes
// per group may be served at once (the default and the ECS layout).
type Prefixes struct {
	Gateway []string `json:"gateway,omitempty"`
	Usage   []string `json:"usage,omitempty"`
	Core    []string `json:"core,omitempty"`
}

// DefaultPrefixes serves the default and the ECS layouts side by side.
func DefaultPrefixes() Prefixes {
	return Prefixes{
		Gateway: []string{"/api", "/gateway/api/v1"},
		Usage:   []string{"/api/usage", "/usage/api/v1"},
		Core:    []string{"/api/v1", "/core/api/v1"},
	}
}

// Headers are the brand's header names (wire.Headers).
type Headers = wire.Headers

// NewHeaders builds the header names for a brand (wire.NewHeaders).
func NewHeaders(brand string) Headers { return wire.NewHeaders(brand) }
