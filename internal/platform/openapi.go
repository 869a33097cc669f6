package platform

import (
	"fmt"

	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/openapidoc"
)

// loadOpenAPI reads and checks the OpenAPI document each service attaches
// (`openapi`), when the config loads: a missing file or an invalid
// document stops the load, so the public catalog never serves half of
// what the operator meant. A reload reads the files again.
func loadOpenAPI(c *catalog.Catalog) (map[string][]byte, error) {
	docs := make(map[string][]byte)
	for _, s := range c.Services() {
		if s.OpenAPI == "" {
			continue
		}
		doc, err := openapidoc.LoadFile(s.OpenAPI)
		if err != nil {
			return nil, fmt.Errorf("service %s: %w", s.ID, err)
		}
		docs[s.ID] = doc
	}
	return docs, nil
}

// OpenAPIDocument is the OpenAPI document the service attaches, as JSON;
// nil when it attaches none.
func (a *App) OpenAPIDocument(serviceID string) []byte { return a.openAPI[serviceID] }
